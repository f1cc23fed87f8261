"""The draft server's stream steps launched ahead (DraftServerConfig.launch_ahead): each step is queued on the
device just before the one in flight ends, fed that step's tokens there (runtime.batchstreams), and the step in
flight is then read and its tokens sent. Meanwhile the serving loop serves messages, so that a commit read while a
step runs is in the next one, as without; but the device no longer waits for the host between two steps (the
schedule, the inputs, the launch, the replies and the messages: 0.4-0.65 ms of a 2.5-2.75 ms period at one row on
one H100 before). A commit that comes in the last `lead` before the step in flight ends waits one step more.

When to launch: the step in flight is due `lead` before its estimated end: its start (its launch, or the end of the
step before it, whichever is later) plus the device's step (a moving average of the steps read), less the host time
from the decision to the launch (a moving average, plus LEAD_SLACK_S). A step already done is due at once. A prefill
queued behind the step in flight (a prompt's forwards, for as long as they take) holds the next launch until it ends,
so that the commits that come meanwhile are in that step; the step in flight is read (its tokens sent) as soon as it
is done all the same."""
from __future__ import annotations

import time

LEAD_SLACK_S = 100e-6    # added to the measured host time of a launch: the device's own start after it
EMA = 0.2                # the moving averages' weight of the newest step


class StepAhead:
    """The step in flight and the estimates that say when the next is due (see the module docstring)."""

    def __init__(self):
        self.flight = None             # runtime.batchseq.Launched: the stream step launched, not yet read
        self.step_s = 0.0              # the device's stream step (moving average; 0: none read yet)
        self.host_s = 0.0              # the host's time from a due decision to the launch (moving average)
        self.t_decided = 0.0           # when the newest due decision was taken
        self.launched = 0              # steps launched ahead
        self.behind = None             # a CUDA event after a prefill queued behind the step in flight

    def next(self) -> str:
        """What the loop does now: 'launch' the next step (nothing in flight, it is done, or it ends within lead,
        and no prefill is queued behind it), 'read' the step in flight only (done, a prefill behind it), or 'wait'."""
        f = self.flight
        if self.behind is not None and not self.behind.query():
            return "read" if f is not None and f.copy.done() else "wait"
        self.behind = None
        if f is None or f.copy.done() or (f.t_due > 0 and time.perf_counter() >= f.t_due):
            self.t_decided = time.perf_counter()
            return "launch"
        return "wait"

    def queued_behind(self, device) -> None:
        """A prefill was queued on device behind the step in flight: the next launch waits for its end."""
        if device.type == "cuda":
            import torch
            self.behind = torch.cuda.Event()
            self.behind.record()

    def took(self, nxt, prev_end: float | None, prev_ms: float) -> None:
        """nxt (a Launched, or None) is in flight; the step before it ended by prev_end (None: there was none)
        after prev_ms of device time (0: its read failed): the estimates move, and nxt's due time is set."""
        if prev_end is not None and prev_ms > 0:
            s = prev_ms / 1e3
            self.step_s = s if not self.step_s else (1 - EMA) * self.step_s + EMA * s
        self.flight = nxt
        if nxt is None:
            return
        self.launched += 1
        host = max(nxt.t_launch - self.t_decided, 0.0)
        self.host_s = host if not self.host_s else (1 - EMA) * self.host_s + EMA * host
        if self.step_s:
            start = max(nxt.t_launch, prev_end or 0.0)
            nxt.t_due = start + self.step_s - self.host_s - LEAD_SLACK_S

"""vLLM's rows as pipelined streams on a draft server (no network): what the remote draft proposer's streaming
mode (wire.vllm_proposer, mode "stream") sends each step, and the streamed drafts it offers.

Terms. A *stream* is one request's pipelined sequence on the draft server (Open with stream=True, runtime.pipeline's
rules): `base` the context length it was opened with, `context` every token settled since (the target's accepted
drafts and its own tokens), each sent as a CommitRow in order (stream position = context index - base), and `view`
the drafts that have arrived (a View: runtime.pipeline's rules, on both sides alike: a commit that differs from a
drafted token starts a new epoch). Rows are matched to streams by content, as wire.vllm_rows matches tracks: a stream
continues row i when its context is a prefix of the row's context.

Rules. Each step every row's tokens past its stream's context are committed, all of them, in order (a stream the
server has not drafted that far is extended by them: caught up, never re-opened); the row's drafts are the view's
chain at the row's next position, at most k, and [] when none has arrived: nothing here waits. A row no stream
fits (a new request, one resumed after preemption with a context that went back) opens one with its whole context;
a stream no row fits for `idle_steps` steps is ended (its request finished, was aborted, or was preempted and
not resumed), and at once while `max_streams` are held and a new row waits. A stream the server refused is dropped
(desync: it is opened again at the row's next step) or held for `hold_s` (any other refusal: no drafts, then a new
stream). A row whose context leaves no room for the window within `context` gets no stream.

Measured on the way, for a policy that decides whether a step waits (each an O(1) update of an event this module
already handles): the *restart latency*, from the commit that starts a new epoch leaving here to that epoch's first
draft arriving here; and the verdicts: of the drafts offered to a row, how many its next commits accepted. The
proposer reads messages only inside its propose calls, so a draft that arrived while vLLM ran its forward is taken
at the next call: timed by its take, the latency would be a bound in whole steps (a restart would look as slow as
vLLM's step, and a policy would never wait for one). So it is timed on the server's clock: the new epoch's first
row carries when the server read the commit that restarted it (StreamRow.read_at) and its Streamed when the step
ended (stepped_at); that lag plus the link's round trip (the Hello's, as the proposer measured it) is the restart.
A row without those stamps falls back to the take's time. (How fast drafts come, the draft period, is the server's step: the proposer takes it
from the Streamed messages' compute, not from arrival times, which the same polling blurs.)
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from . import protocol
from .vllm_rows import IDLE_STEPS, MAX_TRACKS, common_prefix

HOLD_S = 1.0             # a stream refused (other than desync) drafts nothing this long, then opens again
LOG_EVERY_S = 1.0        # a StepLog writes its lines this often
MEASURE_WINDOW = 64      # restart latencies (and the proposer's draft periods) a median is taken over
SENDS_KEPT = 16          # a stream's last steps of commits whose send time a restart can be traced to


class View:
    """The proposer's picture of one stream on the server, for a client that commits every position in order
    (runtime.pipeline.StreamView's rules, each event O(1)). The server's chain holds our commits and its drafts past
    them; a commit that differs from the draft's token there makes it roll back and start a new epoch. A commit whose
    draft has not arrived is *unresolved* (positions [lo, hi), contiguous: a draft that arrives resolves every
    earlier one); the first draft of this epoch at or past an unresolved position settles it: the server took our
    token there (drafted none), or drafted its own, and if that differs, restarted there."""

    def __init__(self):
        self.epoch, self.lo, self.hi = 0, 0, 0
        self.drafts: dict[int, int] = {}         # pos -> the draft's token (this epoch, past the commits)
        self.mine: dict[int, int] = {}           # unresolved pos -> our token
        self.restarts = 0

    def _restart(self, at: int) -> None:
        self.epoch += 1
        self.restarts += 1
        self.drafts.clear()
        for u in range(self.lo, min(at + 1, self.hi)):
            self.mine.pop(u, None)
        self.lo = max(self.lo, at + 1)

    def on_commit(self, pos: int, token: int) -> None:
        d = self.drafts.pop(pos, None)
        if d is None:                            # not arrived: resolved by the next draft of this epoch
            if self.lo == self.hi:
                self.lo = pos
            self.hi, self.mine[pos] = pos + 1, token
        elif d != token:
            self.lo = self.hi = pos + 1
            self._restart(pos)

    def on_drafted(self, epoch: int, pos: int, token: int) -> None:
        if epoch != self.epoch:
            return                               # run-ahead the server has since dropped
        for u in range(self.lo, min(pos, self.hi)):
            self.mine.pop(u, None)               # the server took our token there
        self.lo = max(self.lo, min(pos, self.hi))
        if self.lo < self.hi:                    # pos is unresolved: ours against the draft's
            mine = self.mine.pop(pos)
            self.lo = pos + 1
            if mine != token:
                self._restart(pos)
        elif pos >= self.hi:
            self.drafts[pos] = token

    def chain(self, pos: int, n_max: int) -> list[int]:
        """The drafts at pos, pos + 1, ... (at most n_max); [] while a commit is unresolved."""
        out = []
        if self.lo < self.hi:
            return out
        while len(out) < n_max and (t := self.drafts.get(pos + len(out))) is not None:
            out.append(t)
        return out


@dataclass(eq=False)
class Stream:
    seq: str
    base: int                            # the context length it was opened with (position 0 is the next token)
    context: np.ndarray                  # [n] every token settled (the Open's, then the commits')
    view: View = field(default_factory=View)
    gen: int = 0
    idle: int = 0                        # steps since a row last fitted it
    held_until: float = 0.0              # refused: no drafts before then, a new stream after
    raw: bytes = b""                     # context's bytes (what fits compares)
    offered: list[int] = field(default_factory=list)   # the drafts offered to its row at the last step
    t_restart: float = 0.0               # a new epoch's first draft awaited since its commit left then (0: none)
    sends: collections.deque = field(default_factory=lambda: collections.deque(maxlen=SENDS_KEPT))  # (pos, t)

    def __post_init__(self):
        self.raw = self.context.tobytes()


@dataclass
class StreamPlan:
    """One step's messages (Opens with their context, CommitRows, Ends) and the rows to offer drafts to:
    (row, stream, the row's next position, drafts at most)."""
    opens: list = field(default_factory=list)
    commits: list[protocol.CommitRow] = field(default_factory=list)
    ends: list[Stream] = field(default_factory=list)
    reads: list[tuple[int, Stream, int, int]] = field(default_factory=list)
    verified: int = 0                    # drafts offered last step whose verdict these commits carry
    accepted: int = 0                    # ... of them accepted
    verdicts: list[tuple[int, int]] = field(default_factory=list)   # ... per row: (accepted, offered)


class StreamTracker:
    """vLLM's rows matched to pipelined streams by content (this module's docstring has the rules)."""

    def __init__(self, window: int, idle_steps: int = IDLE_STEPS, prefix: str = "", max_streams: int = MAX_TRACKS,
                 hold_s: float = HOLD_S):
        self.window, self.idle_steps, self.max_streams, self.hold_s = window, idle_steps, max_streams, hold_s
        self.prefix = prefix or f"s{os.getpid():x}-"
        self.streams: dict[str, Stream] = {}
        self.by_row: dict[int, Stream] = {}
        self.count = 0
        self.restarts_s: collections.deque = collections.deque(maxlen=MEASURE_WINDOW)  # restart latency (s)

    def plan(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, k: int, context: int,
             now: float) -> StreamPlan:
        """This step's Opens, commits, Ends and reads (k: drafts a row may take; context: the longest context a
        stream may reach, its window included)."""
        plan, claimed, by_row, crowded = StreamPlan(), set(), {}, False
        lengths = np.asarray(num_tokens_no_spec[:len(sampled_token_ids)]).tolist()
        for i, n in enumerate(lengths):
            ctx = token_ids_cpu[i, :n]
            s = self._match(i, ctx, claimed)
            if s is not None and s.held_until and now >= s.held_until:     # refused before: start over
                plan.ends.append(self._drop(s))
                s = None
            if s is None and n + self.window + 2 > context:
                continue                                               # no room to draft ahead: no stream
            if s is None and len(self.streams) >= self.max_streams:
                crowded = True
                continue
            if s is None:
                s = self._open(plan, ctx)
            if not s.held_until:                                 # (a held stream sends nothing until it starts over)
                self._commit(plan, s, ctx[:context - 3], now)    # (the server's limit on a stream's positions)
            claimed.add(s)
            by_row[i] = s
            s.idle = 0
            if not s.held_until and n + 3 <= context:
                plan.reads.append((i, s, n - s.base, min(k, context - 3 - n)))
        self.by_row = by_row
        for s in [s for s in self.streams.values() if s not in claimed]:
            s.idle += 1
            if s.idle > self.idle_steps or crowded:
                plan.ends.append(self._drop(s))
        return plan

    def _match(self, row: int, ctx: np.ndarray, claimed: set) -> Stream | None:
        """The row's own stream of the last step if it still fits, else the unclaimed stream with the longest
        context that is a prefix of ctx."""
        hint = self.by_row.get(row)
        if hint is not None and hint.seq in self.streams and hint not in claimed and fits(hint, ctx):
            return hint
        best = None
        for s in self.streams.values():
            if s not in claimed and (best is None or len(s.context) > len(best.context)) and fits(s, ctx):
                best = s
        return best

    def _open(self, plan: StreamPlan, ctx: np.ndarray) -> Stream:
        self.count += 1
        s = Stream(f"{self.prefix}{self.count}", len(ctx), ctx.copy())
        self.streams[s.seq] = s
        plan.opens.append((s, s.context))
        return s

    def _commit(self, plan: StreamPlan, s: Stream, ctx: np.ndarray, now: float = 0.0) -> None:
        """Every token of ctx past s's context, in order, as commits; the view follows them. The drafts offered
        last step get their verdict (the leading news equal to them; the last token is the target's own)."""
        n0 = len(s.context)
        if len(ctx) <= n0:
            return
        off, news, restarts = n0 - s.base, ctx[n0:].tolist(), s.view.restarts
        if s.offered:
            n = min(common_prefix(news, s.offered), len(news) - 1)
            plan.verified += len(s.offered)
            plan.accepted += n
            plan.verdicts.append((n, len(s.offered)))
            s.offered = []
        for j, token in enumerate(news):
            plan.commits.append(protocol.CommitRow(s.seq, s.gen, off + j, token))
            s.view.on_commit(off + j, token)
        s.sends.append((off, now))
        if s.view.restarts != restarts:                  # a commit differed from an arrived draft: a new epoch
            s.t_restart = now
        s.context = ctx.copy()
        s.raw = s.context.tobytes()

    def take(self, rows: list[protocol.StreamRow], now: float | None = None, stepped_at: float = 0.0,
             link_s: float = 0.0) -> int:
        """A Streamed's rows into their streams' views (rows of ended streams or old generations are dropped);
        the rows taken. For the restart latency: `now`, when the message was taken (default: now); stepped_at, the
        Streamed's (the server's clock; 0: unknown); link_s, the link's round trip."""
        now = time.perf_counter() if now is None else now
        n = 0
        for r in rows:
            s = self.streams.get(r.seq)
            if s is None or r.gen != s.gen:
                continue
            restarts = s.view.restarts
            s.view.on_drafted(r.epoch, r.pos, r.token)
            n += 1
            if s.view.restarts != restarts:              # our unresolved commit differed: the server restarts there
                s.t_restart = self._sent_at(s, r.pos)
            elif r.epoch == s.view.epoch and s.t_restart:
                timed = stepped_at > 0 and r.since >= 0 and r.read_at > 0       # the server's lag, its clock
                self.restarts_s.append(max(stepped_at - r.read_at, 0.0) + link_s if timed else now - s.t_restart)
                s.t_restart = 0.0
        return n

    @staticmethod
    def _sent_at(s: Stream, pos: int) -> float:
        """When the commit at stream position pos left (the step that sent it), 0 if no longer known."""
        for first, t in reversed(s.sends):
            if first <= pos:
                return t
        return 0.0

    def restart_s(self) -> float | None:
        """The median restart latency over the last MEASURE_WINDOW (None: none measured yet)."""
        return statistics.median(self.restarts_s) if self.restarts_s else None

    def refused(self, seq: str, gen: int, code: str, now: float) -> bool:
        """The server refused stream seq: dropped (desync: it no longer holds it), or held for hold_s. Whether
        the refusal was one of this tracker's streams."""
        s = self.streams.get(seq)
        if s is None or s.gen != gen:
            return False
        if code == "desync":
            if not s.held_until:            # (a held stream's desync follows its first refusal: it stays as held)
                self._drop(s)
        else:
            s.held_until = max(s.held_until, now + self.hold_s)
        return True

    @staticmethod
    def drafts(s: Stream, pos: int, most: int) -> list[int]:
        """The drafts that continue s at pos exactly (at most `most`; [] while none has arrived)."""
        return s.view.chain(pos, most) if most > 0 else []

    def _drop(self, s: Stream) -> Stream:
        self.streams.pop(s.seq, None)
        return s

    def reset(self) -> None:
        self.streams.clear()
        self.by_row.clear()


def fits(s: Stream, ctx: np.ndarray) -> bool:
    """Whether s's context is a prefix of ctx (vllm_rows.fits, its compare as bytes: a step's host time is short)."""
    n = len(s.context)
    return n <= len(ctx) and ctx[:n].tobytes() == s.raw


class StepLog:
    """Each propose step as one JSON line appended to `path` (written every LOG_EVERY_S, and at flush): `t` its
    start (wall clock, time.time()), `host_ms` propose's own time, `gap_ms` the time since the previous step
    returned (the target's step; 0: not timed), `rows`, `ready` (rows offered drafts), `offered` (drafts offered),
    `server_steps` and `server_ms` (the server's draft steps whose tokens arrived since the step before, and their
    compute on its clock: how fast it drafts while the target steps), the proposer's totals so far of sequences
    `opened`, `ended` (End sent) and `confirmed` (Ended received: the End processed by the server), and the step's
    decision: `wait_for` (drafts a row waited for beyond those on offer; 0: it took what was on offer),
    `wait_max_ms` (the longest it would wait) and `waited_ms` (how long it waited). An empty path: nothing is kept."""

    def __init__(self, path: str):
        self.path, self.lines, self.t_written = path, [], time.perf_counter()
        self.server = (0.0, 0)                   # the server's draft seconds and steps so far (the last add's)

    def add(self, t0: float, t1: float, out: list[list[int]], gap_s: float, server: tuple[float, int] = (0.0, 0),
            seqs: tuple[int, int, int] = (0, 0, 0), decision: tuple[int, float, float] = (0, 0.0, 0.0)):
        """One step; `server`: the server's draft seconds and steps received so far, `seqs`: sequences opened, ended
        and confirmed ended so far (the proposer's totals), `decision`: drafts waited for, the longest wait (s) and
        the time waited (s)."""
        if not self.path:
            return
        (s0, n0), self.server = self.server, server
        self.lines.append(json.dumps({"t": time.time() - (time.perf_counter() - t0), "host_ms": (t1 - t0) * 1e3,
                                      "gap_ms": gap_s * 1e3, "rows": len(out), "ready": sum(1 for d in out if d),
                                      "offered": sum(len(d) for d in out), "server_steps": server[1] - n0,
                                      "server_ms": (server[0] - s0) * 1e3, "opened": seqs[0], "ended": seqs[1],
                                      "confirmed": seqs[2], "wait_for": decision[0],
                                      "wait_max_ms": decision[1] * 1e3, "waited_ms": decision[2] * 1e3}))
        if t1 - self.t_written > LOG_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.path and self.lines:
            with open(self.path, "a") as f:
                f.write("\n".join(self.lines) + "\n")
        self.lines, self.t_written = [], time.perf_counter()

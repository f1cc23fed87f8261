"""The pipelined draft's side (runtime.pipeline has the protocol and the target's side): `StreamDrafter`
drafts a chain of tokens ahead of the target's commits, each step launched ahead of its host read, and follows
the target's Commits. It drafts in-process pipelined runs; a remote draft is the draft server (wire.draft_server,
whose batched drafter follows the same commit rules and drafts branches with its verdict cache).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .engine import Engine, HostCopy, HostPart
from .loop import draft_prefill, draft_token, q_support
from .settings import STREAM_WINDOW
from .verify import Sampling


@dataclass
class Step:
    """One drafted position, launched on the device and (after settle) read to the host."""
    epoch: int
    pos: int
    tok: torch.Tensor                   # the token on the device (0-d); it feeds the next step there
    q: torch.Tensor | None              # a sampled draft's distribution [V] on the device
    copies: tuple                       # HostCopy of the token (and of q's top pairs)
    clock: object                       # the forward's timing mark (ForwardClock.last)
    token: int = -1                     # after settle: the token on the host
    q_idx: list | None = None           # after settle: q's non-zero ids and their probabilities
    q_val: list | None = None
    ms: float = 0.0                     # after settle: the step's device time
    restart_ms: float | None = None     # after settle, the first step after a restart: ms since that commit
    period_ms: float = 0.0              # the previous step's launch -> this one's, when the draft stepped on without
                                        # a pause or a restart between (its host's work included); 0: not timed
    alts: object = None                 # watched: HostCopy of the draft's top choices at pos
    alt_ids: list | None = None         # after settle: the draft's next choices at pos (watched)


class StreamDrafter:
    """The draft's side: a chain of tokens for positions 0.., its cache holding all but the last.

    Steps are launched ahead of their host read: `launch()` queues the next position's forward with the
    newest token as it lies on the device, `settle()` reads the oldest launched step (waiting for it alone),
    `ready()` says whether that would wait; the worker looks at its socket while a step runs, so a commit is
    seen at once and a restart is queued right behind the step in flight. `depth` steps may be queued: 2 keeps
    the device from ever waiting for the host between steps, but a restart then waits for two stale steps
    (measured on two H200s: median restart 5.7 ms at depth 2), so the default is 1. `step()` is launch + settle."""

    def __init__(self, engine: Engine, q_top: int = 0, window: int = STREAM_WINDOW, watch: int = 0):
        """watch > 0: each step also reads the draft's next `watch` choices at its position and sends them with
        its token, so the target learns how often a correction is among them (StreamView.among)."""
        self.engine, self.q_top, self.window = engine, q_top, window
        self.watch = max(watch, 0)
        self.gen = torch.Generator(device=engine.device)
        self.sampling = Sampling()
        self.chain: list[int] = []          # settled tokens
        self.flight: list[Step] = []        # launched, not settled: positions len(chain), len(chain)+1, ...
        self.fed = 0            # tokens (chain, then flight) in the draft's cache
        self.epoch = 0
        self.acked = 0          # positions < acked are final (the target said so)
        self.t_restart = None   # when the last restart's commit arrived, until its first step settles
        self.t_launch = None    # the last launch, while the draft steps on without a pause or a restart
        self.last_tok = None    # the chain's last token on the device, while it is the one a settled step drafted
        self.depth = 1          # steps queued on the device at most (see above)

    def start(self, prompt_ids: list[int], size: int, first: int, s: Sampling, seed: int = 0) -> None:
        self.sampling = s
        self.prefill_s = draft_prefill(self.engine, self.gen, prompt_ids, size, seed)
        self.base, self.size = len(prompt_ids), size
        self.chain, self.flight, self.fed, self.epoch, self.acked = [first], [], 0, 0, 1
        self.t_launch = None
        self.last_tok = None

    @property
    def compute_s(self) -> float:
        return self.engine.forward_s

    @property
    def ahead(self) -> int:
        """Positions drafted or launched."""
        return len(self.chain) + len(self.flight)

    def can_step(self) -> bool:
        """Room in the window past the settled positions, in the request's cache, and in the queue."""
        room = (len(self.flight) < self.depth and self.ahead < self.acked + self.window
                and self.base + self.ahead < self.size)
        if not room and not self.flight:
            self.t_launch = None                 # a pause: the next step's period is not the draft's
        return room

    def _period_ms(self) -> float:
        """At a launch: ms since the previous one, if the draft stepped on between (else 0); starts the next."""
        now = time.perf_counter()
        ms = (now - self.t_launch) * 1e3 if self.t_launch is not None else 0.0
        self.t_launch = now
        return ms

    def launch(self) -> None:
        """Queue the next position's forward (nothing waits for the device)."""
        period = self._period_ms()
        if self.flight:
            assert self.fed == self.ahead - 1, "only the newest token is unfed while steps are in flight"
            feed = self.flight[-1].tok
        elif self.last_tok is not None and self.fed == len(self.chain) - 1:
            feed = self.last_tok                 # the token just read: still on the device, no copy back
        else:
            feed = self.chain[self.fed:]
        logits = self.engine.forward(feed)[-1]
        self.fed = self.ahead
        if self.watch and self._greedy:
            self.flight.append(self._greedy_step(logits, period))
            return
        alts = HostCopy(torch.topk(logits, min(self.watch + 1, logits.shape[-1])).indices) if self.watch else None
        self.flight.append(self._step(logits, alts=alts, period=period))

    @property
    def _greedy(self) -> bool:
        return self.sampling.greedy or not self.sampling.draft_sampled

    def _greedy_step(self, logits: torch.Tensor, period: float) -> Step:
        """A watched greedy step's token and its next choices in one device-to-host copy: the token (the argmax of
        logits [V]), then the watch + 1 best ids (the token itself dropped at settle)."""
        tok = logits.argmax(-1, keepdim=True)
        hc = HostCopy(torch.cat([tok, torch.topk(logits, min(self.watch + 1, logits.shape[-1])).indices]))
        return Step(self.epoch, self.ahead, tok[0], None, (HostPart(hc, 0),), self.engine.clock.last(),
                    alts=HostPart(hc, slice(1, None)), period_ms=period)

    def _draft(self, logits) -> tuple:
        """One position's token (and q) on the device, with the host copies that settle will read."""
        tok, q = draft_token(logits, self.sampling, self.gen, self.q_top)
        copies = (HostCopy(tok),)
        if q is not None:
            top = q_support(q, self.q_top)
            copies += (HostCopy(top.indices), HostCopy(top.values))
        return tok, q, copies

    def _step(self, logits, alts=None, period: float = 0.0) -> Step:
        tok, q, copies = self._draft(logits)
        return Step(self.epoch, self.ahead, tok, q, copies, self.engine.clock.last(), alts=alts, period_ms=period)

    def ready(self) -> bool:
        return bool(self.flight) and self.flight[0].copies[0].done()

    def settle(self) -> Step:
        """Read the oldest launched step to the host (waiting for it) and add its token to the chain."""
        st = self.flight.pop(0)
        st.token = int(st.copies[0].value())
        if st.q is not None:
            st.q_idx, st.q_val = st.copies[1].value(), st.copies[2].value()
        st.ms = self.engine.clock.elapsed(st.clock) * 1e3
        self.chain.append(st.token)
        self.last_tok = st.tok
        if self.t_restart is not None and st.epoch == self.epoch:
            st.restart_ms, self.t_restart = (time.perf_counter() - self.t_restart) * 1e3, None
        if st.alts is not None:
            st.alt_ids = [int(a) for a in st.alts.value() if int(a) != st.token][:self.watch]
        return st

    def messages(self, st: Step) -> list[tuple]:
        """A settled step as StreamView.on_drafted's arguments (one message: its token)."""
        return [(st.epoch, st.pos, st.token, st.q, -1, -1, st.alt_ids)]

    def step(self) -> list[tuple]:
        """Draft the next position now. Returns its messages (see messages())."""
        self.launch()
        return self.messages(self.settle())

    def commit(self, pos: int, token: int) -> list[Step]:
        """The target's token at pos. Returns the steps it made settle (launched at or before pos): they must
        reach the target before anything drafted after this commit. A step launched after pos is not waited
        for (a restart would drop it): a restart starts right behind it on the device."""
        settled = []
        while self.flight and self.flight[0].pos <= pos:
            settled.append(self.settle())
        if pos < len(self.chain):
            if self.chain[pos] != token:
                # positions < pos are all fed (pos was drafted from them); steps in flight are dropped
                self.engine.rollback(self.base + pos)
                self.chain, self.fed = self.chain[:pos] + [token], pos
                self.t_restart = time.perf_counter()
                self.flight = []
                self.epoch += 1
                self.t_launch = None             # the next launch waits behind the step in flight
                self.last_tok = None
        elif pos == len(self.chain):
            self.chain.append(token)
            self.last_tok = None
        else:
            raise ValueError(f"commit at position {pos}, but the draft's chain ends at {len(self.chain) - 1}")
        self.acked = max(self.acked, pos + 1)
        return settled

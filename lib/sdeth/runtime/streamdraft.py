"""The pipelined draft's side (runtime.pipeline has the protocol and the target's side): `StreamDrafter`
drafts a chain of tokens ahead of the target's commits, each step launched ahead of its host read, and follows
the target's Commits; with the outcome cache on it also drafts branches on its likely corrections. `CacheSpec`
(`parse_cache`) is how an outcome cache is written.

The outcome cache (fanout > 0; Saguaro's speculative speculative decoding, across a link): at each drafted
position the target has not settled, the draft also opens a branch on its next choice there (the likely
correction if the target rejects it) and drafts that branch's continuation as extra rows of the same
forward (Engine.forward_rows: the rows share the cached prefix, each branch writes to its own scratch
slots). Branch tokens stream to the target at once as Drafted(fork, corr): "if your token at fork is corr,
my next tokens are these". A Commit that rejects the draft's token at fork with corr selects the branch on
both sides by the same rule: the draft adopts it (its rows copied into the chain, no recompute) and drafts
on from its end in a new epoch; the target takes the branch tokens it already holds, and those still on
the wire, as that epoch's drafts, so a hit costs neither the round trip nor fresh draft steps. A commit
that finds no branch restarts as before (a miss). Which branches to open is the fan-out (how many open at
once, earliest positions first, the first `ranks` alternatives at each) and the depth (tokens per branch).
The branches are drafts like any other: the target verifies them, so the cache changes speed, never output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .engine import Engine, HostCopy, HostPart
from .loop import draft_prefill, draft_token, q_support
from .settings import STREAM_WINDOW
from .specs import parse_branch_spec
from .verify import Sampling


CACHE_DEFAULT = "4x4x2"   # what "on" turns on: 2 forks x 2 alternatives, 4 tokens deep (AGENT_LOG says why)


@dataclass(frozen=True)
class CacheSpec:
    """An outcome cache: `fanout` branches open at once (0: off), each `depth` tokens deep, on the draft's first
    `ranks` alternatives at a position. Written "off" (or "" / "0"), "on" (CACHE_DEFAULT) or
    FANOUT[xDEPTH[xRANKS]], e.g. "2x4": two branches, four tokens each, on the draft's second choice."""
    fanout: int = 0
    depth: int = 4
    ranks: int = 1

    @classmethod
    def parse(cls, spec: str) -> "CacheSpec":
        parts = parse_branch_spec(spec, "outcome cache", CACHE_DEFAULT, "RANKS")
        return cls(*parts) if parts else cls()

    @property
    def on(self) -> bool:
        return self.fanout > 0


def parse_cache(spec: str) -> tuple[int, int, int]:
    """CacheSpec.parse(spec) as (fanout, depth, ranks); fanout 0 is off."""
    c = CacheSpec.parse(spec)
    return c.fanout, c.depth, c.ranks


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
    rows: list = field(default_factory=list)       # outcome cache: (branch, token, q, copies) launched with it
    alts: object = None                 # outcome cache: HostCopy of the draft's top choices at pos
    branched: list = field(default_factory=list)   # after settle: the branch tokens (BranchToken) it made
    alt_ids: list | None = None         # after settle: the draft's next choices at pos (outcome cache, or watched)


@dataclass
class BranchToken:
    """A token of a branch: the draft's token at `pos` if the target's token at `fork` is `corr`."""
    fork: int
    corr: int
    pos: int
    token: int
    q: torch.Tensor | None = None
    q_idx: list | None = None
    q_val: list | None = None

    def message(self, epoch: int) -> tuple:
        """As StreamView.on_drafted takes it."""
        return (epoch, self.pos, self.token, self.q, self.fork, self.corr)


@dataclass
class Branch:
    """A continuation drafted for one likely correction: at generated position `fork` the target takes
    `corr` (not the draft's token); `tokens` are the draft's for fork+1, fork+2, ...; its rows (corr,
    tokens[0], ...) sit in the scratch slots region, region+1, ... of the draft's cache."""
    fork: int
    corr: int
    region: int
    tokens: list[int] = field(default_factory=list)
    fed: int = 0                        # rows in the cache

    def feed(self, j: int) -> int:
        return self.corr if j == 0 else self.tokens[j - 1]


class StreamDrafter:
    """The draft's side: a chain of tokens for positions 0.., its cache holding all but the last.

    Steps are launched ahead of their host read: `launch()` queues the next position's forward with the
    newest token as it lies on the device, `settle()` reads the oldest launched step (waiting for it alone),
    `ready()` says whether that would wait; the worker looks at its socket while a step runs, so a commit is
    seen at once and a restart is queued right behind the step in flight. `depth` steps may be queued: 2 keeps
    the device from ever waiting for the host between steps, but a restart then waits for two stale steps
    (measured on two H200s: median restart 5.7 ms at depth 2), so the default is 1. `step()` is launch + settle."""

    def __init__(self, engine: Engine, q_top: int = 0, window: int = STREAM_WINDOW, fanout: int = 0, depth: int = 4,
                 ranks: int = 1, watch: int = 0):
        """fanout > 0: the outcome cache (see the module's doc): at most `fanout` branches open at once, each
        drafted `depth` tokens deep, on the first `ranks` alternatives at a position. It needs a draft engine
        with rows (the fast decoder) and fanout * depth scratch slots. watch > 0 (with the cache off): each
        step also reads the draft's next `watch` choices at its position and sends them with its token, so the
        target learns how often a correction is among them (the hit rate the cache would have; `--cache auto`)."""
        self.engine, self.q_top, self.window = engine, q_top, window
        self.fanout, self.branch_depth, self.ranks = fanout, depth, ranks
        self.watch = 0 if fanout else max(watch, 0)
        if fanout:
            if fanout < 0 or depth < 1 or ranks < 1:
                raise ValueError(f"outcome cache fanout={fanout} depth={depth} ranks={ranks}: use fanout >= 0, "
                                 "depth >= 1, ranks >= 1")
            have = self.can_branch(engine)
            if have < fanout * depth:
                raise ValueError(f"outcome cache {fanout}x{depth} needs a fast-decoder draft engine with "
                                 f"{fanout * depth} scratch slots (this one: impl={getattr(engine, 'impl', '?')!r}, "
                                 f"scratch={have}): run the draft with impl 'fast', or turn the cache off")
        self.branches: dict[tuple[int, int], Branch] = {}
        self.hits = 0           # commits that selected a branch
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
        self.branches.clear()
        self.hits = 0
        self.t_launch = None
        self.last_tok = None

    @staticmethod
    def can_branch(engine) -> int:
        """The scratch slots an engine offers the outcome cache's branch rows (0: it cannot draft them)."""
        return getattr(engine, "scratch", 0) if getattr(engine, "impl", "") == "fast" else 0

    def _drop_branches(self, dead) -> None:
        for key in [k for k, b in self.branches.items() if dead(b)]:
            del self.branches[key]

    def _free_region(self) -> int | None:
        """A scratch region no open branch holds (fanout regions of depth slots each)."""
        used = {b.region for b in self.branches.values()}
        base = self.engine.scratch_base()
        return next((r for r in range(base, base + self.fanout * self.branch_depth, self.branch_depth)
                     if r not in used), None)

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
        if self.fanout:
            return self._launch_rows(period)
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
            self.flight.append(self._greedy_step(logits[None], [], self.watch, period))
            return
        alts = HostCopy(torch.topk(logits, min(self.watch + 1, logits.shape[-1])).indices) if self.watch else None
        self.flight.append(self._step(logits, alts=alts, period=period))

    @property
    def _greedy(self) -> bool:
        return self.sampling.greedy or not self.sampling.draft_sampled

    def _greedy_step(self, logits: torch.Tensor, branches: list, n_alts: int, period: float) -> Step:
        """A greedy step's tokens and its next choices in one device-to-host copy: logits [1 + branch rows, V],
        the chain's row first; the chain row's n_alts + 1 best ids come along (the token itself dropped at
        settle)."""
        toks = logits.argmax(-1)
        parts = [toks]
        if n_alts:
            parts.append(torch.topk(logits[0], min(n_alts + 1, logits.shape[-1])).indices)
        hc = HostCopy(torch.cat(parts) if len(parts) > 1 else toks)
        rows = [(b, toks[1 + r], None, (HostPart(hc, 1 + r),)) for r, b in enumerate(branches)]
        return Step(self.epoch, self.ahead, toks[0], None, (HostPart(hc, 0),), self.engine.clock.last(), rows=rows,
                    alts=HostPart(hc, slice(len(toks), None)) if n_alts else None, period_ms=period)

    def _draft(self, logits) -> tuple:
        """One position's token (and q) on the device, with the host copies that settle will read."""
        tok, q = draft_token(logits, self.sampling, self.gen, self.q_top)
        copies = (HostCopy(tok),)
        if q is not None:
            top = q_support(q, self.q_top)
            copies += (HostCopy(top.indices), HostCopy(top.values))
        return tok, q, copies

    def _step(self, logits, rows=(), alts=None, period: float = 0.0) -> Step:
        tok, q, copies = self._draft(logits)
        return Step(self.epoch, self.ahead, tok, q, copies, self.engine.clock.last(), rows=list(rows), alts=alts,
                    period_ms=period)

    def _launch_rows(self, period: float = 0.0) -> None:
        """One forward of rows: the chain's unfed tokens, then one row for each branch still growing."""
        assert not self.flight, "the outcome cache keeps one step in flight"
        main = self.chain[self.fed:]
        a0 = self.base + self.fed
        ids, pos = list(main), list(range(a0, a0 + len(main)))
        slots, prefix, lo, hi = list(pos), [a + 1 for a in pos], [-1] * len(main), [-2] * len(main)
        growing = [b for b in self.branches.values() if len(b.tokens) < self.branch_depth
                   and self.base + b.fork + b.fed + 1 < self.size]
        for b in growing:
            j = b.fed
            ids.append(b.feed(j))
            pos.append(self.base + b.fork + j)
            slots.append(b.region + j)
            prefix.append(self.base + b.fork)
            lo.append(b.region)
            hi.append(b.region + j)
        logits = self.engine.forward_rows(*self.engine.rows_inputs(ids, pos, slots, prefix, lo, hi), advance=len(main))
        self.fed = len(self.chain)
        if self._greedy:
            self.flight.append(self._greedy_step(logits[len(main) - 1:], growing, self.ranks, period))
            for b in growing:
                b.fed += 1
            return
        rows = []
        for r, b in enumerate(growing):
            b.fed += 1
            rows.append((b, *self._draft(logits[len(main) + r])))
        last = logits[len(main) - 1]
        alts = HostCopy(torch.topk(last, min(self.ranks + 1, last.shape[-1])).indices)
        self.flight.append(self._step(last, rows, alts, period))

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
        for b, tok, q, copies in st.rows:
            if self.branches.get((b.fork, b.corr)) is not b:
                continue                    # resolved while the row ran: nothing to send
            bt = BranchToken(b.fork, b.corr, b.fork + 1 + len(b.tokens), int(copies[0].value()), q)
            if q is not None:
                bt.q_idx, bt.q_val = copies[1].value(), copies[2].value()
            b.tokens.append(bt.token)
            st.branched.append(bt)
        if st.alts is not None:
            st.alt_ids = [int(a) for a in st.alts.value() if int(a) != st.token][:self.ranks if self.fanout else self.watch]
        if self.fanout and st.pos >= self.acked:     # open branches on the next choices here
            for corr in st.alt_ids:
                region = self._free_region()
                if region is None:
                    break
                self.branches[(st.pos, corr)] = Branch(st.pos, corr, region)
        return st

    def messages(self, st: Step) -> list[tuple]:
        """A settled step as StreamView.on_drafted's arguments: its token, then its branch tokens."""
        return [(st.epoch, st.pos, st.token, st.q, -1, -1, st.alt_ids)] + [bt.message(st.epoch) for bt in st.branched]

    def step(self) -> list[tuple]:
        """Draft the next position now. Returns its messages (see messages())."""
        self.launch()
        return self.messages(self.settle())

    def commit(self, pos: int, token: int) -> list[Step]:
        """The target's token at pos. Returns the steps it made settle (launched at or before pos): they must
        reach the target before anything drafted after this commit. A step launched after pos is not waited
        for (a restart would drop it): a restart or a hit starts right behind it on the device."""
        settled = []
        while self.flight and self.flight[0].pos <= pos:
            settled.append(self.settle())
        if pos < len(self.chain):
            if self.chain[pos] != token:
                b = self.branches.get((pos, token))
                # positions < pos are all fed (pos was drafted from them); steps in flight are dropped
                self.engine.rollback(self.base + pos)
                if b is not None and b.tokens:
                    # a hit: the branch's rows (corr, tokens[:-1]) become the chain's, its settled tokens (all
                    # sent) its new tail; a row still in flight is not waited for (its token is drafted again)
                    n = len(b.tokens)
                    self.engine.copy_slots([b.region + j for j in range(n)], self.base + pos)
                    self.chain, self.fed = self.chain[:pos] + [token] + b.tokens, pos + n
                    self.hits += 1
                else:
                    self.chain, self.fed = self.chain[:pos] + [token], pos
                    self.t_restart = time.perf_counter()
                self.flight = []
                self.epoch += 1
                self.branches.clear()
                self.t_launch = None             # the next launch waits behind the step in flight
                self.last_tok = None
        elif pos == len(self.chain):
            self.chain.append(token)
            self.last_tok = None
        else:
            raise ValueError(f"commit at position {pos}, but the draft's chain ends at {len(self.chain) - 1}")
        self._drop_branches(lambda b: b.fork <= pos)
        self.acked = max(self.acked, pos + 1)
        return settled

"""Pipelined SD: the draft streams tokens ahead while the target verifies; the target never idles
longer than the cost model says is worth it.

Positions count generated tokens (0 = the target's first token, from prefill). Both sides keep the
same picture of the sequence:

  draft  -> target   Drafted(epoch, pos, token, q): the draft's next token, drafted on the
                     assumption that everything it sent before in this epoch is accepted.
  target -> draft    Commit(pos, token): the target's own token at `pos` (a correction, the bonus
                     after a full acceptance, or a plain target step); every position before `pos`
                     is final as the draft drafted it or as earlier Commits said.

The draft, on Commit(pos, t): if it drafted pos as t, nothing changes (its run-ahead stays valid);
if it drafted something else, it rolls back to pos, takes t, and starts a new epoch; if it has not
drafted pos yet, it takes t as the next token of its chain. The target applies the same rule to
its picture: it compares t with the draft's token at pos as soon as it has it (messages keep their
order, so a Drafted for pos+1 with no Drafted for pos means the draft took t), and ignores tokens
of an old epoch. This is PEARL's post-verify (Liu et al. 2024: keep drafting while the target
verifies, assume acceptance) without its rigid segments, and AMUSD's asynchronous rollback; the
bonus token is not thrown away: when the draft guessed it (probability ~alpha) the run-ahead
survives.

Each target round verifies m >= 0 streamed drafts in one forward of [x, d1..dm] (x: the last
committed token, not yet in its cache) and commits the accepted ones plus its own token; m = 0 is
a plain target step. m, and how long to wait for it, is chosen per round by a named policy (costmodel.SETTINGS;
the default, costmodel.StepPolicy, maximises long-run tokens/s from the measured alpha, draft period, verify costs
and restart latency; "sync" always waits for k, "offered" goes with what is on offer): wait for more drafts only
when that pays. Lossless for the
same reason as synchronous SD: every committed token is either the target's own sample or a draft
token accepted against the q the draft used, in the context the target committed.

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

from ..costmodel import AdaptivePolicy, StepPolicy, setting_of
from .engine import Engine, HostCopy, HostPart
from .loop import (DraftUnavailable, RequestRecord, _done, _finish, begin_request, choose_host_token, draft_prefill,
                   draft_token, note_round, note_width, q_support, start_draft)
from .roles import DraftStream
from .specs import parse_branch_spec
from .verify import Sampling, read_verdict


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


# ------------------------------------------------------------------------------------- draft side
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

    def __init__(self, engine: Engine, q_top: int = 0, window: int = 16, fanout: int = 0, depth: int = 4,
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
        self.s = Sampling()
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
        self.s = s
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
        return self.s.greedy or not self.s.draft_sampled

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
        tok, q = draft_token(logits, self.s, self.gen, self.q_top)
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


# ------------------------------------------------------------------------------------ target side
class StreamView:
    """The target's picture of the draft's stream (the same rules as StreamDrafter.commit)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.epoch = 0
        self.drafts: dict[int, tuple[int, torch.Tensor | None]] = {}
        self.unresolved: dict[int, int] = {}     # committed by the target, draft's token not seen yet
        self.t_epoch = time.perf_counter()
        self.received = 0                        # tokens received in this epoch
        self.branches: dict[tuple[int, int], dict[int, tuple]] = {}   # (fork, corr) -> {pos: (token, q)}
        self.follow: tuple | None = None         # (old epoch, fork, corr): the branch the draft adopts
        self.restarts = 0                        # rejections of a streamed token (each starts an epoch)
        self.hits = 0                            # of those, the ones a branch of the outcome cache served
        self._hit = False
        self.alts: dict[int, list] = {}          # pos -> the draft's next choices there (when it sends them)
        self.judged = 0                          # restarts at a position whose next choices the draft sent
        self.among = 0                           # of those, corrections among them (the hit rate the cache would get)

    def _restart(self, at: int, token: int) -> None:
        """The draft's token at `at` differs from ours (`token`): it rolls back there and starts a new
        epoch, from its branch (at, token) if it drafted one. Our commits after `at` still reach it (in
        order) and are compared in the new epoch."""
        branch = self.branches.get((at, token), {})
        alts = self.alts.get(at)
        if alts is not None:
            self.judged += 1
            self.among += token in alts
        self.alts.clear()
        self.follow = (self.epoch, at, token)
        self.epoch += 1
        self.drafts.clear()
        self.branches.clear()
        self.unresolved = {u: t for u, t in self.unresolved.items() if u > at}
        self.t_epoch = time.perf_counter()
        self.received = 0
        self.restarts += 1
        self._hit = bool(branch)
        self.hits += self._hit
        epoch = self.epoch
        for p in sorted(branch):
            if self.epoch != epoch:
                break                            # a commit after `at` rejected the branch itself
            self._take(p, *branch[p])

    def _take(self, pos: int, token: int, q, alts=None) -> None:
        """A token of the current epoch at pos (alts: the draft's next choices there, if it sent them)."""
        self.received += 1
        if alts is not None:
            self.alts[pos] = alts
        for u in [u for u in self.unresolved if u < pos]:
            del self.unresolved[u]               # the draft took our token there (drafted none)
        if pos in self.unresolved:
            mine = self.unresolved.pop(pos)
            if mine != token:
                self._restart(pos, mine)
            return
        self.drafts[pos] = (token, q)

    def on_drafted(self, epoch: int, pos: int, token: int, q, fork: int = -1, corr: int = -1, alts=None) -> None:
        if fork >= 0:                            # a branch token (outcome cache)
            if epoch == self.epoch:
                self.branches.setdefault((fork, corr), {})[pos] = (token, q, alts)
                return
            if self.follow != (epoch, fork, corr):
                return                           # a branch the draft did not adopt
            epoch = self.epoch                   # the adopted branch: this epoch's drafts
            if not self._hit:
                self._hit, self.hits = True, self.hits + 1
        if epoch != self.epoch:
            return                               # run-ahead the draft has since dropped
        self._take(pos, token, q, alts)

    def on_commit(self, pos: int, token: int) -> None:
        d = self.drafts.pop(pos, None)
        for p in [p for p in self.drafts if p < pos]:
            del self.drafts[p]
        if d is not None and d[0] != token:
            self._restart(pos, token)
            return
        for key in [key for key in self.branches if key[0] <= pos]:
            del self.branches[key]               # resolved forks
        for p in [p for p in self.alts if p <= pos]:
            del self.alts[p]
        if d is None:
            self.unresolved[pos] = token

    def chain(self, pos: int, n_max: int) -> list[tuple[int, torch.Tensor | None]]:
        """Usable drafts at pos, pos+1, ... (at most n_max)."""
        if self.unresolved:
            return []
        out = []
        while len(out) < n_max and pos + len(out) in self.drafts:
            out.append(self.drafts[pos + len(out)])
        return out


EXPLORE_EVERY = 16     # after this many plain steps in a row, verify the drafts on offer once
WAIT_SLICE_S = 0.02    # the target waits for drafts in slices this long, choosing again after each


@dataclass
class StreamStats:
    """What a draft stream measured over one request, beyond the DraftStream contract; a stream that does not
    measure one of these (an in-process double) reports the default."""
    link_ms: float | None = None                                # the link's own round trip (two transits)
    periods_ms: list[float] = field(default_factory=list)      # the draft's wall step, launch to launch
    restarts_ms: list[float] = field(default_factory=list)     # a Commit's mismatch to the new epoch's 1st token
    restarts_stepped_ms: list[float] = field(default_factory=list)   # ... to that token stepped (one host's clock)
    gaps_ms: list[float] = field(default_factory=list)         # two tokens of one run stepped apart (pauses too)
    branched: int = 0                                           # outcome-cache branch tokens drafted

    @classmethod
    def of(cls, stream: DraftStream) -> "StreamStats":
        return cls(**{f: getattr(stream, f) for f in ("link_ms", "periods_ms", "restarts_ms", "restarts_stepped_ms",
                                                      "gaps_ms", "branched") if hasattr(stream, f)})


@dataclass
class DraftFeed:
    """The target's side of one request's draft stream: whether it is usable, and the waiting done on it."""
    stream: DraftStream
    est: AdaptivePolicy
    timeout_s: float                # silence longer than this, while the policy waits, means the draft is gone
    alive: bool = True
    wait_s: float = 0.0             # target idle, waiting for streamed drafts
    plain_run: int = 0              # plain steps in a row while drafts were on offer

    def take(self, pos: int, m_max: int) -> list[tuple[int, torch.Tensor | None]]:
        """The drafts to verify at pos (at most m_max): as many as the policy chooses, waiting in slices of
        WAIT_SLICE_S while more are worth it; [] for a plain step (also once the draft is gone)."""
        drafts: list = []
        if self.alive and m_max >= 1:
            try:
                drafts = self._choose(pos, m_max)
            except DraftUnavailable:
                self.alive, drafts = False, []
        self.plain_run = 0 if drafts else self.plain_run + 1
        return drafts

    def _choose(self, pos: int, m_max: int) -> list:
        """A policy that holds (the step policy) keeps its first choice while the drafts are on their way, giving it
        up only once they are overdue (it then goes with what is on offer); the others choose again after every
        slice of waiting."""
        stream, view, est = self.stream, self.stream.view, self.est
        stream.poll()
        t_w, fresh, m, avail0 = time.perf_counter(), view.received == 0, None, 0
        while True:
            drafts = view.chain(pos, m_max)
            now = time.perf_counter()
            if m is None or not getattr(est, "holds", False):
                m, avail0 = est.choose_m(len(drafts), m_max, view.received == 0, now - view.t_epoch), len(drafts)
            elif isinstance(est, StepPolicy) and (est.overdue(m, now - view.t_epoch) if fresh
                                                  else est.overdue(m, now - t_w, avail0)):
                m = len(drafts)            # the drafts are late (a stall): go with what is on offer
            if m == 0 and drafts and self.plain_run >= EXPLORE_EVERY:
                m = min(len(drafts), 2)    # keep alpha's estimate current: verify what is here
            if m <= len(drafts):
                self.wait_s += time.perf_counter() - t_w
                return drafts[:m]
            if time.perf_counter() - t_w > self.timeout_s:
                raise DraftUnavailable(f"no draft token within {self.timeout_s:.1f} s")
            stream.wait(WAIT_SLICE_S)      # then choose again: a late draft may be worth no more wait


def pipelined_round(target: Engine, x: int, drafts: list[tuple[int, torch.Tensor | None]], s: Sampling, gen,
                    est: AdaptivePolicy, req: RequestRecord) -> list[int]:
    """One target round: verify the m drafts [(token, q [V] or None)] after x (the last committed token, not yet
    in the target's cache) in one forward of [x, d1..dm]; returns the tokens it commits: the accepted drafts and
    the target's own token (m = 0: a plain step, its token alone). Feeds est and req's counters."""
    m = len(drafts)
    v0 = target.forward_s
    ids = target.on_device([x] + [d for d, _ in drafts])
    logits = target.forward(ids)               # [m+1, V]
    if m:
        q = torch.stack([qq for _, qq in drafts]) if drafts[0][1] is not None else None
        n, y = read_verdict(ids[1:], q, logits, s, gen)   # the round's one host read
        target.rollback(target.pos - m + n)    # keep x and the n accepted
        est.observe_round(n, m)
        note_round(req, n, m)
    else:
        n, y = 0, choose_host_token(logits[-1], s, gen)
    est.observe_verify(m + 1, target.forward_s - v0)
    note_width(req, m + 1, target.forward_s - v0)
    req.k_trace.append(m)
    return [d for d, _ in drafts[:n]] + [y]


def generate_pipelined(target: Engine, stream: DraftStream, prompt_ids: list[int], max_tokens: int, k_max: int,
                       s: Sampling, eos: int | None, gen=None, prompt_id: str = "", est: AdaptivePolicy | None = None,
                       draft_timeout_s: float = 5.0, draft_seed: int | None = None) -> RequestRecord:
    """Pipelined SD for one request over a draft stream (roles.DraftStream), k_max drafts per round at most.
    If the draft becomes unavailable, the request finishes on the target alone. est: the step's policy and its
    estimates (default: the step policy, costmodel.StepPolicy); the record names its setting."""
    est = est or StepPolicy()
    if hasattr(stream, "est"):
        stream.est = est                           # a stream that measures the draft feeds the policy
    req, t0, t_first, size, x = begin_request(target, prompt_ids, max_tokens, k_max, s, gen, prompt_id)
    feed = DraftFeed(stream, est, draft_timeout_s,
                     alive=start_draft(req, stream.start, prompt_ids, size, x, seed=draft_seed))
    while not _done(req.output_ids, eos, max_tokens):
        pos = len(req.output_ids)                  # the position the next token goes to
        m_max = min(k_max, max_tokens - pos - 1)   # room for m drafts and the target's token
        drafts = feed.take(pos, m_max)
        committed = pipelined_round(target, x, drafts, s, gen, est, req)
        if not drafts:                             # a plain step, counted by why
            if not feed.alive:
                req.tokens_without_draft += 1
            elif m_max < 1:
                req.tail_steps += 1
            else:
                req.plain_steps += 1
        req.output_ids.extend(committed)
        x = committed[-1]
        if feed.alive:
            stream.commit(len(req.output_ids) - 1, x)
    if feed.alive:
        stream.end()
    _record_stream(req, target, feed)
    return _finish(req, t0, t_first, eos, max_tokens)


def _record_stream(req: RequestRecord, target: Engine, feed: DraftFeed) -> None:
    """The request's stream figures into its record (and the link's round trip and the draft's alternatives
    into the policy, for the next request)."""
    stream, view, est, stats = feed.stream, feed.stream.view, feed.est, StreamStats.of(feed.stream)
    req.verify_s = target.forward_s
    req.draft_s = stream.compute_s
    req.drafted = stream.streamed
    req.rtt_est_ms = est.rtt * 1e3 if est.rtt is not None else None
    req.link_rtt_ms = stats.link_ms
    req.alt_judged, req.alt_among = view.judged, view.among
    est.observe_alternatives(view.judged, view.among)
    if req.link_rtt_ms is not None:
        est.observe_link(req.link_rtt_ms / 1e3)
    periods = stats.periods_ms
    req.draft_period_ms, req.draft_periods = (sum(periods) / len(periods) if periods else None), len(periods)
    req.restarts_ms, req.restarts_stepped_ms = list(stats.restarts_ms), list(stats.restarts_stepped_ms)
    req.draft_gaps_ms = list(stats.gaps_ms)
    req.stream_restarts, req.cache_hits = view.restarts, view.hits
    req.branch_tokens = stats.branched
    req.wire_s = feed.wait_s                       # target idle, waiting for streamed drafts
    req.step_policy = setting_of(est)

"""Pipelined SD, the target's side: the draft (runtime.streamdraft) streams tokens ahead while the target
verifies; the target never idles longer than the cost model says is worth it. Here: the protocol both sides
follow, the target's picture of the stream, its rounds and its request loop.

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

Branches sent ahead (a draft server's verdict cache, runtime.verdictcache): the draft also streams branch tokens,
Drafted(fork, corr): "if your token at fork is corr, my next tokens are these". A Commit that rejects the draft's
token at fork with corr selects the branch on both sides by the same rule: the target takes the branch tokens it
already holds, and those still on the wire, as the new epoch's drafts, so a hit costs neither the round trip nor
fresh draft steps. The branches are drafts like any other: the target verifies them, so the cache changes speed,
never output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..costmodel import AdaptivePolicy, StepPolicy, setting_of
from .engine import Engine
from .loop import (DraftUnavailable, RequestRecord, _done, _finish, begin_request, choose_host_token, note_round,
                   note_width, start_draft)
from .roles import DraftStream
from .verify import Sampling, read_verdict


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
        self.hits = 0                            # of those, the ones a branch sent ahead served
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
        if fork >= 0:                            # a branch token (sent ahead)
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
    branched: int = 0                                           # branch tokens drafted (sent ahead)

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
    """The request's stream figures into its record (and the link's round trip into the policy, for the next
    request)."""
    stream, view, est, stats = feed.stream, feed.stream.view, feed.est, StreamStats.of(feed.stream)
    req.verify_s = target.forward_s
    req.draft_s = stream.compute_s
    req.drafted = stream.streamed
    req.rtt_est_ms = est.rtt * 1e3 if est.rtt is not None else None
    req.link_rtt_ms = stats.link_ms
    req.alt_judged, req.alt_among = view.judged, view.among
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

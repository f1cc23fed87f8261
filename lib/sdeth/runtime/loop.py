"""The decoding loops: target-only and speculative, one request at a time (batch 1).

Invariant between rounds: `last` is the newest token, in neither cache yet; the target's cache
holds everything before it; the draft's cache holds everything before `pending` (which ends with
`last`). A round: the draft eats `pending` and proposes k tokens, the target verifies
[last, d1..dk] in one forward, both caches roll back to what was accepted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .engine import Engine, HostCopy, decode_one_token, host_read, prefill
from .roles import DraftSource
from .verify import Sampling, draw, probs, read_verdict


@dataclass
class RequestRecord:
    """One request's output and counters (the `requests` entries of the results JSON)."""
    prompt_id: str
    prompt_tokens: int
    output_ids: list[int] = field(default_factory=list)
    ttft_ms: float = 0.0
    tpot_ms: float | None = None
    e2e_s: float = 0.0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    rounds: int = 0
    draft_prefill_s: float = 0.0
    draft_s: float = 0.0        # draft model compute during rounds
    wire_s: float = 0.0         # waiting for proposals beyond the draft's compute (the link; ~0 colocated)
    link_s: float = 0.0         # remote draft: the wait minus the time the draft worker held the requests
                                # (transport both ways: zmq, TCP, (de)serialisation on the target's side)
    draft_host_s: float = 0.0   # remote draft: held minus its model time (the draft worker's own host work)
    bare_rtt_ms: float | None = None   # remote draft: median bare Ping/Pong round trip, the transport's floor
    verify_s: float = 0.0       # target forwards during rounds (or decode steps, target-only); device time on CUDA
    verify_wall_s: float = 0.0  # sync SD: proposal in hand -> verdict on the host (verify's launch, its device
                                # time, the verdict's kernels and read)
    between_s: float = 0.0      # sync SD: verdict on the host -> next proposal asked for (the loop's bookkeeping)
    tokens_without_draft: int = 0   # decoded by the target alone because the draft was unavailable
    tail_steps: int = 0             # target-only steps at the end, with no room left to draft
    k_trace: list[int] = field(default_factory=list)   # drafts verified per round (adaptive k / pipelined)
    plain_steps: int = 0            # pipelined: rounds the target stepped alone rather than wait for drafts
    step_policy: str = ""          # pipelined: the step's policy, by its setting's name (costmodel.POLICIES)
    drafted: int = 0                # pipelined: tokens the draft streamed (used, or dropped with a run)
    rtt_est_ms: float | None = None # pipelined: the target's running estimate of the link round trip
    link_rtt_ms: float | None = None  # pipelined, remote: the link's own round trip (two transits, as learnt)
    draft_period_ms: float | None = None  # pipelined: the draft's wall ms from one step's launch to the next while it
    draft_periods: int = 0                # stepped on (host work included), mean over this many steps
    alt_judged: int = 0             # pipelined: corrections at a position whose next draft choices were sent
    alt_among: int = 0              # ... of those, the ones among them (the hit rate branches on them could get)
    restarts_ms: list[float] = field(default_factory=list)  # pipelined, remote: a correcting commit sent ->
                                    # the draft's first token of the new epoch received, each time
    restarts_stepped_ms: list[float] = field(default_factory=list)  # ... -> that token stepped at the draft (one
                                    # clock: draft and target on one host; a remote stream that can tell)
    draft_gaps_ms: list[float] = field(default_factory=list)  # pipelined, draft server: two tokens of one run
                                    # stepped apart (the server's period; a pause where the window was full)
    stream_restarts: int = 0        # pipelined: the target's token differed from a streamed draft's (new epoch)
    cache_hits: int = 0             # pipelined, branches sent ahead: of those, the ones a drafted branch served
    branch_tokens: int = 0          # pipelined, branches sent ahead: branch tokens the draft streamed
    rejections: int = 0             # rounds that ended in a rejection (alpha = accepted / (accepted + this))
    verify_widths: dict = field(default_factory=dict)   # "m" -> [forwards of m tokens, seconds] during rounds


def draft_prefill(engine: Engine, gen, prompt_ids: list[int], size: int, seed: int | None) -> float:
    """A draft's start of a request (in-process and streaming drafters alike): its sampling seeded (None:
    the generator runs on), a cache of `size`, the prompt prefilled; returns the prefill's forward seconds."""
    if seed is not None:
        gen.manual_seed(seed)
    engine.start(size)
    engine.forward(prompt_ids)                   # its logits are not needed: the target's first token comes next
    prefill_s, engine.forward_s = engine.forward_s, 0.0
    return prefill_s


def note_round(req: RequestRecord, n: int, m: int) -> None:
    """The counters of one verified round: m drafts judged, the first n accepted."""
    req.rejections += n < m
    req.rounds += 1
    req.drafts += 1
    req.draft_tokens += m
    req.accepted_tokens += n
    for i in range(n):
        req.accepted_per_pos[i] += 1


def note_width(req: RequestRecord, m: int, seconds: float) -> None:
    c = req.verify_widths.setdefault(str(m), [0, 0.0])
    c[0] += 1
    c[1] += seconds


def choose(logits: torch.Tensor, s: Sampling, gen) -> torch.Tensor:
    """The target's own token for one position as a device tensor (0-d): argmax, or a draw from p."""
    return logits.argmax(-1) if s.greedy else draw(probs(logits, s), gen)


def choose_host_token(logits: torch.Tensor, s: Sampling, gen) -> int:
    """choose(), read to the host."""
    return int(host_read(choose(logits, s, gen)))


def _finish(req: RequestRecord, t_start: float, t_first: float, eos: int | None, max_tokens: int) -> RequestRecord:
    out = req.output_ids
    if eos is not None and eos in out:
        out = out[:out.index(eos) + 1]
    req.output_ids = out[:max_tokens]
    t_end = time.perf_counter()
    req.ttft_ms = (t_first - t_start) * 1e3
    req.e2e_s = t_end - t_start
    n = len(req.output_ids)
    req.tpot_ms = (t_end - t_first) * 1e3 / (n - 1) if n > 1 else None
    return req


def _done(out: list[int], eos: int | None, max_tokens: int) -> bool:
    return len(out) >= max_tokens or (eos is not None and eos in out)


def generate_target_only(target: Engine, prompt_ids: list[int], max_tokens: int, s: Sampling,
                         eos: int | None, gen=None, prompt_id: str = "") -> RequestRecord:
    """The baseline, as fast as this engine decodes: each step's token feeds the next step on the device,
    and is read to the host while that next step runs (one step behind; a step past an end-of-sequence
    token is the only waste)."""
    req = RequestRecord(prompt_id, len(prompt_ids))
    t0 = time.perf_counter()
    target.start(len(prompt_ids) + max_tokens + 1)
    tok = choose(prefill(target, prompt_ids), s, gen)
    req.output_ids.append(int(host_read(tok)))
    t_first = time.perf_counter()
    target.forward_s = 0.0                       # from here on: decode time
    pending = None                               # the newest token, decoded, on its way to the host
    while True:
        launch = not _done(req.output_ids, eos, max_tokens) and len(req.output_ids) + (pending is not None) < max_tokens
        if launch:
            tok = choose(decode_one_token(target, tok), s, gen)
            new = HostCopy(tok)
        if pending is not None:
            req.output_ids.append(int(pending.value()))
        pending = new if launch else None
        if pending is None and not launch:
            break
    req.verify_s = target.forward_s
    return _finish(req, t0, t_first, eos, max_tokens)


def draft_token(logits: torch.Tensor, s: Sampling, gen, q_top: int = 0):
    """The draft's token for one position as a device tensor (0-d), and q ([V], or None for a greedy
    draft). A sampled draft draws from q; with q_top > 0, q is its top-q_top tokens renormalised (still
    exact: acceptance uses that same q, and it crosses a wire as q_top pairs instead of a full vocabulary)."""
    if s.greedy or not s.draft_sampled:
        return logits.argmax(-1), None
    q = probs(logits, s)
    if q_top:
        top = torch.topk(q, min(q_top, q.numel()))
        q = torch.zeros_like(q).scatter_(0, top.indices, top.values / top.values.sum())
    return draw(q, gen), q


def q_support(q: torch.Tensor, q_top: int):
    """A sampled draft's q reduced to what crosses the wire: its q_top largest entries per row (ids and
    probabilities, on the device; q_top 0: the whole row)."""
    return torch.topk(q, min(q_top or q.shape[-1], q.shape[-1]), dim=-1)


def draft_n_tokens(draft: Engine, pending: list[int], n: int, s: Sampling, gen, q_top: int = 0):
    """Feed `pending` to the draft and propose n tokens, each drafted token feeding the next step on the
    device. Returns (tokens [n] as a device tensor, q [n, V] or None); nothing is read to the host here.
    The draft's cache then holds pending + tokens[:-1]."""
    logits = draft.forward(pending)[-1]
    toks, qs = [], []
    for i in range(n):
        t, q = draft_token(logits, s, gen, q_top)
        toks.append(t)
        if q is not None:
            qs.append(q)
        if i < n - 1:
            logits = decode_one_token(draft, t)
    return torch.stack(toks), (torch.stack(qs) if qs else None)


class DraftUnavailable(RuntimeError):
    """The draft cannot propose (its worker died or timed out): decode on the target alone."""


class Drafter:
    """The draft's side of SD, the same code in-process and inside the draft worker.

    start() prefills the prompt; propose(n_prev, nxt, k) first applies the verdict on the previous
    proposal (n_prev of its tokens accepted, then the target's token nxt), then proposes k tokens.
    """
    def __init__(self, engine: Engine, s: Sampling = Sampling(), seed: int = 0, q_top: int = 0):
        self.engine, self.sampling, self.q_top = engine, s, q_top
        self.gen = torch.Generator(device=engine.device).manual_seed(seed)
        self.prev: list[int] = []

    def start(self, prompt_ids: list[int], size: int, s: Sampling | None = None, seed: int | None = None) -> None:
        if s is not None:
            self.sampling = s
        self.prefill_s = draft_prefill(self.engine, self.gen, prompt_ids, size, seed)
        self.prev = []

    @property
    def compute_s(self) -> float:
        """Draft model time in propose() since start()."""
        return self.engine.forward_s

    def propose(self, n_prev: int, nxt: int, k: int):
        eng, prev = self.engine, self.prev
        if prev:  # the draft ate prev[:-1]: keep the accepted ones; its own last proposal is pending if accepted
            eng.rollback(eng.pos - (len(prev) - 1) + min(n_prev, len(prev) - 1))
        pending = ([prev[-1]] if prev and n_prev == len(prev) else []) + [nxt]
        toks, q = draft_n_tokens(eng, pending, k, self.sampling, self.gen, self.q_top)
        self.prev = host_read(toks)              # the round's one read on the draft's side
        return self.prev, q


def speculative_step(target: Engine, drafter, last: int, n_prev: int, k: int, s: Sampling, gen):
    """One round. Returns (new tokens: accepted drafts + the target's token, n accepted, seconds
    spent waiting for the proposal)."""
    t_base = target.pos
    t0 = time.perf_counter()
    toks, q = drafter.propose(n_prev, last, k)
    t1 = time.perf_counter()
    ids = target.on_device([last] + list(toks))
    logits = target.forward(ids)                 # [k+1, V]: position i predicts the token after toks[i-1]
    n, nxt = read_verdict(ids[1:], q, logits, s, gen)  # the round's one read on the target's side
    target.rollback(t_base + 1 + n)              # keep last + n accepted
    return toks[:n] + [nxt], n, t1 - t0


def begin_request(target: Engine, prompt_ids: list[int], max_tokens: int, k: int, s: Sampling, gen, prompt_id: str,
                  before_prefill=None):
    """The start both SD loops share: the request record, the target's cache sized for the request,
    its prefill and first token. Returns (request, t0, t_first, cache size, first token).
    before_prefill(req, size): called just before the target's prefill (a remote draft's Start goes out
    there, so that the two prefills overlap)."""
    req = RequestRecord(prompt_id, len(prompt_ids), accepted_per_pos=[0] * k)
    t0 = time.perf_counter()
    size = len(prompt_ids) + max_tokens + k + 2
    target.start(size)
    if before_prefill is not None:
        before_prefill(req, size)
    tok = choose_host_token(prefill(target, prompt_ids), s, gen)
    t_first = time.perf_counter()
    target.forward_s = 0.0                       # from here on: verify time
    req.output_ids.append(tok)
    return req, t0, t_first, size, tok


def start_draft(req: RequestRecord, start, *args, seed: int | None = None) -> bool:
    """Start the draft's side of a request; False (decode alone) when the draft is unavailable.
    seed: the draft's sampling seed for this request (None: its generator runs on). A sampled draft
    needs fresh draws per request: re-using one seed makes its proposal a fixed function of the
    context, and speculative sampling then no longer reproduces the target's distribution."""
    try:
        t_d = time.perf_counter()
        start(*args, seed=seed)
        req.draft_prefill_s = time.perf_counter() - t_d
        return True
    except DraftUnavailable:
        return False


def generate_sd(target: Engine, drafter: DraftSource, prompt_ids: list[int], max_tokens: int, k: int, s: Sampling,
                eos: int | None, gen=None, prompt_id: str = "", est=None, draft_seed: int | None = None) -> RequestRecord:
    """SD for one request. `drafter` is a draft source (roles.DraftSource: a Drafter, or a remote one); if it
    becomes unavailable, the request finishes on the target alone (same output, greedy).
    est (a costmodel.AdaptivePolicy): adaptive k, chosen per round in 1..k from its running estimates.
    draft_seed: the draft's seed for this request (a remote draft must get one per request)."""
    # a draft that starts without waiting (a remote one) prefills while the target does; one in this
    # process would only delay the target's first token
    early = getattr(drafter, "starts_async", False)
    started = []
    req, t0, t_first, size, tok = begin_request(
        target, prompt_ids, max_tokens, k, s, gen, prompt_id,
        (lambda req, size: started.append(start_draft(req, drafter.start, prompt_ids, size, seed=draft_seed)))
        if early else None)
    alive = started[0] if early else start_draft(req, drafter.start, prompt_ids, size, seed=draft_seed)
    last, n_prev, wait_s = tok, 0, 0.0
    t_read = None                                # when the last round's verdict was on the host
    while not _done(req.output_ids, eos, max_tokens):
        if t_read is not None:
            req.between_s += time.perf_counter() - t_read
            t_read = None
        k_round = est.choose_k(k, k) if est is not None else k
        k_eff = min(k_round, max_tokens - len(req.output_ids) - 1)   # no drafting past max_tokens
        if alive and k_eff >= 1:
            try:
                new, n, wait, t_read = _sd_round(target, drafter, req, last, n_prev, k_eff, s, gen, est)
            except DraftUnavailable:
                alive = False
                continue
            wait_s += wait
            req.output_ids.extend(new)
            last, n_prev = new[-1], n
            continue
        last = choose_host_token(decode_one_token(target, last), s, gen)
        req.output_ids.append(last)
        if alive:
            req.tail_steps += 1
        else:
            req.tokens_without_draft += 1
    _record_sd(req, target, drafter, wait_s)
    return _finish(req, t0, t_first, eos, max_tokens)


def _sd_round(target: Engine, drafter: DraftSource, req: RequestRecord, last: int, n_prev: int, k: int, s: Sampling,
              gen, est) -> tuple[list[int], int, float, float]:
    """One sync round of k drafts after `last` (the previous round's n_prev accepted): returns the tokens it
    commits (accepted drafts and the target's own), n accepted, the seconds waited for the proposal and when the
    verdict was on the host (perf_counter). Feeds req's counters and est (when adaptive)."""
    v0, d0 = target.forward_s, drafter.compute_s
    t_round = time.perf_counter()
    new, n, wait = speculative_step(target, drafter, last, n_prev, k, s, gen)
    t_read = time.perf_counter()
    req.verify_wall_s += t_read - t_round - wait     # the round less its wait for the proposal
    req.k_trace.append(k)
    note_round(req, n, k)
    note_width(req, k + 1, target.forward_s - v0)
    if est is not None:
        d = drafter.compute_s - d0
        est.observe_round(n, k)
        est.observe_verify(k + 1, target.forward_s - v0)
        est.observe_draft(d / k)
        est.observe_rtt(wait - d)
    return new, n, wait, t_read


def _record_sd(req: RequestRecord, target: Engine, drafter: DraftSource, wait_s: float) -> None:
    """Where a sync request's time went: the target's forwards, the draft's compute and prefill, the wire (the
    wait for proposals less the draft's compute), split by a remote draft's own hold time into link and host."""
    req.verify_s = target.forward_s
    late = getattr(drafter, "started_wait_s", 0.0)   # a remote draft's prefill, waited for at the first proposal
    req.draft_prefill_s += late
    wait_s -= late
    req.draft_s = drafter.compute_s if req.rounds else 0.0
    req.wire_s = max(wait_s - req.draft_s, 0.0)
    held = getattr(drafter, "held_s", None)       # remote drafts report how long they held each request
    if held is not None and req.rounds:
        req.link_s, req.draft_host_s = max(wait_s - held, 0.0), max(held - req.draft_s, 0.0)
    req.bare_rtt_ms = getattr(drafter, "bare_rtt_ms", None)

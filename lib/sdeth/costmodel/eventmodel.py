"""The event model of the pipelined protocol (simulate_pipelined): the policies (policies) played against modelled
drafts (modeldraft), one stream or a batch."""
from __future__ import annotations

from .cacheterms import CacheTerms
from .modeldraft import _ModelDraft
from .policies import AdaptivePolicy, _policy
from .rounds import Costs


def simulate_pipelined(alpha: float, c: Costs, k_max: int, n_tokens: int = 20000, seed: int = 0,
                       adaptive: bool = True, cache: tuple | None = None, policy: str = "", streams: int = 1,
                       late: tuple[float, float] | None = None, spread: bool = False) -> dict:
    """Event model of the pipelined protocol (runtime.pipeline). Terms: a *step* is one draft token, one per
    draft_period (its device step plus its host's work: read, send, launch) from the start of its current
    run; a *transit* is link_rtt/2 (c.rtt/2 when link_rtt is None), a token's or a Commit's way over the link;
    each draft token equals the target's choice with probability alpha (for greedy decoding: acceptance).

    Per round the target applies the runtime's own policy (AdaptivePolicy.choose_m, fed the draft's device
    step and the round trip as the target lives it, c.rtt), verifies and commits; the Commit reaches the
    draft a transit later, between two of its steps: a mismatch there restarts the draft's run behind the
    step it has in flight, a position not drafted yet is taken as given. adaptive=False plays FixedPolicy;
    policy names one of POLICIES instead ("offered": verify what is on offer, never wait).
    Deterministic for a seed.

    streams: B sequences a target verifies in one batch (c's verify costs are the batch's): each has a draft of its
    own on the server's period; every step waits for the batch's choice (the step policy's choose_batch; another
    policy's choice per stream, the step waiting for the last) and verifies them all at once. At 1, one stream.

    cache: a CacheTerms (or its 4-tuple; cache_terms makes it). A rejection at one of the first `forks`
    positions past the last commit finds its correction on a branch with probability `hit`; the branch
    drafted `depth` tokens from its fork's step on, so a hit costs no restart. Every step costs row_cost
    plain ones unless draft_period, measured with the branches on, already holds them.

    late: (probability, seconds): a restart that much later with that probability (a tail the median does not
    show). spread: the step policy gets the newest 64 restarts, as the emulated targets give it theirs (_step_choice).

    Returns tokens/s (over all streams), per stream and round: mean drafts verified and tokens, the shares of plain
    rounds and of idle target time, the restarts and the hit rate after a rejection (None without restarts)."""
    import random
    terms = CacheTerms(*cache) if cache else CacheTerms(0, 0, 0.0, 1.0)
    period = c.draft_period or c.draft_step * terms.row_cost
    est = _policy(alpha, c, k_max, policy or adaptive, period if cache and not c.draft_period else None)
    est.period = period                              # the draft's wall step, as the runtime measures it
    one_way = (c.rtt if c.link_rtt is None else c.link_rtt) / 2
    drafts = [_ModelDraft(alpha, period, one_way, terms, random.Random(seed + j * 1_000_003), late)
              for j in range(streams)]
    t, outs = 0.0, [1] * streams     # target clock (s); positions < outs[j] of stream j are committed
    idle, rounds, verified, plain, seen = 0.0, 0, 0, 0, []
    while sum(outs) < n_tokens:
        if spread and seen and rounds % (32 * streams) == 0:
            est.restarts = tuple(sorted(seen[-64:]))
        ms, ready = _step_choice(est, drafts, outs, t, k_max)
        idle += ready - t
        t = ready + c.verify(max(ms) + 1) + c.overhead
        rounds, verified, plain = rounds + streams, verified + sum(ms), plain + ms.count(0)
        for j, (d, m) in enumerate(zip(drafts, ms)):
            run = [x for x in d.run if x.pos >= outs[j]]
            n = next((i for i in range(m) if not run[i].match), m)      # accepted drafts
            outs[j] += n + 1
            restarts = d.restarts
            d.commit(outs[j] - 1, t)
            if d.restarts > restarts and d.t_restart == t:
                seen.append(d.t_first - t)
            d.acked = outs[j]
            d.run[:] = [x for x in d.run if x.pos >= outs[j]]
    restarts, hits = sum(d.restarts for d in drafts), sum(d.hits for d in drafts)
    return {"tokens_per_s": sum(outs) / t, "verified_per_round": verified / rounds,
            "tokens_per_round": sum(outs) / rounds, "plain_step_share": plain / rounds, "target_idle_share": idle / t,
            "restarts": restarts, "cache_hit_rate": hits / restarts if restarts else None}


def _step_choice(est: AdaptivePolicy, drafts: list[_ModelDraft], outs: list[int], t: float,
                 k_max: int) -> tuple[list[int], float]:
    """simulate_pipelined's step at t: each stream's drafts to verify (one stream: choose_m; a batch: the step
    policy's choose_batch, another policy's choose_m per stream) and when the last of them is at the target. A wait
    the restarts' spread chose ends at its time, or with the last draft it planned: those short then are planned
    again from what came and how long it has been (as the emulated targets do)."""
    ms = _choose(est, drafts, outs, t, k_max)
    for _ in range(16):
        if not getattr(est, "batch_spread", False):
            break
        end = t + est.batch_wait_s
        for d in drafts:
            d.produce_until(end - d.one_way)
        if all(d.arrived(out, end)[1] >= m for d, out, m in zip(drafts, outs, ms)):
            return ms, max([t] + [_at_target(d, out, m) for d, out, m in zip(drafts, outs, ms) if m])
        t = end
        ms = _choose(est, drafts, outs, t, k_max)
    ready = t
    for d, out, m in zip(drafts, outs, ms):
        if m > d.arrived(out, t)[1]:                # wait for the m-th token
            d.produce_until(-1, out + m - 1)
            ready = max(ready, _at_target(d, out, m))
    return ms, ready


def _at_target(d: _ModelDraft, out: int, m: int) -> float:
    """When the m-th draft from position out (already produced) reaches the target."""
    return [x for x in d.run if x.pos >= out][m - 1].end + d.one_way


def _choose(est: AdaptivePolicy, drafts: list[_ModelDraft], outs: list[int], t: float, k_max: int) -> list[int]:
    """Each stream's drafts to verify from what has come by t."""
    seen = []
    for d, out in zip(drafts, outs):
        d.produce_until(t - d.one_way)
        _, avail, fresh = d.arrived(out, t)
        if getattr(est, "holds", False):
            fresh = t < d.t_first                   # the step policy's fresh: nothing of this run has arrived
        seen.append((avail, fresh, t - d.t_restart))
    if len(drafts) > 1 and hasattr(est, "choose_batch"):
        return est.choose_batch([a for a, _, _ in seen], k_max, [f for _, f, _ in seen], [s for _, _, s in seen])
    return [est.choose_m(a, k_max, f, s) for a, f, s in seen]


def pipelined_speedup(alpha: float, c: Costs, k_max: int, **kw) -> float:
    return simulate_pipelined(alpha, c, k_max, **kw)["tokens_per_s"] * c.target_step

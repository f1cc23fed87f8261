"""Acceptance and timing metrics, with vLLM's definitions so numbers compare one to one.

vLLM counters (per engine): num_drafts, num_draft_tokens, num_accepted_tokens,
num_accepted_tokens_per_pos[i] (drafts whose position i was accepted). From them:
  draft_acceptance_rate     = accepted / draft_tokens
  mean_acceptance_length    = 1 + accepted / drafts          (the +1 is the target's own token)
  per_position_acceptance[i]= accepted_per_pos[i] / drafts
and the per-token alpha that explains the rate, if each draft token is accepted independently with
probability alpha (a draft of k stops at the first rejection):
  accepted per draft = alpha + alpha^2 + ... + alpha^k,  so  rate(alpha, k) = that / k.
"""
from __future__ import annotations

import math
import statistics

# the user's vLLM figures (M1): draft acceptance rate at k=5 for a Qwen3-8B target with each draft
USER_K = 5
USER_RATES = {"Qwen3-0.6B": 0.238, "Qwen3-1.7B": 0.405}


def expected_accepted(alpha: float, k: int) -> float:
    """E[accepted draft tokens in one draft of k] = sum_{i=1..k} alpha^i."""
    return sum(alpha ** i for i in range(1, k + 1))


def rate_from_alpha(alpha: float, k: int) -> float:
    """vLLM's draft_acceptance_rate for per-token alpha at k speculative tokens."""
    return expected_accepted(alpha, k) / k


def alpha_from_rate(rate: float, k: int, tol: float = 1e-9) -> float:
    """Invert rate_from_alpha by bisection (it increases with alpha). 0.238 at k=5 -> 0.56."""
    if not 0 <= rate <= 1:
        raise ValueError(f"acceptance rate {rate}: must be in [0, 1]")
    if k < 1:
        raise ValueError(f"k {k}: must be >= 1")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate_from_alpha(mid, k) < rate else (lo, mid)
    return (lo + hi) / 2


def alpha_from_positions(per_position: list[float]) -> float:
    """alpha from per-position acceptance (P(position i accepted) = alpha^(i+1)): the maximum-
    likelihood estimate for i.i.d. acceptance is accepted tokens / positions tried, where position i
    is tried only when position i-1 was accepted."""
    tried = [1.0] + per_position[:-1]          # P(position i was reached)
    reached = sum(tried)
    return sum(per_position) / reached if reached else 0.0


def vllm_metrics(drafts: int, draft_tokens: int, accepted: int, accepted_per_pos: list[int],
               rejections: int | None = None) -> dict:
    """Summary acceptance figures from the four counters. With k varying per round (adaptive,
    pipelined) pass `rejections` (drafts that ended in a rejection): alpha is then its maximum-
    likelihood estimate accepted / (accepted + rejections)."""
    if drafts == 0:
        return {"draft_acceptance_rate": None, "mean_acceptance_length": None,
                "per_position_acceptance": [], "alpha": None}
    rate = accepted / draft_tokens
    pos = [a / drafts for a in accepted_per_pos]
    k = round(draft_tokens / drafts)
    uniform_k = draft_tokens == k * drafts
    return {
        "draft_acceptance_rate": rate,
        "mean_acceptance_length": 1 + accepted / drafts,
        "per_position_acceptance": pos,
        # with a fixed k the rate inverts exactly; with varying k count rejections (or use the positions)
        "alpha": (alpha_from_rate(rate, k) if uniform_k and rejections is None else
                  accepted / (accepted + rejections) if rejections is not None and accepted + rejections else
                  alpha_from_positions(pos)),
    }


def timing(requests: list[dict]) -> dict:
    """Run-level timing from per-request records (sequential requests, batch 1)."""
    out_tokens = sum(len(r["output_ids"]) for r in requests)
    e2e = sum(r["e2e_s"] for r in requests)
    tpots = [r["tpot_ms"] for r in requests if r["tpot_ms"] is not None]
    return {
        "requests": len(requests),
        "output_tokens": out_tokens,
        "tokens_per_s": out_tokens / e2e if e2e else None,
        "ttft_ms": statistics.mean(r["ttft_ms"] for r in requests),
        "tpot_ms": statistics.mean(tpots) if tpots else None,
        "e2e_s": statistics.mean(r["e2e_s"] for r in requests),
        "e2e_total_s": e2e,
    }


def ratio_ci(num: list[float], den: list[float], base_num: list[float] | None = None,
             base_den: list[float] | None = None, level: float = 0.95, n_boot: int = 4000,
             seed: int = 0) -> tuple[float, float, float]:
    """(point, low, high) of sum(num)/sum(den), or of that over sum(base_num)/sum(base_den) when a base
    is given (a speedup: tokens/s over the base's tokens/s). The interval is a percentile bootstrap over
    requests; with a base it is paired: request i of both runs is the same prompt with the same seed,
    so its difficulty cancels."""
    import random
    n = len(num)
    if n == 0 or len(den) != n or (base_num is not None and (len(base_num) != n or len(base_den) != n)):
        raise ValueError(f"ratio_ci needs equal, non-empty per-request lists (got {n}, {len(den)})")

    def stat(idx):
        d = sum(den[i] for i in idx)
        if d == 0 or (base_num is not None and (sum(base_den[i] for i in idx) == 0 or sum(base_num[i] for i in idx) == 0)):
            return None            # e.g. only requests that judged no draft: a resample that says nothing
        r = sum(num[i] for i in idx) / d
        return r / (sum(base_num[i] for i in idx) / sum(base_den[i] for i in idx)) if base_num is not None else r

    point = stat(range(n))
    if point is None:
        raise ValueError("ratio_ci: the denominators sum to zero over all requests")
    rng = random.Random(seed)
    boots = sorted(b for b in (stat([rng.randrange(n) for _ in range(n)]) for _ in range(n_boot)) if b is not None)
    lo, hi = boots[int((1 - level) / 2 * len(boots))], boots[min(len(boots) - 1, int((1 + level) / 2 * len(boots)))]
    return point, lo, hi


def user_alpha(draft: str) -> float:
    """The per-token alpha behind the user's rate for `draft` (0.238 at k=5 -> 0.56; 0.405 -> 0.71)."""
    return alpha_from_rate(USER_RATES[draft], USER_K)


def percentile(xs, q: float):
    """The q-th percentile (nearest rank: the smallest value with at least q% of the values at or below it);
    None for no values."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]

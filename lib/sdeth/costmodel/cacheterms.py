"""The outcome and verdict caches as the event model sees them (CacheTerms): made from an outcome cache's spec
(cache_terms) or from the draft server's verdict cache (verdict_terms)."""
from __future__ import annotations

from typing import NamedTuple


class CacheTerms(NamedTuple):
    """The outcome cache as the event model sees it (cache_terms makes it from a cache spec)."""
    forks: int          # branches open at the first `forks` positions past the last commit
    depth: int          # tokens a branch drafts from its fork's step on
    hit: float          # P(a rejection's correction is among the branched alternatives)
    row_cost: float     # a step's cost with the branch rows over a plain step's


def cache_terms(fanout: int, depth: int, ranks: int, rank_shares: list[float], row_costs: dict) -> CacheTerms:
    """simulate_pipelined's cache terms for an outcome cache of fanout branches, depth deep, on the first
    `ranks` alternatives: forks covered (fanout // ranks), the hit probability (the share of rejections whose
    correction is the draft's 2nd..(ranks+1)th choice: rank_shares[r] = P(rank r | rejection)), and the
    step's cost with fanout + 1 rows over one row (row_costs: rows -> ratio; missing: the nearest below)."""
    rows = fanout + 1
    known = sorted(r for r in row_costs if r <= rows) or [1]
    return CacheTerms(max(fanout // ranks, 1), depth, sum(rank_shares[1:ranks + 1]), row_costs.get(known[-1], 1.0))


def fanouts(alpha: float, fanout: int, budget: int, n: int, shares: list[float] | None = None) -> list[int]:
    """Branches at each of n unverified positions, `budget` in all, on the draft's first choices there. Without
    shares: round(fanout * alpha^i) at the i-th (at least one at the first), the first positions first (Saguaro's
    geometric rule). With shares (shares[r] = P(the correction is the draft's rank-r choice | a rejection), r >= 1):
    the budget goes to the (position i, rank r <= fanout) pairs of most expected hits, alpha^i * shares[r] (the
    shares made non-increasing in r, so that each position's branches are its first choices); none of no worth."""
    if shares is None:
        out, left = [], budget
        for i in range(n):
            f = min(max(round(fanout * alpha ** i), 1 if i == 0 else 0), left)
            out.append(f)
            left -= f
        return out
    s = [min(shares[1:r + 1]) for r in range(1, min(fanout, len(shares) - 1) + 1)]
    pairs = sorted(((alpha ** i * v, -i, -r) for i in range(n) for r, v in enumerate(s, 1) if v > 0), reverse=True)
    out = [0] * n
    for _, i, _ in pairs[:budget]:
        out[-i] += 1
    return out


def verdict_terms(alpha: float, fanout: int, depth: int, budget: int, rank_shares: list[float], row_cost: float = 1.0,
                  window: int = 8, placed: bool = True) -> CacheTerms:
    """simulate_pipelined's cache terms for the draft server's verdict cache (runtime.verdictcache), which places
    its branches with fanouts() on the ranks it has seen (placed=False: the geometric rule, which servers used before
    they placed them): forks: the positions covered; hit: P(a rejection at one of them finds its branch), each
    position weighted by where first rejections fall (alpha^i) and covered by its fan-out's share of correction
    ranks (rank_shares[r] = P(the correction is the draft's rank-r choice | a rejection), r >= 1)."""
    fs = fanouts(alpha, fanout, budget, window, rank_shares if placed else None)
    covered = [i for i, f in enumerate(fs) if f]
    if not covered:
        return CacheTerms(0, 0, 0.0, row_cost)
    w = [alpha ** i for i in covered]
    hit = sum(wi * sum(rank_shares[1:fs[i] + 1]) for wi, i in zip(w, covered)) / sum(w)
    return CacheTerms(len(covered), depth, hit, row_cost)

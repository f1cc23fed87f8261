"""What SD should deliver, from alpha, k and component costs (Leviathan et al. 2023, section 3.5).

One synchronous round drafts k tokens, verifies k+1 positions on the target, and crosses the link
once each way (rtt). With per-token acceptance alpha it yields on average
    E(alpha, k) = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)   tokens
and costs
    T(k) = k * draft_step + verify(k + 1) + rtt + overhead                      seconds.
tokens/s = E / T; target-only decodes 1 / target_step. Speedup = E / T * target_step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] = sum_{i=0..k} alpha^i (accepted drafts + the target's own token)."""
    if alpha >= 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass
class Costs:
    """Seconds. verify_s[m] is the target's cost for m tokens in one forward (m = k+1); a missing m
    is interpolated linearly from the measured ones (and target_step at m = 1)."""
    target_step: float
    draft_step: float
    verify_s: dict[int, float] = field(default_factory=dict)
    rtt: float = 0.0
    overhead: float = 0.0       # per round: acceptance, bookkeeping, draft catch-up
    # pipelined only (simulate_pipelined): what the draft's host and the link add to what the policy sees
    draft_period: float = 0.0   # wall seconds between the draft's steps (device step + its host's work); 0: draft_step
    link_rtt: float | None = None   # the link's own round trip (two transits); None: rtt

    def verify(self, m: int) -> float:
        pts = sorted({1: self.target_step, **{int(k): v for k, v in self.verify_s.items()}}.items())
        if m in dict(pts):
            return dict(pts)[m]
        lo = max((p for p in pts if p[0] < m), default=pts[0])
        hi = min((p for p in pts if p[0] > m), default=None)
        if hi is None:  # extrapolate from the last two points
            (m0, v0), (m1, v1) = (pts[-2], pts[-1]) if len(pts) > 1 else ((0, 0.0), pts[-1])
            return v1 + (v1 - v0) / (m1 - m0) * (m - m1)
        return lo[1] + (hi[1] - lo[1]) * (m - lo[0]) / (hi[0] - lo[0])

    def to_dict(self) -> dict:
        return asdict(self)


def round_time(c: Costs, k: int) -> float:
    return k * c.draft_step + c.verify(k + 1) + c.rtt + c.overhead


def sd_tokens_per_s(alpha: float, k: int, c: Costs) -> float:
    return expected_tokens(alpha, k) / round_time(c, k)


def speedup(alpha: float, k: int, c: Costs) -> float:
    """SD tokens/s over target-only tokens/s (decode phase)."""
    return sd_tokens_per_s(alpha, k, c) * c.target_step


def best_k(alpha: float, c: Costs, k_max: int = 16) -> tuple[int, float]:
    """The k in 1..k_max with the highest predicted tokens/s, and that speedup."""
    k = max(range(1, k_max + 1), key=lambda k: sd_tokens_per_s(alpha, k, c))
    return k, speedup(alpha, k, c)


def predicted_run_tokens_per_s(n_tokens: list[int], ttft_s: float, alpha: float, k: int, c: Costs) -> float:
    """tokens/s for a run of sequential requests: each pays its TTFT (which yields the first token),
    then (n - 1) tokens at E tokens per round of T seconds."""
    per_round = round_time(c, k)
    e = expected_tokens(alpha, k)
    total_time = sum(ttft_s + max(n - 1, 0) / e * per_round for n in n_tokens)
    return sum(n_tokens) / total_time if total_time else 0.0

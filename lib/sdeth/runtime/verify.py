"""Lossless acceptance: greedy, and speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

All functions take the target's logits for the k+1 positions of one round ([k+1, V]: position i
predicts the token after draft token i, position 0 the token after the last accepted one) and
return (n_accepted, next_token): the first n draft tokens are kept, then `next_token` (the target's
correction, or its bonus token when all k were accepted).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0    # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0              # 0 = off
    draft_sampled: bool = False # False: greedy draft (q one-hot, vLLM's default); True: draft samples from q

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature {self.temperature}: must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k {self.top_k}: must be >= 0 (0 turns it off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Distribution after temperature, top-k and top-p: [..., V] float32, rows sum to 1."""
    logits = logits.float() / s.temperature
    if s.top_k:
        kth = torch.topk(logits, min(s.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if s.top_p < 1:
        sp, si = torch.sort(p, dim=-1, descending=True)
        drop = (sp.cumsum(-1) - sp) > s.top_p        # keep the smallest prefix with mass >= top_p
        p = p.scatter(-1, si, sp.masked_fill(drop, 0.0))
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=gen).item())


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Accept the longest prefix where draft token == target argmax, then the target's token."""
    best = target_logits.argmax(-1)                                   # [k+1]
    k = draft_tokens.numel()
    miss = (draft_tokens != best[:k]).nonzero()
    n = int(miss[0]) if miss.numel() else k
    return n, int(best[n])


def verify_sampled(draft_tokens: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
                   s: Sampling, gen: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling. q: the draft's distributions [k, V], or None for a greedy draft
    (q one-hot at the drafted token)."""
    p = probs(target_logits, s)                                       # [k+1, V]
    k = draft_tokens.numel()
    idx = torch.arange(k, device=p.device)
    p_x = p[idx, draft_tokens]
    q_x = torch.ones_like(p_x) if q is None else q[idx, draft_tokens]
    # accept x with prob min(1, p(x)/q(x)); on reject sample norm(max(p - q, 0))
    u = torch.rand(k, generator=gen, device=p.device)
    reject = (u * q_x > p_x).nonzero()                                # u < p/q, written without division
    if not reject.numel():
        return k, sample(p[k], gen)                                   # all accepted: bonus token from p
    n = int(reject[0])
    qn = torch.nn.functional.one_hot(draft_tokens[n], p.shape[-1]).float() if q is None else q[n]
    residual = torch.clamp(p[n] - qn, min=0)
    total = residual.sum()
    # total == 0 only when p == q, where rejection has probability 0; guard rounding anyway
    return n, sample(residual / total if total > 0 else p[n], gen)


def accept(draft_tokens: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
           s: Sampling, gen: torch.Generator | None) -> tuple[int, int]:
    if s.greedy:
        return verify_greedy(draft_tokens, target_logits)
    return verify_sampled(draft_tokens, q if s.draft_sampled else None, target_logits, s, gen)

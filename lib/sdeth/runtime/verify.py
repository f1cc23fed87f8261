"""Lossless acceptance: greedy, and speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

All functions take the target's logits for the k+1 positions of one round ([k+1, V]: position i
predicts the token after draft token i, position 0 the token after the last accepted one) and
return (n_accepted, next_token): the first n draft tokens are kept, then `next_token` (the target's
correction, or its bonus token when all k were accepted).
"""
from __future__ import annotations

import torch

from .settings import Sampling  # noqa: F401  (the sampling settings: plain data)


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


def draw(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One draw from each row of p ([V] -> 0-d, [n, V] -> [n]) as a device tensor, without a host read:
    argmax of p / E with E ~ Exp(1) (the exponential race; gpt-fast's sync-free multinomial). E is
    clamped away from 0 so that a zero-probability id can never win through 0 / 0."""
    e = torch.empty_like(p).exponential_(1.0, generator=gen).clamp_min_(1e-30)
    return (p / e).argmax(-1)


def sample(p: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(draw(p, gen))


def first_miss(ok: torch.Tensor) -> torch.Tensor:
    """The number of leading True entries of a [k] bool tensor, on the device (0-d long)."""
    return ok.long().cumprod(0).sum()


def verdict_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Greedy verification on the device: [n, next] as a long tensor [2], no host read. The longest
    prefix where draft token == target argmax is accepted, then the target's own token."""
    best = target_logits.argmax(-1)                                   # [k+1]
    k = draft_tokens.numel()
    n = first_miss(draft_tokens == best[:k])
    return torch.stack([n, best.gather(0, n.view(1))[0]])


def verdict_sampled(draft_tokens: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
                    s: Sampling, gen: torch.Generator | None) -> torch.Tensor:
    """Speculative sampling on the device: [n, next], no host read. q: the draft's distributions
    [k, V], or None for a greedy draft (q one-hot at the drafted token). Each x is accepted with
    probability min(1, p(x)/q(x)); at the first rejection the correction is drawn from
    norm(max(p - q, 0)); after k acceptances the bonus token from p (q's row k is zero)."""
    p = probs(target_logits, s)                                       # [k+1, V]
    k = draft_tokens.numel()
    idx = torch.arange(k, device=p.device)
    p_x = p[idx, draft_tokens]
    q_pad = torch.zeros_like(p)
    if q is None:
        q_pad[idx, draft_tokens] = 1.0
    else:
        q_pad[:k] = q
    u = torch.rand(k, generator=gen, device=p.device)
    n = first_miss(~(u * q_pad[idx, draft_tokens] > p_x))              # u < p/q, written without division
    row = n.view(1)
    p_n = p.index_select(0, row)[0]
    residual = torch.clamp(p_n - q_pad.index_select(0, row)[0], min=0)
    total = residual.sum()
    # total == 0 only when p == q, where rejection has probability 0; guard rounding anyway
    dist = torch.where(total > 0, residual / total.clamp_min(1e-30), p_n)
    return torch.stack([n, draw(dist, gen)])


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """verdict_greedy, read to the host: (n accepted, the target's token)."""
    n, t = verdict_greedy(draft_tokens, target_logits).tolist()
    return n, t


def verify_sampled(draft_tokens: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
                   s: Sampling, gen: torch.Generator | None) -> tuple[int, int]:
    n, t = verdict_sampled(draft_tokens, q, target_logits, s, gen).tolist()
    return n, t


def verdict(draft_tokens: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
            s: Sampling, gen: torch.Generator | None) -> torch.Tensor:
    """The round's verdict on the device, [n, next]: one host read gives both."""
    if s.greedy:
        return verdict_greedy(draft_tokens, target_logits)
    return verdict_sampled(draft_tokens, q if s.draft_sampled else None, target_logits, s, gen)


def read_verdict(draft_tokens: torch.Tensor, q: torch.Tensor | None, target_logits: torch.Tensor,
           s: Sampling, gen: torch.Generator | None) -> tuple[int, int]:
    """The round's verdict read to the host in one read: (n accepted, the target's token)."""
    n, t = verdict(draft_tokens, q, target_logits, s, gen).tolist()
    return n, t

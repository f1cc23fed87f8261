"""Synthetic acceptance: SD timing with random weights, where real acceptance means nothing.

As vLLM's benchmark mode does, each draft token is accepted with a set probability alpha, here in a
way that keeps every part of the runtime real (models, graphs, wire, verification code): a fixed
pseudo-random "true" continuation T[p] (token at absolute position p) stands in for the target's
choices, and the draft proposes T[p] when a per-position coin with P(heads) = alpha says so, else
another token. The engines run their real forwards (the timing is real), then return logits that
put all mass on those tokens. Then greedy verification accepts each draft token independently with
probability alpha, the bonus token is guessed by the draft with probability alpha (as with a real
pair, where it is the same event), and target-only decoding produces T. Figures from this mode are
labelled synthetic.

Each request gets its own sequences: T and the coins are keyed by (seed, the request's prompt), so a
benchmark whose requests have different prompts averages over independent coin sequences (keyed by
position alone, every request replayed one sequence), while the target and the draft, which see the
same prompt, still agree on them.
"""
from __future__ import annotations

import torch

from .engine import Engine

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64: a well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def prompt_key(ids) -> int:
    """A 64-bit key of a prompt's token ids (the same in every process)."""
    key = 0
    for t in ids:
        key = _mix(key ^ int(t))
    return key


def true_token(seed: int, pos: int, vocab: int) -> int:
    return _mix(seed * 1_000_003 + pos) % vocab


def draft_token(seed: int, pos: int, vocab: int, alpha: float) -> int:
    t = true_token(seed, pos, vocab)
    heads = _mix(_mix(seed + 7) ^ pos) / 2.0 ** 64 < alpha
    return t if heads else (t + 1) % vocab


class SyntheticEngine(Engine):
    """An Engine whose forward runs for real, then answers as the synthetic target or draft."""

    def __init__(self, model, name: str = "model", role: str = "target", alpha: float = 0.5, seed: int = 0, **kw):
        super().__init__(model, name, **kw)
        if role not in ("target", "draft"):
            raise ValueError(f"role {role!r}: use 'target' or 'draft'")
        if not 0 <= alpha <= 1:
            raise ValueError(f"synthetic alpha {alpha}: must be in [0, 1]")
        self.role, self.alpha, self.seed = role, alpha, seed
        self.vocab_size = int(self.vocab or model.config.vocab_size)
        self.request_seed = seed

    def token_at(self, pos: int) -> int:
        if self.role == "target":
            return true_token(self.request_seed, pos, self.vocab_size)
        return draft_token(self.request_seed, pos, self.vocab_size, self.alpha)

    def forward(self, ids) -> torch.Tensor:
        start = self.pos
        if start == 0:          # a new request (its prefill): its own sequences, keyed by its prompt
            self.request_seed = _mix(self.seed ^ prompt_key(torch.as_tensor(ids).reshape(-1).tolist()))
        logits = super().forward(ids)
        m = logits.shape[0]
        toks = torch.tensor([self.token_at(start + i + 1) for i in range(m)], device=logits.device)
        out = torch.full_like(logits, -1e4)
        out[torch.arange(m, device=logits.device), toks] = 0.0
        return out


def make_engine(model, name: str, role: str, impl: str = "hf", compile_mode: str | None = None,
                capacity: int = 4096, synthetic_alpha: float | None = None, synthetic_seed: int = 0,
                vocab: int | None = None) -> Engine:
    """The engine a worker runs: transformers or fast decoder, compiled or not, synthetic or real;
    vocab: the pair's tokenizer size (logits cut to it)."""
    kw = dict(impl=impl, compile_mode=compile_mode or None, capacity=capacity, vocab=vocab)
    if synthetic_alpha is None:
        return Engine(model, name, **kw)
    return SyntheticEngine(model, name, role=role, alpha=synthetic_alpha, seed=synthetic_seed, **kw)

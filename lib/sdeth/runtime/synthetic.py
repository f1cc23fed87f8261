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

Trace-driven acceptance (AcceptanceTrace): instead of an independent coin per position, the draft's
behaviour replays a trace recorded from a real pair (study.runs.acceptance.record_trace): per position, the
rank of the target's token in the draft's order (0 = accepted). The synthetic draft's logits put that
many other tokens above the true one, so runs of accepts, and the rank of each correction in the draft's
order, are the real pair's. Figures from this mode are labelled trace-driven.

Each request gets its own sequences: T and the coins are keyed by (seed, the request's prompt), so a
benchmark whose requests have different prompts averages over independent coin sequences (keyed by
position alone, every request replayed one sequence), while the target and the draft, which see the
same prompt, still agree on them.
"""
from __future__ import annotations

import json
from pathlib import Path

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


def request_seed(seed: int, prompt_ids) -> int:
    """The seed of one request's sequences: the run's seed mixed with its prompt's key (prompt_key), so that the
    target and the draft, which see the same prompt, agree on them in any process."""
    return _mix(seed ^ prompt_key(prompt_ids))


def true_token(seed: int, pos: int, vocab: int) -> int:
    return _mix(seed * 1_000_003 + pos) % vocab


def draft_token(seed: int, pos: int, vocab: int, alpha: float) -> int:
    t = true_token(seed, pos, vocab)
    heads = _mix(_mix(seed + 7) ^ pos) / 2.0 ** 64 < alpha
    return t if heads else (t + 1) % vocab


class AcceptanceTrace:
    """A recorded acceptance trace: for each sequence, the rank (0..top) of the target's token in the draft's
    order at each generated position. Request r replays sequence (r's key mod the number of sequences),
    position j its event j (wrapping round).

    Scaling to a set alpha (the documented rule): events are changed one by one, each by its own hash, never
    moved: to lower alpha, each accept becomes a rejection with probability 1 - alpha/alpha0 (its rank drawn
    from the trace's own rejection ranks); to raise it, each rejection becomes an accept with probability
    (alpha - alpha0) / (1 - alpha0). Every kept event keeps its position and rank, so the correlation between
    neighbouring positions (runs of accepts) and the rank distribution of corrections survive, thinned or
    filled at random."""

    def __init__(self, seqs: list[str], top: int = 8, source: str = "", alpha: float | None = None):
        if not seqs or not all(seqs):
            raise ValueError("an acceptance trace needs at least one non-empty sequence")
        self.top, self.source = top, source
        self.raw = [[int(c) for c in s] for s in seqs]
        flat = [r for s in self.raw for r in s]
        self.alpha0 = flat.count(0) / len(flat)
        rejects = sorted(r for r in flat if r) or [1]
        self.reject_ranks = rejects
        self.alpha = self.alpha0 if alpha is None else alpha
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"trace alpha {alpha}: a probability in [0, 1]")
        self.seqs = [[self._scaled(i, j, r) for j, r in enumerate(s)] for i, s in enumerate(self.raw)]

    def _scaled(self, i: int, j: int, r: int) -> int:
        u = _mix(_mix(i * 1_000_003 + j) ^ 0x5EED) / 2.0 ** 64
        if self.alpha < self.alpha0 and r == 0 and u >= self.alpha / self.alpha0:
            return self.reject_ranks[_mix(i ^ (j << 20)) % len(self.reject_ranks)]
        if self.alpha > self.alpha0 and r != 0 and u < (self.alpha - self.alpha0) / (1 - self.alpha0):
            return 0
        return r

    @classmethod
    def load(cls, path, alpha: float | None = None) -> "AcceptanceTrace":
        """From a trace JSON (sdeth.trace/1); alpha: scale to this acceptance (None: the trace's own)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"acceptance trace {path}: no such file (record one with `python -m sdeth "
                                    "trace --out PATH`, or use the committed reports/traces/embedded_greedy.json)")
        d = json.loads(path.read_text())
        return cls([e["rank"] for e in d["sequences"]], d.get("top", 8), f"{d.get('pair')} ({path.name})", alpha)

    def rank(self, key: int, j: int) -> int:
        s = self.seqs[key % len(self.seqs)]
        return s[j % len(s)]

    @property
    def realized_alpha(self) -> float:
        flat = [r for s in self.seqs for r in s]
        return flat.count(0) / len(flat)


class SyntheticEngine(Engine):
    """An Engine whose forward runs for real, then answers as the synthetic target or draft."""
    keyed_by_prompt = True      # its sequences are keyed by the prompt of a request's first forward (its prefill)

    def __init__(self, model, name: str = "model", role: str = "target", alpha: float = 0.5, seed: int = 0,
                 trace: AcceptanceTrace | None = None, **kw):
        """trace: the draft replays this acceptance trace (alpha is then the trace's, already scaled)."""
        super().__init__(model, name, **kw)
        self.trace, self.prompt_len = trace, 0
        if role not in ("target", "draft"):
            raise ValueError(f"role {role!r}: use 'target' or 'draft'")
        if not 0 <= alpha <= 1:
            raise ValueError(f"synthetic alpha {alpha}: must be in [0, 1]")
        self.role, self.alpha, self.seed = role, alpha, seed
        self.vocab_size = int(self.vocab or model.config.vocab_size)
        self.request_seed = seed

    def _dev(self, xs: list) -> torch.Tensor:
        """Host integers to the device as int64, without waiting for it (pinned, non-blocking)."""
        t = torch.tensor(xs, dtype=torch.long)
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    def token_at(self, pos: int) -> int:
        if self.role == "target" or self.trace is not None:
            return true_token(self.request_seed, pos, self.vocab_size)
        return draft_token(self.request_seed, pos, self.vocab_size, self.alpha)

    def forward(self, ids) -> torch.Tensor:
        """The real forward, then the synthetic answer. The answer depends on positions only, never on the
        ids fed (which may still be on the device): nothing here reads the device."""
        start = self.pos
        if start == 0:          # a new request (its prefill): its own sequences, keyed by its prompt
            self.request_seed = request_seed(self.seed, torch.as_tensor(ids).reshape(-1).tolist())
            self.prompt_len = torch.as_tensor(ids).numel()
        logits = super().forward(ids)
        return self._answer(logits, range(start + 1, start + 1 + logits.shape[0]))

    def _answer(self, logits: torch.Tensor, next_positions) -> torch.Tensor:
        """Logits that put all mass on the synthetic token of each row's next position."""
        rows, cols, vals = [], [], []
        for i, p in enumerate(next_positions):
            t = self.token_at(p)
            # trace-driven draft: rank r puts r other tokens above the true one (a greedy draft takes the first)
            r = (self.trace.rank(self.request_seed, p - self.prompt_len)
                 if self.trace is not None and self.role == "draft" and p >= self.prompt_len else 0)
            rows += [i] * (r + 1)
            cols += [(t + 1 + a) % self.vocab_size for a in range(r)] + [t]
            vals += [-a for a in range(r + 1)]
        idx = self._dev([rows, cols, vals])          # one copy to the device
        out = torch.full_like(logits, -1e4)
        out.index_put_((idx[0], idx[1]), idx[2].to(out.dtype))
        return out

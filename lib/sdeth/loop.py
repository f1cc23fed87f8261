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

from .engine import Engine, decode_one_token, prefill
from .verify import Sampling, accept, probs, sample


@dataclass
class Request:
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
    draft_s: float = 0.0        # draft forwards during rounds
    verify_s: float = 0.0       # target forwards during rounds (or decode steps, target-only)
    tokens_without_draft: int = 0


def pick(logits: torch.Tensor, s: Sampling, gen) -> int:
    """The target's own choice for one position (first token, target-only decoding)."""
    return int(logits.argmax()) if s.greedy else sample(probs(logits, s), gen)


def _finish(req: Request, t_start: float, t_first: float, eos: int | None, max_tokens: int) -> Request:
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
                         eos: int | None, gen=None, prompt_id: str = "") -> Request:
    req = Request(prompt_id, len(prompt_ids))
    t0 = time.perf_counter()
    target.start(len(prompt_ids) + max_tokens + 1)
    tok = pick(prefill(target, prompt_ids), s, gen)
    t_first = time.perf_counter()
    target.forward_s = 0.0                       # from here on: decode time
    req.output_ids.append(tok)
    while not _done(req.output_ids, eos, max_tokens):
        tok = pick(decode_one_token(target, tok), s, gen)
        req.output_ids.append(tok)
    req.verify_s = target.forward_s
    return _finish(req, t0, t_first, eos, max_tokens)


def draft_n_tokens(draft: Engine, pending: list[int], n: int, s: Sampling, gen):
    """Feed `pending` to the draft and propose n tokens. Returns (tokens [n], q [n, V] or None);
    the draft's cache then holds pending + tokens[:-1]."""
    logits = draft.forward(pending)[-1]
    toks, qs = [], []
    for i in range(n):
        if s.greedy or not s.draft_sampled:
            t = int(logits.argmax())
        else:
            q = probs(logits, s)
            t = sample(q, gen)
            qs.append(q)
        toks.append(t)
        if i < n - 1:
            logits = decode_one_token(draft, t)
    return toks, (torch.stack(qs) if qs else None)


def speculative_step(target: Engine, draft: Engine, last: int, pending: list[int], k: int, s: Sampling, gen):
    """One round. Returns (new tokens: accepted drafts + the target's token, n accepted, next pending)."""
    d_base = draft.pos + len(pending)            # draft cache length once pending is in
    t_base = target.pos
    toks, q = draft_n_tokens(draft, pending, k, s, gen)
    logits = target.forward([last] + toks)       # [k+1, V]: position i predicts the token after toks[i-1]
    n, nxt = accept(torch.tensor(toks, device=logits.device), q, logits, s, gen)
    target.rollback(t_base + 1 + n)              # keep last + n accepted
    draft.rollback(d_base + min(n, k - 1))       # the draft never ate its own last proposal
    new_pending = ([toks[-1]] if n == k else []) + [nxt]
    return toks[:n] + [nxt], n, new_pending


def generate_sd(target: Engine, draft: Engine, prompt_ids: list[int], max_tokens: int, k: int, s: Sampling,
                eos: int | None, gen=None, prompt_id: str = "") -> Request:
    req = Request(prompt_id, len(prompt_ids), accepted_per_pos=[0] * k)
    t0 = time.perf_counter()
    size = len(prompt_ids) + max_tokens + k + 2
    target.start(size)
    tok = pick(prefill(target, prompt_ids), s, gen)
    t_first = time.perf_counter()
    target.forward_s = 0.0                       # from here on: verify time
    req.output_ids.append(tok)
    draft.start(size)
    t_d = time.perf_counter()
    draft.forward(prompt_ids)                    # draft prefill (its logits are not needed)
    req.draft_prefill_s = time.perf_counter() - t_d
    draft.forward_s = 0.0
    last, pending = tok, [tok]
    while not _done(req.output_ids, eos, max_tokens):
        k_eff = min(k, max_tokens - len(req.output_ids) - 1)   # no drafting past max_tokens
        if k_eff < 1:
            last = pick(decode_one_token(target, last), s, gen)
            req.output_ids.append(last)
            req.tokens_without_draft += 1
            continue
        new, n, pending = speculative_step(target, draft, last, pending, k_eff, s, gen)
        req.output_ids.extend(new)
        last = new[-1]
        req.rounds += 1
        req.drafts += 1
        req.draft_tokens += k_eff
        req.accepted_tokens += n
        for i in range(n):
            req.accepted_per_pos[i] += 1
    req.draft_s = draft.forward_s
    req.verify_s = target.forward_s
    return _finish(req, t0, t_first, eos, max_tokens)

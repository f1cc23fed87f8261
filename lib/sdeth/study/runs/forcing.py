"""Per-token acceptance (alpha) of a draft against a target, measured by teacher forcing.

SD's per-token acceptance at a position depends only on the two models' next-token distributions there
(Leviathan et al. 2023): with target distribution p and draft distribution q (after temperature/top-p),
    greedy target, greedy draft:    alpha = 1[argmax q == argmax p]
    sampled target, greedy draft:   alpha = p(argmax q)            (vLLM's draft_model default)
    sampled target, sampled draft:  alpha = sum_x min(p(x), q(x))  (= 1 - total variation)
So alpha can be measured without running SD: one forward of each model over the target's own
continuations (generated at the same temperature) gives every position at once. tests and 15_acceptance
check it against alpha measured in real SD runs (ours and vLLM's).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from ...runtime.verify import Sampling, probs


@dataclass
class ForcedSequence:
    """A prompt and the target's own continuation of it, for teacher forcing both models over."""
    prompt_id: str
    target_prompt: list[int]       # what the target sees before the continuation
    continuation: list[int]        # the target's own tokens
    draft_prompt: list[int] | None = None   # what the draft sees (None: the same prompt)


@torch.no_grad()
def _next_token_logits(model, prompt: list[int], cont: list[int]) -> torch.Tensor:
    """Logits for each continuation position: [len(cont), V] (row i predicts cont[i])."""
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt + cont[:-1]], device=dev)
    logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1:]


def per_position_alpha(p_logits: torch.Tensor, q_logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """alpha at each position (see the module docstring), [n]."""
    v = min(p_logits.shape[-1], q_logits.shape[-1])     # padded embedding tables: the shared ids only
    p_logits, q_logits = p_logits[..., :v], q_logits[..., :v]
    if s.greedy:
        return (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    p = probs(p_logits, s)
    if not s.draft_sampled:
        return p.gather(-1, q_logits.argmax(-1, keepdim=True)).squeeze(-1)
    return torch.minimum(p, probs(q_logits, s)).sum(-1)


def sequence_se(per_seq: list[float]) -> float:
    """Standard error of a mean over positions, from the spread of per-sequence means (positions within a
    sequence are not independent)."""
    return statistics.stdev(per_seq) / math.sqrt(len(per_seq)) if len(per_seq) > 1 else float("nan")


def expected_alpha(target, draft, seqs: list[ForcedSequence], s: Sampling) -> dict:
    """Mean per-token alpha over all continuation positions, with a standard error from the spread of
    per-sequence means (positions within a sequence are not independent)."""
    per_seq, all_pos = [], []
    for q in seqs:
        p_l = _next_token_logits(target, q.target_prompt, q.continuation)
        q_l = _next_token_logits(draft, q.draft_prompt or q.target_prompt, q.continuation)
        a = per_position_alpha(p_l, q_l, s)
        per_seq.append(a.mean().item())
        all_pos.append(a)
    pos = torch.cat(all_pos)
    se = sequence_se(per_seq)
    return {"alpha": pos.mean().item(), "se": se, "positions": pos.numel(), "sequences": len(seqs)}


def continuations(target, prompts: list[tuple[str, list[int]]], max_new: int, s: Sampling, eos: int | None,
                  seed: int = 0) -> list[ForcedSequence]:
    """The target's own continuations of each prompt, at the run's sampling settings."""
    from ...runtime.engine import Engine
    from ...runtime.loop import generate_target_only
    eng = Engine(target, "target")
    gen = torch.Generator(device=eng.device).manual_seed(seed)
    out = []
    for pid, ids in prompts:
        r = generate_target_only(eng, ids, max_new, s, eos, gen, pid)
        if len(r.output_ids) >= 2:
            out.append(ForcedSequence(pid, ids, r.output_ids))
    return out

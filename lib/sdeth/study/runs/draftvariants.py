"""A lightened draft's alpha: its greedy agreement with the target in other dtypes, with int8 or fp8 weights, and
with its output layer pruned to the target's most used tokens (token_ranking)."""
from __future__ import annotations

import torch

from .forcing import sequence_se


def token_ranking(pair, prompt_spec: str = "sharegpt-train:512:0", max_new: int = 64, batch: int = 32) -> dict:
    """The target's output tokens ranked by how often its own greedy completions of training-split prompts
    use them (ties and unseen ids by id): what a pruned draft output layer keeps (FastOptions.head_rank)."""
    from collections import Counter
    from ...models.distill import build_seqs
    seqs = build_seqs(pair.target, pair.tokenizer, prompt_spec, max_new, batch, "cpu")
    counts = Counter(t for ids, n in seqs for t in ids[n:])
    vocab = pair.vocab_size
    ranked = sorted(range(vocab), key=lambda t: (-counts.get(t, 0), t))
    seen = sum(1 for t in range(vocab) if counts.get(t))
    return {"schema": "sdeth.token_rank/1", "target": pair.config.target, "prompts": prompt_spec, "max_new": max_new,
            "tokens_counted": sum(counts.values()), "distinct_seen": seen, "ranked_ids": ranked}


@torch.no_grad()
def fast_draft_agreement(draft, seqs, fast: str = "", dtype=None) -> dict:
    """Greedy agreement (teacher forcing) of the draft as the fast decoder runs it with `fast` levers
    (runtime.fastmodel.FastOptions) and in `dtype`, on (ids, prompt length) sequences whose continuations
    are the target's greedy tokens: P(draft argmax == the target's token)."""
    import copy
    from ...runtime.engine import Engine
    model = draft if dtype is None else copy.deepcopy(draft).to(dtype)
    eng = Engine(model, "draft", impl="fast", fast=fast or None)
    hits = n = 0
    per_seq = []
    for ids, plen in seqs:
        eng.start(len(ids))
        logits = eng.forward(ids[:-1])[plen - 1:]
        h = (logits.argmax(-1).cpu() == torch.tensor(ids[plen:])).float()
        hits, n = hits + h.sum().item(), n + h.numel()
        per_seq.append(h.mean().item())
    se = sequence_se(per_seq)
    return {"greedy_agreement": round(hits / n, 4), "se": round(se, 4), "positions": n}


def draft_variants(pair, rank_file: str, prompt_spec: str = "sharegpt:256:1000", max_new: int = 64,
                   heads=(4096, 8192, 16384), progress=print) -> dict:
    """The embedded draft's greedy agreement on the card's held-out prompts as loaded (fp32), in bf16
    and fp16, with int8 (weight-only) and fp8 (W8A8) weights as the fast decoder computes them (on a CPU
    the fp8 products are emulated in fp32: the same rounding of weights and activations), and with its
    output layer pruned to the `heads` most frequent target tokens. A draft's numerics change alpha,
    never the output (the target verifies)."""
    import time
    from ... import hardware
    from ...models.distill import build_seqs
    seqs = build_seqs(pair.target, pair.tokenizer, prompt_spec, max_new, 32, "cpu")
    variants = [("fp32 (as loaded)", "", None), ("bf16", "", torch.bfloat16), ("fp16", "", torch.float16),
                ("int8 weights (weight-only, per row)", "weights=int8", None),
                ("fp8 e4m3 weights and activations (per row / per token)", "weights=fp8", None)]
    variants += [(f"output layer pruned to {h} ids", f"head={h},head_rank={rank_file}", None) for h in heads]
    rows = []
    for label, fast, dtype in variants:
        r = {"variant": label, "fast": fast.split(",head_rank")[0] or "defaults", "dtype": str(dtype or "float32"),
             **fast_draft_agreement(pair.draft, seqs, fast, dtype)}
        rows.append(r)
        if progress:
            progress(f"{label:58s} {r['greedy_agreement']:.4f} +- {r['se']:.4f}")
    base = rows[0]["greedy_agreement"]
    for r in rows:
        r["cost"] = round(base - r["greedy_agreement"], 4)
    return {"schema": "sdeth.draft_variants/1", "pair": pair.config.name, "prompts": prompt_spec, "max_new": max_new,
            "acceptance": "real: the embedded pair's own models, greedy, teacher forcing", "rank_file": rank_file,
            "hardware": hardware.describe("cpu"), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}

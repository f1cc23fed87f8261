"""Recorded draft chains: the draft's own greedy continuation from every prefix of the target's output, what the
emulated drafts (runtime.emulated.EmulatedEngine) replay."""
from __future__ import annotations

import torch

from ...runtime.verify import Sampling


@torch.no_grad()
def chains_for(target, draft, prompts: list[tuple[str, list[int]]], max_new: int, depth: int = 17,
               eos: int | None = None) -> dict:
    """For each prompt: the target's greedy output t (max_new tokens) and, from every prefix t[:p], the
    draft's own greedy continuation of `depth` tokens: what runtime.emulated.EmulatedEngine replays."""
    from ...runtime.engine import Engine
    from ...runtime.loop import generate_target_only
    from ...runtime.synthetic import prompt_key
    t_eng, d_eng = Engine(target, "target"), Engine(draft, "draft")
    seqs = []
    for pid, ids in prompts:
        t = generate_target_only(t_eng, ids, max_new, Sampling(), eos, prompt_id=pid).output_ids
        d_eng.start(len(ids) + len(t) + depth + 2)
        logits = d_eng.forward(ids)[-1]
        chains = []
        for p in range(len(t) + 1):
            base, lg, chain = d_eng.pos, logits, []
            for j in range(depth):
                chain.append(int(lg.argmax()))
                if j < depth - 1:
                    lg = d_eng.forward([chain[-1]])[-1]
            chains.append(chain)
            d_eng.rollback(base)
            if p < len(t):
                logits = d_eng.forward([t[p]])[-1]
        seqs.append({"prompt_id": pid, "key": str(prompt_key(ids)), "target": t, "chains": chains})
    return {"schema": "sdeth.chains/1", "depth": depth, "max_new": max_new, "sequences": seqs}


def record_chains(pair, prompt_spec: str, max_new: int, depth: int = 17, chat: bool = True) -> dict:
    """chains_for on a pair's prompts (as RunConfig encodes them), with what it ran on."""
    import time
    from ... import hardware
    from ...models import prompts as P
    tok = pair.tokenizer
    ids = [(p.id, P.encode(p, tok, chat=chat)) for p in P.load(prompt_spec)]
    doc = chains_for(pair.target, pair.draft, ids, max_new, depth, tok.eos_token_id)
    return {**doc, "pair": pair.config.name, "prompts": prompt_spec, "hardware": hardware.describe("cpu"),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

"""Acceptance traces of a real pair: per position of the target's greedy continuations, the rank of its token in
the draft's order and the draft's probabilities (what runtime.synthetic.AcceptanceTrace replays)."""
from __future__ import annotations

import torch

from ...runtime.verify import Sampling
from .forcing import ForcedSequence, _next_token_logits, continuations


TRACE_TOP = 8          # ranks 0..7 of the target's token in the draft's order; 8 = not in its top 8


@torch.no_grad()
def trace_events(target, draft, seqs: list[ForcedSequence], top: int = TRACE_TOP) -> list[dict]:
    """Per position of each target continuation (teacher forcing, greedy): the rank of the target's token
    in the draft's order (0: the draft's argmax, i.e. greedy SD accepts it; `top`: outside its top-`top`)
    and the draft's probability of that token and of its own first choice, in per mille. Greedy SD's
    acceptance at a position depends only on these (the draft drafts in the target's accepted context)."""
    out = []
    for q in seqs:
        cont = torch.tensor(q.continuation)
        p_l = _next_token_logits(target, q.target_prompt, q.continuation)
        q_l = _next_token_logits(draft, q.draft_prompt or q.target_prompt, q.continuation)
        v = min(p_l.shape[-1], q_l.shape[-1])
        tgt = p_l[..., :v].argmax(-1)                      # the target's greedy token = the continuation
        assert torch.equal(tgt, cont.to(tgt.device)), "continuations must be the target's greedy tokens"
        ql = q_l[..., :v]
        above = (ql > ql.gather(-1, tgt[:, None])).sum(-1).clamp(max=top)
        qp = torch.softmax(ql.float(), -1)
        out.append({"prompt_id": q.prompt_id,
                    "rank": "".join(str(int(r)) for r in above),
                    "q_token_pm": [round(float(x) * 1000) for x in qp.gather(-1, tgt[:, None]).squeeze(-1)],
                    "q_top1_pm": [round(float(x) * 1000) for x in qp.max(-1).values]})
    return out


def record_trace(pair, prompt_spec: str = "sharegpt:64", max_new: int = 128, progress=None) -> dict:
    """An acceptance trace of a real pair (greedy, chat template) on held-out prompts: what
    runtime.synthetic.AcceptanceTrace replays on other model shapes (trace-driven timing)."""
    import time
    from ... import hardware
    from ...models import prompts as P
    tok = pair.tokenizer
    ids = [(p.id, P.encode(p, tok, chat=True)) for p in P.load(prompt_spec)]
    seqs = continuations(pair.target, ids, max_new, Sampling(), tok.eos_token_id)
    if progress:
        progress(f"{len(seqs)} continuations")
    events = trace_events(pair.target, pair.draft, seqs)
    ranks = "".join(e["rank"] for e in events)
    return {"schema": "sdeth.trace/1", "pair": pair.config.name, "target": pair.config.target,
            "draft": pair.config.draft, "prompts": prompt_spec, "max_new": max_new, "sampling": "greedy",
            "top": TRACE_TOP, "alpha": ranks.count("0") / len(ranks), "positions": len(ranks),
            "hardware": hardware.describe("cpu"), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sequences": events}

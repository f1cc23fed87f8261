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


def fake_quantize_int8(model) -> None:
    """Round every Linear weight to int8 per output channel (symmetric) and back, in place: the
    accuracy of an int8 weight-only quantized model, without its kernels."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2 and not _shared(model, m.weight):
                w = m.weight
                scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                w.copy_((w / scale).round().clamp(-127, 127) * scale)


def _shared(model, w) -> bool:
    """The tied embedding / output matrix (shared with the target in the embedded pair) is left alone."""
    emb = model.get_input_embeddings()
    return emb is not None and emb.weight is w


# Qwen3's recommended sampling (its model card): thinking mode, and non-thinking mode
_GREEDY = Sampling()
QWEN3_SAMPLING = {"thinking": Sampling(0.6, top_p=0.95, top_k=20), "non-thinking": Sampling(0.7, top_p=0.8, top_k=20)}


def _draft_step_ms(model, context: int = 128, reps: int = 7) -> float:
    from ...runtime.engine import Engine, median_forward_s, prefill
    eng = Engine(model, "draft")
    eng.start(context + 2)
    prefill(eng, list(range(100, 100 + context)))
    return median_forward_s(eng, [7], reps) * 1e3


class _FactorStudy:
    """factor_table's state: the pair, the prompts, the baseline's continuations and the rows so far."""

    def __init__(self, pair, prompt_spec: str, max_new: int, k: int, progress) -> None:
        from ...models import prompts as P
        self.pair, self.max_new, self.k, self.progress = pair, max_new, k, progress
        self.eos = pair.tokenizer.eos_token_id
        self.plist = P.load(prompt_spec)
        self.rows: list[dict] = []
        self.chat_ids: list[tuple[str, list[int]]] = []    # the chat-templated prompts (baseline())
        self.base_seqs: list[ForcedSequence] = []          # the baseline's continuations (baseline())

    def encode(self, chat: bool, thinking: bool | None = None) -> list[tuple[str, list[int]]]:
        from ...models import prompts as P
        return [(p.id, P.encode(p, self.pair.tokenizer, chat=chat, thinking=thinking)) for p in self.plist]

    def continue_(self, ids, s: Sampling = _GREEDY, seed: int = 0) -> list[ForcedSequence]:
        """The loaded target's continuations of these prompts."""
        return continuations(self.pair.target, ids, self.max_new, s, self.eos, seed=seed)

    def baseline(self) -> None:
        """Greedy, chat template, the pair as loaded: the continuations every later row reuses."""
        pair = self.pair
        self.chat_ids = self.encode(True)
        self.base_seqs = self.continue_(self.chat_ids)
        self.row("baseline", "greedy, chat template, pair as loaded",
                 expected_alpha(pair.target, pair.draft, self.base_seqs, _GREEDY), draft_step_ms=_draft_step_ms(pair.draft))

    def row(self, factor: str, setting: str, a: dict, note: str = "", draft_step_ms=None) -> dict:
        from ... import metrics
        k = self.k
        r = {"factor": factor, "setting": setting, "alpha": a["alpha"], "se": a["se"], "positions": a["positions"],
             f"vLLM rate at k={k}": metrics.rate_from_alpha(a["alpha"], k),
             f"mean acceptance length at k={k}": 1 + k * metrics.rate_from_alpha(a["alpha"], k),
             "draft step ms": draft_step_ms, "note": note}
        self.rows.append(r)
        self.progress(f"{factor:14s} {setting:44s} alpha {a['alpha']:.3f} +- {a['se']:.3f}")
        return r

    def sampling(self) -> None:
        """Qwen3's recommended settings, with a greedy draft (vLLM's default) and a sampled one."""
        pair = self.pair
        for label, s in QWEN3_SAMPLING.items():
            seqs = self.continue_(self.chat_ids, s, seed=1)
            for sampled in (False, True):
                s2 = Sampling(s.temperature, s.top_p, s.top_k, draft_sampled=sampled)
                self.row("temperature", f"T={s.temperature} top_p={s.top_p} top_k={s.top_k} ({label}), "
                         f"{'sampled' if sampled else 'greedy'} draft", expected_alpha(pair.target, pair.draft, seqs, s2))

    def prompt_format(self) -> None:
        pair, raw_ids = self.pair, self.encode(False)
        raw_seqs = self.continue_(raw_ids)
        self.row("prompt format", "raw prompt for both (no chat template)",
                 expected_alpha(pair.target, pair.draft, raw_seqs, _GREEDY))
        mismatch = [ForcedSequence(q.prompt_id, q.target_prompt, q.continuation, draft_prompt=r[1])
                    for q, r in zip(self.base_seqs, raw_ids) if q.prompt_id == r[0]]
        self.row("prompt format", "template mismatch: target chat, draft raw",
                 expected_alpha(pair.target, pair.draft, mismatch, _GREEDY),
                 "only possible with separate servers that each apply a template; inside vLLM (and sdeth) the draft "
                 "gets the target's token ids")

    def thinking(self, modes) -> None:
        if not modes:
            self.rows.append({"factor": "thinking mode", "setting": "n/a", "alpha": None, "se": None, "positions": 0,
                              "note": "this pair's chat template has no thinking switch (SmolLM2); set thinking_modes "
                                      "for Qwen3"})
        for mode in modes:
            seqs = self.continue_(self.encode(True, thinking=(mode == "on")))
            self.row("thinking mode", f"enable_thinking={mode == 'on'}, greedy",
                     expected_alpha(self.pair.target, self.pair.draft, seqs, _GREEDY))

    def precision(self) -> None:
        import copy
        pair, base = self.pair, self.base_seqs
        d_bf16 = copy.deepcopy(pair.draft).to(torch.bfloat16)
        self.row("precision", "draft in bf16 (target as loaded)", expected_alpha(pair.target, d_bf16, base, _GREEDY))
        t_bf16 = copy.deepcopy(pair.target).to(torch.bfloat16)
        self.row("precision", "target and draft in bf16", expected_alpha(t_bf16, d_bf16, base, _GREEDY),
                 "the reference continuation stays the loaded target's")
        del t_bf16, d_bf16
        d_int8 = copy.deepcopy(pair.draft)
        fake_quantize_int8(d_int8)
        self.row("precision", "draft re-quantized: int8 weights per channel",
                 expected_alpha(pair.target, d_int8, base, _GREEDY))

    def pairing(self) -> None:
        """Draft size and training: the target's first layers untrained, and the target itself."""
        from ...models.distill import make_draft
        pair, base = self.pair, self.base_seqs
        n_d = pair.draft.config.num_hidden_layers
        for n in sorted({max(1, n_d // 2), n_d}):
            cut, _ = make_draft(pair.target, n)
            cut = cut.to(next(pair.target.parameters()).dtype).eval()
            self.row("pairing", f"first {n} target layers, untrained", expected_alpha(pair.target, cut, base, _GREEDY),
                     draft_step_ms=_draft_step_ms(cut))
            del cut
        self.row("pairing", "the target as its own draft (upper bound)",
                 expected_alpha(pair.target, pair.target, base, _GREEDY), draft_step_ms=_draft_step_ms(pair.target))


def factor_table(pair, prompt_spec: str, max_new: int, k: int = 5, thinking_modes=(), device: str = "cpu",
                 progress=print) -> list[dict]:
    """The investigation: alpha for each factor, on the pair given, each row against the baseline (greedy,
    chat template, the pair as loaded). Every row: what changed, alpha +- se, and what vLLM would report
    at k (draft acceptance rate, mean acceptance length)."""
    study = _FactorStudy(pair, prompt_spec, max_new, k, progress)
    study.baseline()
    study.sampling()
    study.prompt_format()
    study.thinking(thinking_modes)
    study.precision()
    study.pairing()
    return study.rows


# ------------------------------------------------------------------------------------ acceptance traces
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


# ------------------------------------------------------------------------ a lightened draft's alpha
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


# ------------------------------------------------------------------------------ the M1 answer (15_acceptance)
def factor_alpha(rows: list[dict], factor: str, contains: str) -> float | None:
    """alpha of the factor-table row of `factor` whose setting contains `contains` (None: no such row)."""
    for r in rows:
        if r["factor"] == factor and contains in r["setting"] and r.get("alpha") is not None:
            return float(r["alpha"])
    return None


def recommend_k(costs: dict, k_max: int = 8) -> dict:
    """For each of the user's drafts (name -> costmodel.Costs measured on a GPU), its alpha (from the
    user's rate at k=5), the k the cost model picks and the speedups it predicts there and at k=5."""
    from ... import costmodel, metrics
    out = {}
    for name, c in costs.items():
        a = metrics.user_alpha(name)
        kb, sp = costmodel.best_k(a, c, k_max)
        out[name] = {"alpha": a, "best k": kb, "predicted speedup at best k": sp,
                     f"predicted speedup at k={metrics.USER_K}": costmodel.speedup(a, metrics.USER_K, c)}
    return out


def m1_answer(rows: list[dict], pair_name: str, hw_label: str, draft_layers: int) -> str:
    """M1's answer in prose, every number from the factor table and the user's rates."""
    from ... import metrics
    a0 = float(rows[0]["alpha"])
    temp = [r for r in rows if r["factor"] == "temperature" and r.get("alpha") is not None]
    best_temp = max(temp, key=lambda r: r["alpha"]) if temp else None
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    mis = factor_alpha(rows, "prompt format", "mismatch")
    bf16 = factor_alpha(rows, "precision", "target and draft in bf16")
    int8 = factor_alpha(rows, "precision", "int8")
    untrained = factor_alpha(rows, "pairing", f"first {draft_layers} target layers")
    (n0, r0), (n1, r1) = metrics.USER_RATES.items()
    a_0, a_1, k = metrics.user_alpha(n0), metrics.user_alpha(n1), metrics.USER_K
    best = f"best: {best_temp['setting']} at {best_temp['alpha']:.3f}" if best_temp else "n/a"
    return f"""Answer (from these measurements; {pair_name} on {hw_label}):
- Mostly counting. vLLM's draft acceptance rate divides accepted tokens by all k drafted, and a draft stops at its
  first rejection: {r0:.1%} and {r1:.1%} at k={k} are per-token acceptances alpha of {a_0:.2f} and {a_1:.2f},
  i.e. {1 + k * r0:.2f} and {1 + k * r1:.2f} tokens per target forward. The same drafts would show {a_0:.0%} and {a_1:.0%}
  at k=1. Nothing in those two numbers says the setup is broken; the alpha behind them is what matters for speed.
- What does move alpha here: sampling settings ({best}; greedy {a0:.3f}); a chat-template mismatch between
  separately served models ({f(mis)}), impossible inside one vLLM (the draft gets the target's token ids); precision
  (both bf16 {f(bf16)}, int8 draft {f(int8)}); and above all the pairing: an untrained cut of the target reaches
  {f(untrained)}, a draft trained on the target's outputs {a0:.3f}.
- So: report alpha (or mean acceptance length) rather than the rate, pick k by the cost model rather than {k},
  serve both models from one template and one thinking setting, and for more acceptance distil the draft on the
  target's own outputs (as the embedded draft was)."""


# ------------------------------------------------------------------ recorded draft chains (emulated drafts)
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

"""The acceptance study (15_acceptance): what moves alpha, factor by factor against a baseline (factor_table), and
M1's answer from it (m1_answer, recommend_k). alpha is measured by teacher forcing (forcing); the traces, the
lightened drafts and the recorded chains have rooms of their own (traces, draftvariants, chains), re-exported here.
"""
from __future__ import annotations

import torch

from ...runtime.verify import Sampling
from .chains import chains_for, record_chains  # noqa: F401
from .draftvariants import draft_variants, fast_draft_agreement, token_ranking  # noqa: F401
from .forcing import (ForcedSequence, continuations, expected_alpha, per_position_alpha,  # noqa: F401
                      sequence_se)
from .traces import TRACE_TOP, record_trace, trace_events  # noqa: F401


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

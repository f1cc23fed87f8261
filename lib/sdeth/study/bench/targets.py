"""Bigger targets on one GPU (`python -m sdeth bench targets`): the decode step t(B) and the verify
t_v(B, k) of Qwen3-14B, Qwen3-32B (bf16) and a 70B-class shape (Qwen2.5-72B, fp8 weights) beside the
Qwen3-8B reference, and colocated SD over them with the Qwen3-1.7B and 0.6B draft shapes.

Random weights, built fused on the GPU (runtime.randomweights): timing does not depend on their values,
so acceptance is synthetic (a coin per drafted token) or trace-driven (a recorded trace replayed).

Terms (every figure in ms, on one GPU, context 512 tokens):
- step: one greedy decode step of one sequence, fed its own argmax on the device (CUDA graph, host included);
- t(B): one forward of B rows of one token each at the same length (the context), all reading one cached
  prefix: this decoder has no batch of independent sequences, so the keys and values are read once, not B
  times (floor_independent_ms says what B separate caches would add);
- t_v(B, k): one forward of B rows of k+1 tokens each (a verify of k drafted tokens per row);
- replay_ms: the same forward's CUDA graph replayed back to back (device time only);
- floor_ms: max(bytes / copy bandwidth, matrix FLOPs / measured bf16 matrix rate (x2 for fp8: modelled));
- kernels: kernels per step in the step's graph (torch profiler).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from ... import hardware
from ...models.presets import shape
from ...runtime.engine import Engine
from ...runtime.randomweights import fused_random
from ..config import RunConfig
from .step import copy_bandwidth, decode_run_ms, kernel_profile, timed_ms, timed_replays

TARGETS = {"Qwen2.5-72B": "fp8", "Qwen3-32B": "bf16", "Qwen3-14B": "bf16", "Qwen3-8B": "bf16"}  # largest first
DRAFT_ALPHA = {"Qwen3-1.7B": 0.71, "Qwen3-0.6B": 0.56}   # the alphas bench sd used with the 8B (reports/gpu)
TRACE = "reports/traces/embedded_greedy.json"
CONTEXT, CAPACITY, SCRATCH = 512, 1024, 256


def matmul_rate(device: str, n: int = 8192) -> float:
    """FLOP/s of an n x n x n bf16 matrix product on random data (median of 10 after 3 warm-ups)."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    ms = statistics.median(timed_ms(lambda: a @ b, device) for _ in range(10))
    return 2 * n ** 3 / (ms / 1e3)


def batch_inputs(eng: Engine, rows: int, width: int, context: int) -> tuple:
    """`rows` rows of `width` tokens at positions context..context+width-1, row r's keys in the scratch slots
    scratch_base + r*width + j, each seeing the prefix and its own earlier tokens (device tensors)."""
    m, base = rows * width, eng.scratch_base()
    j = torch.arange(width).repeat(rows)
    r = torch.arange(rows).repeat_interleave(width)
    slots = base + r * width + j
    ids = torch.randint(0, 1000, (m,), generator=torch.Generator().manual_seed(rows * 100 + width))
    vis = eng.rows_visible([context] * m, (base + r * width).tolist(), slots.tolist())
    return ids.to(eng.device), (context + j).to(eng.device), slots.to(eng.device), vis


def floors(model, eng: Engine, tokens: int, rows: int, bw: float, rate: float) -> dict:
    """The forward's bytes floor (weights as stored, keys and values of the live context: shared, and as B
    separate caches would be), its FLOP floor, and the larger."""
    c = model.config
    per_tok = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 2
    w = eng.net.weight_bytes()
    matrix = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
    fp8 = model.fused["format"] == "fp8"
    kv_one = per_tok * (CONTEXT + tokens // rows)
    out = {"weight_bytes": w, "bytes_floor_ms": (w + kv_one) / bw * 1e3,
           "flop_floor_ms": 2 * matrix * tokens / (rate * (2 if fp8 else 1)) * 1e3,
           "floor_independent_ms": (w + rows * kv_one) / bw * 1e3}
    out["floor_ms"] = max(out["bytes_floor_ms"], out["flop_floor_ms"])
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def time_rows(eng: Engine, rows: int, width: int, n: int = 15) -> dict:
    """forward_rows of rows x width tokens: ms with the host's launch work (median), and its graph replayed."""
    args = batch_inputs(eng, rows, width, CONTEXT)
    ts = [timed_ms(partial(eng.forward_rows, *args), eng.device) for _ in range(n + 1)]
    return {"forward_ms": round(statistics.median(ts[1:]), 4), **_replay(eng, ("rows", rows * width))}


def chain_point(eng: Engine, ids: list[int], k: int | None) -> dict:
    """One sequence: the decode step (k None) or a verify forward of k+1 tokens, as the SD loop runs them."""
    if k is None:
        for _ in range(2):
            decode_run_ms(eng, ids[CONTEXT], 8)
        ms = statistics.median(decode_run_ms(eng, ids[CONTEXT], 32) for _ in range(5))
        return {"step_ms": round(ms, 4), **_replay(eng, 1, 30)}
    w = ids[CONTEXT:CONTEXT + k + 1]
    ts = []
    for _ in range(16):
        ts.append(timed_ms(partial(eng.forward, w), eng.device))
        eng.rollback(CONTEXT)
    return {"forward_ms": round(statistics.median(ts[1:]), 4), **_replay(eng, k + 1)}


def _replay(eng: Engine, key, n: int = 20) -> dict:
    """ms per replay of the graph captured for `key` (none on a CPU)."""
    return {"replay_ms": round(timed_replays(eng.graphs[key][0], n), 4)} if key in eng.graphs else {}


def measure_target(model, name: str, bw: float, rate: float, batches=(1, 4, 16), ks=(3, 5, 8),
                   compile_mode: str = "default", profile: bool = True) -> dict:
    """A target's step, t(B) and t_v(B, k) with floors; the step's kernel profile."""
    eng = Engine(model, name, capacity=CAPACITY, impl="fast", compile_mode=compile_mode or None, scratch=SCRATCH,
                 max_graph_width=max((1, *batches)) * (max(ks) + 1))
    eng.start(CAPACITY)
    ids = torch.randint(0, 1000, (CONTEXT + 16,), generator=torch.Generator().manual_seed(0)).tolist()
    eng.forward(ids[:CONTEXT])
    t0 = time.perf_counter()
    first = eng.forward(ids[CONTEXT:CONTEXT + 1])
    out = {"model": name, "weights": model.fused["format"], "first_step_s": round(time.perf_counter() - t0, 2),
           "logits_finite": bool(torch.isfinite(first).all()), "points": []}
    eng.rollback(CONTEXT)
    step = chain_point(eng, ids, None)
    out.update(step, **floors(model, eng, 1, 1, bw, rate))
    out["step_over_floor"] = round(step["step_ms"] / out["floor_ms"], 3)
    if profile and 1 in eng.graphs:
        out["kernels"] = kernel_profile(eng.graphs[1][0], replays=5, top=8)
    for k in ks:
        out["points"].append({"B": 1, "k": k, "path": "chain", **chain_point(eng, ids, k), **floors(model, eng, k + 1, 1, bw, rate)})
    for b in batches:
        for k in (None, *ks):
            w = 1 if k is None else k + 1
            pt = {"B": b, "k": k, "path": "rows", **time_rows(eng, b, w), **floors(model, eng, b * w, b, bw, rate)}
            out["points"].append(pt)
    del eng
    gc.collect()
    torch.cuda.empty_cache()
    return out


def headline(model, name: str, bw: float, rate: float, compile_mode: str = "default") -> dict:
    """The step and the verify of 3, 5, 8 tokens of one sequence only (the figures repeated in every call)."""
    return measure_target(model, name, bw, rate, batches=(), compile_mode=compile_mode, profile=False)


# ---------------------------------------------------------------- colocated SD over a big target

def sd_pair(model, name: str, draft: str, device: str):
    """The target (fused, random) with a random-weight draft shape of the same tokenizer family."""
    from ...models.presets import Pair, PairConfig, RandomTokenizer, random_model
    d = random_model(draft, device, torch.bfloat16, seed=1)
    vocab = min(model.config.vocab_size, d.config.vocab_size)     # the tokenizer both tables cover
    cfg = PairConfig(f"random:{name} + random:{draft}", f"random:{name}", f"random:{draft}", "bfloat16", vocab,
                     f"{name} ({model.fused['format']} weights, built fused on the GPU) and {draft}: random weights, "
                     "timings only")
    return Pair(cfg, model, d, RandomTokenizer(vocab),
                {"note": "random weights"})


def sd_config(pair, device: str, acceptance: str, draft: str, k: int, requests: int, max_tokens: int):
    if acceptance not in ("synthetic", "trace-driven"):
        raise ValueError(f"acceptance {acceptance!r}: use 'synthetic' or 'trace-driven'")
    return RunConfig(pair=pair.config.name, mode="sd", placement="colocated", adaptive=False, k=k, device=device,
                     prompts=f"random:{requests}:{CONTEXT}:0", max_tokens=max_tokens, max_len=CAPACITY,
                     capacity=CAPACITY, impl="fast", compile="default" if device.startswith("cuda") else "",
                     synthetic_alpha=DRAFT_ALPHA.get(draft, 0.6),
                     synthetic_trace=TRACE if acceptance == "trace-driven" else None)


def colocated_sd(model, name: str, drafts, acceptances, device: str = "cuda:0", k: int = RunConfig.k,
                 requests: int = 16, max_tokens: int = RunConfig.max_tokens,
                 deadline: float = float("inf")) -> list[dict]:
    """Target-only, then colocated SD with each draft and acceptance kind, on the same requests (in this process:
    one GPU holds both models). Each row: speedup over target-only with its 95% paired bootstrap interval,
    alpha with its interval, the cost model's prediction, and the per-request lists the intervals came from."""
    from .modes import compare, per_request
    from ..runs.experiment import run
    out, ref = [], None
    for draft in drafts:
        pair = sd_pair(model, name, draft, device)
        base = sd_config(pair, device, "synthetic", draft, k, requests, max_tokens)
        run(replace(base, prompts=f"random:1:{CONTEXT}:999983", max_tokens=16), pair, False)   # compile, capture
        ref = ref or run(replace(base, mode="target-only"), pair, False)     # the same target and requests
        for acc in acceptances:
            if time.time() > deadline:
                out.append({"target": name, "draft": draft, "acceptance": acc, "skipped": "out of time"})
                continue
            cfg = sd_config(pair, device, acc, draft, k, requests, max_tokens)
            res = run(cfg, pair, False)
            gc.collect()
            row = compare({"target-only": ref, "colocated": res})[1]
            out.append({"target": name, "target_weights": model.fused["format"], "draft": draft, "acceptance": acc,
                        "acceptance_label": _label(cfg), "k": k, "requests": requests, "max_tokens": max_tokens,
                        "target_only_tokens_per_s": ref["summary"]["tokens_per_s"], "costs": res["summary"].get("costs"),
                        "per_request": {"target-only": per_request(ref), "colocated": per_request(res)},
                        **{key: row.get(key) for key in ("tokens_per_s", "speedup", "speedup_ci95", "predicted_speedup",
                                                         "alpha", "alpha_ci95", "identical_to_target_only")}})
        del pair
        gc.collect()
        torch.cuda.empty_cache()
    return out


def _label(cfg) -> str:
    from .modes import acceptance_label
    return acceptance_label(cfg)


# ---------------------------------------------------------------- one call on the device

def run_call(call: int, json_path: str, targets=tuple(TARGETS), grid: str = "full", sd_targets=("Qwen3-32B", "Qwen2.5-72B"),
             drafts=tuple(DRAFT_ALPHA), acceptances=("synthetic", "trace-driven"), device: str = "cuda:0",
             budget_s: float = 520, requests: int = 16, max_tokens: int = RunConfig.max_tokens, progress=print) -> dict:
    """Measure each target (grid 'full': t(B), t_v(B, k); 'headline': the step and t_v(1, k)), then colocated SD
    over those in sd_targets; the JSON is rewritten after each part, and parts not started by budget_s are
    recorded as skipped."""
    torch.cuda.set_device(device)
    t_end = time.time() + budget_s
    bw, rate = copy_bandwidth(device), matmul_rate(device)
    res = {"schema": "sdeth.bench/1", "bench": "targets", "call": call, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "hardware": hardware.describe(device), "copy_bandwidth_Bps": bw, "bf16_matmul_flops": rate,
           "context": CONTEXT, "capacity": CAPACITY, "compile": "default (one decoder block, torch.compile)",
           "weights": "random, drawn on the GPU in the format listed (fp8: per-row scaled e4m3 weights and per-token "
                      "scaled activations, torch._scaled_mm); timing does not depend on their values",
           "batch_note": "t(B): B rows of one sequence's cached prefix at one length (keys and values read once), "
                         "not B independent sequences",
           "shapes": {t.partition(":")[0]: shape(t.partition(":")[0]) for t in targets} | {d: shape(d) for d in drafts},
           "targets": [], "sd": [], "skipped": []}
    save = lambda: Path(json_path).write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
    for spec in targets:
        name, _, fmt = spec.partition(":")
        if time.time() > t_end:
            res["skipped"].append(f"{spec}: out of time")
            continue
        t0 = time.time()
        model = fused_random(name, device, fmt or TARGETS[name])
        build_s = round(time.time() - t0, 1)
        try:
            row = measure_target(model, name, bw, rate) if grid == "full" else headline(model, name, bw, rate)
            row.update(build_s=build_s, gpu_mem_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 1))
        except Exception as e:                      # noqa: BLE001 (record and go on)
            row = {"model": name, "error": f"{type(e).__name__}: {e}"[:500]}
        res["targets"].append(row)
        progress(table_row(row))
        save()
        if spec in sd_targets or name in sd_targets:      # ("NAME" covers each of its formats)
            n_sd = len(res["sd"])
            try:
                res["sd"] += colocated_sd(model, name, drafts, acceptances, device, requests=requests,
                                          max_tokens=max_tokens, deadline=t_end)
            except Exception as e:                  # noqa: BLE001
                res["sd"].append({"target": name, "error": f"{type(e).__name__}: {e}"[:500]})
            for r in res["sd"][n_sd:]:
                progress(sd_row(r))
            save()
        del model
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        row["gpu_mem_after_free_gib"] = round(torch.cuda.memory_allocated() / 2 ** 30, 2)
    res["wall_s"] = round(time.time() - (t_end - budget_s), 1)
    save()
    return res


def table_row(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: {r['error']}"
    pts = {(p["B"], p["k"]): p for p in r["points"]}
    cell = lambda b, k: f"{pts[(b, k)].get('replay_ms', pts[(b, k)].get('forward_ms')):.2f}" if (b, k) in pts else "-"  # noqa: E731
    return (f"{r['model']:12s} {r['weights']} step {r['step_ms']:.3f} ms (floor {r['floor_ms']:.3f}, x{r['step_over_floor']}) "
            f"kernels {r.get('kernels', {}).get('kernels_per_step', '-')} | tv(1,3/5/8) {cell(1, 3)} {cell(1, 5)} {cell(1, 8)}"
            f" | t(4) {cell(4, None)} t(16) {cell(16, None)} tv(16,8) {cell(16, 8)}")


def sd_row(r: dict) -> str:
    if "speedup" not in r:
        return f"SD {r.get('target')} {r.get('draft', '')}: {r.get('error') or r.get('skipped')}"
    return (f"SD {r['target']:12s} + {r['draft']:10s} {r['acceptance']:12s} speedup {r['speedup']:.3f} "
            f"[{r['speedup_ci95'][0]:.3f}, {r['speedup_ci95'][1]:.3f}] predicted {r['predicted_speedup'] or 0:.3f} "
            f"alpha {r.get('alpha') or 0:.3f} target-only {r['target_only_tokens_per_s']:.1f} tok/s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sdeth bench targets", description=__doc__.split("\n")[0])
    ap.add_argument("--call", type=int, required=True, help="which call on the device this is (1, 2, ...)")
    ap.add_argument("--json", required=True, help="results JSON path (rewritten after each part)")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help=f"comma-separated NAME[:FORMAT], of {list(TARGETS)}; formats bf16, fp8, fp8w (default {TARGETS})")
    ap.add_argument("--grid", default="full", choices=("full", "headline"))
    ap.add_argument("--sd-targets", default="Qwen3-32B,Qwen2.5-72B", help="targets to run colocated SD over ('' none)")
    ap.add_argument("--drafts", default=",".join(DRAFT_ALPHA))
    ap.add_argument("--acceptance", default="synthetic,trace-driven")
    ap.add_argument("--budget-s", type=float, default=520)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=RunConfig.max_tokens)
    a = ap.parse_args(argv)
    split = lambda s: tuple(x for x in s.split(",") if x)  # noqa: E731
    bad = [t for t in split(a.targets) if t.partition(":")[0] not in TARGETS] + \
        [d for d in split(a.drafts) if d not in DRAFT_ALPHA]
    if bad:
        raise SystemExit(f"unknown target or draft {bad}: targets {list(TARGETS)}, drafts {list(DRAFT_ALPHA)}")
    run_call(a.call, a.json, split(a.targets), a.grid, split(a.sd_targets), split(a.drafts), split(a.acceptance),
             budget_s=a.budget_s, requests=a.requests, max_tokens=a.max_tokens)


if __name__ == "__main__":
    main()

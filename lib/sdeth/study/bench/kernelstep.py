"""The fused Triton kernels (runtime.kernels), lever by lever (`python -m sdeth bench step --kernels ...`): each
kernels= lever of runtime.fastmodel.FastOptions on random bf16 weights of each shape, at batch 1 and in batches of
independent rows, beside the step's bytes floor: its step and replay ms, kernels a step, its gain over 'torch' (the
base), its graph against eager and its logits against 'torch'. The timing helpers are study.bench.step's."""
from __future__ import annotations

import statistics
import time
import traceback

import torch

from ... import hardware
from ...runtime.engine import Engine
from .kernelprof import kernel_profile
from .step import bench_ids, copy_bandwidth, decode_run_ms, eager_first_step, timed_ms, timed_replays

KERNEL_LEVERS = ("torch", "attn", "gemv", "all", "auto")     # FastOptions.kernels; 'torch' is the base


def logits_diff(got: torch.Tensor, want: torch.Tensor) -> dict:
    """max |got - want| over the logits and the share of rows whose argmax agrees."""
    got, want = got.float().reshape(-1, got.shape[-1]), want.float().reshape(-1, want.shape[-1])
    return {"max_abs_diff": round(float((got - want).abs().max()), 5),
            "argmax_agree": round(float((got.argmax(-1) == want.argmax(-1)).float().mean()), 4)}


def kv_bytes(cfg, tokens: int) -> int:
    """Keys and values (bf16) of `tokens` cached tokens over every layer."""
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * tokens * 2


def graph_figures(graph, device, profile: bool) -> dict:
    """A captured step's replay ms and (profile) its kernels a step, from one profiled run of replays."""
    if graph is None or torch.device(device).type != "cuda":
        return {}
    out = {"replay_ms": round(timed_replays(graph), 4)}
    if profile:
        prof = kernel_profile(graph, top=6)
        out.update(kernels_per_step=prof["kernels_per_step"], kernel_us_per_step=prof["kernel_us_per_step"],
                   families=prof["families"], top_kernels=prof["top"])
    return out


def kernel_chain(model, name: str, lever: str, context: int, compile_mode: str, bw: float, steps: int,
                 profile: bool, capacity: int = 0) -> tuple[dict, torch.Tensor]:
    """Batch 1, one sequence of `context` tokens: the engine's decode step with kernels=lever (step ms with the
    host's work, the graph's replay ms, kernels a step, the floor) and graph = eager. capacity: the cache's
    slots (0: the context and the steps, plus 64). Returns (row, logits)."""
    fast, capacity = f"kernels={lever}", capacity or context + steps + 64
    if capacity < context + steps + 1:
        raise ValueError(f"capacity={capacity}: the chain needs at least context + steps + 1 = {context + steps + 1}")
    ids = bench_ids(model.config.vocab_size, context)
    eng = Engine(model, name, capacity=capacity, impl="fast", compile_mode=compile_mode or None, fast=fast)
    eng.start(capacity)
    eng.forward(ids[:context])
    t0 = time.perf_counter()
    logits = eng.forward(ids[context:context + 1])[0].clone()
    float(logits.sum())                                 # waits for the first step (compile and capture)
    row = {"model": name, "lever": lever, "rows": 1, "context": context, "capacity": capacity,
           "first_step_s": round(time.perf_counter() - t0, 2)}
    eng.rollback(context)
    row["graph_vs_eager"] = logits_diff(logits, eager_first_step(model, name, context, capacity, fast))
    for _ in range(2):
        decode_run_ms(eng, ids[context], 8)
    row["step_ms"] = round(statistics.median(decode_run_ms(eng, ids[context], steps) for _ in range(5)), 4)
    row.update(graph_figures(eng.graphs.get(1, (None,))[0], eng.device, profile))
    row["weight_bytes"] = eng.net.weight_bytes()
    row["floor_ms"] = round((row["weight_bytes"] + kv_bytes(model.config, context + steps)) / bw * 1e3, 4)
    return row, logits


def row_lengths(rows: int, context: int) -> list[int]:
    """Independent rows' lengths: from three quarters of the context up to all of it."""
    return [context - r * context // (4 * rows) for r in range(rows)]


def kernel_rows(model, name: str, lever: str, rows: int, context: int, compile_mode: str, bw: float,
                profile: bool) -> tuple[dict, torch.Tensor]:
    """`rows` independent sequences (row_lengths) in one BatchDecoder step with kernels=lever: step and replay ms,
    kernels a step, the floor (weights and every row's cache) and graph = eager. Returns (row, logits [rows, V])."""
    from ...runtime.batchmodel import BatchDecoder
    from ...runtime.fastmodel import FastDecoder
    dec = BatchDecoder(FastDecoder(model, 8, f"kernels={lever}"), rows, context + 64, compile_mode=compile_mode or None)
    lengths = row_lengths(rows, context)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (rows, context + 1), generator=g).to(dec.device)
    for c in range(0, context, 256):                    # every row prefilled to the longest; each steps at its own
        pos = torch.arange(c, min(c + 256, context), device=dec.device)[None].expand(rows, -1).contiguous()
        dec.forward(prompt[:, c:c + pos.shape[1]], pos, pos)
    pos = torch.tensor(lengths, device=dec.device)[:, None]
    ids = prompt.gather(1, pos)
    t0 = time.perf_counter()
    logits = dec.step(ids, pos, pos, top=max(lengths) + 1).clone()
    float(logits.sum())
    row = {"model": name, "lever": lever, "rows": rows, "context": context, "row_lengths": [min(lengths), max(lengths)],
           "first_step_s": round(time.perf_counter() - t0, 2)}
    key = next(iter(dec.graphs), None)
    with torch.inference_mode():
        row["graph_vs_eager"] = logits_diff(logits, dec._forward(ids, pos, pos, 0, dec.span_for(max(lengths) + 1),
                                                                 fused=True))
    def run():                                          # 32 steps, each rewriting the rows' same slots
        for _ in range(32):
            dec.step(ids, pos, pos, top=max(lengths) + 1)
    run()
    row["step_ms"] = round(statistics.median(timed_ms(run, dec.device) / 32 for _ in range(5)), 4)
    row.update(graph_figures(dec.graphs[key][0] if key else None, dec.device, profile))
    row["weight_bytes"] = dec.fast.weight_bytes()
    row["floor_ms"] = round((row["weight_bytes"] + kv_bytes(model.config, sum(lengths))) / bw * 1e3, 4)
    return row, logits


def bench_kernels(models=("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-8B"), device: str = "cuda:0", context: int = 512,
                  row_contexts=(512, 2048), rows: int = 16, levers=KERNEL_LEVERS, compile_mode: str = "default",
                  budget_s: float = 480, progress=print, save=None, steps: int = 64, profile: bool = True) -> dict:
    """Each kernels= lever (FastOptions.kernels) on random bf16 weights of each shape: batch 1 at `context`, then
    `rows` independent rows at each of row_contexts; per lever its step, replay, kernels a step, floor, gain over
    'torch', graph = eager and its logits against 'torch' (max abs diff, argmax agreement). Stops starting new
    measurements after budget_s; whatever was measured is kept."""
    from ...runtime.randomweights import fused_random
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    t_end = time.time() + budget_s
    bw = copy_bandwidth(device) if cuda else 1e10
    res = {"schema": "sdeth.bench/1", "bench": "step-kernels", "hardware": hardware.describe(device),
           "weights": "random bf16 on Qwen3 shapes, full output layer (timing does not depend on their values)",
           "context": context, "row_contexts": list(row_contexts), "batch_rows": rows, "compile": compile_mode,
           "levers": list(levers), "copy_bandwidth_Bps": bw, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "rows": []}
    for name in models:
        model = fused_random(name, device)
        settings = [(1, context)] + [(rows, c) for c in row_contexts]
        for n_rows, ctx in settings:
            kernel_setting(model, name, n_rows, ctx, levers, dict(compile_mode=compile_mode, bw=bw, profile=profile),
                           steps, res, progress, save, t_end)
        del model
        if cuda:
            torch.cuda.empty_cache()
    res["wall_s"] = round(time.time() - (t_end - budget_s), 1)
    return res


def kernel_setting(model, name: str, n_rows: int, context: int, levers, common: dict, steps: int, res: dict,
                   progress, save, t_end: float) -> None:
    """Every lever at one (rows, context) of one model, 'torch' first (the reference of the others)."""
    ref = base = None
    for lever in sorted(levers, key=lambda x: x != "torch"):
        if time.time() > t_end:
            row = {"model": name, "lever": lever, "rows": n_rows, "context": context, "skipped": "out of time"}
        else:
            try:
                row, logits = (kernel_chain(model, name, lever, context, steps=steps, **common) if n_rows == 1 else
                               kernel_rows(model, name, lever, n_rows, context, **common))
                row["step_over_floor"] = round(row["step_ms"] / row["floor_ms"], 2)
                if lever == "torch":
                    ref, base = logits, row
                elif ref is not None:
                    row["vs_torch"] = logits_diff(logits, ref)
                    row["gain_ms"] = round(base["step_ms"] - row["step_ms"], 4)
                    if "replay_ms" in base and "replay_ms" in row:
                        row["replay_gain_ms"] = round(base["replay_ms"] - row["replay_ms"], 4)
            except Exception as e:                          # noqa: BLE001 (record and go on)
                traceback.print_exc()
                row = {"model": name, "lever": lever, "rows": n_rows, "context": context,
                       "error": f"{type(e).__name__}: {e}"[:400]}
        res["rows"].append(row)
        progress({k: v for k, v in row.items() if k not in ("top_kernels", "families")})
        if save:
            save(res)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def kernel_table(res: dict) -> str:
    """The kernel levers as aligned text: step, replay, floor, kernels a step, gain, logits against torch."""
    out = [f"{res['hardware'].get('gpu')}, compile {res['compile']!r}, {res['weights']}",
           f"{'model':11s} {'rows':>4s} {'ctx':>5s} {'lever':6s} {'step ms':>8s} {'replay':>7s} {'floor':>6s} "
           f"{'x floor':>7s} {'kernels':>7s} {'gain':>7s} {'vs torch':>16s}"]
    for r in res["rows"]:
        head = f"{r['model']:11s} {r['rows']:4d} {r['context']:5d} {r['lever']:6s}"
        if "step_ms" not in r:
            out.append(f"{head} {r.get('error') or r.get('skipped')}")
            continue
        vs = r.get("vs_torch", {})
        vs_txt = f"{vs['max_abs_diff']:.3g}/{vs['argmax_agree']:.2f}" if vs else ""
        out.append(f"{head} {r['step_ms']:8.3f} {r.get('replay_ms', 0):7.3f} {r['floor_ms']:6.3f} "
                   f"{r['step_over_floor']:7.2f} {r.get('kernels_per_step', 0):7.0f} {r.get('gain_ms', 0):7.3f} "
                   f"{vs_txt:>16s}")
    return "\n".join(out)

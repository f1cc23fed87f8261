"""The decode step, lever by lever (`python -m sdeth bench step`): how long one forward takes for each
fast-decoder lever (runtime.fastmodel.FastOptions), measured alone on top of a base and then together,
beside the step's bytes floor.

For each model shape (random weights; timing does not depend on their values) and lever set:
- step_ms: a run of decode steps, each fed the previous step's argmax on the device, timed with CUDA
  events over the run (host launch work included, as the runtime sees it), divided by the steps;
- replay_ms: the width's CUDA graph replayed back to back (device time only);
- rows_ms: a forward of 1, 2, 4, 8 rows that branch off the cached prefix (Engine.forward_rows);
- verify8_over_step: a verify forward of 8 tokens over one step (a guard for the target);
- floor_ms: bytes one step reads (weights as stored, plus the keys and values of the live context)
  over the measured device copy bandwidth;
- graph_vs_fp32 / eager_vs_fp32: the graph's logits and the same decoder's uncompiled, outside a graph,
  each against an fp32 eager decoder (graph = eager: the graph no further from fp32 than eager is);
  lossy levers' distance shows in vs_base_rel_err;
- kernels (the base): where the step's device time goes, kernel by kernel.

The fused Triton kernels, lever by lever (`bench step --kernels`): study.bench.kernelstep.
"""
from __future__ import annotations

import statistics
import time
import traceback
from functools import partial

import torch

from ... import hardware
from ...runtime.engine import Engine
from .kernelprof import kernel_profile

# a lever measured alone: its FastOptions on top of the base scope (and, for 'capacity', a cache
# sized to the live context instead of the engine's capacity)
LEVERS = {
    "live-length cache": dict(capacity="live"),
    "head=32768": dict(fast="head=32768"),
    "weights=int8": dict(fast="weights=int8"),
    "weights=fp8": dict(fast="weights=fp8"),
    "max-autotune": dict(compile="max-autotune-no-cudagraphs"),          # Triton templates, fused epilogues
    "weights=int8 + max-autotune": dict(fast="weights=int8", compile="max-autotune-no-cudagraphs"),
    "weights=fp8 + max-autotune": dict(fast="weights=fp8", compile="max-autotune-no-cudagraphs"),
}
TARGET_LEVERS = ("live-length cache", "max-autotune")  # the target keeps its numerics


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """|got - want| / |want| over the entries both have (a pruned head leaves the rest at -inf)."""
    fin = torch.isfinite(got) & torch.isfinite(want)
    return round(float((got[fin].float() - want[fin].float()).norm() / want[fin].float().norm()), 5)


def bench_ids(vocab: int, context: int) -> list[int]:
    """The benchmark's prompt (context ids) and the ids after it, the same for every lever."""
    return torch.randint(0, vocab, (context + 16,), generator=torch.Generator().manual_seed(0)).tolist()


def eager_first_step(model, name: str, context: int, capacity: int, fast: str = "") -> torch.Tensor:
    """The first decode step's logits after the benchmark's prompt: the fast decoder with `fast`, uncompiled,
    outside a graph."""
    ids = bench_ids(model.config.vocab_size, context)
    e = Engine(model, name, capacity=capacity, impl="fast", fast=fast or None, cuda_graphs=False)
    e.start(capacity)
    e.forward(ids[:context])
    return e.forward(ids[context:context + 1])[0].clone()


def fp32_logits(model, name: str, context: int, capacity: int) -> torch.Tensor:
    """The first decode step's logits from an fp32 copy of the model, eager: the reference."""
    import copy
    return eager_first_step(copy.deepcopy(model).float(), name, context, capacity)


def timed_ms(fn, device) -> float:
    """ms that fn's work takes: CUDA events around it on a GPU (one wait at the end), a clock elsewhere."""
    if torch.device(device).type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def copy_bandwidth(device: str, gb: float = 2.0) -> float:
    """Bytes read + written per second by a large copy on the device (the memory ceiling)."""
    n = int(gb * 2 ** 30 / 2)
    a = torch.randn(n, device=device, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ms = statistics.median(timed_ms(lambda: b.copy_(a), device) for _ in range(10))
    return 2 * n * 2 / (ms / 1e3)


def timed_replays(graph, n: int = 50) -> float:
    """ms per replay of a captured graph, back to back."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    s.record()
    for _ in range(n):
        graph.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def decode_run_ms(eng: Engine, start_tok: int, steps: int) -> float:
    """ms per step of `steps` greedy decode steps fed on the device, one sync at the end."""
    pos0 = eng.pos
    tok = [torch.tensor([start_tok], device=eng.device)]

    def run():
        for _ in range(steps):
            tok[0] = eng.forward(tok[0])[-1].argmax()[None]
    ms = timed_ms(run, eng.device)
    eng.rollback(pos0)
    return ms / steps


def rows_inputs(m: int, context: int, capacity: int, scratch: int):
    """m rows branching off the prefix at context-m..context-1, one token each, in the scratch slots."""
    pos = [context - 1 - r for r in range(m)]
    vis = torch.zeros(m, capacity + scratch, dtype=torch.bool)
    for r, p in enumerate(pos):
        vis[r, :p] = True
        vis[r, capacity + r] = True
    return [1] * m, pos, [capacity + r for r in range(m)], vis


def measure(model, name: str, label: str, fast: str, compile_mode: str, capacity: int, context: int,
            bandwidth: float, rows=(), verify: bool = False, steps: int = 64, ref=None, profile: bool = False,
            ref32=None) -> dict:
    """One lever set on one model: compile/capture time, step, replay, rows, floor, logits checks."""
    cfg = model.config
    row = {"model": name, "lever": label, "fast": fast or "defaults", "compile": compile_mode, "capacity": capacity}
    ids = bench_ids(cfg.vocab_size, context)
    eng = Engine(model, name, capacity=capacity, impl="fast", compile_mode=compile_mode or None, fast=fast or None)
    eng.start(capacity)
    eng.forward(ids[:context])                   # prefill (eager)
    t0 = time.perf_counter()
    logits = eng.forward(ids[context:context + 1])
    logits.sum().item()
    row["first_step_s"] = round(time.perf_counter() - t0, 2)          # compile + capture of width 1
    eng.rollback(context)
    row.update(logits_checks(model, name, context, capacity, fast, logits[0], ref, ref32))
    for _ in range(2):
        decode_run_ms(eng, ids[context], 8)      # warm
    row["step_ms"] = round(statistics.median(decode_run_ms(eng, ids[context], steps) for _ in range(5)), 4)
    if 1 in eng.graphs:
        row["replay_ms"] = round(timed_replays(eng.graphs[1][0]), 4)
        if profile:
            row["kernels"] = kernel_profile(eng.graphs[1][0])
    live = context + steps
    kv = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * live * 2
    row["weight_bytes"] = eng.net.weight_bytes()
    row["floor_ms"] = round((row["weight_bytes"] + kv) / bandwidth * 1e3, 4)
    row["step_over_floor"] = round(row["step_ms"] / row["floor_ms"], 2)
    if verify:
        row["verify8_ms"] = verify_ms(eng, ids[context:context + 8], context)
        row["verify8_over_step"] = round(row["verify8_ms"] / row["step_ms"], 3)
    if rows:
        row.update(rows_ms(model, name, fast, compile_mode, capacity, context, ids, rows))
    row["_ref"] = logits[0].detach().clone()
    del eng
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def logits_checks(model, name: str, context: int, capacity: int, fast: str, logits, ref, ref32) -> dict:
    """graph = eager: the same decoder uncompiled and outside a graph, both against an fp32 eager decoder (bf16
    rounding differs between fused and unfused kernels: the graph should be no further from fp32); and the
    distance to the base's graph (ref)."""
    want = eager_first_step(model, name, context, capacity, fast)
    out = {"graph_vs_eager": rel_err(logits, want)}
    if ref32 is not None:
        out["graph_vs_fp32"], out["eager_vs_fp32"] = rel_err(logits, ref32), rel_err(want, ref32)
        out["graph_as_exact_as_eager"] = out["graph_vs_fp32"] <= 1.25 * out["eager_vs_fp32"] + 0.005
    if ref is not None:                          # against the base's graph
        out["vs_base_rel_err"] = rel_err(logits, ref)
    return out


def verify_ms(eng: Engine, w: list[int], context: int) -> float:
    """Median ms of a verify forward of the tokens w from the context (rolled back after each; the first of 21
    not counted)."""
    ts = []
    for _ in range(21):
        ts.append(timed_ms(partial(eng.forward, w), eng.device))
        eng.rollback(context)
    return round(statistics.median(ts[1:]), 4)


def rows_ms(model, name: str, fast: str, compile_mode: str, capacity: int, context: int, ids, rows) -> dict:
    """Forwards of m rows (each m of `rows`) on their own engine, whose cache has scratch slots: ms per forward,
    per graph replay, and 4 rows over 1."""
    scratch = 128                                # keeps the slot count a multiple of 128
    eng = Engine(model, name, capacity=capacity, impl="fast", compile_mode=compile_mode or None,
                 fast=fast or None, scratch=scratch)
    eng.start(capacity)
    eng.forward(ids[:context])
    row = {}
    for m in rows:
        args = rows_inputs(m, context, capacity, scratch)
        ts = [timed_ms(partial(eng.forward_rows, *args), eng.device) for _ in range(21)]
        row[f"rows{m}_ms"] = round(statistics.median(ts[1:]), 4)
        if ("rows", m) in eng.graphs:
            row[f"rows{m}_replay_ms"] = round(timed_replays(eng.graphs[("rows", m)][0]), 4)
    key = "rows{}_replay_ms" if "rows1_replay_ms" in row else "rows{}_ms"
    row["rows4_over_rows1"] = round(row[key.format(4)] / row[key.format(1)], 3) if 4 in rows and 1 in rows else None
    return row


def bench_step(models=("Qwen3-1.7B", "Qwen3-0.6B", "Qwen3-8B"), device: str = "cuda:0", context: int = 512,
               capacity: int = 1024, compile_mode: str = "default", budget_s: float = 480, base_scope: str = "layer",
               model_scope_for=("Qwen3-1.7B",), extra=(), progress=print, out: dict | None = None,
               save=None, levers=None, profile: bool = True, steps: int = 64) -> dict:
    """Every lever alone on the base (scope=base_scope), then the ones that paid together (with rows
    1, 2, 4, 8); the whole-model compile beside the base for the models named in model_scope_for.
    Drafts get every lever; a target (Qwen3-8B) only the exact ones. Stops starting new rows after
    budget_s; whatever was measured is kept."""
    from ...models.presets import random_model
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    t_end = time.time() + budget_s
    bw = copy_bandwidth(device)
    res = out if out is not None else {}
    res.update({"schema": "sdeth.bench/1", "bench": "step", "hardware": hardware.describe(device),
                "weights": "random bf16 on Qwen3 shapes (timing does not depend on their values)",
                "context": context, "capacity": capacity, "compile": compile_mode, "batch": 1,
                "copy_bandwidth_Bps": bw, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": []})

    def keep(row):
        row.pop("_ref", None)
        res["rows"].append(row)
        progress(row)
        if save:
            save(res)

    for name in models:
        model = random_model(name, device, torch.bfloat16 if cuda else torch.float32)
        ref32 = fp32_logits(model, name, context, capacity)
        common = dict(compile_mode=compile_mode, context=context, bandwidth=bw, ref32=ref32, steps=steps,
                      verify=name == "Qwen3-8B")
        tries = lever_tries(name, model_scope_for, levers, extra)
        bench_model(model, name, f"scope={base_scope}", tries, capacity, common, res, keep, t_end, profile)
        del model
        if cuda:
            torch.cuda.empty_cache()
    res["wall_s"] = round(time.time() - (t_end - budget_s), 1)
    return res


def lever_tries(name: str, model_scope_for, levers, extra) -> list[tuple[str, dict]]:
    """The levers measured alone on a model: the whole-model compile where asked, every lever for a draft,
    only the exact ones for the target (Qwen3-8B), then any extra."""
    target = name == "Qwen3-8B"
    tries = [("scope=model", dict(fast="scope=model"))] if name in model_scope_for and levers is None else []
    tries += [(k, v) for k, v in LEVERS.items() if (levers is None or k in levers) and (not target or k in TARGET_LEVERS)]
    return tries + list(extra)


def bench_model(model, name: str, base_fast: str, tries, capacity: int, common: dict, res: dict, keep, t_end: float,
                profile: bool) -> None:
    """One model: its base, each lever alone (those that gained over 2% are 'paid'), then the paid ones together."""
    def attempt(label: str, fast: str, cap: int, **kw):
        try:
            return measure(model, name, label, fast, capacity=cap, **{**common, **kw})
        except Exception as e:                              # noqa: BLE001 (record and go on)
            traceback.print_exc()
            keep({"model": name, "lever": label, "error": f"{type(e).__name__}: {e}"[:400]})
            return None

    base = attempt("base", base_fast, capacity, profile=profile)
    if base is None:
        return
    ref = base["_ref"]
    keep(base)
    paid = []
    for label, lever in tries:
        if time.time() > t_end:
            keep({"model": name, "lever": label, "skipped": "out of time"})
            continue
        fast = ",".join(x for x in (base_fast if label != "scope=model" else "", lever.get("fast", "")) if x)
        cap = common["context"] + 80 if lever.get("capacity") == "live" else capacity
        r = attempt(label, fast, cap, ref=ref, compile_mode=lever.get("compile", common["compile_mode"]))
        if r is not None:
            r["gain_ms"] = round(base["step_ms"] - r["step_ms"], 4)
            if r["gain_ms"] > 0.02 * base["step_ms"] and label not in ("scope=model", "live-length cache"):
                paid.append((r["step_ms"], label, lever))
            keep(r)
    combo, label, mode = together(paid, res["rows"], name, base_fast, common["compile_mode"])
    if time.time() < t_end + 60:
        r = attempt(label, combo, capacity, ref=ref, rows=(1, 2, 4, 8), compile_mode=mode)
        if r is not None:
            r["gain_ms"] = round(base["step_ms"] - r["step_ms"], 4)
            keep(r)


def together(paid, rows: list[dict], name: str, base_fast: str, compile_mode: str) -> tuple[str, str, str]:
    """The levers that paid, together: one weights format (the fastest), the head, the compile mode of any that
    paid with its own. Returns (fast spec, row label, compile mode)."""
    chosen: dict[str, str] = {}
    mode = compile_mode
    tuned = next((r["step_ms"] for r in rows if r.get("model") == name and r.get("lever") == "max-autotune"
                  and "step_ms" in r), None)
    for step, label, lever in sorted(paid, key=lambda t: t[0]):
        if lever.get("compile") and lever.get("fast") and tuned is not None and step >= tuned:
            continue            # its weights did not beat the same compile mode without them
        for part in filter(None, lever.get("fast", "").split(",")):
            chosen.setdefault(part.split("=")[0], part)
        mode = lever.get("compile", mode) if mode == compile_mode else mode
    combo = ",".join([base_fast] + list(chosen.values()))
    label = "together: " + (",".join(list(chosen.values()) + ([mode] if mode != compile_mode else [])) or "base")
    return combo, label, mode


def lever_table(res: dict) -> str:
    """The levers as aligned text: step, replay, floor, gain over the base."""
    out = [f"{res['hardware'].get('gpu')}, context {res['context']}, compile {res['compile']!r}, {res['weights']}",
           f"{'model':11s} {'lever':34s} {'step ms':>8s} {'replay':>7s} {'floor':>6s} {'x floor':>7s} {'gain':>7s} "
           f"{'compile s':>9s}"]
    for r in res["rows"]:
        if "step_ms" not in r:
            out.append(f"{r['model']:11s} {r['lever']:34s} {r.get('error') or r.get('skipped')}")
            continue
        out.append(f"{r['model']:11s} {r['lever'][:34]:34s} {r['step_ms']:8.3f} {r.get('replay_ms', 0):7.3f} "
                   f"{r['floor_ms']:6.3f} {r['step_over_floor']:7.2f} {r.get('gain_ms', 0):7.3f} {r['first_step_s']:9.1f}")
    return "\n".join(out)


def merge(paths, note: str = "") -> dict:
    """Several `bench step` results JSON files as one record: every run kept whole."""
    import json
    return merge_runs([json.load(open(p)) for p in paths], note)


def merge_runs(runs: list[dict], note: str = "") -> dict:
    return {"schema": "sdeth.bench/1", "bench": "step-runs", "note": note, "runs": runs}


def summary(res: dict) -> list[dict]:
    """One row per model and lever over every run: step ms (median, and each run's), the gain against
    the same run's base (median), the floor, compile seconds; levers that failed say so."""
    runs = res["runs"] if res.get("bench") == "step-runs" else [res]
    out: dict[tuple, dict] = {}
    for i, run in enumerate(runs):
        base = {r["model"]: r["step_ms"] for r in run["rows"] if r.get("lever") == "base" and "step_ms" in r}
        for r in run["rows"]:
            key = (r["model"], r["lever"])
            row = out.setdefault(key, {"model": r["model"], "lever": r["lever"], "steps_ms": [], "gains_ms": [],
                                       "floor_ms": r.get("floor_ms"), "compile_s": [], "errors": []})
            if "step_ms" not in r:
                row["errors"].append(r.get("error") or r.get("skipped"))
                continue
            row["steps_ms"].append(r["step_ms"])
            row["compile_s"].append(r["first_step_s"])
            row["floor_ms"] = r["floor_ms"]
            if r["model"] in base:
                row["gains_ms"].append(round(base[r["model"]] - r["step_ms"], 4))
            for k in ("verify8_over_step", "rows4_over_rows1", "rows1_replay_ms", "rows2_replay_ms", "rows4_replay_ms",
                      "rows8_replay_ms", "graph_as_exact_as_eager"):
                if k in r:
                    row[k] = r[k]
    rows = []
    for row in out.values():
        s = row["steps_ms"]
        row["step_ms"] = round(statistics.median(s), 3) if s else None
        row["gain_ms"] = round(statistics.median(row["gains_ms"]), 3) if row["gains_ms"] else None
        row["runs"] = len(s)
        row["errors"] = [e for e in row["errors"] if e]
        rows.append(row)
    return rows


def best(rows: list[dict], model: str, levers=None, verify_guard: float | None = None) -> dict | None:
    """The fastest measured lever set of a model (median over runs), among `levers` if given; with
    verify_guard, only those whose verify of 8 tokens costs at most that many steps (a target's guard)."""
    c = [r for r in rows if r["model"] == model and r["step_ms"] and (levers is None or r["lever"] in levers)
         and (verify_guard is None or (r.get("verify8_over_step") or 99) <= verify_guard)]
    return min(c, key=lambda r: r["step_ms"]) if c else None

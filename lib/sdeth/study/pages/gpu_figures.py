"""Tables and plots of the recorded GPU results (reports/gpu/*.json): the mode benchmarks, the RTT sweeps,
the event model against every pipelined measurement, the draft's loop and the decode step's levers (20, 30, 40)."""
from __future__ import annotations

import functools

from ..results import caption, gpu_results, kernel_runs, step_runs


@functools.lru_cache(maxsize=1)
def _rechecked() -> tuple:
    """Every SD measurement on two GPUs predicted by the current model (study.predict.modelcheck), computed once."""
    from ..predict import modelcheck
    return tuple(modelcheck.recheck(gpu_results(), modes=None))


def current_predictions() -> dict:
    """(run, mode, probed round trip or None) -> the current model's speedup; None where the model is not valid
    for the run. Runs with both workers on one GPU have none (contended: not what the model describes)."""
    return {(r["run"], r["mode"], round(r["rtt probe ms"], 3) if r["bench"] == "rtt" else None):
            (r["current"] if r["valid"] else None) for r in _rechecked()}


def bench_table(benches: dict[str, dict]):
    """The rows of `python -m sdeth bench` results (name -> results JSON), one per pair and mode; `predicted` is
    the current model's (n/a where it does not describe the run)."""
    import pandas as pd
    model = current_predictions()
    rows = []
    for name, b in benches.items():
        for r in b["rows"]:
            rows.append({"run": name, "pair": b["config"]["pair"],
                         "acceptance": b.get("acceptance_kind") or b["acceptance"].split(":")[0],
                         "alpha set": b["config"].get("synthetic_alpha"),
                         "mode": r["mode"], "tokens/s": r["tokens_per_s"], "speedup": r["speedup"],
                         "95% low": r["speedup_ci95"][0], "95% high": r["speedup_ci95"][1],
                         "predicted": 1.0 if r["mode"] == "target-only" else model.get((name, r["mode"], None)),
                         "alpha measured": r.get("alpha"),
                         "tokens": r["output_tokens"], "identical": r["identical_to_target_only"]})
    return pd.DataFrame(rows)


def bench_components(benches: dict[str, dict]):
    """Per-round components of each SD mode (ms): target host work, GPU idle on each side, wire, and
    the pipelined draft's restart latency after a correction."""
    import pandas as pd
    rows = []
    for name, b in benches.items():
        for r in b["rows"]:
            c = r.get("components_ms_per_round")
            if not c:
                continue
            rows.append({"run": name, "mode": r["mode"], **{f"{k} ms": v for k, v in c.items()},
                         "link ms": r.get("link_ms_per_round"), "draft host ms": r.get("draft_host_ms_per_round"),
                         "bare rtt ms": r.get("bare_rtt_ms"),
                         "restart ms (median)": (r.get("restart_ms") or {}).get("median")})
    return pd.DataFrame(rows)


def plot_bench(benches: dict[str, dict]):
    """Speedup over target-only per mode, with 95% intervals, one group per run (name -> results)."""
    import matplotlib.pyplot as plt
    df = bench_table(benches)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(df) + 1.2))
    labels, y = [], 0
    for name in benches:
        for _, r in df[df["run"] == name].iterrows():
            ax.errorbar(r["speedup"], y, xerr=[[r["speedup"] - r["95% low"]], [r["95% high"] - r["speedup"]]],
                        fmt="o", color="C0", capsize=3)
            if r["predicted"] == r["predicted"] and r["predicted"]:      # not NaN: the model describes the run
                ax.plot(r["predicted"], y, "x", color="C3")
            labels.append(f"{name.removeprefix('bench_sd_')} ({r['acceptance']}, alpha {r['alpha set']}): {r['mode']}")
            y += 1
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set(yticks=range(len(labels)), yticklabels=labels,
           xlabel="speedup over target-only (x), 95% interval; red x: the current event model",
           title="SD modes on two GPUs: random weights, synthetic or trace-driven acceptance")
    ax.invert_yaxis()
    b = next(iter(benches.values()))
    kinds = sorted({x.get("acceptance_kind") or x["acceptance"].split(":")[0] for x in benches.values()})
    ax.figure.text(0.01, -0.02, caption(b["hardware"], f"measured timing, {' / '.join(kinds)} acceptance, "
                                        f"{b['rows'][0]['output_tokens']} tokens per mode"), fontsize=8)
    plt.show()
    return df


def rtt_points(sweeps: dict[str, dict]):
    """One row per sweep, round trip and mode: set and probed RTT, speedup with its interval, the model's,
    the outcome cache's hit rate (measured and predicted), identity."""
    import pandas as pd
    model = current_predictions()
    rows = []
    for name, b in sweeps.items():
        for p in b["points"]:
            rows.append({"run": name, "pair": b["config"]["pair"], "alpha set": b["config"].get("synthetic_alpha"),
                         "rtt set ms": p["rtt_set_ms"], "rtt probe ms": p["rtt_probe_ms"], "mode": p["mode"],
                         "speedup": p["speedup"], "95% low": p["speedup_ci95"][0], "95% high": p["speedup_ci95"][1],
                         "predicted": model.get((name, p["mode"], round(p["rtt_probe_ms"], 3))),
                         "hit rate": p.get("cache_hit_rate"),
                         "identical": p["identical_to_target_only"]})
    return pd.DataFrame(rows)


def plot_gpu_rtt(sweeps: dict[str, dict]):
    """Speedup against the probed round trip, per mode (with 95% intervals; dashed: the model), one panel per
    sweep; returns the break-even round trips."""
    import matplotlib.pyplot as plt
    import pandas as pd
    df = rtt_points(sweeps)
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4), squeeze=False)
    for ax, (name, b) in zip(axes[0], sweeps.items()):
        d = df[df["run"] == name]
        for i, mode in enumerate(b["modes"]):
            m = d[d["mode"] == mode]
            label = {"cached": "pipelined + outcome cache"}.get(mode, mode)
            ax.errorbar(m["rtt probe ms"], m["speedup"], yerr=[m["speedup"] - m["95% low"], m["95% high"] - m["speedup"]],
                        fmt="o-", color=f"C{i}", capsize=3, label=label)
            ax.plot(m["rtt probe ms"], m["predicted"], "--", color=f"C{i}", alpha=0.6)
        ax.axhline(1.0, color="grey", lw=0.8)
        ticks = sorted(d["rtt probe ms"].unique())
        ax.set(xscale="log", xticks=ticks, xlabel="round trip, as the link probe measured it (ms)",
               ylabel="speedup over target-only",
               title=f"{b['config']['pair']}, alpha {b['config'].get('synthetic_alpha')} ({b['acceptance_kind']})")
        ax.set_xticklabels([f"{t:.2g}" for t in ticks])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    b = next(iter(sweeps.values()))
    fig.text(0.01, -0.04, caption(b["hardware"], f"measured timing, {b['acceptance_kind']} acceptance; dashed: the current "
                                  "event model for the pipelined modes (study.predict.modelcheck), from each run's own components"),
             fontsize=8)
    plt.show()
    return pd.DataFrame([{"run": n, **{f"{m} break-even ms (interpolated)": "never" if v is None else v
                                       for m, v in b["break_even"].items()}}
                         for n, b in sweeps.items()])


# the groups of runs the model check reports on: (file name prefixes, what they have in common)
CHECK_GROUPS = ((("bench_cache", "bench_rtt"), "bench_cache_*, bench_rtt_* (the current protocol)"),
                (("bench_sd",), "bench_sd_* (the draft loop before its host work was cut)"))


def model_check():
    """The current event model against every pipelined measurement on two GPUs (study.predict.modelcheck), one row each,
    with the prediction stored with the run beside it. Returns (the rows the model is valid for, lines): the
    largest error over those rows, the same per group of runs with their dates, and each row left out with why."""
    import pandas as pd
    df = pd.DataFrame([r for r in _rechecked() if r["kind"] == "pipelined"])
    if df.empty:
        return df, "no pipelined measurement on two GPUs in reports/gpu"
    ok = df[df["valid"]]
    lines = [f"{len(ok)} measurements the model describes: the current model within "
             f"{ok['error current'].abs().max():.1%} of each (the predictions stored with the runs: within "
             f"{ok['error stored'].abs().max():.1%})"]
    results = gpu_results()
    for prefixes, label in CHECK_GROUPS:
        d = ok[ok["run"].str.startswith(prefixes)]
        if len(d):
            when = sorted(str(results[n].get("created", "?"))[:16].replace("T", " ") for n in d["run"].unique())
            lines.append(f"{label}, {when[0]} to {when[-1][11:]} UTC: {len(d)} points, current model "
                         f"{d['error current'].min():+.1%} to {d['error current'].max():+.1%}")
    for _, r in df[~df["valid"]].iterrows():
        model = f", current model {r['current']:.2f}x" if r["current"] == r["current"] and r["current"] else ""
        lines.append(f"left out: {r['run']} {r['mode']} (measured {r['measured']:.2f}x{model}): {r['why not']}")
    cols = ["run", "mode", "rtt probe ms", "measured", "95% low", "95% high", "stored", "current", "error stored",
            "error current", "hit rate", "hit rate predicted", "inputs"]
    return ok[cols].reset_index(drop=True), "\n".join(lines)


def draft_loop() -> "object":
    """The pipelined draft's loop, phase by phase (reports/gpu/draft_loop*.json; study.bench.draftloop): before and after
    the host work was cut, one row per model and variant."""
    import pandas as pd
    rows = []
    for name, g in gpu_results().items():
        if g.get("bench") != "draft-loop":
            continue
        for r in g["rows"]:
            if "error" not in r:
                rows.append({"run": name, "model": r["model"], "variant": r["variant"],
                             **{k.removesuffix("_ms") + " ms": r[k] for k in ("period_ms", "device_ms", "host_gap_ms",
                                                                              "launch_ms", "wait_ms")}})
    return pd.DataFrame(rows)


def step_levers():
    """The draft-step levers (reports/gpu/bench_step*.json) as a table: each model and lever, the step
    (median over runs), the gain against the same run's base, the bytes floor, compile seconds."""
    import pandas as pd
    from ..bench import step as stepbench
    res = step_runs()
    if not res:
        return "no step benchmark in reports/gpu (python -m sdeth bench step on a GPU host)"
    rows = stepbench.summary(res)
    df = pd.DataFrame([{"model": r["model"], "lever": r["lever"], "step ms": r["step_ms"], "runs": r["runs"],
                        "each run": ", ".join(f"{x:.3f}" for x in r["steps_ms"]), "gain ms": r["gain_ms"],
                        "floor ms": r["floor_ms"], "x floor": r["step_ms"] / r["floor_ms"] if r["step_ms"] else None,
                        "compile s": max(r["compile_s"]) if r["compile_s"] else None,
                        "verify 8 / step": r.get("verify8_over_step"), "4 rows / 1 row": r.get("rows4_over_rows1"),
                        "graph = eager": r.get("graph_as_exact_as_eager"),
                        "failed": "; ".join(dict.fromkeys(e.split(":")[0] for e in r["errors"])) or "-"}
                       for r in rows])
    return df.sort_values(["model", "step ms"]).set_index(["model", "lever"])


def step_goals():
    """The step goals (ms, batch 1, 512-token context) against the best measured lever set of each model."""
    import pandas as pd
    from ..bench import step as stepbench
    res = step_runs()
    if not res:
        return "no step benchmark in reports/gpu"
    rows = stepbench.summary(res)
    out = []
    for model, goal in (("Qwen3-1.7B", 1.2), ("Qwen3-0.6B", 0.9), ("Qwen3-8B", 4.7)):
        guard = 1.10 if model == "Qwen3-8B" else None      # the target keeps verify(8) <= 1.10 steps
        b = stepbench.best(rows, model, verify_guard=guard)
        base = stepbench.best(rows, model, ("base",))
        if b:
            out.append({"step": model, "base ms": base and base["step_ms"], "best ms": b["step_ms"],
                        "best lever": b["lever"], "goal ms": goal, "met": b["step_ms"] <= goal,
                        "floor ms": b["floor_ms"], "verify 8 / step": b.get("verify8_over_step")})
    return pd.DataFrame(out).set_index("step")


def kernel_levers():
    """The fused-kernel levers (`bench step --kernels`, reports/gpu/bench_step_kernels_*.json), every call: per model,
    rows, context and lever the step and the graph's replay (ms), kernels a step, the bytes floor, the gain over the
    same call's torch kernels, and the logits against torch's (max |diff|, argmax agreement over the rows)."""
    import pandas as pd
    runs = kernel_runs()
    if not runs:
        return "no fused-kernel benchmark in reports/gpu (python -m sdeth bench step --kernels ... on a GPU host)"
    rows = []
    for name, res in runs.items():
        for r in res["rows"]:
            if "step_ms" not in r:
                continue
            vs = r.get("vs_torch") or {}
            rows.append({"call": name.removeprefix("bench_step_kernels_"), "model": r["model"], "rows": r["rows"],
                         "context": r["context"], "lever": r["lever"], "step ms": r["step_ms"],
                         "replay ms": r.get("replay_ms"), "kernels a step": r.get("kernels_per_step"),
                         "floor ms": r["floor_ms"], "x floor": r["step_over_floor"], "gain ms": r.get("gain_ms", 0.0),
                         "vs torch: max diff": vs.get("max_abs_diff"), "vs torch: argmax": vs.get("argmax_agree"),
                         "graph vs eager: max diff": (r.get("graph_vs_eager") or {}).get("max_abs_diff")})
    df = pd.DataFrame(rows)
    df["kernels a step"] = df["kernels a step"].astype("Int64")
    return df.sort_values(["model", "rows", "context", "call"]).set_index(["model", "rows", "context", "call", "lever"])


def kernel_sd():
    """Colocated SD on one GPU with the draft's torch kernels and with kernels=auto (bench_colocated_kernels_*.json):
    the speedup over the same call's target alone, its interval, and greedy identity."""
    import pandas as pd
    rows = []
    for name, g in gpu_results().items():
        if name.startswith("bench_colocated_kernels_"):
            for r in g["rows"]:
                if r["mode"] != "target-only":
                    rows.append({"draft kernels": name.removeprefix("bench_colocated_kernels_"), "mode": r["mode"],
                                 "tok/s": r["tokens_per_s"], "speedup": r["speedup"],
                                 "95% interval": f"[{r['speedup_ci95'][0]:.3f}, {r['speedup_ci95'][1]:.3f}]",
                                 "identical to target-only": r["identical_to_target_only"],
                                 "requests x tokens": f"{g['config']['prompts']} x {g['config']['max_tokens']}"})
    return pd.DataFrame(rows).set_index("draft kernels") if rows else "no colocated SD run with fused kernels"


def kernel_profile():
    """Where a draft step's kernel time goes (reports/gpu/profile_step_kernels.json, torch.profiler over CUDA-graph
    replays): per model, rows, lever and cache slots (None: the 16 rows' batch cache), each kernel family's share,
    count and microseconds a step. The fused rows were profiled with the GEMV rule that preceded GEMV_TABLE (this
    run's sweep made the table); tuned: 1.08 ms at batch 1, 1.84 ms at 16 rows, bench_step_kernels_4.json."""
    import pandas as pd
    prof = gpu_results().get("profile_step_kernels")
    if not prof:
        return "no kernel profile in reports/gpu (scripts/gpu_step_profile.py on a GPU host)"
    rows = []
    for s in prof["steps"]:
        for fam, f in (s.get("families") or {}).items():
            rows.append({"model": s["model"], "rows": s["rows"], "lever": s["lever"], "cache slots": s.get("capacity"),
                         "step ms": s["step_ms"], "family": fam, "kernels a step": int(f["per_step"]),
                         "us a step": f["us_per_step"], "share": f["share"]})
    df = pd.DataFrame(rows)
    df["cache slots"] = df["cache slots"].astype("Int64")
    return df.set_index(["model", "rows", "lever", "cache slots", "step ms", "family"])


def _emulated_row(g: dict) -> dict:
    """What one bench_emulated_target_*.json says of its setting: the draft (model, kernels, GPU) and the target's
    times (source hardware, time field, whether the host's argmax was taken off its pace)."""
    from ...runtime.fastmodel import FastOptions
    c, te = g["config"], g.get("target_emulation") or {}
    resolved = next((r.get("config", {}).get("pair_resolved") for r in (g.get("runs") or {}).values()), None) or {}
    draft = (c.get("draft") or resolved.get("draft") or c["pair"]).removeprefix("random:")
    fast = (g.get("fast_options") or {}).get("draft")
    kernels = FastOptions.parse(fast).kernels if fast else f"impl {c.get('impl')}"
    # older files say it in prose only: "returns its time before the measured one" means taken off
    subtracted = te.get("host_argmax_subtracted", "before the measured" in te.get("host", ""))
    return {"draft": f"{draft} ({kernels})", "alpha set": c.get("synthetic_alpha"),
            "draft GPU": (g.get("draft_hardware") or g.get("hardware") or {}).get("label"),
            "target times": f"{te.get('model')} on {te.get('hardware')} ({te.get('time_field')})",
            "host argmax taken off": "yes" if subtracted else "no"}


def emulated_target_sd():
    """SD against an emulated target (`bench sd --emulate-target`, reports/gpu/bench_emulated_target_*.json): the
    draft on one GPU, the target's forwards paced at times measured on a GPU; per call and draft, each mode's
    speedup over the same call's target-only, its interval, the event model's, identity, and the pipelined
    round's wire, host and restart times. Replay-time files leave out the ~0.1 ms of launch and copy a GPU target
    pays a forward (the 'target times' column names the field)."""
    import pandas as pd
    rows = []
    for name, g in sorted(gpu_results().items()):
        if not name.startswith("bench_emulated_target_"):
            continue
        setting, call = _emulated_row(g), name.rsplit("_", 1)[-1]
        for r in g["rows"]:
            if r["mode"] == "target-only":
                continue
            c = r.get("components_ms_per_round") or {}
            rows.append({**setting, "call": int(call) if call.isdigit() else call, "mode": r["mode"],
                         "tok/s": r["tokens_per_s"], "speedup": r["speedup"],
                         "95% interval": f"[{r['speedup_ci95'][0]:.3f}, {r['speedup_ci95'][1]:.3f}]",
                         "event model": r.get("predicted_speedup"), "identical": r["identical_to_target_only"],
                         "wire ms a round": c.get("wire"), "target host ms a round": c.get("target_host"),
                         "restart ms (mean)": (r.get("restart_ms") or {}).get("mean")})
    if not rows:
        return "no emulated-target run in reports/gpu (python -m sdeth bench sd --emulate-target ...)"
    return pd.DataFrame(rows).set_index(["draft", "alpha set", "mode", "call"]).sort_index()

"""Results JSON -> tables, plots, HTML.

    python -m sdeth.study.report              # run every notebooks/NN_*.ipynb with papermill, render reports/
    python -m sdeth.study.report 00_provision # just one

Each notebook writes its results JSON to reports/<name>.json through `write_results`, with a
one-line `status`; the index links each rendered notebook and its JSON with that line.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time
import traceback
from pathlib import Path

from ..paths import REPO

NOTEBOOKS = REPO / "notebooks"
REPORTS = REPO / "reports"


def results_path(name: str, override: str = "") -> Path:
    """reports/<name>.json; $SDETH_REPORTS redirects it (tests use it to leave reports/ alone)."""
    if override:
        return Path(override)
    return Path(os.environ.get("SDETH_REPORTS") or REPORTS) / f"{name}.json"


def write_results(name: str, status: str, payload: dict, override: str = "") -> Path:
    """The last cell of every notebook: {status, created, ...payload} -> reports/<name>.json."""
    path = results_path(name, override)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"notebook": name, "status": status, "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **payload}
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def caption(hw: dict, what: str) -> str:
    """The line under every figure: what it shows, on which hardware."""
    return f"{what} | {hw.get('label', '?')}, torch {hw.get('torch', '?')}"


SUMMARY_COLUMNS = {"tokens_per_s": "tokens/s", "predicted_tokens_per_s": "predicted tokens/s", "tpot_ms": "TPOT ms",
                   "ttft_ms": "TTFT ms", "draft_acceptance_rate": "acceptance rate",
                   "mean_acceptance_length": "mean acceptance length", "alpha": "alpha",
                   "wire_ms_per_round": "wire ms/round", "bytes_per_round": "bytes/round",
                   "tokens_without_draft": "tokens without draft", "plain_steps": "plain target steps (pipelined)"}


def summary_table(runs: dict[str, dict]):
    """One row per run (label -> results dict), the summary fields that compare runs."""
    import pandas as pd
    rows = {label: {v: r["summary"].get(k) for k, v in SUMMARY_COLUMNS.items()} for label, r in runs.items()}
    df = pd.DataFrame(rows).T
    base = next((r for r in runs.values() if r["summary"]["mode"] == "target-only"), None)
    if base:
        df["speedup vs target-only"] = df["tokens/s"] / base["summary"]["tokens_per_s"]
    return df


def plot_breakdown(runs: dict[str, dict], hw: dict, title: str):
    """Milliseconds per output token, split into where the time went."""
    import matplotlib.pyplot as plt
    import pandas as pd
    per_tok = {label: {k: v * 1e3 / r["summary"]["output_tokens"] for k, v in r["summary"]["time_breakdown_s"].items()}
               for label, r in runs.items()}
    df = pd.DataFrame(per_tok).T.fillna(0.0)
    ax = df.plot.barh(stacked=True, figsize=(7, 0.6 * len(df) + 1.5))
    ax.set(xlabel="milliseconds per output token", title=title)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.invert_yaxis()
    ax.figure.text(0.01, -0.04, caption(hw, "measured"), fontsize=8)
    plt.show()
    return df


def gpu_results() -> dict[str, dict]:
    """The recorded GPU results (reports/gpu/*.json), by file stem; superseded runs (reports/gpu/earlier/) are
    left out."""
    d = REPORTS / "gpu"
    return {f.stem: json.loads(f.read_text()) for f in sorted(d.glob("*.json"))} if d.exists() else {}


def bench_table(benches: dict[str, dict]):
    """The rows of `python -m sdeth bench` results (name -> results JSON), one per pair and mode."""
    import pandas as pd
    rows = []
    for name, b in benches.items():
        for r in b["rows"]:
            rows.append({"run": name, "pair": b["config"]["pair"],
                         "acceptance": b.get("acceptance_kind") or b["acceptance"].split(":")[0],
                         "alpha set": b["config"].get("synthetic_alpha"),
                         "mode": r["mode"], "tokens/s": r["tokens_per_s"], "speedup": r["speedup"],
                         "95% low": r["speedup_ci95"][0], "95% high": r["speedup_ci95"][1],
                         "predicted": r["predicted_speedup"], "alpha measured": r.get("alpha"),
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
            if r["predicted"]:
                ax.plot(r["predicted"], y, "x", color="C3")
            labels.append(f"{name.removeprefix('bench_sd_')} ({r['acceptance']}, alpha {r['alpha set']}): {r['mode']}")
            y += 1
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set(yticks=range(len(labels)), yticklabels=labels, xlabel="speedup over target-only (x), 95% interval; x = model",
           title="SD modes on two GPUs: random weights, synthetic or trace-driven acceptance")
    ax.invert_yaxis()
    b = next(iter(benches.values()))
    kinds = sorted({x.get("acceptance_kind") or x["acceptance"].split(":")[0] for x in benches.values()})
    ax.figure.text(0.01, -0.02, caption(b["hardware"], f"measured timing, {' / '.join(kinds)} acceptance, "
                                        f"{b['rows'][0]['output_tokens']} tokens per mode"), fontsize=8)
    plt.show()
    return df


def rtt_results() -> dict[str, dict]:
    """The `bench rtt` results of reports/gpu (bench_rtt_*.json)."""
    return {n: g for n, g in gpu_results().items() if g.get("bench") == "rtt"}


def rtt_points(sweeps: dict[str, dict]):
    """One row per sweep, round trip and mode: set and probed RTT, speedup with its interval, the model's,
    the outcome cache's hit rate (measured and predicted), identity."""
    import pandas as pd
    rows = []
    for name, b in sweeps.items():
        for p in b["points"]:
            rows.append({"run": name, "pair": b["config"]["pair"], "alpha set": b["config"].get("synthetic_alpha"),
                         "rtt set ms": p["rtt_set_ms"], "rtt probe ms": p["rtt_probe_ms"], "mode": p["mode"],
                         "speedup": p["speedup"], "95% low": p["speedup_ci95"][0], "95% high": p["speedup_ci95"][1],
                         "predicted": p["predicted_speedup"], "hit rate": p.get("cache_hit_rate"),
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
        ax.set(xscale="symlog", xlabel="round trip, as the link probe measured it (ms)", ylabel="speedup over target-only",
               title=f"{b['config']['pair']}, alpha {b['config'].get('synthetic_alpha')} ({b['acceptance_kind']})")
        ax.legend(fontsize=8)
    b = next(iter(sweeps.values()))
    fig.text(0.01, -0.04, caption(b["hardware"], f"measured timing, {b['acceptance_kind']} acceptance; dashed: the event "
                                  "model from each run's own components"), fontsize=8)
    plt.show()
    return pd.DataFrame([{"run": n, **{f"{m} break-even ms": v for m, v in b["break_even"].items()}}
                         for n, b in sweeps.items()])


def render(name: str, parameters: dict | None = None) -> tuple[bool, str]:
    """Execute notebooks/<name>.ipynb headless and render reports/<name>.html. Returns (ok, status)."""
    import nbformat
    import papermill as pm
    from nbconvert import HTMLExporter
    src = NOTEBOOKS / f"{name}.ipynb"
    executed = REPORTS / f"{name}.ipynb"
    REPORTS.mkdir(exist_ok=True)
    ok, err = True, ""
    try:
        pm.execute_notebook(str(src), str(executed), parameters=parameters or {}, cwd=str(NOTEBOOKS),
                            progress_bar=False, kernel_name="python3")
    except Exception as e:  # a failed notebook is still rendered, with its error
        ok, err = False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    if executed.exists():
        body, _ = HTMLExporter().from_notebook_node(nbformat.read(str(executed), as_version=4))
        (REPORTS / f"{name}.html").write_text(body)
    status = err
    if ok:
        res = results_path(name)
        status = json.loads(res.read_text()).get("status", "ran") if res.exists() else "ran (no results JSON)"
    return ok, status


# what kind of figures each report holds (the index says so beside each)
KINDS = {"00_provision": "measured", "10_colocated": "measured", "15_acceptance": "measured and modelled",
         "20_ethernet": "measured on the CPU testbed; recorded two-GPU runs with synthetic or trace-driven acceptance",
         "30_writeup": "reads the results of the others", "40_heterogeneous": "measured, emulated and modelled"}


def write_index(rows: list[tuple[str, bool, str]]) -> Path:
    """reports/index.html: the answer first (the decision and the milestones, from study.status), then one
    line per report with the kind of its figures and its hardware."""
    from . import status as st
    items = []
    for name, ok, status in rows:
        js = f' · <a href="{name}.json">results JSON</a>' if (REPORTS / f"{name}.json").exists() else ""
        res = results_path(name)
        hw = (json.loads(res.read_text()).get("hardware") or {}).get("label", "") if res.exists() else ""
        kind = KINDS.get(name, "")
        about = html.escape("; ".join(x for x in (kind, hw and f"on {hw}") if x))
        mark = "✓" if ok else "✗ failed:"
        items.append(f'<li><a href="{name}.html">{name}</a>{js} <small>({about})</small><br>'
                     f'<small>{mark} {html.escape(status)}</small></li>')
    ms = st.milestones()
    table = "".join(f"<tr><td>{m.id}</td><td>{html.escape(m.title)}</td><td><b>{m.status}</b></td>"
                    f"<td>{'<br>'.join(html.escape(f.label + ': ' + f.shown + ' (' + f.kind + ')') for f in m.figures[:2])}"
                    f"{'<br><small>' + html.escape(m.note) + '</small>' if m.note else ''}</td></tr>" for m in ms)
    page = f"""<!doctype html><meta charset="utf-8"><title>sd-ethernet reports</title>
<style>body{{font-family:sans-serif;max-width:52em;margin:2em auto}} li{{margin:.8em 0}}</style>
<h1>sd-ethernet: speculative decoding with the draft and the target on different machines</h1>
<p><b>The answer so far.</b> {html.escape(st.decision(ms))}</p>
<table border="1" cellpadding="4" style="border-collapse:collapse;font-size:90%">
<tr><th></th><th>milestone</th><th>status</th><th>key figures (python -m sdeth status has them all, with sources)</th></tr>
{table}</table>
<p>Rendered by <code>make report</code> on {html.escape(time.strftime('%Y-%m-%d %H:%M %Z'))}. Each report states
the hardware, models and settings behind its numbers; synthetic or emulated figures are labelled so.</p>
<ul>{''.join(items)}</ul>"""
    path = REPORTS / "index.html"
    path.write_text(page)
    return path


# the notebooks' test runs (make test): every cell and code path of the report runs, on fewer and shorter
# requests (the reports themselves use each notebook's own defaults)
TEST_PARAMETERS = {
    # vLLM's engine starts take a minute each on 2 cores: its runs are tested in tests/test_vllm_baseline.py,
    # and the notebooks run them in `make report`
    "10_colocated": {"prompts": "sharegpt:4", "max_tokens": 16, "k_sweep": "1,3", "with_vllm": False},
    "15_acceptance": {"prompts": "sharegpt:2", "max_tokens": 12, "with_vllm": False},
    "20_ethernet": {"prompts": "sharegpt:2", "max_tokens": 16, "sweep_rtts": "0,5", "rtt_ms": 5.0, "probe_scale": 0.2},
    "40_heterogeneous": {"prompts": "sharegpt:2", "max_tokens": 12, "emulate": "corsair:Qwen3-1.7B:fp8"},
}


def test_copies(out_dir: Path, names) -> list[Path]:
    """Each notebook with its TEST_PARAMETERS injected (papermill, not executed), for nbval."""
    import papermill as pm
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = out_dir / f"{name}.ipynb"
        pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(path), parameters=TEST_PARAMETERS.get(name, {}),
                            prepare_only=True, progress_bar=False)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdeth.study.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="notebook names (default: all notebooks/NN_*.ipynb)")
    ap.add_argument("--test-copies", metavar="DIR", help="instead: write the notebooks with their test parameters "
                    "(TEST_PARAMETERS) into DIR, not executed (make test runs them under nbval)")
    a = ap.parse_args(argv)
    names = a.names or sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if a.test_copies:
        for path in test_copies(Path(a.test_copies), names):
            print(f"report: {path}")
        return 0
    rows = []
    for name in names:
        if not (NOTEBOOKS / f"{name}.ipynb").exists():
            print(f"report: no notebook {name!r} in {NOTEBOOKS}", file=sys.stderr)
            return 2
        print(f"report: running {name} ...", flush=True)
        t0 = time.time()
        try:
            ok, status = render(name)
        except Exception:
            ok, status = False, traceback.format_exc().strip().splitlines()[-1]
        print(f"report: {name}: {'ok' if ok else 'FAILED'} in {time.time() - t0:.0f} s: {status}", flush=True)
        rows.append((name, ok, status))
    # keep the index complete when only some notebooks were re-run
    done = {r[0] for r in rows}
    for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if p.stem not in done and (REPORTS / f"{p.stem}.html").exists():
            res = results_path(p.stem)
            rows.append((p.stem, True, json.loads(res.read_text()).get("status", "ran") if res.exists() else "ran"))
    rows.sort()
    print(f"report: wrote {write_index(rows)}")
    return 0 if all(ok for _, ok, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------- GPU results
def model_check():
    """The event model now against every pipelined measurement on GPUs (study.modelcheck.recheck), one row each,
    with the prediction made when the run was made beside it; and a line per kind of input: the largest error."""
    import pandas as pd
    from . import modelcheck
    df = pd.DataFrame(modelcheck.recheck(gpu_results()))
    if df.empty:
        return df, "no pipelined GPU measurement in reports/gpu"
    valid = df["valid"]
    lines = [f"{len(df[valid])} measurements with valid inputs: the model now within {df[valid]['error now'].abs().max():.1%} "
             f"of each (then: {df[valid]['error then'].abs().max():.1%})"]
    for label, mask in (("sixth-session runs (the current protocol: bench_cache_*, bench_rtt_*)",
                         df["run"].str.startswith(("bench_cache", "bench_rtt"))),
                        ("fourth-session runs (bench_sd_*, older draft loop)", df["run"].str.startswith("bench_sd"))):
        d = df[mask & valid]
        if len(d):
            lines.append(f"{label}: {len(d)} points, error now {d['error now'].min():+.1%} to {d['error now'].max():+.1%}")
    return df, "\n".join(lines)


def draft_loop() -> "object":
    """The pipelined draft's loop, phase by phase (reports/gpu/draft_loop*.json; study.draftloop): before and after
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


def bench_sd_results() -> dict[str, dict]:
    """The `bench sd` results of reports/gpu (bench_sd_*.json and the real embedded pair's identity run)."""
    return {n: g for n, g in gpu_results().items() if g.get("bench") == "sd"}


def gpu_costs(bench: dict):
    """The cost model's components from one `bench sd` result: the target step (target-only), the draft
    step and the target's verify cost per width (every SD mode's measured widths)."""
    from ..costmodel import Costs
    runs = bench["runs"]
    verify: dict[int, float] = {}
    for r in runs.values():
        verify.update({int(m): v for m, v in (r["summary"].get("costs") or {}).get("verify_s", {}).items()})
    sync = runs.get("sync") or next(r for n, r in runs.items() if n != "target-only")
    return Costs(runs["target-only"]["summary"]["costs"]["target_step"], sync["summary"]["costs"]["draft_step"], verify)


def step_runs() -> dict | None:
    """Every `bench step` run in reports/gpu (bench_step*.json: single runs, or several kept together)."""
    runs = []
    for name, g in gpu_results().items():
        if name.startswith("bench_step"):
            runs += g["runs"] if g.get("bench") == "step-runs" else [g]
    return {"bench": "step-runs", "runs": runs} if runs else None


def step_levers():
    """The draft-step levers (reports/gpu/bench_step*.json) as a table: each model and lever, the step
    (median over runs), the gain against the same run's base, the bytes floor, compile seconds."""
    import pandas as pd
    from . import stepbench
    res = step_runs()
    if not res:
        return "no step benchmark in reports/gpu (python -m sdeth bench step on a GPU host)"
    rows = stepbench.summary(res)
    df = pd.DataFrame([{"model": r["model"], "lever": r["lever"], "step ms": r["step_ms"], "runs": r["runs"],
                        "each run": ", ".join(f"{x:.3f}" for x in r["steps_ms"]), "gain ms": r["gain_ms"],
                        "floor ms": r["floor_ms"], "x floor": r["step_ms"] / r["floor_ms"] if r["step_ms"] else None,
                        "compile s": max(r["compile_s"]) if r["compile_s"] else None,
                        "verify 8 / step": r.get("verify8_over_step"), "4 rows / 1 row": r.get("rows4_over_rows1"),
                        "graph = eager": r.get("graph_as_exact_as_eager"), "failed": "; ".join(r["errors"])[:60]}
                       for r in rows])
    return df.sort_values(["model", "step ms"]).set_index(["model", "lever"])


def step_goals():
    """The draft-step issue's goals against the best measured lever set of each model."""
    import pandas as pd
    from . import stepbench
    res = step_runs()
    if not res:
        return "no step benchmark in reports/gpu"
    rows = stepbench.summary(res)
    out = []
    for model, goal, moon in (("Qwen3-1.7B", 1.2, 1.0), ("Qwen3-0.6B", 0.9, 0.6), ("Qwen3-8B", 4.7, 4.4)):
        guard = 1.10 if model == "Qwen3-8B" else None      # the target keeps verify(8) <= 1.10 steps
        b = stepbench.best(rows, model, verify_guard=guard)
        base = stepbench.best(rows, model, ("base",))
        if b:
            out.append({"step": model, "base ms": base and base["step_ms"], "best ms": b["step_ms"],
                        "best lever": b["lever"], "goal ms": goal, "moonshot ms": moon, "met": b["step_ms"] <= goal,
                        "floor ms": b["floor_ms"], "verify 8 / step": b.get("verify8_over_step")})
    return pd.DataFrame(out).set_index("step")


def h200_costs() -> dict:
    """The cost model's components per user draft (Qwen3-0.6B / 1.7B shapes) from the two-GPU benchmarks."""
    benches = bench_sd_results()
    return {name: gpu_costs(benches[f"bench_sd_{tag}"]) for name, tag in (("Qwen3-0.6B", "0.6b"), ("Qwen3-1.7B", "1.7b"))
            if f"bench_sd_{tag}" in benches}


# ---------------------------------------------------------------------------- notebook figures (10, 20, 00)
def plot_k_sweep(ks: dict, hw: dict, what: str):
    """10_colocated: vLLM's rate against k at the measured alpha, and the speedup per k, measured and
    modelled (ks: summary.k_sweep's result). Returns the table."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from .. import metrics
    df = pd.DataFrame(ks["rows"]).set_index("k")
    best = ks["best_k"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    kk = list(range(1, int(df.index.max()) + 1))
    ax1.plot(kk, [metrics.rate_from_alpha(ks["alpha"], x) for x in kk], label=f"rate(alpha={ks['alpha']:.2f}, k)")
    ax1.scatter(df.index, df["rate"], c="C3", zorder=3, label="measured rate")
    ax1.set(xlabel="k", ylabel="draft acceptance rate", title="vLLM's rate falls with k")
    ax1.legend(fontsize=8)
    ax2.plot(df.index, df["predicted"], marker="x", label="cost model")
    ax2.scatter(df.index, df["speedup"], c="C3", zorder=3, label="measured")
    ax2.axhline(1, c="gray", ls="--")
    ax2.set(xlabel="k", ylabel="speedup over target-only", title=f"best k by the model: {best[0]} ({best[1]:.2f}x)")
    ax2.legend(fontsize=8)
    fig.text(0.01, -0.06, caption(hw, what), fontsize=8)
    plt.show()
    return df


def plot_rtt_sweep(sw: dict, rtts, hw: dict, title: str) -> dict:
    """20_ethernet: speedup against injected round trip, measured points and the cost model's curves from
    the sweep's own components (the relay's own delay, measured at the smallest RTT, is added to the
    model's round trip). Returns {"table", "curves", "relay_base_rtt_ms", "crossover"}."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from .summary import crossover, find_run, model_curves
    table = pd.DataFrame(sw["table"])
    base_rtt = find_run(sw["runs"], "sd", "ethernet", min(rtts))["summary"]["wire_ms_per_round"] - min(rtts)
    fine = sorted(set(rtts) | {x / 4 for x in range(0, 4 * int(max(rtts)) + 1)})
    curves = pd.DataFrame(model_curves(sw["runs"], [r + base_rtt for r in fine]))
    curves["rtt_ms"] -= base_rtt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, (mode, g) in enumerate(curves.groupby("mode")):
        ax.plot(g["rtt_ms"], g["speedup"], c=f"C{i}", label=f"{mode}: model")
        pts = table[(table["mode"] == mode) & (table["placement"] == "ethernet")]
        ax.scatter(pts["rtt_ms"], pts["speedup"], c=f"C{i}", marker="o", zorder=3, label=f"{mode}: measured")
    col = table[table["mode"] == "sync SD (colocated)"].iloc[0]
    ax.axhline(col["speedup"], c="C2", ls=":", label="colocated SD: measured")
    ax.axhline(1, c="gray", ls="--", label="target only")
    ax.set(xscale="symlog", xticks=list(rtts), xticklabels=[f"{r:g}" for r in rtts], xlabel="injected round trip (ms)",
           ylabel="speedup over target-only", title=title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.figure.text(0.01, -0.1, caption(hw, "measured points; lines: cost model from this sweep's components"), fontsize=8)
    plt.show()
    curves_rows = curves.to_dict("records")
    return {"table": table, "curves": curves_rows, "relay_base_rtt_ms": base_rtt,
            "crossover": crossover(sw["table"], curves_rows)}


def probe_table(link: list[dict]):
    """The link probe's scenarios: RTT and each direction's one-way delay as read naively, by NTP's
    correction, and with the true clock offset (ms, medians)."""
    import pandas as pd
    rows = [{"scenario": r["scenario"], "RTT p50": r["naive"]["rtt_ms"]["p50"], "RTT p90": r["naive"]["rtt_ms"]["p90"],
             "naive t->d": r["naive"]["up_ms"]["p50"], "naive d->t": r["naive"]["down_ms"]["p50"],
             "NTP t->d": r["ntp"]["up_ms"]["p50"], "NTP d->t": r["ntp"]["down_ms"]["p50"],
             "true t->d": r["true_offset"]["up_ms"]["p50"], "true d->t": r["true_offset"]["down_ms"]["p50"]} for r in link]
    return pd.DataFrame(rows).set_index("scenario")


def draft_card(card: dict):
    """00_provision: the embedded draft's card: held-out agreement after each training round, and the last
    round's training curve."""
    import matplotlib.pyplot as plt
    import pandas as pd
    ev = card["eval"]
    from ..models.distill import card_rounds
    rounds = card_rounds(card)
    df = pd.DataFrame([{"round": i + 1, "start": (r.get("recipe") or {}).get("init") or
                        f"the target's first {card['layers']} layers",
                        "training (s)": r["train_seconds"], "steps": r.get("steps_done"),
                        "held-out agreement before": r.get("before"),
                        "after": r["greedy_agreement"]} for i, r in enumerate(rounds)]
                      ).set_index("round")
    print(f"held-out positions: {ev['positions']} ({ev['prompts']}); trained on {card['train_tokens']:,} target tokens "
          f"on {card['hardware']}; {len(rounds)} round(s), {sum(r['train_seconds'] for r in rounds) / 60:.1f} min in "
          f"all; sampled acceptance at T=1 now {ev['sampled_acceptance_t1']}; last recipe: {card['recipe']}")
    h = pd.DataFrame(card["history"])
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(h["s"], h["train_agreement"], marker=".", label="training batches")
    ax.axhline(ev["before_training"]["greedy_agreement"], ls=":", c="gray", label="held-out, before this round")
    ax.axhline(ev["greedy_agreement"], ls="--", c="gray", label="held-out, after it")
    ax.set(xlabel="training time (s)", ylabel="greedy agreement (fraction)",
           title=f"Draft distillation, round {len(rounds)}: agreement with the target")
    ax.legend(loc="lower right", fontsize=8)
    fig.text(0.01, -0.08, f"{card['layers']}-layer draft of {card['target']}, trained on {card['hardware']}", fontsize=8)
    plt.show()
    return df


def draft_variants():
    """The embedded draft's alpha in other numerics and with a pruned output layer (reports/draft_variants_embedded.json)."""
    import pandas as pd
    p = REPORTS / "draft_variants_embedded.json"
    if not p.exists():
        return "no draft-variant figures (python -m sdeth draft-variants)"
    d = json.loads(p.read_text())
    print(f"{d['acceptance']}; {d['prompts']} x {d['max_new']} tokens; {d['hardware']['label']}")
    return pd.DataFrame(d["rows"]).set_index("variant")[["dtype", "fast", "greedy_agreement", "se", "cost", "positions"]]


def plot_design_map(maps: dict, draft_steps_ms, rtts_ms, points: list[dict], measured: list[dict]):
    """40_heterogeneous: modelled speedup of pipelined SD over (draft step, round trip), one panel per target and
    alpha, with each device profile's draft step and each measured or emulated run marked."""
    import matplotlib.pyplot as plt
    import numpy as np
    n = len(maps)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4), sharey=True, squeeze=False)
    for ax, (title, grid) in zip(axes[0], maps.items()):
        g = np.array(grid)
        im = ax.contourf(rtts_ms, draft_steps_ms, g, levels=[0, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0], cmap="RdYlGn")
        cs = ax.contour(rtts_ms, draft_steps_ms, g, levels=[1.0, 2.0], colors="k", linewidths=0.8)
        ax.clabel(cs, fmt="%gx", fontsize=7)
        for p in points:
            ax.axhline(p["step_ms"], color="C0", lw=0.5, ls=":")
            ax.text(rtts_ms[-1], p["step_ms"], f" {p['device']} {p['draft'].split()[-1]}", fontsize=6, va="center")
        for m in measured:
            if m.get("panel") == title:
                ax.plot(m["rtt_ms"], m["draft_step_ms"], "k*" if m["kind"] == "measured" else "bs", ms=6)
        ax.set(xscale="log", yscale="log", title=title, xlabel="round trip (ms)")
    axes[0][0].set_ylabel("draft step (ms)")
    fig.colorbar(im, ax=axes[0].tolist(), label="speedup over target-only (modelled)")
    fig.text(0.01, -0.08, "modelled: sdeth.costmodel's pipelined event model; lines: device profiles (params/devices); "
             "star: measured, square: emulated", fontsize=8)
    plt.show()

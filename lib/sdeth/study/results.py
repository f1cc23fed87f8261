"""Results I/O: where each notebook's results JSON lives, writing it, and reading the recorded GPU results.

A notebook's last cell calls `write_results`; reports/<name>.json then holds {notebook, status, created, ...}.
The GPU results are the JSON files of reports/gpu/ (superseded runs in reports/gpu/earlier/ are left out).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..paths import REPO

NOTEBOOKS = REPO / "notebooks"
# results files read both by the bench room (the event model's inputs) and by the status above it, named once here
# the draft server's `bench streams` calls with the stream timeline and the bigger targets (one H200, a file a call)
SERVER_STREAMS = ("reports/gpu/bench_streams_server_6.json", "reports/gpu/bench_streams_server_7.json")
# the step policies side by side (policy, sync, offered at each point; the restart in server periods), one H200, a
# file a call; the first with the server reading its socket while a step runs, the later two without (the default)
POLICY_STREAMS = tuple(f"reports/gpu/bench_streams_server_{n}.json" for n in (9, 10, 11))
# the verdict cache measured on the CPU (embedded pair) and modelled on H200 components (`bench ssd-cpu`)
SSD_CPU = "reports/ssd_cpu.json"
# the step policies on the CPU testbed (embedded pair, the draft server on a core of its own; `bench ssd-cpu --specs
# off --policies policy,sync,offered`): tokens/s per policy, and the restart in server periods; its repeats beside it,
# policy_cpu_2.json, ... (`make bench-policy-cpu REPEAT=N`)
POLICY_CPU = "reports/policy_cpu.json"
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


def gpu_results() -> dict[str, dict]:
    """The recorded GPU results (reports/gpu/*.json), by file stem; superseded runs (reports/gpu/earlier/) are
    left out."""
    d = REPORTS / "gpu"
    return {f.stem: json.loads(f.read_text()) for f in sorted(d.glob("*.json"))} if d.exists() else {}


def gpu_state() -> tuple:
    """What reports/gpu holds now, as a key for what is read from it (each JSON's name, size and time): a reader that
    caches by it reads again only when a result is added or rewritten."""
    d = REPORTS / "gpu"
    return (str(d),) + tuple((f.name, s.st_size, s.st_mtime_ns) for f in sorted(d.glob("*.json"))
                             for s in [f.stat()]) if d.exists() else (str(d),)


def vllm_study_results() -> dict | None:
    """The committed vLLM study (`python -m sdeth bench vllm`: reports/vllm_remote_cpu.json), or None."""
    path = REPORTS / "vllm_remote_cpu.json"
    return json.loads(path.read_text()) if path.exists() else None


def rtt_results() -> dict[str, dict]:
    """The `bench rtt` results of reports/gpu (bench_rtt_*.json)."""
    return {n: g for n, g in gpu_results().items() if g.get("bench") == "rtt"}


def bench_sd_results() -> dict[str, dict]:
    """The `bench sd` results of reports/gpu (bench_sd_*.json and the real embedded pair's identity run)."""
    return {n: g for n, g in gpu_results().items() if g.get("bench") == "sd"}


def step_runs() -> dict | None:
    """Every `bench step` run in reports/gpu (bench_step*.json: single runs, or several kept together)."""
    runs = []
    for name, g in gpu_results().items():
        if name.startswith("bench_step") and g.get("bench") in ("step", "step-runs"):   # (step-kernels: their own)
            runs += g["runs"] if g.get("bench") == "step-runs" else [g]
    return {"bench": "step-runs", "runs": runs} if runs else None


def kernel_runs() -> dict[str, dict]:
    """The fused-kernel lever runs of `bench step --kernels` (reports/gpu/bench_step_kernels_*.json), by file stem."""
    return {n: g for n, g in gpu_results().items() if g.get("bench") == "step-kernels"}


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


def h200_costs() -> dict:
    """The cost model's components per user draft (Qwen3-0.6B / 1.7B shapes) from the two-GPU benchmarks."""
    benches = bench_sd_results()
    return {name: gpu_costs(benches[f"bench_sd_{tag}"]) for name, tag in (("Qwen3-0.6B", "0.6b"), ("Qwen3-1.7B", "1.7b"))
            if f"bench_sd_{tag}" in benches}

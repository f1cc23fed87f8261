"""Results JSON -> tables, plots, HTML: the notebooks' one import (`from sdeth.study.pages import report`) and the
command that renders them.

    python -m sdeth.study.pages.report              # run every notebooks/NN_*.ipynb with papermill, render reports/
    python -m sdeth.study.pages.report 00_provision # just one
    python -m sdeth.study.pages.report --test-copies DIR   # the notebooks with their test parameters, for nbval

Each notebook writes its results JSON to reports/<name>.json through `write_results`, with a one-line `status`;
the index links each rendered notebook and its JSON with that line. The work lives in:
`results` (results I/O), `notebook_run` (papermill and HTML), `index` (reports/index.html), `run_figures` (the
notebooks' own runs) and `gpu_figures` (the recorded GPU results).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from .run_figures import (clip_to_measured, draft_card, draft_variants, plot_breakdown,  # noqa: F401
                          plot_design_map, plot_k_sweep, plot_rtt_sweep, probe_table, show_figures_with_alt_text,
                          summary_table, view)
from .gpu_figures import (bench_components, bench_table, draft_loop, model_check, plot_bench,  # noqa: F401
                          plot_gpu_rtt, rtt_points, step_goals, step_levers, kernel_levers, kernel_sd,
                          kernel_profile, emulated_target_sd)
from .index import write_index
from .notebook_run import TEST_PARAMETERS, render, test_copies  # noqa: F401
from ..results import (NOTEBOOKS, REPORTS, bench_sd_results, caption, gpu_costs, gpu_results,  # noqa: F401
                      h200_costs, results_path, rtt_results, step_runs, vllm_study_results, write_results)

show_figures_with_alt_text()      # in a notebook's kernel: every figure's caption becomes its alt text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdeth.study.pages.report", description=__doc__.split("\n\n")[0])
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

"""Running a notebook headless (papermill) and rendering it to reports/<name>.html; the notebooks' test copies."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .results import NOTEBOOKS, REPORTS, results_path


# The kernel of a rendered notebook inherits these: no progress bars (tqdm, Hugging Face), and no warning that a
# notebook without ipywidgets cannot draw them (it prints the library's path).
QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
         "PYTHONWARNINGS": "ignore:IProgress not found"}


def render(name: str, parameters: dict | None = None) -> tuple[bool, str]:
    """Execute notebooks/<name>.ipynb headless and render reports/<name>.html. Returns (ok, status)."""
    import nbformat
    import papermill as pm
    from nbconvert import HTMLExporter
    src = NOTEBOOKS / f"{name}.ipynb"
    executed = REPORTS / f"{name}.ipynb"
    REPORTS.mkdir(exist_ok=True)
    ok, err = True, ""
    os.environ.update(QUIET)
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


# the notebooks' test runs (make test): every cell and code path of the report runs, on fewer and shorter
# requests (the reports themselves use each notebook's own defaults)
TEST_PARAMETERS = {
    # vLLM's engine starts take a minute each on 2 cores: its runs are tested in tests/test_vllm_baseline.py,
    # and the notebooks run them in `make report`
    "10_colocated": {"prompts": "sharegpt:4", "max_tokens": 16, "k_sweep": "1,3", "with_vllm": False},
    "15_acceptance": {"prompts": "sharegpt:2", "max_tokens": 12, "with_vllm": False},
    "20_ethernet": {"prompts": "sharegpt:2", "max_tokens": 16, "sweep_rtts": "0,5", "rtt_ms": 5.0, "probe_scale": 0.2},
    "25_draft_server": {"prompts": "sharegpt:4", "max_tokens": 12},
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

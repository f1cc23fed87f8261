"""Running a notebook headless (papermill) and rendering it to reports/<name>.html; the notebooks' test copies."""
from __future__ import annotations

import html
import json
import os
from pathlib import Path

from ..results import NOTEBOOKS, REPORTS, results_path


# The kernel of a rendered notebook inherits these: no progress bars (tqdm, Hugging Face), and no warning that a
# notebook without ipywidgets cannot draw them (it prints the library's path).
QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
         "PYTHONWARNINGS": "ignore:IProgress not found"}


def render(name: str, parameters: dict | None = None) -> tuple[bool, str]:
    """Execute notebooks/<name>.ipynb headless and render reports/<name>.html. Returns (ok, status)."""
    import nbformat
    import papermill as pm
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
        (REPORTS / f"{name}.html").write_text(to_html(nbformat.read(str(executed), as_version=4)))
    status = err
    if ok:
        res = results_path(name)
        status = json.loads(res.read_text()).get("status", "ran") if res.exists() else "ran (no results JSON)"
    return ok, status


def title_of(nb) -> str:
    """The notebook's first Markdown heading, without its '#'s: the rendered page's title."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip().replace("`", "")
    return "sd-ethernet report"


NO_ALT = 'alt="No description has been provided for this image"'


def add_alt_text(nb) -> list[str]:
    """Every image output's alt text, in order: its own (figures drawn through `report` carry their titles and
    caption), else the heading of the section it sits in, which is then written into the output's metadata."""
    heading, alts = title_of(nb), []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heads = [ln.lstrip("#").strip() for ln in cell.source.splitlines() if ln.startswith("#")]
            heading = heads[-1].replace("`", "") if heads else heading
            continue
        for out in cell.get("outputs", []):
            for mime in ("image/png", "image/jpeg", "image/svg+xml"):
                if mime in out.get("data", {}):
                    md = out.setdefault("metadata", {}).setdefault(mime, {})
                    md["alt"] = md.get("alt") or f"Figure: {heading}"
                    alts.append(md["alt"])
    return alts


def to_html(nb) -> str:
    """A executed notebook as the report shows it: its first heading as the page's title, the code cells hidden
    (they stay in the notebook), alt text on every figure, and each glossary term's first use linked."""
    from nbconvert import HTMLExporter
    from ..status.glossary import link_first_use
    alts = add_alt_text(nb)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title_of(nb)}})
    for alt in alts:         # the lab template writes no alt text; the exporter then puts in a placeholder
        body = body.replace(NO_ALT, f'alt="{html.escape(alt, quote=True)}"', 1)
    return link_first_use(body)


# the notebooks' test runs (make test): every cell and code path of the report runs, on fewer and shorter
# requests (the reports themselves use each notebook's own defaults)
TEST_PARAMETERS = {
    # vLLM's engine starts take a minute each on 2 cores: its runs are tested in tests/test_vllm_baseline.py,
    # and the notebooks run them in `make report`
    "10_colocated": {"prompts": "sharegpt:2", "max_tokens": 12, "k_sweep": "1,3", "with_vllm": False},
    "15_acceptance": {"prompts": "sharegpt:2", "max_tokens": 12, "with_vllm": False},
    "20_ethernet": {"prompts": "sharegpt:2", "max_tokens": 12, "sweep_rtts": "0,5", "rtt_ms": 5.0, "probe_scale": 0.2},
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

"""Every name a notebook reads is defined in it (by a cell, an import or the parameters cell): a name left
behind when a cell's work moves into the library fails here, not after minutes of nbval."""
import ast
import builtins
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def undefined_names(src: str) -> set[str]:
    tree = ast.parse(src)
    defined = set(dir(builtins)) | {"display", "get_ipython"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - defined


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_name_a_notebook_reads_is_defined_in_it(nb):
    cells = json.loads(nb.read_text())["cells"]
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert not undefined_names(src), f"{nb.name} reads names it never defines"


def test_the_check_catches_a_name_left_behind():
    assert undefined_names("prov = 1\nprint(nodes)") == {"nodes"}
    assert not undefined_names("import pandas as pd\nx = [y for y in range(3)]\npd.DataFrame(x)")

"""The package's layers: each imports only layers below it (function-level imports included), no import
cycle anywhere, the place layer and the wire's protocol free of torch. Parses the source; imports nothing."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lib" / "sdeth"

# lowest first; a module may import its own layer and those before it
LAYERS = [
    ("leaves", {"sdeth", "sdeth.paths", "sdeth.hardware", "sdeth.metrics", "sdeth.costmodel", "sdeth.envcheck",
                "sdeth.devices"}),
    ("models", {"sdeth.models"}),
    ("runtime", {"sdeth.runtime"}),
    ("wire", {"sdeth.wire"}),
    ("place", {"sdeth.place"}),
    # the study's rooms, lowest first: what every run shares (its configuration, results files and summaries),
    # the vLLM study, runs, the models that predict, the benchmarks, the answer, and the pages that show it
    ("study", {"sdeth.study", "sdeth.study.config", "sdeth.study.results", "sdeth.study.summary"}),
    ("study.vllm", {"sdeth.study.vllm"}),
    ("study.runs", {"sdeth.study.runs"}),
    ("study.predict", {"sdeth.study.predict"}),
    ("study.bench", {"sdeth.study.bench", "sdeth.study.streambench"}),
    ("study.status", {"sdeth.study.status"}),
    ("study.pages", {"sdeth.study.pages"}),
    ("cli", {"sdeth.cli", "sdeth.__main__"}),
]
# beyond the order: what a layer may not import even though it lies below
FORBIDDEN = {
    "leaves": {"sdeth."},                                   # leaves import nothing of sdeth (but their own rooms)
    "place": {"sdeth.models", "sdeth.runtime", "sdeth.wire", "torch", "transformers"},
}
NO_TORCH = {"sdeth.wire.protocol", "sdeth.wire.messages", "sdeth.wire.server_messages",   # plain data on the wire
            "sdeth.wire.checks"}


def layer_of(mod: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (i, p)
    if best is None:
        raise AssertionError(f"{mod} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best[0]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """Every module `path` imports, at any depth of the code, relative imports resolved; `from P import n`
    counts as P.n where P.n is a module of the package."""
    me = module_name(path, root)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.add(target)
            for a in node.names:
                sub = target + "." + a.name
                if (root.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                        (root.parent / Path(*sub.split(".")) / "__init__.py").exists():
                    out.add(sub)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {module_name(p, root): imports_of(p, root) for p in sorted(root.rglob("*.py"))}


def leaf_of(mod: str) -> str:
    """The leaf a module belongs to: a leaf may be a package of rooms (sdeth.costmodel.rules is sdeth.costmodel's)."""
    return max((p for p in LAYERS[0][1] - {"sdeth"} if mod == p or mod.startswith(p + ".")), key=len, default=mod)


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        mine = layer_of(mod)
        name = LAYERS[mine][0]
        for d in sorted(deps):
            if d.split(".")[0] == "sdeth" and d != mod:
                if layer_of(d) > mine:
                    bad.append(f"{mod} ({name}) imports {d} ({LAYERS[layer_of(d)][0]}): upward")
                if name == "leaves" and mod != "sdeth" and d.startswith("sdeth.") and \
                        not (d == leaf_of(mod) or d.startswith(leaf_of(mod) + ".")):
                    bad.append(f"{mod} is a leaf but imports {d}")
            for f in FORBIDDEN.get(name, ()):
                if name != "leaves" and (d == f or d.startswith(f + ".") or (f.endswith(".") and d.startswith(f))):
                    bad.append(f"{mod} ({name}) imports {d}, which that layer must not")
            if mod in NO_TORCH and d.split(".")[0] == "torch":
                bad.append(f"{mod} imports torch: the wire carries plain data")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among the package's modules (a package's __init__ counts as importing what it names)."""
    found, state = [], {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if d not in g or d == m:
                continue
            if state.get(d) == 1:
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in g:
        if m not in state:
            visit(m, [m])
    # a package importing its own submodules (re-exports) is not a cycle of the design
    return [c for c in found if not all(c[i + 1].startswith(c[i] + ".") or c[i].startswith(c[i + 1] + ".")
                                        for i in range(len(c) - 1))]


def test_every_module_imports_only_downward():
    assert violations(graph()) == []


def test_every_import_of_the_package_names_a_module_that_is_there():
    """A module moved to another room leaves no import of its old place behind, not even inside a function (which
    no import of the module would reveal until that function runs)."""
    g = graph()
    assert [f"{m} imports {d}, which is no module" for m, deps in g.items() for d in sorted(deps)
            if d.split(".")[0] == "sdeth" and d not in g] == []


def top_names(path: Path) -> set[str]:
    """What a module defines or imports at its top level (a star import counts as everything)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            out |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return out


def test_every_name_imported_from_the_package_is_there():
    """`from sdeth.X import n`: n is a module of X or a name X defines (an import of a moved module's old name from
    its package, inside a function, fails only when that function runs)."""
    g, bad = graph(), []
    for path in sorted(ROOT.rglob("*.py")):
        me = module_name(path, ROOT)
        pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target not in g:
                continue
            src = ROOT.parent / Path(*target.split("."))
            src = src / "__init__.py" if src.is_dir() else src.with_suffix(".py")
            names = top_names(src)
            bad += [f"{me}: from {target} import {a.name}" for a in node.names
                    if a.name not in ("*", "__doc__") and f"{target}.{a.name}" not in g and a.name not in names]
    assert bad == []


def test_the_tests_scripts_and_notebooks_import_modules_that_are_there():
    """Their `sdeth` imports, at any depth (a test's import inside its function fails only when it runs, and a slow
    one may not run before a fresh clone's), name modules of the package, or names those define."""
    import json
    g, repo, bad = graph(), ROOT.parents[1], []
    sources = [(p, p.read_text()) for p in sorted((repo / "tests").glob("*.py")) + sorted((repo / "scripts").glob("*.py"))]
    sources += [(p, "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code"))
                for p in sorted((repo / "notebooks").glob("*.ipynb"))]
    for path, text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:                 # (a notebook's magics)
            tree = ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("sdeth"):
                if node.module not in g:
                    bad.append(f"{path.name}: from {node.module}")
                    continue
                src = ROOT.parent / Path(*node.module.split("."))
                names = top_names(src / "__init__.py" if src.is_dir() else src.with_suffix(".py"))
                bad += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                        if a.name != "*" and f"{node.module}.{a.name}" not in g and a.name not in names]
            elif isinstance(node, ast.Import):
                bad += [f"{path.name}: import {a.name}" for a in node.names
                        if a.name.startswith("sdeth") and a.name not in g]
    assert bad == []


def test_no_import_cycles_even_through_function_level_imports():
    assert cycles(graph()) == []


def test_the_check_catches_an_upward_import_and_a_cycle(tmp_path):
    """The check itself: a runtime module importing the study, and a models <-> models cycle, are caught."""
    root = tmp_path / "sdeth"
    for d in ("runtime", "study", "models"):
        (root / d).mkdir(parents=True)
        (root / d / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "runtime" / "engine.py").write_text("def f():\n    from ..study import experiment\n")
    (root / "study" / "experiment.py").write_text("")
    (root / "models" / "a.py").write_text("from . import b\n")
    (root / "models" / "b.py").write_text("def g():\n    from .a import x\n")
    g = graph(root)
    assert any("sdeth.runtime.engine (runtime) imports sdeth.study" in v for v in violations(g))
    assert cycles(g) and set(cycles(g)[0]) == {"sdeth.models.a", "sdeth.models.b"}


def test_a_leaf_imports_its_own_rooms_and_no_other_leaf(tmp_path):
    """The check itself: a leaf package's rooms may import each other; a leaf importing another leaf is caught."""
    root = tmp_path / "sdeth"
    (root / "costmodel").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "paths.py").write_text("")
    (root / "metrics.py").write_text("from . import paths\n")
    (root / "costmodel" / "__init__.py").write_text("from .rules import x\n")
    (root / "costmodel" / "rounds.py").write_text("")
    (root / "costmodel" / "rules.py").write_text("from .rounds import y\n")
    assert violations(graph(root)) == ["sdeth.metrics is a leaf but imports sdeth.paths"]


@pytest.mark.parametrize("mod", ["sdeth.place.testbed", "sdeth.place.cluster", "sdeth.place.netprobe"])
def test_place_layer_knows_nothing_of_torch(mod):
    g = graph()
    assert not any(d.split(".")[0] in ("torch", "transformers") for d in g[mod])


# inside study.status, lowest first: a module imports only those before it (its __init__ re-exports them all)
STATUS_ORDER = ["sources", "glossary", "figures", "answer", "options", "decide", "milestones", "text"]


def order_violations(g: dict[str, set[str]], pkg: str, order: list[str]) -> list[str]:
    rank = {f"{pkg}.{m}": i for i, m in enumerate(order)}
    return [f"{mod} imports {d}, which comes after it in {pkg}" for mod, deps in g.items() if mod in rank
            for d in deps if d in rank and rank[d] >= rank[mod] and d != mod]


def test_the_status_package_imports_in_its_order_even_inside_functions(tmp_path):
    g = graph()
    assert set(STATUS_ORDER) == {m.rsplit(".", 1)[1] for m in g if m.startswith("sdeth.study.status.")}
    assert order_violations(g, "sdeth.study.status", STATUS_ORDER) == []
    # the check itself: a function-level import of a later module is caught
    root = tmp_path / "sdeth"
    (root / "study" / "status").mkdir(parents=True)
    for f in ("__init__.py", "study/__init__.py", "study/status/__init__.py", "study/status/text.py"):
        (root / f).write_text("")
    (root / "study" / "status" / "sources.py").write_text("def f():\n    from .text import x\n")
    bad = order_violations(graph(root), "sdeth.study.status", STATUS_ORDER)
    assert bad == ["sdeth.study.status.sources imports sdeth.study.status.text, which comes after it in "
                   "sdeth.study.status"]

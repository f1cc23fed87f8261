"""Functions stay short enough to read: none in lib/ over MAX_LINES lines (def to last line, docstring
included), but the few listed in LONG, each with the reason it reads better whole. Parses the source."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "lib" / "sdeth"
MAX_LINES = 60
LONG = {   # "module:function" -> why it may be longer; at most three
    "sdeth.cli.parser:build_parser": "the command line's reference: one add_argument a line, read top to bottom",
}


def long_functions(root: Path = ROOT, max_lines: int = MAX_LINES) -> dict[str, int]:
    """'module:qualified.name' -> lines, for every function (methods and nested ones too) over max_lines."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        mod = ".".join(("sdeth",) + path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")

        def visit(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    lines = child.end_lineno - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and lines > max_lines:
                        out[f"{mod}:{name}"] = lines
                    visit(child, name + ".")
                else:
                    visit(child, prefix)
        visit(ast.parse(path.read_text(), str(path)))
    return out


def test_no_function_over_the_limit_but_the_listed():
    over = {f: n for f, n in long_functions().items() if f not in LONG}
    assert not over, (f"functions over {MAX_LINES} lines: {over}; split them into named steps "
                      "(or, rarely, list one in LONG with its reason)")


def test_the_list_is_short_and_current():
    assert len(LONG) <= 3, f"LONG lists {len(LONG)} functions; at most three may be long"
    found = long_functions()
    stale = [f for f in LONG if f not in found]
    assert not stale, f"listed in LONG but no longer over {MAX_LINES} lines (or gone): {stale}; remove them"
    assert all(len(why) > 20 for why in LONG.values()), "each listed function needs its reason"


def test_the_count_sees_long_functions(tmp_path):
    (tmp_path / "m.py").write_text("class C:\n    def f(self):\n" + "        x = 1\n" * 61 + "\ndef g():\n    pass\n")
    assert long_functions(tmp_path) == {"sdeth.m:C.f": 62}

"""The verdict and the decision table: every figure in them is read back from its results JSON, each has its kind
and its source, every ratio has an absolute TPOT and tokens/s beside it, the rule picks what it says, and a cell
the evidence cannot fill says so (Markdown for `sdeth status`, HTML for the index and 30_writeup)."""
import html
import re

import pytest

from sdeth.paths import REPO
from sdeth.study import status
from sdeth.study.status import decide
from sdeth.study.status.figures import Figure

KINDS = {"measured", "synthetic", "trace-driven", "emulated", "modelled", "arithmetic", "published"}


def table_figures() -> list[Figure]:
    return [f for c in status.decision_table() for f in c.figures] + [t.t1 for t in status.targets()]


def test_every_figure_of_the_table_and_the_verdict_is_read_back_from_its_json():
    figs = table_figures() + status.verdict().figures
    assert len(figs) > 30
    for f in figs:
        assert (REPO / f.source).exists(), f.source
        assert abs(status.read_back(f, REPO) - f.value) < 1e-9, f.label
        assert f.kind.split(",")[0] in KINDS, (f.label, f.kind)


def test_the_table_covers_every_size_goal_and_draft_hardware():
    cells = status.decision_table()
    assert {(c.target, c.goal, c.hardware) for c in cells} == {
        (t, g, h) for t in ("8B", "32B", "72B-class") for g in status.TPOT_GOALS
        for h in ("same GPU type", "a cheaper card")}
    assert {c.option for c in cells} - {None} <= set(decide.OPTIONS) | {"replicas, batched"}


def test_every_ratio_has_an_absolute_tpot_and_tokens_per_s_beside_it():
    for c in status.decision_table():
        for f in c.figures:
            if f.fmt.endswith("x"):
                near = [g for g in c.figures if g.source == f.source]
                assert any(g.fmt.endswith("ms") for g in near) and any("tok/s" in g.fmt for g in near), \
                    (c.target, c.goal, f.label)


def test_the_recommendation_meets_the_goal_and_gives_the_most_per_gpu():
    for t in status.targets():
        for goal, frac in status.TPOT_GOALS.items():
            cell = decide._same_gpu(t, goal)
            fits = [o for o in t.options if o.meets(1 / frac)]
            if cell.option in (o.name for o in t.options):
                pick = next(o for o in t.options if o.name == cell.option)
                best = max(fits, key=lambda o: o.per_gpu)
                solid = [o for o in fits if o.ratio.kind not in ("emulated", "published")]
                assert pick in fits
                top = max((o.per_gpu for o in solid), default=0.0)
                if best.ratio.kind == "emulated" and solid and best.per_gpu < decide.EMULATED_MARGIN * top:
                    assert pick.per_gpu == max(o.per_gpu for o in solid) and best.name in cell.note
                else:
                    assert pick.per_gpu == best.per_gpu
            elif cell.option is None:
                assert not fits


def test_the_rule_on_made_up_options_and_a_cell_it_cannot_fill():
    def f(v, fmt="{:.2f}x", ci=None):
        return Figure("x", v, fmt, "reports/x.json", (), "hw", "measured", "d", ci)

    def opt(name, sp, tok, gpus, ci=None):
        return decide.Option(name, f(5 / sp, "{:.2f} ms"), f(tok, "{:.0f} tok/s"), f(sp, ci=ci), gpus)
    t = decide.Target("8B", "made up", f(5.0, "{:.2f} ms"),
                      [opt("replicas", 1.0, 100, 1), opt("colocated SD", 1.2, 120, 1, (1.05, 1.3)),
                       opt("remote pipelined", 1.5, 150, 2, (1.45, 1.55))])
    assert decide._same_gpu(t, "relaxed").option == "colocated SD"      # the most per GPU among those that meet it
    assert decide._same_gpu(t, "moderate").option == "remote pipelined"  # colocated's interval starts below 1.11x
    t.options = t.options[:2]
    cell = decide._same_gpu(t, "tight")
    assert cell.option is None and "no option" in cell.note
    assert "the evidence cannot fill it" in decide_html_of(cell)


def decide_html_of(cell) -> str:
    from sdeth.study.status import text
    return text._cell_html(cell)


@pytest.mark.parametrize("render", ["markdown", "html"])
def test_every_figure_of_the_table_is_shown_with_its_kind_and_source(render):
    out = status.decision_markdown() if render == "markdown" else html.unescape(status.decision_html())
    for c in status.decision_table():
        for f in c.figures:
            src = f.source if render == "markdown" else f.source.removeprefix("reports/")
            # the figure, then (kind; source) after the figures of its group
            assert re.search(re.escape(f.shown) + r"[^()]*?(\([^()]*\)[^()]*?)*\(" + re.escape(f.kind) + "; "
                             + re.escape(src) + r"\)", out), (render, f.label)


def test_status_opens_with_the_verdict_then_the_table():
    md = status.markdown()
    assert md.startswith("*Verdict.*") and md.index("| target") < md.index("*Single-stream latency.*")
    v = status.verdict().plain()
    assert "loopback" in v and "vLLM runs a proposer synchronously" in v and "not measured" in v


NUMBER = re.compile(r"(\d+(?:\.\d+)?) ?(x|ms|tok/s)\b")


def test_the_readme_answer_quotes_the_verdict_figures():
    """Every number of the README's five-line answer is one of the verdict's figures, as the status prints it."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## The answer, in five lines")[1].split("\n## ")[0]
    quoted = set(NUMBER.findall(block))
    shown = {m for f in status.verdict().figures for m in NUMBER.findall(f.fmt.format(f.value))}
    assert len(quoted) >= 8 and quoted <= shown, quoted - shown
    assert NUMBER.findall("1.23x [1.20, 1.27], 114 tok/s per GPU, 5.20 ms") == [("1.23", "x"), ("114", "tok/s"),
                                                                             ("5.20", "ms")]


def test_an_emulated_option_is_the_pick_only_by_a_clear_margin_and_else_is_named_beside():
    def f(v, kind, fmt="{:.2f}x"):
        return Figure("x", v, fmt, "reports/x.json", (), "hw", kind, "d")

    def opt(name, sp, tok, gpus, kind):
        return decide.Option(name, f(5 / sp, kind, "{:.2f} ms"), f(tok, kind, "{:.0f} tok/s"), f(sp, kind), gpus)
    t = decide.Target("32B", "made up", f(5.0, "measured", "{:.2f} ms"),
                      [opt("replicas", 1.0, 50, 1, "measured"), opt("colocated SD", 1.5, 75, 1, "synthetic"),
                       opt("remote pipelined", 1.7, 95, 1.25, "emulated")])       # 76 per GPU: within the margin
    cell = decide._same_gpu(t, "tight")
    assert cell.option == "colocated SD" and "also meets it: remote pipelined" in cell.note
    assert len(cell.figures) == 6                                            # both options' figures
    t.options[2] = opt("remote pipelined", 1.7, 110, 1.25, "emulated")      # 88 per GPU: past it
    assert decide._same_gpu(t, "tight").option == "remote pipelined"

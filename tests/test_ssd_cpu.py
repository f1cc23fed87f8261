"""The verdict cache without a GPU: the CPU run's JSON (streambench.ssd_cpu, reports/ssd_cpu.json) read back with its labels,
the H200 model over the measured components (streambench.ssd_model), the model's check against a CPU run's own
components, and the status part that quotes both."""
import json

import pytest

from sdeth.costmodel import Costs, simulate_pipelined
from sdeth.paths import REPO
from sdeth.study.status.sources import SSD_CPU
from sdeth.study.streambench import ssd_model as M

DOC = REPO / SSD_CPU


def _doc():
    if not DOC.exists():
        pytest.skip(f"{SSD_CPU} not written yet (python -m sdeth.study.streambench.ssd_cpu)")
    return json.loads(DOC.read_text())


def test_the_cpu_run_is_labelled_and_its_figures_read_back():
    doc = _doc()
    cpu = doc["measured_cpu"]
    assert "measured on the CPU" in cpu["label"] and "does not transfer to a GPU" in cpu["wall_note"]
    assert doc["hardware"].get("label") and doc["models"]["target"] and doc["models"]["draft"]
    specs = {(p["cache"], p["streams"]) for p in cpu["points"]}
    assert {("off", 1), ("off", 4)} <= specs and any(c != "off" for c, _ in specs)
    assert all(p["greedy_identical"] for p in cpu["points"]), [p["cache"] for p in cpu["points"]]
    for p in cpu["points"]:
        v = p.get("verdict_cache")
        assert (v is None) == (p["cache"] == "off")
        if v:
            assert v["hits"] + v["misses"] == sum(v["rejections_by_position"].values())
            assert v["hit_rate"] == pytest.approx(v["hits"] / (v["hits"] + v["misses"]), abs=1e-3)
            assert set(v["hit_rate_by_position"]) <= set(v["rejections_by_position"])
    t = M.cpu_table(doc)
    assert len(t) == len(cpu["points"]) and list(t["tokens/target step"]) == [p["tokens_per_target_step"]
                                                                             for p in cpu["points"]]


def test_the_modelled_part_names_its_inputs_and_its_goals():
    doc = _doc()
    m = doc["modelled"]
    assert m["label"].startswith("modelled") and m["alpha"] == 0.71 and m["not_measured"]
    rows = [r for r in m["points"] if "missing" not in r]
    assert {r["hit_source"] for r in rows} == set(M.HIT_SOURCES)
    for r in rows:
        assert r["inputs"]["draft_ms_mean"] > 0 and r["inputs"]["t_v_ms"]["0"] > 0 and r["row_cost"] >= 1
    cpu_rows = [r for r in rows if r["hit_source"] == "cpu-measured"]
    hits = M.cpu_hits(doc["measured_cpu"])
    assert all(r["terms"]["hit"] == hits[r["cache"]] for r in cpu_rows)
    g = {(x["target"], x["N"], x["figure"], x["hit_source"]) for x in m["goals"]}
    assert ("Qwen3-32B", 1, "ssd_over_plain", "trace") in g and ("Qwen3-32B", 4, "ssd_over_colocated_per_gpu",
                                                               "synthetic:0.9") in g
    line = M.answer_line(doc)
    assert "modelled on H200 components" in line and "measured on the CPU" in line
    t32 = next(x for x in m["goals"] if x["goal_ranks"] == x["hit_source"] == "trace" and x["target"] == "Qwen3-32B")
    assert f"{t32['modelled']}x over plain pipelined" in line and f"the issue's {t32['least']}" in line


def _run(steps: dict) -> dict:
    return {"draft_step": [{"points": [{"B": b, "context": 512, "step_ms": s} for b, s in steps.items()]}]}


def test_the_step_at_live_and_branch_rows_is_interpolated_and_extrapolated():
    run = _run({1: 2.0, 8: 2.7, 16: 3.5})
    assert M.step_at(run, 1) == 2.0 and M.step_at(run, 8) == 2.7
    assert M.step_at(run, 4) == pytest.approx(2.0 + 0.7 * 3 / 7)
    assert M.step_at(run, 24) == pytest.approx(3.5 + 0.1 * 8)          # past the grid: the last two points' slope
    with pytest.raises(ValueError, match="draft_step"):
        M.step_at({}, 4)


def test_more_hits_model_more_gain_and_a_missing_cpu_hit_is_said():
    fake = {"remote_pipelined": {"points": [{"B": 1, "N": 1, "draft_ms_mean": 2.0, "server_period_ms_p25": 2.2,
                                             "timeline_ms": {"sent_to_read": {"p50": 1.0}}}]},
            "settings": {"target": "Qwen3-8B"}, **_run({1: 2.0, 8: 2.2, 16: 2.4, 32: 2.7})}
    tv = {(1, m): 5.0 + 0.1 * m for m in range(5)}
    rows = M._row("fake", fake, "Qwen3-8B", 1, 1, tv, {"4x4x8": 0.2})
    by = {(r["cache"], r["hit_source"]): r for r in rows}
    assert "missing" in by[("8x4x16", "cpu-measured")]                 # no CPU point with that spec
    assert by[("4x4x8", "synthetic:0.9")]["ssd_over_plain"] > by[("4x4x8", "cpu-measured")]["ssd_over_plain"]
    assert by[("4x4x8", "synthetic:0.9")]["ssd_over_plain"] > 1.1
    assert by[("4x4x8", "trace")]["row_cost"] == pytest.approx(M.step_at(fake, 9) / 2.0)


def test_the_model_check_flags_a_run_the_model_does_not_predict():
    """A CPU point whose measured tokens per step is the model's (from its own components) passes; twice it fails."""
    comp = {"verify_s": {"1": 0.02, "2": 0.022, "3": 0.024, "4": 0.026, "5": 0.028}, "draft_period_ms": 5.0,
            "link_rtt_ms": 1.0}
    c = Costs(0.02, 0.005, {int(m): s for m, s in comp["verify_s"].items()}, rtt=0.001, draft_period=0.005)
    want = simulate_pipelined(0.6, c, 4, n_tokens=2000, policy="fixed")["tokens_per_round"]
    pts = [{"cache": "off", "streams": 1, "alpha": 0.6, "tokens_per_target_step": round(want, 3), "components": comp},
           {"cache": "off", "streams": 4, "alpha": 0.6, "tokens_per_target_step": 2 * want, "components": comp}]
    out = M.model_check({"config": {"k": 4}, "points": pts})
    assert [r["within_15pct"] for r in out["points"]] == [True, False] and not out["all_within_15pct"]


def test_the_model_reads_the_paths_the_status_reads():
    from sdeth.study.status import sources
    assert M.SSD_CPU is sources.SSD_CPU and M.SERVER_STREAMS is sources.SERVER_STREAMS   # one definition


def test_the_status_quotes_verdict_speculation_with_its_labels():
    _doc()
    from sdeth.study.status.answer import answer
    part = next((p for p in answer() if p.title == "Verdict speculation"), None)
    assert part is not None
    kinds = {f.kind for f in part.figures}
    assert kinds == {"modelled", "measured", "emulated"}          # the H200 call's points: emulated targets
    assert "Measured on an H200 (emulated" in part.markdown() and SSD_CPU in part.markdown()


def test_the_cli_takes_bench_ssd_cpu(capsys):
    from sdeth.cli import main
    with pytest.raises(SystemExit) as e:
        main(["bench", "ssd-cpu", "--help"])
    assert e.value.code == 0 and "--specs" in capsys.readouterr().out


@pytest.mark.slow
def test_a_small_cpu_run_of_the_embedded_pair_is_lossless_and_counted(pair):
    """One prompt, 10 tokens, cache off and on through the real server: identical to target-only both ways, the
    cache's counts add up, and the run's components (target forwards, draft compute per step, round trip) are there
    for the model check."""
    from sdeth.study.streambench.ssd_cpu import SsdCpuConfig, measure
    cpu = measure(pair, SsdCpuConfig("sharegpt:1", 10, specs=("off", "2x2x4"), streams=(1,)), progress=lambda _: None)
    off, on = cpu["points"]
    assert off["greedy_identical"] and on["greedy_identical"] and "verdict_cache" not in off
    v = on["verdict_cache"]
    assert v["branches"] > 0 and v["hits"] + v["misses"] == sum(v["rejections_by_position"].values())
    for p in (off, on):
        assert p["components"]["verify_s"] and p["components"]["draft_period_ms"] > 0
        assert p["components"]["link_rtt_ms"] > 0 and p["tokens_per_target_step"] >= 1
    r = off["restart"]              # restarts at the target: the draft's step (one clock) plus a transit, in periods
    if r is not None:               # (None only when no restart came in 10 tokens)
        assert r["n"] >= 1 and r["transit_ms"] > 0 and r["p50_ms"] > r["transit_ms"] and r["period_ms_p50"] > 0
        assert r["taken_by_the_loop_ms"]["p50"] > 0 and isinstance(r["met"], bool)
    check = M.model_check(cpu)
    assert len(check["points"]) == 2 and all("missing" not in r for r in check["points"])


def test_the_cpu_policy_goals_read_every_repeat_and_judge_each_run(tmp_path, monkeypatch):
    """cpu_lines: policy_cpu.json and each repeat beside it (policy_cpu_2.json) give a block of their own, each stream
    count judged against its own run's better corner (within 5%)."""
    from sdeth.study import results
    from sdeth.study.streambench import policies as SP
    src = REPO / results.POLICY_CPU
    if not src.exists():
        pytest.skip(f"{results.POLICY_CPU} not written yet (make bench-policy-cpu)")
    doc = json.loads(src.read_text())
    (tmp_path / "policy_cpu.json").write_text(json.dumps(doc))
    for p in doc["measured_cpu"]["points"]:             # the repeat: the policy 10% below offered at every count
        if p["step_policy"] == "offered":
            p["tokens_per_s"] = 100.0
        elif p["step_policy"] == "policy":
            p["tokens_per_s"] = 90.0
    (tmp_path / "policy_cpu_2.json").write_text(json.dumps(doc))
    (tmp_path / "policy_cpu_before.json").write_text(json.dumps(doc))      # not a numbered repeat: left out
    monkeypatch.setattr(results, "POLICY_CPU", str(tmp_path / "policy_cpu.json"))
    text = "\n".join(SP.cpu_lines())
    first, second = text.split("CPU testbed, policy_cpu_2.json")
    assert first.startswith("CPU testbed, policy_cpu.json") and "stream(s)" in first and "before" not in text
    counts = len({p["streams"] for p in doc["measured_cpu"]["points"]
                  if p["step_policy"] == "policy" and p["cache"] == "off"})
    assert second.count("tokens/s policy 90.0") == counts and second.count("less 5%: missed") == counts

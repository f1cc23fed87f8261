"""The link curve (bench link): per-request TPOT on the serving definition, the sync model through the lowest
point, and the curve's rows in the decision table's testbed section, each point with the delay it added."""
import json
from types import SimpleNamespace

from sdeth.study.bench import link_cpu
from sdeth.study.status import decide


def rec(pid, tpot, rounds=10, out=21, acc=12, rej=8):
    return SimpleNamespace(prompt_id=pid, tpot_ms=tpot, rounds=rounds, output_ids=[1] * out, accepted_tokens=acc,
                           rejections=rej)


def test_tpot_stats_and_a_paired_speedup_on_one_definition():
    base = [rec("a", 10.0), rec("b", 12.0), rec("c", 14.0)]
    got = link_cpu.summary([rec("a", 8.0), rec("b", 9.0), rec("c", 10.0)], base, {"a": [1] * 21, "b": [1] * 21,
                                                                                    "c": [2] * 21})
    assert got["tpot_ms"] == {"mean": 9.0, "p50": 9.0, "p99": 10.0, "n": 3}
    assert abs(got["speedup"] - 12.0 / 9.0) < 1e-3 and got["speedup_ci95"][0] <= got["speedup"] <= got["speedup_ci95"][1]
    assert got["greedy_identical"] is False and got["rounds_per_token"] == 0.5 and got["alpha"] == 0.6


def test_the_sync_model_goes_through_the_lowest_point_and_pays_a_round_trip_a_round():
    pts = [{"mode": "sync", "injected_rtt_ms": r, "probe_rtt_ms": r + 0.1, "tpot_ms": {"mean": 10.0 + r / 2},
            "speedup": 20.0 / (10.0 + r / 2), "rounds_per_token": 0.5} for r in (0.02, 2.0, 10.0)]
    link_cpu.model(pts, [], {})
    for p in pts:                       # the data pay exactly one round trip a round: the model finds them
        assert abs(p["model_speedup"] - p["speedup"]) < 1e-3, p


def test_the_link_curve_has_testbed_rows_with_each_injected_delay(tmp_path):
    (tmp_path / "reports").mkdir()
    pts = [{"mode": m, "injected_rtt_ms": r, "probe_rtt_ms": r + 0.1, "speedup": 1.1, "speedup_ci95": [1.0, 1.2],
            "model_speedup": 1.05} for m in ("sync", "pipelined") for r in (0.02, 0.5, 2.0)]
    doc = {"created": "2026-12-05T00:00:00Z", "hardware": {"label": "a CPU"}, "modes": ["sync", "pipelined"],
           "points": pts}
    (tmp_path / "reports" / "link_cpu.json").write_text(json.dumps(doc))
    rows = decide.link_rows(tmp_path)
    assert [c.target for c in rows] == ["testbed", "testbed"] and len(rows[0].figures) == 6
    assert {f.kind for f in rows[0].figures} == {"measured", "modelled"}
    assert any("2 ms injected round trip" in f.label for f in rows[1].figures)

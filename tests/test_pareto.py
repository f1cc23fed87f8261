"""The Pareto study's arithmetic, frontier, crossover and event model, on made-up step tables shaped like the
measured ones (8B step 5.19 ms at batch 1, 1.05x at 4 rows; 1.7B step 1.85 ms)."""
import json

import pytest

from sdeth.costmodel import expected_tokens
from sdeth.study.predict import pareto
from sdeth.study.predict.pareto import Tables

ALPHA = 0.71


def tables(draft_scale: float = 1.0, rtt_s: float = 2e-4, **kw) -> Tables:
    target = {1: 5.19e-3, 4: 5.45e-3, 16: 6.0e-3, 64: 9.0e-3, 256: 28e-3}
    verify = {(1, 4): 5.6e-3, (4, 4): 6.3e-3, (16, 4): 9.5e-3, (64, 4): 30e-3, (256, 4): 110e-3}
    draft = {r: s * draft_scale for r, s in {1: 1.85e-3, 16: 2.0e-3, 64: 2.6e-3, 256: 6e-3, 1024: 20e-3}.items()}
    return Tables(target, verify, draft, 36, rtt_s, 1e-4, kw.pop("source", "made-up tables, modelled"), **kw)


def test_expected_tokens_per_round_and_the_colocated_row():
    assert expected_tokens(ALPHA, 4) == pytest.approx((1 - ALPHA ** 5) / (1 - ALPHA))
    assert expected_tokens(ALPHA, 4) == pytest.approx(1 + 0.71 + 0.71 ** 2 + 0.71 ** 3 + 0.71 ** 4)
    t = tables()
    (row,) = pareto.colocated_points(t, ALPHA, ks=[4], batches=[4])
    round_s = 4 * t.t_d(4) + t.t_v(4, 4) + t.host_s
    assert row["tokens_per_round"] == pytest.approx(expected_tokens(ALPHA, 4))
    assert row["tpot_ms"] == pytest.approx(round_s / expected_tokens(ALPHA, 4) * 1e3)
    assert row["tok_s_per_gpu"] == pytest.approx(4 * expected_tokens(ALPHA, 4) / round_s)


def test_colocated_takes_the_best_k():
    t = tables()
    row = pareto.colocated_points(t, ALPHA, batches=[1])[0]
    rate = {k: expected_tokens(ALPHA, k) / pareto.colocated_round_s(t, k, 1) for k in pareto.KS}
    assert row["k"] == max(rate, key=rate.get)


def test_replicas_cannot_go_below_one_step():
    t = tables()
    rows = pareto.replica_points(t)
    assert min(r["tpot_ms"] for r in rows) == pytest.approx(t.t(1) * 1e3)
    assert pareto.throughput_at(rows, 0.9 * t.t(1) * 1e3) is None
    assert [r["tok_s_per_gpu"] for r in rows] == pytest.approx([b / t.t(b) for b in sorted(t.target_step)])


def test_remote_in_one_group_never_beats_colocated_at_the_same_batch():
    for scale in (0.05, 1.0, 3.0):
        t = tables(draft_scale=scale)
        for col in pareto.colocated_points(t, ALPHA):
            rem = pareto.remote_points(t, ALPHA, ns=(1, 4, 16), batches=[col["B"]], groups=(1,))
            assert max(r["tok_s_per_gpu"] for r in rem) < col["tok_s_per_gpu"]


def compute_bound(draft_s: float) -> Tables:
    """Verifies that grow with tokens (t_v(B, k) = t(B (k + 1))), a draft step flat in rows."""
    target = {1: 5e-3, 8: 5.2e-3, 64: 8e-3, 256: 20e-3, 1024: 70e-3}
    return Tables(target, {}, {1: draft_s, 4096: draft_s * 1.05}, 36, 2e-4, 1e-4, "made-up, modelled")


def test_remote_with_two_groups_beats_colocated_when_drafting_costs_the_target_much():
    # at B = 256 a verify of k = 1 takes t(512) = 37 ms; a 22 ms draft step is over half of it
    for draft_s, remote_wins in ((22e-3, True), (0.3e-3, False)):
        t = compute_bound(draft_s)
        col = pareto.colocated_points(t, ALPHA, batches=[256])[0]["tok_s_per_gpu"]
        rem = max(r["tok_s_per_gpu"] for r in pareto.remote_points(t, ALPHA, ns=(8, 16), batches=[256]))
        assert (rem > 1.1 * col) if remote_wins else (rem < col), (draft_s, rem, col)


def test_the_frontier_is_monotone_and_dominates_every_point():
    t = tables()
    rows = pareto.replica_points(t) + pareto.colocated_points(t, ALPHA) + pareto.remote_points(t, ALPHA)
    front = pareto.pareto_front(rows)
    assert len(front) >= 3
    for a, b in zip(front, front[1:]):
        assert b["tpot_ms"] > a["tpot_ms"] and b["tok_s_per_gpu"] > a["tok_s_per_gpu"]
    for r in rows:
        assert pareto.throughput_at(front, r["tpot_ms"]) >= r["tok_s_per_gpu"]


def _pt(kind, tpot, tok, **kw):
    return {"kind": kind, "tpot_ms": tpot, "tok_s_per_gpu": tok, **kw}


def test_crossover_is_where_b_wins_from_then_on():
    a = [_pt("a", 5, 100), _pt("a", 10, 150)]
    b = [_pt("b", 8, 120), _pt("b", 20, 400)]     # b wins at 8, loses at 10, wins from 20 on
    assert pareto.crossover_tpot(a, b)["tpot_ms"] == 20
    assert pareto.crossover_tpot(b, a)["tpot_ms"] is None      # b wins at the largest TPOT: a never does from there
    lo_hi = pareto.crossover_tpot(a, [_pt("b", 8, 120), _pt("b", 20, 400, tpot_lo=18, tpot_hi=22)])
    assert lo_hi["tpot_ms"] == 20 and 17 < lo_hi["lo"] < 20 < lo_hi["hi"] < 23


def test_answer_compares_at_nine_tenths_of_one_step():
    t = tables()
    rows = (pareto.replica_points(t) + pareto.colocated_points(t, ALPHA) + pareto.remote_points(t, ALPHA)
            + pareto.eagle_points(t))
    out = pareto.answer(rows, t.t(1) * 1e3)
    assert out["tpot_budget_ms"] == pytest.approx(0.9 * t.t(1) * 1e3)
    thr = out["tok_s_per_gpu"]
    assert thr["replica"] is None
    assert out["remote_over_colocated"] == pytest.approx(thr["remote"] / thr["colocated"])
    assert out["eagle3_over_colocated"] == pytest.approx(thr["eagle3"] / thr["colocated"])
    assert out["replicas_win_above_ms"]["colocated"]["tpot_ms"] > t.t(1) * 1e3


def test_eagle_draft_is_one_layer_plus_the_head():
    t = tables()
    (row,) = pareto.eagle_points(t, tau=3.0, k=5, lm_head_layers=0.5, batches=[16])
    round_s = 5 * t.t(16) / 36 * 1.5 + t.t_v(16, 5) + t.host_s
    assert row["tpot_ms"] == pytest.approx(round_s / 3.0 * 1e3)
    assert "modelled" in row["label"]
    assert expected_tokens(pareto.implied_alpha(3.0, 5), 5) == pytest.approx(3.0)
    best = pareto.eagle_points(t, tau=3.0, k=5, ks=range(1, 9), batches=[16])[0]
    assert best["tok_s_per_gpu"] >= row["tok_s_per_gpu"] - 1e-9


def test_simulation_matches_the_closed_form_for_one_target_and_one_stream():
    t = tables()
    for k in (2, 4):
        sim = pareto.simulate_shared(t, ALPHA, k, 1, 1, rounds=2000)
        round_s = pareto.shared_round_s(t, k, 1, 1)
        assert round_s == pytest.approx(k * t.t_d(1) + t.rtt_s + t.t_v(1, k) + t.host_s)
        assert sim["round_ms_mean"] == pytest.approx(round_s * 1e3, rel=1e-6)
        closed_tok = expected_tokens(ALPHA, k) / round_s / 2
        assert sim["tok_s_per_gpu"] == pytest.approx(closed_tok, rel=0.03)
        assert sim["tpot_ms_p50"] == pytest.approx(round_s / expected_tokens(ALPHA, k) * 1e3, rel=0.05)
        assert sim["queue_ms_mean"] == 0.0


@pytest.mark.parametrize("b,n,k,groups", [(1, 4, 2, 1), (4, 4, 4, 1), (16, 8, 2, 1), (16, 32, 4, 1),
                                          (4, 4, 4, 2), (16, 8, 4, 4), (64, 8, 2, 2)])
def test_simulation_matches_the_greedy_closed_form_when_shared(b, n, k, groups):
    t = tables()
    sim = pareto.simulate_shared(t, ALPHA, k, b, n, rounds=400, groups=groups)
    assert sim["round_ms_mean"] == pytest.approx(pareto.shared_round_s(t, k, b, n, groups) * 1e3, rel=0.03)


def test_the_draft_saturates_as_rows_grow():
    t = tables()
    light = pareto.simulate_shared(t, ALPHA, 4, 1, 1, rounds=300)
    heavy = pareto.simulate_shared(t, ALPHA, 4, 64, 16, rounds=300)
    assert light["draft_busy_frac"] < 0.7 and light["queue_ms_mean"] == 0
    assert heavy["draft_busy_frac"] > 0.97
    assert heavy["queue_ms_mean"] > 5
    assert heavy["tpot_ms_p50"] > 3 * light["tpot_ms_p50"]


def test_a_server_that_holds_requests_can_beat_greedy_batching():
    t = tables()
    assert pareto.shared_round_s(t, 2, 1, 4, greedy=False) < 0.9 * pareto.shared_round_s(t, 2, 1, 4)


def test_tables_round_trip_through_json_and_interpolate():
    t = tables(source="H200, Qwen3-8B / Qwen3-1.7B shapes, measured")
    back = Tables.from_json(json.loads(json.dumps(t.to_json())))
    assert back == t
    assert t.t_v(1, 2) == pytest.approx(5.19e-3 + (5.6e-3 - 5.19e-3) / 2)       # between t(1) at k=0 and k=4
    assert t.t_v(1, 8) == pytest.approx(5.19e-3 + (5.6e-3 - 5.19e-3) * 2)       # the same line past k=4
    assert t.t_v(8, 4) == pytest.approx(6.3e-3 + (9.5e-3 - 6.3e-3) * 4 / 12)    # between batches 4 and 16
    assert t.t_d(2048) > t.t_d(1024) and t.t_d(0.5) == t.t_d(1)
    assert "measured" in pareto.replica_points(t)[0]["label"]
    with pytest.raises(ValueError, match="B,k"):
        Tables.from_json({**t.to_json(), "verify": {"4": 1e-3}})
    with pytest.raises(ValueError, match="non-positive"):
        Tables({1: 0.0}, {}, {}, 36)


def test_figure_says_what_it_shows():
    t = tables()
    rows = pareto.replica_points(t) + pareto.colocated_points(t, ALPHA) + pareto.eagle_points(t)
    fig = pareto.figure(rows, "Tokens/s per GPU against TPOT", "made-up tables; Qwen3-8B / Qwen3-1.7B shapes")
    ax = fig.axes[0]
    assert "ms" in ax.get_xlabel() and "per GPU" in ax.get_ylabel() and ax.get_title()
    legend = {text.get_text(): line for text, line in zip(ax.get_legend().get_texts(), ax.get_legend().get_lines())}
    eagle = next(label for label in legend if label.startswith("EAGLE-3"))
    assert "modelled" in eagle and legend[eagle].get_linestyle() == "--"
    assert any("Qwen3-8B" in text.get_text() for text in fig.texts)

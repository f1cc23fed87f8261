"""bench streams on a CPU with the tiny model: each part's record, a real draft server (a thread) serving two
emulated targets (processes) of two streams each."""
import threading
import time

import pytest
from doubles import tiny_qwen3

from sdeth.place.testbed import free_port
from sdeth.runtime.batchdraft import BatchDrafter
from sdeth.runtime.batchmodel import BatchDecoder
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.study import streambench as sb
from sdeth.wire.draft_server import DraftServerConfig, ServerLimits, build_server

PROMPT, CONTEXT = 16, 40          # short sequences, so that some end and new ones open within a second


@pytest.fixture(scope="module")
def fast():
    return FastDecoder(tiny_qwen3(0), 8)


def test_coins_stop_at_the_first_tails():
    class Seq:
        def __init__(self, xs):
            self.xs = iter(xs)

        def random(self):
            return next(self.xs)
    assert sb.coins(Seq([0.1, 0.2, 0.9, 0.1]), 4, 0.5) == 2
    assert sb.coins(Seq([0.1, 0.1, 0.1]), 3, 0.5) == 3
    assert sb.coins(Seq([0.7]), 3, 0.5) == 0
    assert sb.pct([3, 1, 2, 4], 50) == 2 and sb.pct([3, 1, 2, 4], 100) == 4 and sb.pct([], 50) is None


def test_draft_step_target_and_colocated_records(fast):
    part = sb.draft_step(fast, 300, "tiny", batches=(1, 2), contexts=(64,), k=3, reps=2)
    assert [(p["B"], p["context"]) for p in part["points"]] == [(1, 64), (2, 64)]
    for p in part["points"]:
        assert p["step_ms"] > 0 and p["draft_wall_ms"] > 0 and p["host_ms_per_step"] >= 0
    tdec, pts = sb.target_points(fast, batches=(1, 2), ks=(1, 3), context=CONTEXT)
    assert [(p["B"], p["k"], p["width"]) for p in pts] == [(1, None, 1), (1, 1, 2), (1, 3, 4), (2, None, 1),
                                                            (2, 1, 2), (2, 3, 4)]
    tv = sb.tv_table(pts)
    assert tv[(2, 3)] == pts[-1]["wall_ms"]          # no graphs on a CPU: the wall is what a target waits
    drafter = BatchDrafter(BatchDecoder(fast, 2, CONTEXT + sb.SLACK), 300)
    p = sb.colocated_point(drafter, tdec, 2, 3, 0.7, 0.2, prompt=PROMPT, context=24, min_rounds=8)
    assert p["rounds"] > 0 and p["tokens"] >= 2 * p["rounds"] and p["new_sequences"] > 0
    assert p["tpot_ms"]["p50"] <= p["tpot_ms"]["p99"]
    assert not drafter.seqs and sorted(drafter.free_rows) == [0, 1]      # every sequence freed at the end
    assert sb.best_k([p])[0]["k"] == 3


def test_colocated_against_an_emulated_target_waits_its_tv_in_series(fast):
    """Colocated SD in the remote options' harness: real draft steps, then the emulated target's t_v(B, k) in
    series; a round costs the draft plus t_v, and each sequence's per-request TPOT is recorded as serving
    benchmarks count it."""
    from sdeth.study.streambench.colocated import emulated_label, emulated_tables
    tv = {(1, 3): 30.0, (2, 3): 40.0}
    drafter = BatchDrafter(BatchDecoder(fast, 2, CONTEXT + sb.SLACK), 300)
    p = sb.colocated_point(drafter, None, 2, 3, 0.7, 0.3, prompt=PROMPT, context=24, min_rounds=8, tv_ms=tv,
                           label=emulated_label("Qwen3-32B"))
    assert p["target"] == "emulated" and "emulated target" in p["label"] and "Qwen3-32B" in p["label"]
    assert p["verify_ms_mean"] >= 40.0 and p["round_ms"]["p50"] >= 40.0 + 0.5 * p["draft_ms_mean"]
    r = p["request_tpot_ms"]
    assert r["n"] >= 2 and r["p50"] <= r["p99"] and "(tokens - 1)" in r["definition"]
    assert r["mean"] >= 40.0 / (sb.PIPELINED_K + 1)          # a round's tokens at most k + 1 = 4 a stream
    assert not drafter.seqs and sorted(drafter.free_rows) == [0, 1]
    with pytest.raises(ValueError, match="no t_v for B=4 k=3"):
        sb.colocated_point(drafter, None, 4, 3, 0.7, 0.1, tv_ms=tv)
    tabs = emulated_tables((sb.TARGET, "no-such-model"), tv, (1, 2), 3)
    assert tabs[sb.TARGET] is tv and "no-such-model" in tabs["no-such-model"]


def test_remote_point_against_a_real_draft_server(fast):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = build_server(fast, sb.welcome("tiny", 300, 8), DraftServerConfig(8, 64, ttl_s=30,
                                                                            limits=ServerLimits(reserve=0)))
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 40}, daemon=True).start()
    grid = sb.remote_grid(batches=(2,), ns=(2,), ks=(3,), rows=8)
    assert grid == [(2, 2, 3)] and sb.remote_grid(batches=(8,), ns=(1, 2), ks=(3,), rows=8) == [(8, 1, 3)]
    saved = []
    t0 = time.time()
    with sb.Targets(2) as pool:
        out = sb.remote_points(addr, pool, grid, {(2, 3): 10.0}, 0.7, 1.0, 300, prompt=PROMPT, context=CONTEXT,
                               progress=lambda line: None, save=lambda: saved.append(1))
    assert time.time() - t0 < 30 and saved
    p = out[0]
    assert "error" not in p, p.get("trace")
    assert p["label"] == sb.REMOTE_LABEL and (p["B"], p["N"], p["k"], p["gpus"]) == (2, 2, 3, 3)
    assert p["stream_tokens_min"] > 0 and len(p["tokens_per_s_per_target"]) == 2
    assert p["rounds"] > 4 and p["tokens"] >= 2 * p["rounds"]
    assert p["tpot_ms"]["p50"] > 0 and p["round_ms"]["p50"] >= 10.0      # a round holds at least the verify wait
    req = p["request_tpot_ms"]                     # each sequence's own: its rounds' time over its tokens
    assert req["n"] >= 1 and p["round_ms"]["p50"] / 4 <= req["p50"] <= p["round_ms"]["p99"], (req, p["round_ms"])
    split = p["split_ms_mean"]
    assert split["client_wait"] >= split["server_held"] >= 0 and split["draft_compute"] > 0
    assert 1 <= p["server_batch"]["min"] <= p["server_batch"]["max"] <= 4
    assert p["new_sequence"]["count"] > 0 and p["new_sequence"]["open_to_first_draft_ms_p50"] > 0
    em = p["emulation"]
    assert 0 <= em["t_v_over_intended_mean"] < 1.0          # loose: a shared CPU oversleeps, never undersleeps
    assert not server.drafter.seqs                                # each target ended its sequences (End, Ended)


def test_a_sequences_own_tpot_leaves_out_its_first_round_and_counts_at_its_end():
    """Per request, as serving benchmarks count it: the first round (it waits for the prompt: time to first token)
    starts the clock; the sequence's TPOT is recorded when it ends; a sequence cut by the point's end counts only
    with 16 tokens or more."""
    from sdeth.study.streambench.emulated import Emulated
    e = object.__new__(Emulated)
    e.rec, e.seq_at, e.seq_n, e.opened = {"request_tpot_ms": []}, [0.0, 0.0], [0, 0], {}
    e.per_request({}, [2, 1], 0.010)
    e.opened = {0: 0.0}                            # stream 0's sequence ended in this round
    e.per_request({}, [3, 1], 0.020)
    assert e.rec["request_tpot_ms"] == [pytest.approx(4.0)]                 # 20 ms over 5 tokens
    e.opened = {}
    e.per_request({0: 0.0}, [1, 1], 0.100)         # the new sequence's first round: the clock starts at its end
    e.per_request({}, [4, 1], 0.108)
    e.per_request({}, [0, 0], 0.108, least=16)     # the point's end: stream 0 has 4 tokens, stream 1 has 4
    assert e.rec["request_tpot_ms"] == [pytest.approx(4.0)]
    e.per_request({}, [0, 12], 0.200, least=16)    # stream 1: 16 tokens over 200 ms
    assert e.rec["request_tpot_ms"][1:] == [pytest.approx(12.5)]
    e.opened = {}
    e.per_request({0: 0.0}, [3, 0], 0.300)         # a first round of 3 tokens: the 2 past the first come with it
    e.opened = {0: 0.0}
    e.per_request({}, [2, 0], 0.316)               # ends: 16 ms over 2 + 2 tokens
    assert e.rec["request_tpot_ms"][2:] == [pytest.approx(4.0)]


def test_the_grid_from_the_command_line():
    from sdeth.study.streambench.call import grid_of, parser
    a = parser().parse_args(["--json", "x.json", "--pipelined", "1:1,4:4", "--big-targets", "Qwen3-32B",
                             "--remote-ks", "3", "--quick"])
    g = grid_of(a)
    assert g.pipelined == ((1, 1), (4, 4)) and g.big_targets == ("Qwen3-32B",) and g.remote_ks == (3,)
    assert g.batches == (1, 16)                                   # --quick's small grid under the points given
    assert sb.Grid().to_json()["pipelined"] == () and len(sb.pipelined_grid()) == 15
    with pytest.raises(SystemExit, match="B:N"):
        grid_of(parser().parse_args(["--json", "x.json", "--pipelined", "1x1"]))


def test_the_draft_runs_the_fused_kernels_on_a_gpu_unless_told_and_a_bad_spec_stops_the_call_at_once():
    """--draft-fast: none given, kernels=auto on a GPU and torch's on a CPU (the fused kernels need CUDA); a spec
    the random-weights draft cannot take (a bad key, fp8 weights, a pruned head) exits before anything runs."""
    from sdeth.study.streambench.call import grid_of, parser
    from sdeth.study.streambench.common import draft_options
    assert draft_options("cuda:0", None) == "kernels=auto" and draft_options("cpu", None) == ""
    assert draft_options("cuda:0", "kernels=torch") == "kernels=torch"
    assert grid_of(parser().parse_args(["--json", "x.json"])).draft_fast is None
    g = grid_of(parser().parse_args(["--json", "x.json", "--draft-fast", "kernels=attn"]))
    assert g.draft_fast == "scope=layer,weights=bf16,head=0,kernels=attn"
    for bad, why in (("kernels=fast", "kernels"), ("weights=fp8", "bf16"), ("head=4096", "whole output layer")):
        with pytest.raises(SystemExit, match=why):
            grid_of(parser().parse_args(["--json", "x.json", "--draft-fast", bad]))


def test_a_pipelined_point_carries_the_timeline_the_streams_held_and_the_model(fast):
    """Two emulated pipelined targets of two streams: every stream's timeline gap measured, the server held exactly
    the live streams, and the event model fed the point's measured step."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = build_server(fast, sb.welcome("tiny", 300, 8), DraftServerConfig(8, 256, ttl_s=30, prefill_chunk=16,
                                                                             limits=ServerLimits(reserve=0)))
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 40}, daemon=True).start()
    tv = {(2, m): 8.0 + m for m in range(sb.PIPELINED_K + 1)}
    res = {}
    with sb.Targets(2) as pool:
        sb.pipelined_part(res, "Qwen3-1.7B", addr, pool, tv, 300, sb.Grid(remote_s=1.5, pipelined=((2, 2),),
                          prompt=PROMPT, context=100), time.time() + 60, lambda line: None, lambda: None)
    p = res["remote_pipelined"]["points"][0]
    assert "error" not in p, p
    assert p["server_streams"]["live"] == 4 and p["server_streams"]["held_max"] == 4
    tl = p["timeline_ms"]
    assert all(tl[key]["n"] > 0 and tl[key]["p50"] >= 0 for key in sb.TIMELINE)
    assert tl["sent_to_arrived"]["p50"] >= tl["sent_to_read"]["p50"]
    assert p["offered_mean"] > 0.3                     # the streams keep drafts on offer
    assert p["speedup"] > 1.0 and 0 < p["model"]["verified_per_round"] <= sb.PIPELINED_K
    assert not server.drafter.seqs                           # every stream ended (End, Ended)


def test_ranks_name_the_draft_choices_tokens():
    from sdeth.study.streambench.ranks import TOP, Ranks, token_of
    syn = Ranks("synthetic:0.9", 0.7, 1)
    rs = [syn.rank(0, j) for j in range(4000)]
    rej = [r for r in rs if r]
    assert abs(rs.count(0) / len(rs) - 0.7) < 0.03 and abs(rej.count(1) / len(rej) - 0.9) < 0.04
    assert set(rej) <= {1, TOP} and syn.shares()[1] == 0.9 and "synthetic ranks" in syn.label
    tr = Ranks("trace", 0.71, 1)
    assert abs(tr.trace.realized_alpha - 0.71) < 0.02 and "trace-driven" in tr.label
    assert 0.1 < tr.shares()[1] < 0.3 and abs(sum(tr.shares()) - 1) < 1e-9     # the trace's 2nd choices: 18%
    assert token_of(0, 5, [7, 9], 300) == 5 and token_of(2, 5, [7, 9], 300) == 9
    assert token_of(TOP, 5, [6, 7], 300) == 8 and token_of(1, None, None, 300) == -1
    with pytest.raises(ValueError, match="synthetic:H"):
        Ranks("sometimes", 0.7, 1)


def ssd_servers(fast, settings) -> dict:
    """One draft server over the tiny model (a thread) per (cache setting, rows), as ssd_points takes them: the
    setting's server runs its spec (ssd.server_spec: '+ahead' is the targets' side)."""
    from sdeth.study.streambench.ssd import server_spec
    servers = {}
    for cache, rows in settings:
        addr = f"tcp://127.0.0.1:{free_port()}"
        server = build_server(fast, sb.welcome("tiny", 300, rows), DraftServerConfig(
            rows, 256, ttl_s=30, prefill_chunk=16, verdict_cache=server_spec(cache), limits=ServerLimits(reserve=0)))
        threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 60}, daemon=True).start()
        servers[cache] = (server, addr, {"vocab": 300})
    return servers


def test_the_ssd_points_off_and_on_with_a_full_server(fast):
    """Verdict cache off and on (two servers over the tiny model, threads) and a full one (rows = B * N), synthetic
    ranks at a 0.9 hit rate: on foresees restarts (hits, branch rows), off and full spend nothing on branches;
    each point carries the event model with the cache's terms."""
    from sdeth.study.streambench.ssd import goal_lines, ssd_points, ssd_table
    servers = ssd_servers(fast, (("off", 8), ("2x4x4", 8), ("4x4x8", 4)))
    g = sb.Grid(ssd_points=((2, 2),), ssd_targets=("Qwen3-8B",), ssd_ranks=("synthetic:0.9",), ssd_s=1.5,
                prompt=PROMPT, context=100)
    res = {"ssd": {"points": []}}
    with sb.Targets(2) as pool:
        ssd_points(res, "Qwen3-1.7B", servers, pool, g, time.time() + 60, lambda line: None, lambda: None)
    pts = {p["verdict_cache"]["spec"]: p for p in res["ssd"]["points"] if "verdict_cache" in p}
    assert set(pts) == {"off", "2x4x4", "4x4x8"}, res["ssd"]["points"]
    on, off, full = pts["2x4x4"], pts["off"], pts["4x4x8"]
    assert "synthetic ranks" in on["label"] and on["target"] == "Qwen3-8B"
    assert on["verdict_cache"]["hits"] > 0 and on["verdict_cache"]["branch_rows_per_step"] > 0
    assert on["verdict_cache"]["hit_rate_by_position"] and on["model_cached"]["terms"]["hit"] > 0.5
    assert off["verdict_cache"]["hits"] == 0 and not off["verdict_cache"]["branch_rows_per_step"]
    assert full["verdict_cache"]["hits"] == 0 and not full["verdict_cache"]["branch_rows_per_step"], \
        (full["verdict_cache"], servers["4x4x8"][0].verdicts.stats)
    st = servers["4x4x8"][0].verdicts.stats       # full: a branch only on a row no stream has opened yet (the start), given
    assert st["hits"] == 0 and st["branches"] == st["evicted"] + st["dropped"]   # back to it; none at a turnover
    for p in (on, off, full):
        assert p["tokens_per_step"] >= 1 and p["model_cached"]["tokens_per_round"] >= 1
    table = ssd_table({"call": res})
    assert len(table) == 3 and table["on / off"].notna().all() and set(table["cache"]) == set(pts)
    res["ssd"]["server_rows"] = 4                          # (the full server's rows, as its call records them)
    lines = goal_lines({"call": res})
    assert len(lines) == 2 and all("full server (4 rows)" in line and "within 5%" in line for line in lines), lines


def test_a_second_hold_runs_beside_the_first_and_stays_out_of_the_tables(fast):
    """`--ssd-hold periods,draft`: each point under both holds on the same server; the first's points are the
    part's, the second's go to hold_points (labelled, out of the tables), and hold_lines sets each beside its
    pair."""
    from sdeth.study.streambench.ssd import hold_lines, ssd_points, ssd_table
    servers = ssd_servers(fast, (("off", 4),))
    g = sb.Grid(ssd_points=((1, 1),), ssd_targets=("Qwen3-8B",), ssd_ranks=("synthetic:0.9",), ssd_s=1.0,
                prompt=PROMPT, context=100, ssd_holds=("periods", "draft"))
    res = {"ssd": {"points": []}}
    with sb.Targets(1) as pool:
        ssd_points(res, "Qwen3-1.7B", servers, pool, g, time.time() + 60, lambda line: None, lambda: None)
    (p,), (q,) = res["ssd"]["points"], res["ssd"]["hold_points"]
    assert p["emulation"]["hold"] == "periods" and q["emulation"]["hold"] == "draft", (p, q)   # (the targets' own)
    assert "held for the draft's token (draft)" in q["label"] and "held" not in p["label"]
    assert len(ssd_table({"call": res})) == 1
    (line,) = hold_lines({"call": res})
    assert "hold periods: speedup" in line and "hold draft: speedup" in line and "B=1 N=1 off" in line


@pytest.mark.slow
def test_an_ssd_only_call_on_a_cpu_writes_its_json(tmp_path):
    """`bench streams --only-ssd` end to end with the tiny-2L shape on a CPU: two server processes (cache off, on),
    one emulated target process, trace-driven ranks; the JSON has both points, labelled, and its own bench name."""
    import json
    from sdeth.study.streambench.call import run_call
    g = sb.Grid(verdict_caches=("off", "on"), only_ssd=True, ssd_points=((1, 1),), ssd_targets=("Qwen3-8B",),
                ssd_ranks=("trace",), ssd_s=1.0, ssd_rows=4, prompt=PROMPT, context=100)
    path = tmp_path / "ssd.json"
    run_call(1, str(path), g, ("tiny-2L",), "cpu", budget_s=150, progress=lambda line: None)
    res = json.loads(path.read_text())
    assert res["bench"] == "streams-ssd" and set(res["ssd"]["servers"]) == {"off", "on"}
    pts = res["ssd"]["points"]
    assert [p["verdict_cache"]["spec"] for p in pts] == ["off", "on"], pts
    assert all("trace-driven ranks" in p["label"] and p["tokens"] > 0 for p in pts)


def test_the_ssd_points_with_branches_sent_ahead(fast):
    """A cache setting with '+ahead' (its server runs the spec before it; the targets ask for the branches ahead and
    wait for no answer): hits are taken from the branches the targets hold, the step after a hit has drafts on offer,
    and no answer is awaited."""
    from sdeth.study.streambench.ssd import ssd_points
    servers = ssd_servers(fast, (("off", 8), ("2x4x4+ahead", 8)))
    g = sb.Grid(ssd_points=((1, 2),), ssd_targets=("Qwen3-8B",), ssd_ranks=("synthetic:0.9",), ssd_s=1.5,
                prompt=PROMPT, context=100)
    res = {"ssd": {"points": []}}
    with sb.Targets(2) as pool:
        ssd_points(res, "Qwen3-1.7B", servers, pool, g, time.time() + 60, lambda line: None, lambda: None)
    pts = {p["verdict_cache"]["spec"]: p for p in res["ssd"]["points"] if "verdict_cache" in p}
    ahead = pts["2x4x4+ahead"]["verdict_cache"]
    assert ahead["ahead"] and ahead["hits"] > 0 and ahead["hit_next_offered"] > 0, ahead
    assert ahead["answer_wait_ms"] is None and not pts["off"]["verdict_cache"]["ahead"]
    assert pts["2x4x4+ahead"]["model_cached"]["terms"]["hit"] > 0.5
    from sdeth.study.streambench import hitcurve      # the hit-rate curve from the same points
    res["ssd"].update(k=sb.PIPELINED_K, targets=["Qwen3-8B"], server_rows=8)
    c = hitcurve.curve(res, "Qwen3-8B", 1, 2)
    assert c["spec"] == "2x4x4+ahead" and {m["spec"] for m in c["measured"]} == {"off", "2x4x4+ahead"}
    sweep = c["model"]
    assert len(sweep) == 11 and sweep[0]["hit_rate"] == 0 and sweep[-1]["hit_rate"] > 0.5
    assert sweep[-1]["speedup"] > sweep[0]["speedup"]          # every hit saves a restart
    assert c["colocated_speedup"] is None and c["hit_to_beat_colocated"] is None
    assert len(hitcurve.curve_table([{"call": "c", **c}])) == 2


def test_the_hit_rate_crossing_reads_between_the_sweeps_points():
    from sdeth.study.streambench.hitcurve import crossing
    sweep = [{"hit_rate": 0.0, "speedup": 1.5}, {"hit_rate": 0.4, "speedup": 1.9}, {"hit_rate": 0.8, "speedup": 2.3}]
    assert crossing(sweep, 2.1) == pytest.approx(0.6) and crossing(sweep, 1.2) == 0.0
    assert crossing(sweep, 2.5) == "not reached" and crossing(sweep, None) is None


def test_the_crossing_lines_say_what_a_call_lacks():
    """A call without colocated SD says so, and a level no hit rate reaches reads as such (not "None" or "Nonex")."""
    from sdeth.study.streambench.hitcurve import crossing_lines
    c = {"call": "c", "target": "Qwen3-8B", "spec": "4x4x8+ahead", "trace_hit_rate": 0.09, "colocated_speedup": None,
         "hit_to_beat_colocated": None, "hit_to_match_ssd": "not reached"}
    (line,) = crossing_lines([c])
    assert "no colocated SD in this call" in line and "at no hit rate up to 1" in line and "None" not in line
    (line,) = crossing_lines([{**c, "colocated_speedup": 1.9, "hit_to_beat_colocated": 0.2, "hit_to_match_ssd": 0.66}])
    assert "beats colocated SD (1.9x, same call) from a hit rate of 0.2" in line and "from a hit rate of 0.66" in line
    (line,) = crossing_lines([{**c, "trace_hit_rate": None}])
    assert "no point of the embedded trace's ranks in this call" in line and "None" not in line


def test_the_link_points_go_through_a_delay_relay_and_carry_the_model_between(fast):
    """The link part (a tiny draft server, a thread): each injected round trip through a delay relay (a process),
    its Ping through the relay recorded; the commit's transit grows with the delay; the event model's curve, fed the
    lowest point, falls as the round trip grows and holds each measured point."""
    from sdeth.study.streambench.link import link_points
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = build_server(fast, sb.welcome("tiny", 300, 8), DraftServerConfig(8, 256, ttl_s=30, prefill_chunk=16,
                                                                             limits=ServerLimits(reserve=0)))
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 60}, daemon=True).start()
    g = sb.Grid(link_rtts=(0.02, 6.0), link_targets=("Qwen3-8B",), link_points=((1, 1),), policies=("offered",),
                remote_s=1.5, prompt=PROMPT, context=100)
    res = {"link": {"targets": {}, "points": []}}
    with sb.Targets(1) as pool:
        link_points(res, "Qwen3-1.7B", addr, pool, 300, g, time.time() + 90, lambda line: None, lambda: None)
    pts = {p["injected_rtt_ms"]: p for p in res["link"]["points"]}
    assert set(pts) == {0.02, 6.0} and all("error" not in p for p in pts.values()), res["link"]["points"]
    near, far = pts[0.02], pts[6.0]
    assert "6 ms injected round trip" in far["label"] and far["target"] == "Qwen3-8B"
    assert far["probe_rtt_ms"] >= 6.0 > near["probe_rtt_ms"]
    assert far["timeline_ms"]["sent_to_read"]["p50"] >= 3.0 > near["timeline_ms"]["sent_to_read"]["p50"]
    (m,) = res["link"]["model"]
    curve = [c["speedup"] for c in m["curve"]]
    assert m["fed_from_rtt_ms"] == 0.02 and curve[-1] < curve[0]              # 6 ms costs more than 0.02 ms, and
    assert max(curve) <= 1.05 * curve[0], curve     # nothing between gains (the model's own coins wobble a little)
    assert [x["injected_rtt_ms"] for x in m["measured"]] == [0.02, 6.0]
    assert all(x["measured_over_model"] > 0 for x in m["measured"])
    assert m["measured"][0]["measured_over_scaled_model"] == 1.0           # the scaled curve holds its lowest point
    from sdeth.study.streambench.link import link_lines, link_table
    (line,) = link_lines({"c": res})
    assert "2 round trips measured" in line and "within 10%" in line
    assert list(link_table({"c": res})["injected RTT ms"]) == [0.02, 6.0]
    cut = {"c": {"link": {"points": res["link"]["points"]}}}              # a call cut before its model was written
    assert link_lines(cut) == [] and list(link_table(cut)["model"]) == [None, None]


def test_a_colocated_only_call_sets_a_real_target_beside_its_emulation(tmp_path, monkeypatch):
    """`bench streams --only-colocated --colocated-real` on a CPU (tiny-2L as draft and target): the real target's
    t_v measured in the call, colocated SD with it and with its emulation at that t_v, their ratio per (B, k)."""
    import json
    from sdeth.study.bench.targets import DRAFT_ALPHA
    from sdeth.study.streambench.call import grid_of, parser, run_call
    monkeypatch.setitem(DRAFT_ALPHA, "tiny-2L", 0.71)
    g = grid_of(parser().parse_args(["--json", "x", "--only-colocated", "--colocated-real", "tiny-2L", "--batches",
                                     "1", "--colocated-ks", "2", "--colocated-s", "0.5"]))
    g.prompt, g.context = PROMPT, 100
    path = tmp_path / "colocated.json"
    run_call(1, str(path), g, ("tiny-2L",), "cpu", budget_s=900, progress=lambda line: None)   # (a loaded machine
    res = json.loads(path.read_text())                                                          # takes its time)
    part = res["colocated_real"]["tiny-2L"]
    assert res["bench"] == "streams-colocated" and set(part["t_v_ms"]) == {"1,0", "1,1", "1,2"}
    real, emu = part["points"]
    assert real["target"] == "real" and emu["target"] == "emulated" and "measured in this call" in emu["label"]
    (r,) = part["real_over_emulated"]
    assert (r["B"], r["k"]) == (1, 2) and r["tpot_mean"] == pytest.approx(real["tpot_ms"]["mean"] / emu["tpot_ms"]["mean"],
                                                                          abs=1e-3)
    with pytest.raises(SystemExit, match="--only-colocated"):
        grid_of(parser().parse_args(["--json", "x", "--only-colocated"]))

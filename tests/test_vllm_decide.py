"""Where the remote draft proposer decides whether a step waits (wire.vllm_proposer `_decide`), what it measures for
that decision as it runs (the target's step, the server's draft step, the restart latency, the verdicts), the
decision in its step log, and the study's comparison of its step, where it did not wait, with target-only's. No
vLLM: the tracker alone, or a proposer against the stand-in stream server."""
import json
import time

import pytest

from sdeth.wire import protocol as W
from sdeth.wire import vllm_proposer as VP
from sdeth.wire.vllm_streams import StreamTracker
from test_vllm_proposer import HELLO, Batch, vllm_config
from test_vllm_stream import StreamStub, f, grow


def test_sync_waits_for_every_rounds_drafts_until_the_deadline_and_stream_takes_what_is_on_offer():
    """The decisions as today's modes make them, and what is measured before any step (the draft period: the
    server's step, its Streamed messages' compute)."""
    sync = VP.SyncDraftProposer(vllm_config(3), addr="tcp://127.0.0.1:1", deadline_ms=40, step_ratio=2)
    assert sync._decide([]) == (3, pytest.approx(0.04))
    sync.steps_s.extend([0.05, 0.03, 0.04])                  # the target's step: 40 ms, x 2 > the 40 ms floor
    assert sync._decide([]) == (3, pytest.approx(0.08))
    assert sync.measured() == (0.04, None, None, 0, 0)
    stream = VP.StreamingDraftProposer(vllm_config(3), addr="tcp://127.0.0.1:1")
    assert stream._decide([0, 2, 3]) == (0, 0.0)
    assert stream.measured() == (None, None, None, 0, 0)
    for ms in (12.0, 20.0, 16.0, 0.0):                       # the server's steps (0: a foreseen branch, no step)
        stream._take(W.Streamed([], 1, ms))
    assert stream.measured().draft_period_s == pytest.approx(0.016)


def test_the_stream_tracker_measures_the_restart_latency_and_the_verdicts():
    tr, b = StreamTracker(window=8), Batch()
    b.add([5, 6, 7], sampled=False)
    (s, _), = tr.plan(*b.args(), k=3, context=200, now=1.0).opens
    tr.take([W.StreamRow(s.seq, 0, 0, 0, 8)], now=1.1)
    tr.take([W.StreamRow(s.seq, 0, 0, 1, 9), W.StreamRow(s.seq, 0, 0, 2, 10)], now=1.3)
    assert tr.restart_s() is None
    s.offered = tr.drafts(s, 0, 3)                           # what the proposer offers the row: [8, 9, 10]
    b.grow(0, [8, 4])                                        # one accepted, then the target's own token (not 9)
    p = tr.plan(*b.args(), k=3, context=200, now=2.0)
    assert (p.verified, p.accepted) == (3, 1) and s.view.epoch == 1 and not s.offered
    tr.take([W.StreamRow(s.seq, 0, 0, 3, 11)], now=2.1)      # the old epoch's: not the restart's first draft
    tr.take([W.StreamRow(s.seq, 0, 1, 2, 12)], now=2.25)     # the new epoch's first: 0.25 s after the commit left
    assert tr.restart_s() == pytest.approx(0.25)
    b.grow(0, [12, 13])                                      # committed before its draft arrived (unresolved) ...
    tr.plan(*b.args(), k=3, context=200, now=3.0)
    tr.take([W.StreamRow(s.seq, 0, 1, 3, 99)], now=3.2)      # ... and the draft there differs: a restart at 3.0
    assert s.view.epoch == 2
    tr.take([W.StreamRow(s.seq, 0, 2, 4, 14)], now=3.5)
    assert sorted(tr.restarts_s) == pytest.approx([0.25, 0.5])
    tr.take([W.StreamRow(s.seq, 0, 2, 5, 16)], now=3.6)
    b.grow(0, [14, 5])                                       # the draft's 14 accepted, then 5, not its 16: a restart
    tr.plan(*b.args(), k=3, context=200, now=4.0)            # at 4.0 ...
    assert s.view.epoch == 3
    # ... whose first draft carries the server's stamps: read the commit at 100.010, stepped at 100.030 (its clock);
    # taken a whole vLLM step later (4.9), the restart is the server's 20 ms plus the link's 2 ms round trip
    tr.take([W.StreamRow(s.seq, 0, 3, 6, 15, since=5, read_at=100.010)], now=4.9, stepped_at=100.030, link_s=0.002)
    assert tr.restarts_s[-1] == pytest.approx(0.022)


class WaitingProposer(VP.StreamingDraftProposer):
    """Streaming, with a decision to wait for up to 3 more drafts a row for at most 2 s (a policy's stand-in)."""

    def _decide(self, offered):
        return 3, 2.0


def test_a_decision_to_wait_takes_what_arrives_within_it_and_the_step_log_keeps_the_decision(tmp_path, monkeypatch):
    """Against a stand-in server whose every Streamed is 0.3 s late: the stock stream mode's first step offers
    nothing and waits for nothing; a proposer whose _decide says wait gets the Open's drafts in its first step,
    having waited about the server's delay (far less than its 2 s), and logs so. Its drafts, all accepted by a
    target that agrees with the draft, are counted as verified and accepted."""
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("stream", "waiting")}
    server = StreamStub(delay_s=0.3)
    got = {}
    for name, cls in (("stream", VP.StreamingDraftProposer), ("waiting", WaitingProposer)):
        monkeypatch.setenv(VP.STEPS_LOG_ENV, str(logs[name]))
        p = cls(vllm_config(3, 200), addr=server.addr, hello=HELLO)
        p.load_model()
        b = Batch()
        b.add([10 + len(got), 20, 30])
        t0 = time.perf_counter()
        out = p.propose(*b.args())
        got[name] = (out, time.perf_counter() - t0)
        grow(b, out)
        p.propose(*b.args())
        p.close()
        got[name] += (p.stats, p.measured())
    server.kill()
    (out, wall, _, _), (w_out, w_wall, w_stats, w_measured) = got["stream"], got["waiting"]
    assert out == [[]] and wall < 0.2
    assert w_out == [[f(3), f(4), f(5)]] and 0.25 < w_wall < 1.5
    assert w_stats.waited >= 1 and (w_measured.verified, w_measured.accepted) == (3, 3)
    lines = {name: [json.loads(x) for x in path.read_text().splitlines()] for name, path in logs.items()}
    assert [(x["wait_for"], x["waited_ms"]) for x in lines["stream"]] == [(0, 0.0), (0, 0.0)]
    first = lines["waiting"][0]
    assert first["wait_for"] == 3 and first["wait_max_ms"] == 2000.0 and 250 < first["waited_ms"] < 1500


def test_the_study_sets_the_proposers_step_where_it_did_not_wait_against_target_onlys_step(tmp_path):
    """The proposer's period (host time + the gap after it) over steps that took what was on offer, its p99 less
    target-only's engine step p99; steps that waited are left out; EngineSteps writes the engine's step times."""
    from sdeth.study.vllm import stream as S
    lines, t = [], 100.0
    for i in range(40):                                      # 10 ms steps; every 10th waits 30 ms (then 40 ms)
        wait = i % 10 == 9
        lines.append({"t": t, "host_ms": 30.0 if wait else 0.5, "gap_ms": 9.5 if i else 0.0, "rows": 1,
                      "ready": 1, "offered": 2 if i % 2 else 0, "accepted": 0, "wait_for": 3 if wait else 0,
                      "wait_max_ms": 50.0 if wait else 0.0, "waited_ms": 29.5 if wait else 0.0})
        t += (lines[-1]["host_ms"] + 9.5) / 1e3
    phase = {"t0": 99.0, "t1": t + 1, "accepted": 10}
    fig = S.step_figures(lines, phase)
    assert fig["period_ms_not_waiting"]["p99"] == pytest.approx(10.0) and fig["period_ms"]["p99"] > 30
    assert fig["steps_waiting_share"] == pytest.approx(0.1) and fig["waited_ms"]["n"] == 4
    ref = S.engine_step_figures([100.0 + 0.0099 * i for i in range(50)] + [200.0], {"t0": 99, "t1": 300})
    assert ref["p99"] == pytest.approx(9.9) and ref["n"] == 49     # the idle gap is no step
    cmp = S.over_target_only(fig, ref)
    assert cmp["not_waiting_p99_over_target_only_ms"] == pytest.approx(0.1)
    assert cmp["no_drafts_p99_over_target_only_ms"] == pytest.approx(0.1)
    assert S.over_target_only(fig, None)["not_waiting_p99_over_target_only_ms"] is None
    log = S.EngineSteps(str(tmp_path / "engine.jsonl"))
    log.t_written = 0.0                                      # (written once a second: the next add writes)
    log.add()
    assert [set(x) for x in S._jsonl(tmp_path / "engine.jsonl")] == [{"t"}]


def test_a_sync_step_with_no_round_to_answer_waits_not_at_all():
    """A row still in prefill gets its track opened and no round: the step's decision is sync's, its wait 0."""
    server = StreamStub()
    p = VP.SyncDraftProposer(vllm_config(3, 200), addr=server.addr, hello=HELLO, deadline_ms=500)
    p.load_model()
    b = Batch()
    b.add([5, 6, 7], sampled=False)
    assert p.propose(*b.args()) == [[]] and p.stats.opened == 1
    assert p.decision == (3, pytest.approx(0.5), 0.0) and p.stats.waited == 0
    p.close()
    server.kill()


# ------------------------------------------------------------------ policy mode: the step policy decides

def measured_as(p: VP.RemoteDraftProposer, step_s: float, period_s: float, alpha_high: bool) -> None:
    """p's measurements as if long taken: the target's step, the server's draft step, and verdicts that put alpha
    near 0.9 (nine accepted, then a rejection, each round) or near 0 (every round rejected at its first draft); and
    a rule scored (as over the steps that follow, SCORE_BUDGET_S a step: for these costs, or for the costs of a
    scoring already under way)."""
    p.steps_s.extend([step_s] * VP.STEP_WINDOW)
    p.draft_steps_s.extend([period_s] * 8)
    for _ in range(300):
        p.policy.observe_round(*((9, 10) if alpha_high else (0, 3)))
    p._feed()
    steps = 0
    while p._rule() is None or p.scoring is not None:
        steps += 1
    assert steps < 63                # k = 3: 31 rules of two cycles each, SCORE_BUDGET_S of them a step (one at least)


def test_the_mode_is_policy_by_default_sync_and_stream_by_name_and_a_bad_name_says_the_choices(monkeypatch):
    monkeypatch.delenv(VP.MODE_ENV, raising=False)
    addr = "tcp://127.0.0.1:1"
    assert VP.RemoteDraftProposer(vllm_config(3), addr=addr).mode == "policy"
    for mode in VP.MODES:
        monkeypatch.setenv(VP.MODE_ENV, mode)
        p = VP.RemoteDraftProposer(vllm_config(3), addr=addr)
        assert p.mode == mode and (p.streams is None) == (mode == "sync") and (p.policy is None) == (mode != "policy")
        module, name = VP.CLASS_PATHS[mode].rsplit(".", 1)       # the class vLLM loads for a named mode
        assert module == VP.__name__ and getattr(VP, name)(vllm_config(3), addr=addr).mode == mode
    assert VP.StreamingDraftProposer(vllm_config(3), addr=addr).mode == "stream"      # a class's mode beats the env
    monkeypatch.setenv(VP.MODE_ENV, "fast")
    with pytest.raises(VP.ProposerError, match="SDETH_DRAFT_MODE='fast': use one of policy, sync, stream"):
        VP.RemoteDraftProposer(vllm_config(3), addr=addr)


def test_policy_mode_waits_where_the_measured_costs_say_waiting_pays_and_not_where_they_say_not():
    """Until the target's step and the draft period are measured it takes what is on offer. A slow target step
    (300 ms), a fast draft (10 ms a token) and alpha near 0.9: a row with nothing on offer waits for all k drafts, at
    most OVERDUE x their due time (the restart's 3.5 periods) and never past the deadline; a row with them all on
    offer waits for none. A fast target (10 ms), a slow draft (100 ms) and alpha near 0: it takes what is on offer."""
    p = VP.PolicyDraftProposer(vllm_config(3), addr="tcp://127.0.0.1:1", deadline_ms=500, step_ratio=0)
    assert p._decide([0, 0]) == (0, 0.0)
    p.steps_s.extend([0.3] * VP.STEP_WINDOW)
    p.draft_steps_s.extend([0.01] * 8)
    assert p._decide([0, 0]) == (0, 0.0) and p.scoring is not None      # the first rule is being scored
    measured_as(p, 0.3, 0.01, alpha_high=True)
    m, wait_s = p._decide([0, 3])
    assert m == 3 and 0.5 * 3 * 3.5 * 0.01 < wait_s < 2 * 3 * 3.5 * 0.01
    assert p._decide([3, 3]) == (0, 0.0)
    p.steps_s.extend([2.0] * VP.STEP_WINDOW)                  # a 2 s target step: the wait stays within the deadline
    assert p._decide([0])[1] <= 0.5
    q = VP.PolicyDraftProposer(vllm_config(3), addr="tcp://127.0.0.1:1")
    measured_as(q, 0.01, 0.1, alpha_high=False)
    assert q._decide([0, 1]) == (0, 0.0) and q._decide([0]) == (0, 0.0)


def test_policy_mode_scores_a_piece_a_step_and_once_it_holds_a_rule_looks_at_the_costs_every_rule_every_steps(
        monkeypatch):
    """A step's host work stays small: with no time budget each step scores one piece of the rule (one restart
    cycle of one rule: 2 x 31 for k = 3), and once a rule is held the costs (medians, the rule's key) are taken again
    only every RULE_EVERY steps, so a change of costs reaches the rule within RULE_EVERY steps plus a scoring (at once
    where alpha has moved by 0.1)."""
    monkeypatch.setattr(VP, "SCORE_BUDGET_S", 0.0)
    p = VP.PolicyDraftProposer(vllm_config(3), addr="tcp://127.0.0.1:1", deadline_ms=500)
    p.steps_s.extend([0.3] * VP.STEP_WINDOW)
    p.draft_steps_s.extend([0.01] * 8)
    feeds = []
    feed = p._feed
    monkeypatch.setattr(p, "_feed", lambda: feeds.append(1) or feed())
    steps = 0
    while p._rule() is None:
        steps += 1
    assert steps == 2 * 31 and len(feeds) == 1               # 62 pieces, then the step that returns the best
    first = p.rule_now
    for _ in range(3 * VP.RULE_EVERY):
        assert p._rule() == first
    assert len(feeds) == 4                                           # at steps RULE_EVERY, 2x and 3x after the first
    p.steps_s.extend([0.001] * VP.STEP_WINDOW)                        # a fast target, a slow draft: another rule
    p.draft_steps_s.extend([0.5] * 64)
    for _ in range(VP.RULE_EVERY + 2 * 31):
        p._rule()
    assert p.rule_now != first and p.scoring is None
    assert p.rule_due > 0
    taken = len(feeds)
    for _ in range(40):                                              # alpha falls by more than 0.1: the costs
        p.policy.observe_round(0, 3)                                 # are taken again at once, not RULE_EVERY on
    p._rule()
    assert len(feeds) == taken + 1 and p.rule_due == VP.RULE_EVERY - 1


def test_policy_mode_logs_its_decisions_and_waits_only_as_long_as_the_drafts_take(tmp_path, monkeypatch):
    """Against a stand-in server whose every Streamed is 50 ms late: with costs that say wait (slow target, fast
    draft, alpha high) the first step waits for the Open's drafts (about the server's delay), offers k and logs
    (3, its cap, the time waited); with costs that say not, the first step offers nothing and logs (0, 0, 0)."""
    server = StreamStub(delay_s=0.05)
    got = {}
    for name, costs in (("wait", (0.3, 0.02, True)), ("not", (0.01, 0.1, False))):
        log = tmp_path / f"{name}.jsonl"
        monkeypatch.setenv(VP.STEPS_LOG_ENV, str(log))
        p = VP.PolicyDraftProposer(vllm_config(3, 200), addr=server.addr, hello=HELLO)
        p.load_model()
        measured_as(p, *costs)
        b = Batch()
        b.add([40 + len(got), 20, 30])
        out = p.propose(*b.args())
        grow(b, out)
        p.propose(*b.args())
        p.close()
        got[name] = (out, p.stats, [json.loads(x) for x in log.read_text().splitlines()])
    server.kill()
    out, stats, lines = got["wait"]
    assert out == [[f(3), f(4), f(5)]] and stats.waited >= 1
    first = lines[0]
    assert first["wait_for"] == 3 and 30 < first["waited_ms"] < first["wait_max_ms"] and first["offered"] == 3
    out, stats, lines = got["not"]
    assert out == [[]] and stats.waited == 0
    assert [(x["wait_for"], x["wait_max_ms"], x["waited_ms"]) for x in lines][0] == (0, 0.0, 0.0)

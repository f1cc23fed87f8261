"""Pipelined streams of emulated targets against a real draft server (a thread; the targets in processes): every
stream makes progress, drafts are on offer, the commit rules agree on both sides (no desync)."""
import threading

from doubles import tiny_qwen3

from sdeth.place.testbed import free_port
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.study import streambench as sb
from sdeth.wire.draft_server import DraftServerConfig, ServerLimits, build_server


def test_pipelined_points_against_a_real_draft_server():
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = build_server(FastDecoder(tiny_qwen3(0), 8), sb.welcome("tiny", 300, 8),
                          DraftServerConfig(8, 256, ttl_s=30, prefill_chunk=64, limits=ServerLimits(reserve=0)))
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 40}, daemon=True).start()
    tv = {(2, m): 8.0 + m for m in range(sb.PIPELINED_K + 1)}
    res, g = {}, sb.Grid(remote_s=1.5, pipelined=((2, 1), (2, 2)), prompt=16, context=120)
    with sb.Targets(2) as pool:
        import time
        sb.pipelined_part(res, "Qwen3-1.7B", addr, pool, tv, 300, g, time.time() + 60, lambda line: None, lambda: None)
    pts = res["remote_pipelined"]["points"]
    assert [(p["B"], p["N"]) for p in pts] == [(2, 1), (2, 2)]
    for p in pts:
        assert "error" not in p, p
        assert p["label"] == sb.PIPELINED_LABEL and p["gpus"] == p["N"] + 1
        assert p["steps"] > 20 and p["tokens"] >= 2 * p["steps"]          # each stream a token a step at least
        assert p["offered_mean"] > 0 and p["accepted_mean"] > 0           # drafts arrived and some were accepted
        assert p["tpot_ms"]["mean"] < 8.0 + sb.PIPELINED_K                # faster than one token a target step
        assert p["server_batch"]["max"] >= 1
    assert not server.drafter.seqs                                       # every stream ended (End, Ended)


def test_the_emulated_targets_play_the_step_policy_named():
    """sync waits for k drafts a stream, offered never waits; each point says which it played."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = build_server(FastDecoder(tiny_qwen3(0), 8), sb.welcome("tiny", 300, 8),
                          DraftServerConfig(8, 256, ttl_s=30, prefill_chunk=64, limits=ServerLimits(reserve=0)))
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 40}, daemon=True).start()
    tv = {(1, m): 6.0 + m for m in range(sb.PIPELINED_K + 1)}
    with sb.Targets(1) as pool:
        import time
        res, g = {}, sb.Grid(remote_s=1.0, pipelined=((1, 1),), prompt=16, context=120,
                             policies=("sync", "offered", "policy"))
        sb.pipelined_part(res, "Qwen3-1.7B", addr, pool, tv, 300, g, time.time() + 30, lambda line: None,
                          lambda: None)
    got = {p["step_policy"]: p for p in res["remote_pipelined"]["points"]}
    assert list(got) == ["sync", "offered", "policy"]                  # one point, each policy in turn
    for policy, p in got.items():
        assert "error" not in p, p
        assert p["steps"] > 20
        lo, hi = p["speedup_interval"]                                  # an interval over runs of steps
        assert lo <= p["speedup"] <= hi and hi - lo < p["speedup"]
        assert p["restart_periods"]["p50"] > 0 and p["restart_periods"]["p99"] >= p["restart_periods"]["p50"]
    assert got["sync"]["offered_mean"] > sb.PIPELINED_K - 0.5 and got["sync"]["wait_ms_mean"] > 0.5
    assert got["offered"]["wait_ms_mean"] < 0.5


def test_a_message_the_server_refused_whole_ends_the_point_naming_it():
    """A refused message (an Error: a Commits or an Open dropped past the server's per-connection queue) leaves the
    streams out of step with the server: take() stops there with the server's words, not at a later desync."""
    import types

    import pytest

    from sdeth.wire import protocol
    waiting = [protocol.Error("limit", "per_pass: 64 messages of this connection wait to be served")]
    t = sb.EmulatedPipelined.__new__(sb.EmulatedPipelined)
    recv = lambda _: waiting.pop() if waiting else None     # noqa: E731
    t.streams, t.server = [], types.SimpleNamespace(client=types.SimpleNamespace(recv=recv))
    with pytest.raises(RuntimeError, match=r"refused a message \(limit\): per_pass: 64 messages"):
        t.take()


def test_a_bonus_whose_draft_is_not_here_yet_is_held_then_sent_as_the_drafts():
    """A stream's bonus token that is the draft's own (rank 0) while the draft's token there has not arrived: its
    commit, and the stream's next one behind it, are held (no restart counted, the view untouched); when the
    draft's token arrives both go out in order, the first as the draft's token, and the view stays in step with the
    server (no restart); a commit held past HOLD_S goes as a token of our own. Under the hold "periods", one held
    past HOLD_PERIODS of the server's period goes as a token of our own, one held less stays."""
    import random
    import time
    import types

    import pytest

    from sdeth.runtime.pipeline import StreamView
    from sdeth.study.streambench import emulated_pipelined as ep
    from sdeth.wire import protocol
    waiting, sent = [], []
    t = sb.EmulatedPipelined.__new__(sb.EmulatedPipelined)
    t.server = types.SimpleNamespace(client=types.SimpleNamespace(recv=lambda _: waiting.pop(0) if waiting else None,
                                                                  send=sent.append))
    t.rec = {"restarts": 0, "restarts_late": 0, "rejections_at": {}, "hits_at": {}, "held": [], "period_ms": [],
             "draft_ms": [], "batch": [], "branch_rows": []}
    t.rng, t.vocab, t.ahead, t.missed, t.window_from, t.last_step = random.Random(0), 300, False, set(), 0.0, 0.0
    t.hold, t.gaps, t.stamp = "draft", [], 0.0
    view = StreamView()
    view.on_commit(0, 7)
    s = {"seq": "a", "view": view, "held": [[1, -1, 0, time.perf_counter()], [2, 99, 0, time.perf_counter()]],
         "sent": {}, "first": None}
    t.streams = [s]
    t.release()
    assert not sent and view.restarts == 0                         # the draft's token at 1 not here: both held
    waiting.append(protocol.Streamed([protocol.StreamRow("a", 0, 0, 1, 42)]))
    t.take()
    assert [[(r.pos, r.token) for r in m.rows] for m in sent] == [[(1, 42), (2, 99)]]
    assert not s["held"] and view.restarts == 0 and t.rec["restarts_late"] == 0
    s["held"].append([3, -1, 0, time.perf_counter() - ep.HOLD_S - 0.01])
    t.release()
    assert sent[-1].rows[0].pos == 3 and sent[-1].rows[0].token >= 0 and not s["held"]
    t.hold, n = "periods", len(sent)
    for stepped in (10.0, 10.03, 10.08, 10.13):      # steps that carried our streams: gaps 0.03, 0.05, 0.05 (median)
        waiting.append(protocol.Streamed([], batch=1, stepped_at=stepped))
    t.take()
    assert t.hold_s() == pytest.approx(ep.HOLD_PERIODS * 0.05) and len(sent) == n
    s["held"] += [[4, -1, 0, time.perf_counter() - t.hold_s() - 0.001], [5, -1, 0, time.perf_counter()]]
    t.release()
    assert [(r.pos, r.token >= 0) for r in sent[-1].rows] == [(4, True)] and len(sent) == n + 1   # 5: not yet
    assert [h[0] for h in s["held"]] == [5]


def test_a_targets_first_sequences_end_at_staggered_lengths():
    """A target's first B sequences end after 1..room settled tokens, spread (so its streams open anew, each a prompt
    for the draft to prefill, at staggered times, not in waves); every later one after room (it fills the context)."""
    import random
    import types

    from sdeth.wire import protocol
    sent = []
    t = sb.EmulatedPipelined.__new__(sb.EmulatedPipelined)
    t.server = types.SimpleNamespace(client=types.SimpleNamespace(send=sent.append))
    t.rng, t.vocab, t.count, t.index, t.B = random.Random(3), 300, 0, 0, 8
    t.window, t.prompt, t.context, t.k, t.watch, t.ahead = 8, 16, 120, 4, 0, False
    room = t.context - t.prompt - t.window - t.k - 2
    first = [t.fresh()["end"] for _ in range(t.B)]
    assert all(1 <= e <= room for e in first) and len(set(first)) >= t.B // 2
    assert [t.fresh()["end"] for _ in range(3)] == [room] * 3
    assert sum(isinstance(m, protocol.Open) for m in sent) == t.B + 3


def test_a_sync_targets_first_sequences_end_at_staggered_lengths(monkeypatch):
    """The sync target alike: each track's first sequence ends after 1..room tokens past its prompt and k (its next
    round would pass the end), spread; a sequence that ends opens a new one, which runs to the context."""
    import types

    from sdeth.study.streambench import emulated_sync
    from sdeth.wire import draft_client
    opened = []

    class Fake:
        def __init__(self, *a, **kw):
            self.client = types.SimpleNamespace(send=lambda m: None)

        def open(self, seq, ids, *a):
            opened.append(seq)
            return types.SimpleNamespace(seq=seq, have=len(ids))
    monkeypatch.setattr(draft_client, "DraftServerClient", Fake)
    B, k, prompt, context = 8, 3, 16, 120
    t = emulated_sync.Emulated("tcp://x", 0, B, k, 5.0, 0.7, 1, 300, prompt=prompt, context=context)
    assert all(prompt + k + 1 <= e <= context for e in t.ends) and len(set(t.ends)) >= B // 2
    j = min(range(B), key=t.ends.__getitem__)
    t.ends = [e if i == j else context for i, e in enumerate(t.ends)]     # (the others: not ending this round)
    t.tracks[j].have = t.ends[j] - k           # its next round (a + 1 + k past `have`) passes its end
    t.verdicts([types.SimpleNamespace(error=None, tokens=[1] * k) for _ in range(B)])
    assert len(opened) == B + 1 and t.ends[j] == context


def test_a_batch_gives_up_its_wait_a_period_after_the_time_it_chose():
    """Four streams just restarted behind a long verify: the step policy's batch waits for each one's own choice, at
    the time those drafts are due. Drafts that never come hold the batch only a server period past that time (not
    until each stream's restart is overdue, three times its due time): it goes with what is on offer. Planned from
    the restarts' measured spread, it waits (planning again when a wait ends short) no longer than the latest draft
    those restarts would bring: past every one of them the restart is a stall."""
    import time

    from sdeth import costmodel
    from sdeth.costmodel import Costs
    from sdeth.runtime.pipeline import StreamView
    k, d = 8, 0.005
    c = Costs(20 * d, d, {m: 20 * d * (1 + 0.03 * (m - 1)) for m in range(2, k + 2)}, rtt=0.0005)
    t = sb.EmulatedPipelined.__new__(sb.EmulatedPipelined)
    t.est = costmodel._policy(0.7, c, k, "policy", None)
    t.est.period, t.est.link = d, 0.0005
    t.k, t.rec = k, {"step_ms": [1.0], "wait_ms": []}
    t.streams = [{"view": StreamView()} for _ in range(4)]
    t.offered, t.take = (lambda s: 0), (lambda: None)            # (nothing arrives)
    t0 = time.perf_counter()
    got = t.chosen()
    waited = time.perf_counter() - t0
    planned = t.est.batch_wait_s
    assert got == [0] * 4 and planned is not None and planned > 2 * d
    assert planned <= waited < planned + d + 0.5 * (costmodel.OVERDUE * planned - planned - d), (planned, waited)
    t.est.restarts = tuple(0.0005 + d * (1 + i / 64) for i in range(64))    # (planned from the measured spread)
    t.streams = [{"view": StreamView()} for _ in range(4)]                    # (restarted now)
    t0 = time.perf_counter()
    got = t.chosen()
    waited = time.perf_counter() - t0
    reach = t.est.restarts[-1] + (k - 1) * d         # (the latest draft the restarts measured would bring)
    assert got == [0] * 4 and waited < reach + d / 2, (reach, waited)

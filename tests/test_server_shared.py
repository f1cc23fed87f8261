"""A shared draft server that no idle client can degrade (docs/reliability.md): a step computes only the rows that
are warm, whatever row a sequence landed on; rows idle past idle_s are reclaimed for a client that waits for one;
a full client table makes room for a new Hello; a flooding connection's excess is dropped unread. Each test prints
its measured figures."""
import json
import statistics
import time

import pytest
import torch

from doubles import tiny_qwen3
from sdeth.runtime.batchdraft import BatchDrafter
from sdeth.runtime.batchmodel import BatchDecoder
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.runtime.verify import Sampling
from sdeth.wire import protocol as W
from sdeth.wire.draft_server import ServerLimits
from test_draft_server import HELLO, VOCAB, tiny_server
from test_server_survives import _drive, _hello, _pct

ROWS, CAP = 8, 256


def _prompt(i: int, n: int = 24) -> list[int]:
    return [(7 * i + 3 * j) % VOCAB for j in range(n)]


def _draft_rounds(d: BatchDrafter, seqs: list, n: int, k: int = 4) -> tuple[list, list]:
    """n rounds of seqs drafted together (every draft accepted, then one token): (each round's drafts, each
    round's seconds)."""
    out, took = [], []
    for i in range(n):
        for s in seqs:
            if s.prev or s.drafted:
                d.apply(s, s.n, len(s.prev), [(s.n + i) % VOCAB])
        t0 = time.perf_counter()
        out.append([x.tokens for x in d.draft([(s, k) for s in seqs])])
        took.append(time.perf_counter() - t0)
    return out, took


def _drafter(fast) -> BatchDrafter:
    d = BatchDrafter(BatchDecoder(fast, ROWS, CAP), VOCAB, chunk=64)
    d.warm_s = 0.2
    return d


def _open(d: BatchDrafter, key, i: int):
    seq = d.open(key, 0, _prompt(i), Sampling(), 0, 0)
    while d.prefill():
        pass
    return seq


# ------------------------------------------------------------------ a step costs only the rows that step

def test_a_neighbour_beside_seven_idle_rows_steps_one_row_and_drafts_as_alone():
    """Client X holds rows 0-6 and went quiet after a round; a neighbour's sequence lands on row 7. Its steps compute
    one cache row (the decoder's record), as on an empty server, its drafts are the same, and X's sequences, moved
    up, draft afterwards what they drafted unmoved. Round times printed with the unpacked layout's (every row
    computed) for scale; the goal is the neighbour within 1.1x of alone, asserted at 1.35x for a busy host."""
    torch.set_num_threads(1)
    fast = FastDecoder(tiny_qwen3(0), 8)
    alone, shared, ref = _drafter(fast), _drafter(fast), _drafter(fast)
    idle = [_open(shared, ("x", f"s{i}"), i) for i in range(7)]
    twins = [_open(ref, ("x", f"s{i}"), i) for i in range(7)]
    _draft_rounds(shared, idle, 1), _draft_rounds(ref, twins, 1)
    time.sleep(0.3)                                           # X's rows go cold (warm_s 0.2)
    wide = _drafter(fast)
    wide.warm_s = float("inf")                                # every row warm: the neighbour stays on row 7
    for i in range(7):
        _open(wide, ("x", f"s{i}"), i)
    n_alone, n_shared, n_wide = (_open(d, ("n", "s"), 9) for d in (alone, shared, wide))
    assert n_shared.row == 7
    got_alone, got_shared, t_alone, t_shared, t_wide = [], [], [], [], []
    for _ in range(40):                                       # interleaved: the three see the same host
        for d, seq, got, took in ((alone, n_alone, got_alone, t_alone), (shared, n_shared, got_shared, t_shared),
                                  (wide, n_wide, [], t_wide)):
            out, t = _draft_rounds(d, [seq], 1)
            got += out
            took += t
    assert got_shared == got_alone                            # the same drafts
    assert n_shared.row == 0 and shared.dec.last_rows == 1 and shared.moves == 1    # one move, then one row a step
    assert n_wide.row == 7 and wide.dec.last_rows == 8
    again, _ = _draft_rounds(shared, idle, 2)                 # X comes back: moved rows draft as if never moved
    assert again == _draft_rounds(ref, twins, 2)[0]
    ms = {name: round(statistics.median(t[5:]) * 1e3, 3) for name, t in
          (("alone", t_alone), ("beside_7_idle", t_shared), ("every_row_computed", t_wide))}
    print("\n" + json.dumps({"neighbour_round_ms_p50": ms, "ratio": round(ms["beside_7_idle"] / ms["alone"], 3),
                             "measured": "tiny 2-layer Qwen3 draft, 8 rows, k=4, one CPU thread"}))
    assert ms["beside_7_idle"] <= 1.35 * ms["alone"], ms


# ------------------------------------------------------------------ idle rows are reclaimed for a waiting client

def _open_msg(server, ident, seq, peer, gen=0) -> str:
    out = server.dispatch(ident, W.Open(seq, gen, _prompt(len(seq))), time.time(), peer)
    return next((r.message for m in out if isinstance(m, W.Drafts) for r in m.rows if r.error), "")


def _round(server, ident, seq, peer) -> W.RowDraft:
    s = server.drafter.get((ident, seq))
    server.dispatch(ident, W.Rounds([W.Row(seq, s.gen, s.n, len(s.prev), [5], 3)]), time.time(), peer)
    rows = [r for i, m in _drive(server) if i == ident and isinstance(m, W.Drafts) for r in m.rows if r.seq == seq]
    assert rows and not rows[-1].error, rows
    return rows[-1]


def test_rows_idle_past_idle_s_pass_to_a_waiting_client_and_their_holder_is_told(capsys):
    """All 8 rows held (A 7, B 1), each drafted a round, then only Pings. C's Open is refused (`sequences`) until
    A's oldest row has gone idle_s without a step; then it is A's (over its fair share of 8 // 3) that is freed, A
    is told `reclaimed` naming it, and C drafts. B's row, within its share, and A's active rows are kept."""
    idle_s = 0.4
    server = tiny_server(tiny_qwen3(0), rows=ROWS, capacity=CAP, idle_s=idle_s)
    for ident, peer in ((b"a", "10.0.0.1"), (b"b", "10.0.0.2"), (b"c", "10.0.0.3")):
        _hello(server, ident, peer)
    assert [_open_msg(server, b"a", f"a{i}", "10.0.0.1") for i in range(7)] == [""] * 7
    assert _open_msg(server, b"b", "b0", "10.0.0.2") == ""
    _drive(server)
    for i in range(7):
        _round(server, b"a", f"a{i}", "10.0.0.1")
    _round(server, b"b", "b0", "10.0.0.2")
    last_step = time.perf_counter()
    assert _open_msg(server, b"c", "c0", "10.0.0.3").startswith("sequences:")
    t0, waited = time.perf_counter(), None
    while time.perf_counter() - t0 < idle_s + 2:
        server.dispatch(b"a", W.Ping(0.0), time.time(), "10.0.0.1")        # pinging: still idle
        _round(server, b"a", "a6", "10.0.0.1") if time.perf_counter() - t0 < idle_s / 2 else None   # a6 active
        if _open_msg(server, b"c", "c0", "10.0.0.3") == "":
            waited = time.perf_counter() - last_step
            break
        time.sleep(0.02)
    assert waited is not None and waited <= idle_s + 0.5, waited          # the idle limit plus a step (and a retry)
    told = [r for i, m in _drive(server) if i == b"a" and isinstance(m, W.Drafts) for r in m.rows if r.error]
    assert [(r.seq, r.error) for r in told] == [("a0", "reclaimed")] and "open it again" in told[0].message
    held = sorted(key for key in server.drafter.seqs)
    assert (b"a", "a0") not in held and (b"b", "b0") in held and (b"a", "a6") in held and (b"c", "c0") in held
    assert _round(server, b"c", "c0", "10.0.0.3").tokens
    assert "peer=10.0.0.1: refused (reclaimed): idle_s:" in capsys.readouterr().out
    print(f"\n{json.dumps({'idle_s': idle_s, 'waiting_client_admitted_after_s': round(waited, 3)})}")


def test_a_closed_connections_row_passes_to_a_waiting_client_at_once(capsys):
    """A one-row server: the holder's connection closes (a target that lost its link and comes back on a new one);
    a new client's Open takes the row at once, long before idle_s or the closed client's GONE_S."""
    server = tiny_server(tiny_qwen3(0), rows=1, capacity=CAP, idle_s=30)
    for ident, peer in ((b"a", "10.0.0.1"), (b"b", "10.0.0.2")):
        _hello(server, ident, peer)
    assert _open_msg(server, b"a", "a0", "10.0.0.1") == ""
    _drive(server)
    _round(server, b"a", "a0", "10.0.0.1")
    assert _open_msg(server, b"b", "b0", "10.0.0.2").startswith("sequences:")     # a is there: refused
    server.clients.closed(b"a")
    assert _open_msg(server, b"b", "b0", "10.0.0.2") == ""                        # a's connection closed: taken
    assert list(server.drafter.seqs) == [(b"b", "b0")] and _round(server, b"b", "b0", "10.0.0.2").tokens
    assert "refused (reclaimed): idle_s: sequence 'a0': its connection closed" in capsys.readouterr().out


def test_a_reclaimed_sequence_is_opened_again_by_its_client_and_loses_nothing_but_time():
    """Over the wire: the holder's next round of a reclaimed sequence re-opens it (the next generation, its whole
    context) and is drafted; its other sequence is not touched."""
    from test_draft_server import serving
    from sdeth.wire.draft_client import DraftServerClient
    server = tiny_server(tiny_qwen3(0), rows=2, capacity=CAP, idle_s=0.3, limits=ServerLimits(reserve=0))
    addr = serving(server, 60)
    a, c = DraftServerClient(addr, HELLO), DraftServerClient(addr, HELLO)
    try:
        tracks = [a.open(f"s{i}", _prompt(i)) for i in range(2)]
        first = a.rounds([(t, 0, [5], 3) for t in tracks])
        assert all(not r.error for r in first)
        time.sleep(0.5)                                        # idle past idle_s
        tc = c.open("c", _prompt(5))
        assert not c.rounds([(tc, 0, [5], 3)])[0].error        # C took a reclaimed row
        c.end(tc)                                              # ... and gives it back
        again = a.rounds([(t, 3, [6], 3) for t in tracks])
        assert all(not r.error and len(r.tokens) == 3 for r in again), again
        assert sum(t.reopened for t in tracks) == 1 and sum(t.gen for t in tracks) == 1
    finally:
        a.close(), c.close()


# ------------------------------------------------------------------ a full client table makes room

def test_256_pinging_hellos_from_8_addresses_leave_room_for_a_normal_client(capsys):
    """256 connections from 8 addresses said Hello and only Ping: a normal client's Hello takes the place of the one
    idle longest, at once; a client holding a sequence, and a per-client key's only connection, are never taken;
    the per-address cap still holds."""
    server = tiny_server(tiny_qwen3(0), rows=ROWS, capacity=CAP)
    assert server.limits.clients == 256 and server.limits.clients_per_peer == 32
    _hello(server, b"holder", "10.0.0.1"), _hello(server, b"keyed", "10.0.0.2 key=alice")
    assert _open_msg(server, b"holder", "h", "10.0.0.1") == ""
    flood = [(b"f%d" % i, f"10.0.1.{i % 8}") for i in range(254)]
    for ident, peer in flood:
        _hello(server, ident, peer)
    assert len(server.clients) == 256
    for _ in range(3):                                        # every connection pings (no activity)
        for ident, peer in flood + [(b"holder", "10.0.0.1"), (b"keyed", "10.0.0.2 key=alice")]:
            server.dispatch(ident, W.Ping(0.0), time.time(), peer)
    crowded = server.dispatch(b"x", HELLO, time.time(), "10.0.1.3")[0]   # an address at its cap: no room made
    assert isinstance(crowded, W.Error) and crowded.message.startswith("clients_per_peer:") and b"f0" in server.clients
    t0 = time.perf_counter()
    out = server.dispatch(b"normal", HELLO, time.time(), "10.0.0.9")[0]
    admitted_s = time.perf_counter() - t0
    assert isinstance(out, W.Welcome) and admitted_s < 1.0
    assert b"holder" in server.clients and b"keyed" in server.clients and b"f0" not in server.clients
    for i in range(5):                                        # each new Hello takes the next idlest's place
        assert isinstance(server.dispatch(b"n%d" % i, HELLO, time.time(), "10.0.0.10")[0], W.Welcome)
    assert b"holder" in server.clients and b"keyed" in server.clients and len(server.clients) == 256
    assert "sent nothing but Pings for" in capsys.readouterr().out
    print(f"\n{json.dumps({'hellos': 256, 'addresses': 8, 'normal_client_admitted_ms': round(admitted_s * 1e3, 3)})}")


# ------------------------------------------------------------------ a flood's excess is dropped unread

def test_a_connections_excess_past_its_queue_is_dropped_before_decoding(monkeypatch, capsys):
    """A connection that sends far more than a pass takes: the messages past its queue are never decoded (counted,
    the sender told once a second, one log line), its own urgent Commits still held."""
    import zmq
    from sdeth.wire import serving
    from sdeth.wire.draft_server import DECODE
    from sdeth.wire.serving import QUEUED, _in_turn, _Server
    from sdeth.wire.transport import Log, PeerLimits
    from test_draft_server import free_port
    from test_server_survives import _dealer
    decoded, screen = [], serving.screen
    monkeypatch.setattr(serving, "screen", lambda *a: decoded.append(1) or screen(*a))
    addr = f"tcp://127.0.0.1:{free_port()}"
    srv = _Server(addr, None, Log("test"), None)
    n = 1000
    try:
        a = _dealer(addr)
        for m in [HELLO] + [W.Ping(1.0)] * n + [W.Commits([W.CommitRow("s", 0, 0, 1)])]:
            a.send(W.encode(m))
        time.sleep(0.5)
        served = [m for _, _, m, _, _ in _in_turn(srv, DECODE, Log("test"), PeerLimits(), None, 0, 1.0, 1, None,
                                                   (W.Commits, W.End))]
        assert sum(isinstance(m, W.Commits) for m in served) == 1
        assert len(decoded) <= QUEUED + 80 and len(served) <= QUEUED + 80, (len(decoded), len(served))
        a.setsockopt(zmq.RCVTIMEO, 500)
        told = W.Decoder("a client", (W.Error,))(a.recv())
        assert told.code == "limit" and "dropped unread" in told.message
    finally:
        srv.close()
    log = capsys.readouterr().out
    assert log.count("messages dropped unread since the last line") == 1
    print(f"\n{json.dumps({'sent': n + 2, 'decoded': len(decoded), 'served': len(served)})}")



def _flood_unpaced(addr: str, rate: float, kind: str, go, sent) -> None:
    """While `go` is set: one connection sends Pings (kind 'ping') or Open/End pairs ('open-end') at `rate`
    messages a second (bursts every 10 ms), whatever is answered; sent: the messages sent so far."""
    import uuid

    import zmq
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
    s.setsockopt(zmq.SNDHWM, 100000)
    s.connect(addr)
    s.send(W.encode(HELLO))
    s.recv()
    msgs = ([W.encode(W.Ping(0.0))] if kind == "ping" else
            [W.encode(W.Open("f", 0, [1, 2, 3, 4])), W.encode(W.End("f"))])
    n, n0, t0 = 0, 0, time.perf_counter()       # (go may already be set when this process gets here)
    while True:
        if not go.is_set():
            go.wait()
            t0, n0 = time.perf_counter(), n
        while n - n0 < rate * (time.perf_counter() - t0):
            s.send(msgs[n % len(msgs)], zmq.NOBLOCK)
            n += 1
        while s.poll(0):
            s.recv()
        sent.value = n
        time.sleep(0.01)


def _neighbour_under_flood(addr: str, go, sent, blocks: int = 4) -> tuple[dict, float]:
    """The neighbour's round latencies alone and under the flood, in alternating blocks: ({state: [s]}, the flood's
    messages sent a second)."""
    from sdeth.wire.draft_client import DraftServerClient
    from test_server_survives import _rounds as neighbour_rounds
    c = DraftServerClient(addr, HELLO, timeout_s=60)
    neighbour_rounds(c, [], 5)                                  # warm
    lat, seconds, n0 = {"alone": [], "flood": []}, 0.0, sent.value
    for _ in range(blocks):
        for state in ("alone", "flood"):
            t0 = time.time()
            if state == "flood":
                go.set()
                time.sleep(0.3)
            neighbour_rounds(c, lat[state], 40)
            if state == "flood":
                go.clear()
                seconds += time.time() - t0
                time.sleep(0.3)
    c.close()
    return lat, (sent.value - n0) / seconds


@pytest.mark.parametrize("kind", ["ping", "open-end"])
def test_an_unpaced_flood_above_the_budget_leaves_a_neighbours_rounds_near_alone(kind):
    """The server, an unpaced flooder (6,400 messages a second from one connection, past the 4,000 budget) and a
    neighbour, each a process of its own: the neighbour's round p50 and p99 alone and under the flood, in
    alternating blocks. Goal: p50 within 1.3x, p99 within 1.5x; asserted at 1.6x and 2.2x, and a measurement is
    taken again (three at most) when a p99 falls to the shared host's spikes; every figure printed."""
    import multiprocessing
    from sdeth.place.testbed import free_port
    from test_server_survives import _serve_plain
    torch.set_num_threads(1)
    mp = multiprocessing.get_context("spawn")
    addr, go, sent = f"tcp://127.0.0.1:{free_port()}", mp.Event(), mp.Value("q", 0)
    procs = [mp.Process(target=_serve_plain, args=(addr, 300), daemon=True),
             mp.Process(target=_flood_unpaced, args=(addr, 6400.0, kind, go, sent), daemon=True)]
    for p in procs:
        p.start()
    try:
        for attempt in range(3):
            lat, rate = _neighbour_under_flood(addr, go, sent)
            ms = {s: {"p50": _pct(v, .5), "p99": _pct(v, .99), "rounds": len(v)} for s, v in lat.items()}
            ratio = {q: round(ms["flood"][q] / ms["alone"][q], 2) for q in ("p50", "p99")}
            print("\n" + json.dumps({"flood": kind, "attempt": attempt, "flood_sent_per_s": round(rate),
                                     "round_ms": ms, "ratio": ratio,
                                     "measured": "this host's CPU, a process each (server, flooder, neighbour), "
                                                 "tiny 2-layer Qwen3 draft, k=3, loopback TCP"}))
            if ratio["p50"] <= 1.6 and ratio["p99"] <= 2.2:
                break
    finally:
        for p in procs:
            p.kill()
    assert rate > 4000                                          # past the per-client budget
    assert ratio["p50"] <= 1.6 and ratio["p99"] <= 2.2, (ratio, ms)


# ------------------------------------------------------------------ nothing lost through all of it

def test_through_idle_holders_a_reclaim_and_a_full_client_table_an_active_client_loses_nothing():
    """One server (6 rows, idle_s 0.4, 22 client slots): X holds 5 rows and goes quiet after a round, 19 connections
    only said Hello, and N decodes three prompts through the server; meanwhile a new client's Hello takes a silent
    connection's slot and its Open takes one of X's rows by reclaim. N's outputs equal target-only, every token of
    them came with a draft, and N was never refused."""
    import threading
    from sdeth.runtime.engine import Engine
    from sdeth.runtime.loop import generate_target_only
    from sdeth.wire.draft_client import DraftServerClient
    from test_draft_server import _client_runs, serving, tiny_pair
    target, draft = tiny_pair()
    server = tiny_server(draft, rows=6, capacity=CAP, idle_s=0.4, limits=ServerLimits(clients=22, reserve=0))
    addr = serving(server, 120)
    x = DraftServerClient(addr, HELLO)
    xs = [x.open(f"x{i}", _prompt(i)) for i in range(5)]
    assert all(not r.error for r in x.rounds([(t, 0, [5], 3) for t in xs]))
    silent = [DraftServerClient(addr, HELLO) for _ in range(19)]
    prompts = [_prompt(20 + i, 12) for i in range(3)]
    runs: list = []
    n = threading.Thread(target=lambda: runs.extend(_client_runs(addr, target, prompts, Sampling(), 48, 3)))
    n.start()
    t0 = time.perf_counter()
    while server.drafter.held() < 6 and time.perf_counter() - t0 < 10:     # N holds the sixth row
        time.sleep(0.01)
    time.sleep(0.5)                                            # X's rows idle past idle_s
    y = DraftServerClient(addr, HELLO)                         # the 22nd client
    assert len(server.clients) == 22
    z = DraftServerClient(addr, HELLO)                         # the 23rd: a silent one's slot
    tz = z.open("z", _prompt(9))
    assert not z.rounds([(tz, 0, [5], 3)])[0].error
    n.join()
    eng = Engine(target, "t")
    want = [generate_target_only(eng, p, 48, Sampling(), None).output_ids for p in prompts]
    assert [r.output_ids for r in runs] == want
    assert all(r.tokens_without_draft == 0 for r in runs) and sum(r.accepted_tokens for r in runs) > 0
    assert len(server.clients) == 22 and server.drafter.held() <= 6
    for c in [x, y, z] + silent:
        c.close()

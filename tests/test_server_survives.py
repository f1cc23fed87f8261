"""The draft server survives its clients: no request within its limits ends it (each case of a batch drafting past a
row's room, a stream past the cache, an error inside a step), a random walk of requests near every limit from
several clients leaves it answering, and its settings travel from the command line whole (docs/reliability.md)."""
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from doubles import tiny_qwen3
from sdeth.runtime.batchdraft import BatchDrafter
from sdeth.runtime.batchmodel import BatchDecoder
from sdeth.runtime.batchseq import CATCH_UP
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.runtime.verify import Sampling
from sdeth.wire import protocol as W
from sdeth.wire.draft_server import ServerLimits
from test_draft_server import HELLO, VOCAB, tiny_server

CAP = 64                 # cache slots a row: small, so that every limit is near


class Sock:
    """The replies a server's idle() sends, decoded."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, frames):
        self.sent.append((frames[0], W.decode(frames[-1])))


def _hello(server, ident: bytes, peer: str = "127.0.0.1") -> None:
    assert isinstance(server.dispatch(ident, HELLO, time.time(), peer)[0], W.Welcome)


def _drive(server, rounds: int = 40) -> list:
    """idle() until nothing is left to do (or `rounds` calls): every reply it sent, (ident, message)."""
    sock = Sock()
    for _ in range(rounds):
        if not server.idle(sock):
            break
    return sock.sent


def _answers(server, ident: bytes = b"a") -> bool:
    return isinstance(server.dispatch(ident, W.Ping(1.0), time.time(), "127.0.0.1")[0], W.Pong)


# ------------------------------------------------------------------ a batch never drafts past a row's room

def test_a_row_at_the_cache_end_beside_a_k16_row_drafts_what_each_drafts_alone():
    """A row at capacity - 1 tokens with k=1 and a short row with k=16 in one step: no write past the cache, and each
    row's proposal (and the next round's, after every draft is accepted) equals the row's drafted alone."""
    model = tiny_qwen3(0)
    fast = FastDecoder(model, 8)

    def drafter():
        return BatchDrafter(BatchDecoder(fast, rows=4, capacity=CAP), VOCAB, chunk=16)
    g = torch.Generator().manual_seed(3)
    long_p, short_p = torch.randint(0, VOCAB, (CAP - 1,), generator=g).tolist(), [5, 6, 7, 8]
    both, alone = drafter(), [drafter(), drafter()]
    pairs = [(both.open(("c", "long"), 0, long_p, Sampling(), 0, 0), both.open(("c", "short"), 0, short_p, Sampling(), 0, 0))]
    pairs.append((alone[0].open(("c", "long"), 0, long_p, Sampling(), 0, 0),
                  alone[1].open(("c", "short"), 0, short_p, Sampling(), 0, 0)))
    for d in (both, *alone):
        while d.prefill():
            pass
    (bl, bs), (al, as_) = pairs
    assert bl.n + 1 == CAP
    together = both.draft([(bl, 1), (bs, 16)])
    assert together[0].tokens == alone[0].draft([(al, 1)])[0].tokens
    assert together[1].tokens == alone[1].draft([(as_, 16)])[0].tokens
    both.apply(bs, bs.n, 16, [9])                      # all accepted: the next round reads the cache written above
    alone[1].apply(as_, as_.n, 16, [9])
    assert both.draft([(bs, 3)])[0].tokens == alone[1].draft([(as_, 3)])[0].tokens


@pytest.mark.parametrize("clients", [1, 2])
def test_rows_at_the_limit_beside_short_rows_are_drafted_and_the_server_serves_on(clients):
    """The issue's cases, at a 64-slot cache: one Rounds (or two clients' Rounds in one step) with a row at
    have = capacity - 3 and k=1 beside a short row with k=16: both drafted, no error, the server answers."""
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    idents = [b"a", b"b"][:clients]
    for i in idents:
        _hello(server, i)
    server.dispatch(idents[0], W.Open("long", 0, list(range(1, CAP - 2))), time.time(), "127.0.0.1")
    server.dispatch(idents[-1], W.Open("short", 0, [1, 2, 3, 4]), time.time(), "127.0.0.1")
    _drive(server)
    rows = {"long": W.Row("long", 0, CAP - 3, 0, [7], 1), "short": W.Row("short", 0, 4, 0, [9], 16)}
    if clients == 1:
        assert not server.dispatch(b"a", W.Rounds(list(rows.values())), time.time(), "127.0.0.1")
    else:
        assert not server.dispatch(b"a", W.Rounds([rows["long"]]), time.time(), "127.0.0.1")
        assert not server.dispatch(b"b", W.Rounds([rows["short"]]), time.time(), "127.0.0.1")
    got = {r.seq: r for _, m in _drive(server) for r in m.rows}
    assert not got["long"].error and len(got["long"].tokens) == 1
    assert not got["short"].error and len(got["short"].tokens) == 16
    assert max(server.batches) == 2 and _answers(server)


def test_a_stream_near_the_cache_end_is_refused_at_open_or_stops_at_its_end():
    """A stream whose prompt and window pass the cache is refused at Open (`window`); one that commits its way to
    the cache's end stops drafting there and its commits past it are refused (`context`): never an exit."""
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    _hello(server, b"a")
    out = server.dispatch(b"a", W.Open("s", 0, list(range(1, CAP - 1)), stream=True), time.time(), "p")
    refused = [r for m in out if isinstance(m, W.Drafts) for r in m.rows]
    assert refused[0].error == "limit" and refused[0].message.startswith("window:")
    server.dispatch(b"a", W.Open("t", 0, list(range(1, 40)), stream=True, window=8), time.time(), "p")
    server.dispatch(b"a", W.Commits([W.CommitRow("t", 0, 0, 5)]), time.time(), "p")
    errors = []
    for _ in range(60):
        for _, m in _drive(server, 2):
            if isinstance(m, W.Streamed):
                for r in m.rows:
                    out = server.dispatch(b"a", W.Commits([W.CommitRow("t", 0, r.pos, r.token)]), time.time(), "p")
                    errors += [r.message for m2 in out if isinstance(m2, W.Drafts) for r in m2.rows if r.error]
            else:
                errors += [r.message for r in m.rows if r.error]
        assert _answers(server)
    seq = server.drafter.seqs.get((b"a", "t"))
    assert errors and all(e.startswith("context:") for e in errors)
    assert seq is None or seq.n <= CAP - 1


def test_commits_inside_a_window_admitted_at_open_are_taken_near_the_cache_end():
    """A stream drafts one token a step: its commits are bounded by that token, not by k (16), so a stream opened
    near the cache's end with a small window commits every position up to the one that fills the cache."""
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    _hello(server, b"a")
    n = CAP - 8                                          # n + window + 1 = CAP - 3: admitted at Open
    assert not server.dispatch(b"a", W.Open("w", 0, list(range(1, n + 1)), stream=True, window=4), time.time(), "p")
    taken, refused = [], []

    def commit(pos, token):
        out = server.dispatch(b"a", W.Commits([W.CommitRow("w", 0, pos, token)]), time.time(), "p")
        bad = [r.message for m in out if isinstance(m, W.Drafts) for r in m.rows if r.error]
        (refused if bad else taken).append(pos)
        assert all(b.startswith("context:") for b in bad)
    commit(0, 5)
    for _ in range(20):
        streamed = [r for _, m in _drive(server) if isinstance(m, W.Streamed) for r in m.rows]
        if not streamed:
            break
        for r in streamed:
            commit(r.pos, r.token)
    assert taken == list(range(CAP - 2 - n)) and refused == [CAP - 2 - n]    # n + pos + 2 <= CAP - 1: taken


def test_an_error_inside_a_step_refuses_its_rows_and_the_server_serves_on(monkeypatch, capsys):
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    for i in (b"a", b"b"):
        _hello(server, i)
        server.dispatch(i, W.Open("s", 0, [1, 2, 3]), time.time(), "p")
    _drive(server)

    def boom(batch):
        raise RuntimeError("device fault")
    monkeypatch.setattr(server.drafter, "draft", boom)
    for i in (b"a", b"b"):
        server.dispatch(i, W.Rounds([W.Row("s", 0, 3, 0, [4], 3)]), time.time(), "p")
    got = [(i, r) for i, m in _drive(server) for r in m.rows]
    assert sorted(i for i, _ in got) == [b"a", b"b"]
    assert all(r.error == "internal" and r.message.startswith("step: sequence 's': RuntimeError: device fault")
               for _, r in got)
    assert not server.drafter.seqs and _answers(server)
    assert "2 sequences refused and freed: step: RuntimeError: device fault" in capsys.readouterr().out
    monkeypatch.undo()
    server.dispatch(b"a", W.Open("s", 1, [1, 2, 3]), time.time(), "p")
    server.dispatch(b"a", W.Rounds([W.Row("s", 1, 3, 0, [4], 3)]), time.time(), "p")
    assert [len(r.tokens) for _, m in _drive(server) for r in m.rows] == [3]


# ------------------------------------------------------------------ a random walk near every limit

_seqs = st.sampled_from(["s0", "s1", "s2"])
_len = st.sampled_from([1, 2, CAP - 4, CAP - 3, CAP - 2, CAP - 1, CAP])
_op = st.one_of(
    st.tuples(st.just("open"), _seqs, _len, st.booleans(), st.sampled_from([0, 1, 8, 64]), st.booleans()),
    st.tuples(st.just("round"), _seqs, st.integers(0, 17), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("commit"), _seqs, st.integers(-1, CAP)),
    st.tuples(st.just("end"), _seqs),
    st.tuples(st.just("idle"),),
)


def _message(op, server, ident):
    """The walk's op as a message from client `ident` (rounds and commits follow the sequence's state, so that
    most are accepted and reach the step, near its limits)."""
    kind, seq = op[0], op[1] if len(op) > 1 else ""
    held = server.drafter.seqs.get((ident, seq))
    if kind == "open":
        _, _, n, stream, q_top, sampled = op
        return W.Open(seq, (held.gen + 1) if held else 0, [7] * n, temperature=0.8 if sampled else 0.0,
                      draft_sampled=sampled, q_top=q_top, stream=stream, window=8)
    if kind == "round":
        _, _, k, accepted, n_tokens = op
        have, gen = (held.n, held.gen) if held else (4, 0)
        return W.Rounds([W.Row(seq, gen, have, min(accepted, len(held.prev)) if held else 0, [3] * n_tokens, k)])
    if kind == "commit":
        pos = op[2] if op[2] >= 0 else (len(held.chain) if held else 0)
        return W.Commits([W.CommitRow(seq, held.gen if held else 0, pos, 11)])
    return W.End(seq)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), _op), min_size=5, max_size=40))
def test_random_requests_near_every_limit_from_several_clients_never_stop_the_server(walk):
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP, limits=ServerLimits(k=16, reserve=1))
    for ident in (b"a", b"b", b"c"):
        _hello(server, ident)
    for ident, op in walk:
        if op[0] == "idle":
            _drive(server, 3)
        else:
            server.dispatch(ident, _message(op, server, ident), time.time(), "127.0.0.1")
        assert _answers(server, ident)
    _drive(server)
    assert _answers(server)
    assert len(server.drafter.seqs) + len(server.drafter.free_rows) == 4



def test_an_error_feeding_one_prompt_refuses_that_prompt_only(monkeypatch):
    """A prefill that fails on one prompt refuses (and frees) that sequence; the other prompts waiting are fed and
    drafted."""
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    for i in (b"a", b"b"):
        _hello(server, i)
    server.dispatch(b"a", W.Open("bad", 0, list(range(1, CATCH_UP + 4))), time.time(), "p")   # (prefilled)
    server.dispatch(b"b", W.Open("good", 0, list(range(1, 40))), time.time(), "p")
    feed = server.drafter._feed

    def fails_on_bad(seq, ids):
        if seq.key == (b"a", "bad"):
            raise RuntimeError("device fault")
        feed(seq, ids)
    monkeypatch.setattr(server.drafter, "_feed", fails_on_bad)
    got = [(i, r) for i, m in _drive(server) for r in m.rows]
    assert [(i, r.seq, r.error) for i, r in got] == [(b"a", "bad", "internal")]
    assert got[0][1].message.startswith("prefill: sequence 'bad': RuntimeError: device fault")
    assert sorted(server.drafter.seqs) == [(b"b", "good")] and server.drafter.seqs[(b"b", "good")].ready
    server.dispatch(b"b", W.Rounds([W.Row("good", 0, 39, 0, [4], 3)]), time.time(), "p")
    assert [len(r.tokens) for _, m in _drive(server) for r in m.rows] == [3]


# ------------------------------------------------------------------ one config, from the command line to the server

def test_every_setting_travels_from_the_command_line_to_the_running_server():
    """Each DraftServerConfig field (its limits too) set by a flag, read back from the running server's Welcome
    (limits and sizes) or its config (the rest): no setting dropped or re-guessed on the way."""
    from dataclasses import asdict, fields
    from sdeth.cli.worker import draft_server_config, worker_parser
    from sdeth.wire.draft_client import DraftServerClient
    from sdeth.wire.draft_server import build_server
    from sdeth.wire.server_config import ServerLimits
    from test_draft_server import serving
    lim = dict(sequences_per_client=2, sequences=5, reserve=1, context=60, k=7, rows_per_message=9,
               tokens_per_row=5, batch=3, clients=11, clients_per_key=4, clients_per_peer=6, reply_bytes=1 << 20)
    assert set(lim) == {f.name for f in fields(ServerLimits)}
    argv = ["--role", "draft-server", "--bind", "tcp://127.0.0.1:1", "--kv-rows", "6", "--capacity", "80", "--ttl", "9",
            "--idle", "7", "--prefill-chunk", "12", "--prefill-budget", "24", "--compile", "none", "--fast", "", "--no-warm",
            "--messages-per-s", "321", "--per-pass", "3", "--report-every", "2.5"]
    argv += [x for name, v in lim.items() for x in (f"--limit-{name.replace('_', '-')}", str(v))]
    a = worker_parser().parse_args(argv)

    class Run:                       # the run configuration's share (--config): capacity, fast options
        capacity, draft_fast = 4096, "unused"
    cfg = draft_server_config(a, Run, spin_s=0.0)
    me = W.Welcome(W.PROTOCOL_VERSION, "tiny", VOCAB, "sha", "float32")
    server = build_server(FastDecoder(tiny_qwen3(0), 8), me, cfg)
    c = DraftServerClient(serving(server, 20), HELLO)
    told = c.peer.limits
    c.close()
    assert {k: told[k] for k in lim} == lim and c.peer.sequences == 5
    assert (told["rows"], told["capacity"], told["ttl_ms"], told["idle_ms"], told["prefill_chunk"],
            told["prefill_budget"], told["messages_per_s"], told["per_pass"]) == (6, 80, 9000, 7000, 12, 24, 321, 3)
    assert (server.cfg.compile_mode, server.cfg.fast, server.cfg.warm, server.cfg.spin_s, server.cfg.report_s) == (
        "none", "", False, 0.0, 2.5)
    assert asdict(server.cfg.limits) == lim and server.drafter.dec.rows == 6 and server.drafter.dec.capacity == 80


@pytest.mark.parametrize("lim,flag", [(dict(k=0), "--limit-k 0"),
                                      (dict(sequences_per_client=-1), "--limit-sequences-per-client -1"),
                                      (dict(reply_bytes=1000), "--limit-reply-bytes 1000")])
def test_limits_a_server_cannot_serve_under_are_refused_at_start_naming_the_flag(lim, flag):
    from sdeth.wire.server_config import DraftServerConfig
    with pytest.raises(ValueError, match=f"^{flag}: .*use "):
        DraftServerConfig(rows=8, limits=ServerLimits(**lim)).check()
    assert DraftServerConfig(rows=8, limits=ServerLimits(reply_bytes=7 * 16 * 78)).check()     # q_top 1 fits


# ------------------------------------------------------------------ admission that cannot be monopolised

def _open(server, ident, seq, peer="127.0.0.1", **kw) -> str:
    """'' when the Open is taken, else the refusal's message."""
    out = server.dispatch(ident, W.Open(seq, 0, [1, 2, 3], **kw), time.time(), peer)
    return next((r.message for m in out if isinstance(m, W.Drafts) for r in m.rows if r.error), "")


def test_one_client_cannot_hold_every_row_and_freed_rows_pass_to_the_client_waiting(capsys):
    """8 rows keep a reserve of 1: one client holds at most 7; a second client gets the reserve row; once it waits
    (refused for a full server), the first client's next Open is refused `fair_share` and the freed row is the
    second's. Each refusal names its field and is logged with the peer."""
    server = tiny_server(tiny_qwen3(0), rows=8, capacity=CAP)
    _hello(server, b"a", "10.0.0.1"), _hello(server, b"b", "10.0.0.2")
    assert [_open(server, b"a", f"a{i}", "10.0.0.1") for i in range(7)] == [""] * 7
    assert _open(server, b"a", "a7", "10.0.0.1").startswith("sequences_per_client: this client holds 7")
    assert _open(server, b"b", "b0", "10.0.0.2") == ""                       # the reserve row
    assert _open(server, b"b", "b1", "10.0.0.2").startswith("sequences: this server holds 8")
    server.dispatch(b"a", W.End("a0"), time.time(), "10.0.0.1")
    assert _open(server, b"a", "a8", "10.0.0.1").startswith("fair_share: this client holds 6 sequences")
    assert _open(server, b"b", "b1", "10.0.0.2") == ""
    log = capsys.readouterr().out
    assert "peer=10.0.0.1: refused (limit): fair_share:" in log and "peer=10.0.0.2: refused (limit): sequences:" in log
    assert server.welcome.limits["reserve"] == 1 and server.welcome.limits["sequences_per_client"] == 7


def test_a_client_that_waited_stops_blocking_others_once_it_is_admitted_or_gone():
    """A client refused a row waits (others at their fair share are refused) only until it is admitted one, or
    leaves: never for the rest of the few seconds its wait counts."""
    server = tiny_server(tiny_qwen3(0), rows=8, capacity=CAP, limits=ServerLimits(reserve=0))
    for i, peer in ((b"a", "10.0.0.1"), (b"b", "10.0.0.2"), (b"c", "10.0.0.3")):
        _hello(server, i, peer)
    assert [_open(server, b"a", f"a{i}", "10.0.0.1") for i in range(8)] == [""] * 8
    assert _open(server, b"b", "b0", "10.0.0.2").startswith("sequences:")           # b waits
    server.clients.forget(server.clients[b"b"], "left")
    server.dispatch(b"a", W.End("a0"), time.time(), "10.0.0.1")
    assert _open(server, b"a", "a8", "10.0.0.1") == ""                              # b left: nobody waits
    assert _open(server, b"c", "c0", "10.0.0.3").startswith("sequences:")           # c waits
    server.dispatch(b"a", W.End("a1"), time.time(), "10.0.0.1")
    assert _open(server, b"a", "a9", "10.0.0.1").startswith("fair_share:")
    assert _open(server, b"c", "c0", "10.0.0.3") == ""                              # c admitted: waits no longer
    server.dispatch(b"a", W.End("a2"), time.time(), "10.0.0.1")
    assert _open(server, b"a", "a9", "10.0.0.1") == ""


def test_connections_are_bounded_per_address():
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(clients_per_peer=3))
    for i in range(3):
        _hello(server, b"h%d" % i, "10.0.0.1")
    out = server.dispatch(b"h3", HELLO, time.time(), "10.0.0.1")[0]
    assert out.code == "limit" and out.message.startswith("clients_per_peer: address 10.0.0.1 holds 3 connections")
    _hello(server, b"other", "10.0.0.2")


def test_a_client_that_reconnects_under_its_client_id_takes_its_sequences_back():
    """The same client id from the same address takes the old connection's sequences (and its place); the same id
    from another address is another client."""
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    hello = W.Hello(**{**{f: getattr(HELLO, f) for f in HELLO.__struct_fields__}, "client": "c-1"})
    assert isinstance(server.dispatch(b"old", hello, time.time(), "10.0.0.1")[0], W.Welcome)
    assert _open(server, b"old", "s0", "10.0.0.1") == "" and _open(server, b"old", "s1", "10.0.0.1") == ""
    assert isinstance(server.dispatch(b"new", hello, time.time(), "10.0.0.1")[0], W.Welcome)
    assert sorted(server.drafter.seqs) == [(b"new", "s0"), (b"new", "s1")] and b"old" not in server.clients
    assert server.drafter.seqs[(b"new", "s0")].key == (b"new", "s0")
    _drive(server)
    server.dispatch(b"new", W.Rounds([W.Row("s0", 0, 3, 0, [4], 2)]), time.time(), "10.0.0.1")
    assert [len(r.tokens) for _, m in _drive(server) for r in m.rows] == [2]
    assert isinstance(server.dispatch(b"elsewhere", hello, time.time(), "10.0.0.9")[0], W.Welcome)
    assert sorted(server.drafter.seqs) == [(b"new", "s0"), (b"new", "s1")] and b"new" in server.clients


def test_a_closed_connection_frees_its_rows_at_once_not_at_the_ttl(capsys):
    from sdeth.wire.draft_client import DraftServerClient
    from test_draft_server import serving
    server = tiny_server(tiny_qwen3(0), ttl_s=60)
    c = DraftServerClient(serving(server, 30), HELLO)
    for i in range(3):
        c.open(f"s{i}", [1, 2, 3, 4])
    assert _wait(lambda: len(server.drafter.seqs) == 3)
    t0 = time.time()
    c.client.sock.close(linger=0)                          # gone without End (a killed process closes its socket)
    assert _wait(lambda: not server.drafter.seqs, 10)
    assert time.time() - t0 < 5 and sorted(server.drafter.free_rows) == list(range(8))
    assert "freed 3 sequences: its connection closed" in capsys.readouterr().out


def test_a_client_that_timed_out_says_hello_at_once_and_takes_its_sequences_back(monkeypatch):
    """DraftServerClient's timeout closes its socket; its fresh one says Hello under the same client id at once (not
    at its next call, which may come after the server forgot the old connection), and takes its sequences back."""
    import zmq
    from sdeth.runtime.loop import DraftUnavailable
    from sdeth.wire.draft_client import DraftServerClient
    from test_draft_server import serving
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP, ttl_s=60)
    c = DraftServerClient(serving(server, 30), HELLO, timeout_s=0.5)
    t = c.open("s0", [1, 2, 3, 4])
    assert _wait(lambda: server.drafter.seqs and server.drafter.seqs[next(iter(server.drafter.seqs))].ready)
    draft = server.drafter.draft

    def slow(batch):
        time.sleep(1.0)
        return draft(batch)
    monkeypatch.setattr(server.drafter, "draft", slow)
    with pytest.raises(DraftUnavailable, match="no Drafts"):
        c.rounds([(t, 0, [5], 2)])
    new = c.client.sock.getsockopt(zmq.ROUTING_ID)
    assert _wait(lambda: list(server.drafter.seqs) == [(new, "s0")] and list(server.clients) == [new], 1.5)
    monkeypatch.setattr(server.drafter, "draft", draft)
    assert [len(r.tokens) for r in c.rounds([(t, 0, [6], 2)]) if not r.error] == [2]
    c.close()


def _wait(ok, timeout_s: float = 5.0) -> bool:
    t_end = time.time() + timeout_s
    while time.time() < t_end:
        if ok():
            return True
        time.sleep(0.05)
    return ok()


def test_the_ttl_counts_from_the_end_of_a_clients_own_work_and_a_silent_hello_is_forgotten_quietly(monkeypatch,
                                                                                                 capsys):
    import sdeth.wire.clients as ds
    monkeypatch.setattr(ds, "SWEEP_S", 0.0)
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=256, ttl_s=0.3, prefill_budget=16)
    _hello(server, b"a"), _hello(server, b"quiet")
    server.dispatch(b"a", W.Open("long", 0, list(range(1, 200))), time.time(), "p")
    time.sleep(0.4)
    server.clients.expire()                                         # its prompt is being fed: not silent
    assert b"a" in server.clients and b"quiet" not in server.clients
    sock = Sock()
    while server.drafter.waiting():
        server.idle(sock)
    server.clients.expire()
    assert b"a" in server.clients                           # the TTL counts from here
    time.sleep(0.4)
    server.clients.expire()
    assert b"a" not in server.clients and not server.drafter.seqs
    log = capsys.readouterr().out
    assert "freed 1 sequences: no word from the client for 0 s" in log and "freed 0" not in log


# ------------------------------------------------------------------ work per request bounded

def test_a_sampled_drafts_reply_is_bounded_and_q_top_0_refused_where_it_would_not_fit():
    lim = ServerLimits(reply_bytes=64 << 10)
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP, limits=lim)
    most = server.limits.q_top_most(VOCAB)
    assert 0 < most < VOCAB
    _hello(server, b"a")
    sampled = dict(temperature=0.8, draft_sampled=True)
    assert _open(server, b"a", "whole", q_top=0, **sampled).startswith("q_top: q_top whole vocabulary")
    assert _open(server, b"a", "big", q_top=most + 1, **sampled).startswith("q_top:")
    assert _open(server, b"a", "greedy", q_top=0) == ""                   # a greedy draft sends no q
    for i in range(2):
        assert _open(server, b"a", f"s{i}", q_top=most, **sampled) == ""
    _drive(server)
    server.dispatch(b"a", W.Rounds([W.Row(f"s{i}", 0, 3, 0, [4], 16) for i in range(2)]
                                   + [W.Row("greedy", 0, 3, 0, [4], 16)]), time.time(), "p")
    replies = [m for _, m in _drive(server)]
    assert [len(r.q_idx[0]) for m in replies for r in m.rows if r.q_idx] == [most, most]
    assert all(len(W.encode(m)) <= lim.reply_bytes for m in replies)


# ------------------------------------------------------------------ fairness under a flood from one host

def _serve_plain(addr: str, seconds: float) -> None:
    torch.set_num_threads(1)
    tiny_server(tiny_qwen3(0), rows=8, capacity=256).serve(addr, max_seconds=seconds)


def _flood_host(addr: str, kind: str, conns: int, go, sent, window: int = 64) -> None:
    """While `go` is set: `conns` connections of this host send Pings (kind 'ping') or Open/End pairs ('open-end') at
    the server's own processing rate: each keeps `window` messages unanswered, and sends one more for each answer.
    sent: the answers so far."""
    import uuid

    import zmq
    socks = []
    for _ in range(conns):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        s.connect(addr)
        s.send(W.encode(HELLO))
        s.recv()
        socks.append(s)
    msgs = ([W.encode(W.Ping(0.0))] if kind == "ping" else
            [W.encode(W.Open("f", 0, [1, 2, 3, 4])), W.encode(W.End("f"))])
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    out, n = {s: 0 for s in socks}, 0
    while True:
        go.wait()
        for s in socks:
            while out[s] < window:
                for m in msgs:
                    s.send(m)
                out[s] += 1
        for s, _ in poller.poll(100):
            while s.poll(0):
                s.recv()
                out[s] -= 1
                n += 1
        sent.value = n


def _rounds(c, lat: list, n: int) -> None:
    """n rounds of one sequence (k=3, a token each), each round's latency (s) into lat."""
    t = c.open(f"s{len(lat)}", [1, 2, 3, 4])
    for i in range(n):
        t0 = time.perf_counter()
        got = c.rounds([(t, 0, [5 + i % 7], 3)])[0]
        lat.append(time.perf_counter() - t0)
        assert not got.error and len(got.tokens) == 3, got
    c.end(t)


@pytest.mark.parametrize("kind,conns", [("ping", 1), ("open-end", 3)])
def test_a_flood_from_one_host_leaves_a_neighbours_rounds_near_alone(kind, conns, tmp_path):
    """The server, the flooding host's connections and the neighbour on one address (plain TCP: the budget is per
    connection, the turns per connection), one thread each on this CPU: the neighbour's round p50 and p99 alone and
    under the flood, in alternating blocks; the figures printed and written to flood.json."""
    import json
    import multiprocessing
    from sdeth.place.testbed import free_port
    from sdeth.wire.draft_client import DraftServerClient
    torch.set_num_threads(1)
    mp = multiprocessing.get_context("spawn")
    addr, go, sent = f"tcp://127.0.0.1:{free_port()}", mp.Event(), mp.Value("q", 0)
    procs = [mp.Process(target=_serve_plain, args=(addr, 300), daemon=True),
             mp.Process(target=_flood_host, args=(addr, kind, conns, go, sent), daemon=True)]
    for p in procs:
        p.start()
    try:
        c = DraftServerClient(addr, HELLO, timeout_s=60)
        _rounds(c, [], 5)                                       # warm
        lat, seconds, n0 = {"alone": [], "flood": []}, 0.0, sent.value
        for _ in range(4):
            for state in ("alone", "flood"):
                t0 = time.time()
                if state == "flood":
                    go.set()
                    time.sleep(0.3)
                _rounds(c, lat[state], 40)
                if state == "flood":
                    go.clear()
                    seconds += time.time() - t0
                    time.sleep(0.3)                             # its last messages drained
        flood_rate = (sent.value - n0) / seconds              # answered: the server's own rate
        c.close()
    finally:
        for p in procs:
            p.kill()
    ms = {s: {"p50": _pct(v, .5), "p99": _pct(v, .99), "rounds": len(v)} for s, v in lat.items()}
    figures = {"flood": kind, "connections": conns, "flood_answered_per_s": round(flood_rate), "round_ms": ms,
               "measured": "this host's CPU, one thread each (server, flooder, neighbour), tiny 2-layer Qwen3 draft, "
                           "k=3, loopback TCP"}
    (tmp_path / "flood.json").write_text(json.dumps(figures, indent=1))
    print(f"\n{json.dumps(figures)}")
    assert flood_rate > 100                                      # a flood, as fast as the server answered it
    # the goal is 2x; asserted at 2.5x, since the server, the flooder and the neighbour share this host's cores with
    # whatever else runs (measured within 2x in every run so far: docs/reliability.md has the figures)
    assert ms["flood"]["p50"] <= 2.5 * ms["alone"]["p50"] and ms["flood"]["p99"] <= 2.5 * ms["alone"]["p99"], figures


def _pct(v: list, q: float) -> float:
    return round(sorted(v)[min(int(q * len(v)), len(v) - 1)] * 1e3, 2)


# ------------------------------------------------------------------ a closed connection stays closed

def _dealer(addr: str):
    import uuid
    import zmq
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
    d.connect(addr)
    return d


def _take(srv, server):
    """The next message on srv's socket through note_fd and the server's dispatch: (its ident, whether it was
    served)."""
    assert srv.sock.poll(2000)
    frames = srv.sock.recv_multipart(copy=False)
    ident = frames[0].bytes
    live = srv.note_fd(ident, frames[-1])
    if live:
        server.dispatch(ident, W.decode(frames[-1].bytes), time.time(), "127.0.0.1")
    return ident, live


def test_a_killed_clients_last_messages_do_not_keep_its_rows_and_a_reused_fd_is_not_taken_for_closed():
    """libzmq hands out a closed connection's last messages after its close was reported: they are dropped and do
    not make the client live again (its rows go GONE_S after the close). A new connection on the closed one's file
    descriptor, whose message is read before that close, is not taken for closed."""
    import sdeth.wire.draft_server as ds
    from sdeth.wire.serving import _Server
    from sdeth.wire.transport import Log
    from test_draft_server import free_port
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP, ttl_s=60)
    addr = f"tcp://127.0.0.1:{free_port()}"
    srv = _Server(addr, None, Log("test"), server.clients.closed)
    try:
        a = _dealer(addr)
        a.send(W.encode(HELLO))
        ident_a, live = _take(srv, server)
        assert live and ident_a in server.clients
        fd_a = next(fd for fd, ids in srv.fds.items() if ident_a in ids)
        a.send(W.encode(W.Open("s", 0, [1, 2, 3])))
        _take(srv, server)
        for _ in range(3):
            a.send(W.encode(W.Ping(1.0)))
        time.sleep(0.3)
        a.close()                                       # killed: its Pings are still readable on the server
        time.sleep(0.3)
        srv.read_events()                               # the close is read first
        assert server.clients[ident_a].gone
        gone_at = server.clients[ident_a].gone
        assert [_take(srv, server)[1] for _ in range(3)] == [False] * 3
        assert server.clients[ident_a].gone == gone_at  # still closed, since the first close
        for attempt in range(5):     # the OS hands out the lowest free fd, a's again, unless another thread took it
            b = _dealer(addr)
            b.send(W.encode(HELLO))
            time.sleep(0.3)
            ident_b, live = _take(srv, server)          # b's message before anything of the monitor's
            assert live and ident_b in server.clients and not server.clients[ident_b].gone
            if ident_b in srv.fds.get(fd_a, ()) or attempt == 4:    # the race: a reused fd (else the last try's b)
                break
            b.close()                                   # another fd: try again (this one holds no rows)
            time.sleep(0.3)
            srv.read_events()
        b.send(W.encode(W.Open("t", 0, [1, 2, 3])))
        _take(srv, server)
        server.clients[ident_a].gone -= ds.GONE_S
        server.clients.t_sweep = 0
        server.clients.expire()
        assert ident_a not in server.clients and ident_b in server.clients
        assert sorted(server.drafter.seqs) == [(ident_b, "t")]
        b.close()
    finally:
        srv.close()


def test_a_closed_connections_queued_messages_are_dropped_not_served():
    """In passes (per_pass), messages taken off the socket wait in their connection's queue: when its close is read
    first, they are dropped (never handed to the server, which would take the client for live again)."""
    from sdeth.wire.draft_server import DECODE
    from sdeth.wire.serving import _in_turn, _Server
    from sdeth.wire.transport import Log, PeerLimits
    from test_draft_server import free_port
    addr, closed = f"tcp://127.0.0.1:{free_port()}", []
    srv = _Server(addr, None, Log("test"), closed.append)
    try:
        a = _dealer(addr)
        for m in [HELLO] + [W.Ping(1.0)] * 5:
            a.send(W.encode(m))
        time.sleep(0.3)
        served = _in_turn(srv, DECODE, Log("test"), PeerLimits(), None, 0, 1.5, 1, closed.append)
        ident, msg = next(served)[1:3]
        assert isinstance(msg, W.Hello)
        a.close()
        time.sleep(0.3)
        assert list(served) == [] and closed == [ident]
    finally:
        srv.close()


def test_a_streams_commits_are_never_refused_while_the_server_catches_up():
    """A pipelined client never waits for the server: while a pass is slow its Commits pile up past the queue's
    QUEUED. They carry the stream's state (a refused one would leave the server's chain behind the client's), so
    they are held and served, in their connection's order among its other messages, whatever per_pass; only the
    other types are refused past QUEUED."""
    import zmq
    from sdeth.wire.draft_server import DECODE
    from sdeth.wire.serving import QUEUED, _in_turn, _Server
    from sdeth.wire.transport import Log, PeerLimits
    from test_draft_server import free_port
    addr = f"tcp://127.0.0.1:{free_port()}"
    srv = _Server(addr, None, Log("test"), None)
    n = QUEUED + 40
    try:
        a = _dealer(addr)
        sent = [HELLO] + [W.Commits([W.CommitRow("s", 0, i, 1)]) for i in range(n)] + [W.Ping(1.0)] * (QUEUED + 8)
        for m in sent:
            a.send(W.encode(m))
        time.sleep(0.5)
        served = [m for _, _, m, _, _ in _in_turn(srv, DECODE, Log("test"), PeerLimits(), None, 0, 1.5, 1, None,
                                                   (W.Commits, W.End))]
        commits = [m.rows[0].pos for m in served if isinstance(m, W.Commits)]
        assert commits == list(range(n))                           # every one, in order
        assert sum(isinstance(m, W.Ping) for m in served) < QUEUED + 8  # the other types are still bounded
        a.setsockopt(zmq.RCVTIMEO, 500)
        refused = W.Decoder("a client", (W.Error,))(a.recv())
        assert isinstance(refused, W.Error) and refused.code == "limit" and "per_pass" in refused.message
    finally:
        srv.close()


# ------------------------------------------------------------------ where the loop's time goes

def test_the_loops_parts_add_up_to_its_time_and_are_logged_every_report_s(capsys, monkeypatch):
    """report_s: the server logs ms a step per part of its loop. A stream's step made 20 ms slower shows in the
    streams part (and in streams.run within it), and the top-level parts add up to the wall time a step."""
    import re
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP, report_s=0.3, verdict_cache="on")
    _hello(server, b"a")
    server.dispatch(b"a", W.Open("s", 0, [1, 2, 3], stream=True, window=40), time.time(), "p")
    inner = server.drafter.stream_step
    monkeypatch.setattr(server.drafter, "stream_step", lambda seqs: (time.sleep(0.02), inner(seqs))[1])
    sock, t_end, pos = Sock(), time.time() + 1.2, 0
    while time.time() < t_end:
        server.idle(sock)
        rows = [r for _, m in sock.sent if isinstance(m, W.Streamed) for r in m.rows if r.fork < 0]
        if rows and rows[-1].pos >= pos + 2:       # settle a token now and then (the window stays open)
            pos = rows[-1].pos - 1
            server.dispatch(b"a", W.Commits([W.CommitRow("s", 0, pos, rows[-2].token)]), time.time(), "p")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "the loop's parts:" in ln]
    assert len(lines) >= 2, lines
    m = re.search(r"(\d+) steps, ms a step: wall ([\d.]+) = (.*?)(?:; within: (.*?))?(?:; counts: (.*))?$", lines[-1])
    top = dict((k, float(v)) for k, v in (p.rsplit(" ", 1) for p in m.group(3).split(" + ")))
    within = dict((k, float(v)) for k, v in (p.rsplit(" ", 1) for p in m.group(4).split(", ")))
    wall = float(m.group(2))
    assert top["streams"] >= 20 and 20 <= within["streams.run"] <= top["streams"], lines[-1]
    assert abs(sum(top.values()) - wall) <= 0.1 * wall, lines[-1]
    assert {"sweep", "rounds", "send", "plan", "prefill", "between"} <= set(top), lines[-1]
    assert {"draft.pack", "draft.inputs", "draft.launch", "draft.wait", "draft.settle", "plan.copy"} <= set(within)
    assert "counts: opened 1" in lines[0], lines[0]


def test_a_stream_left_more_than_a_catch_up_behind_is_counted_apart_from_prompts():
    """The parts' counts tell a prompt's prefill from a stream's: one whose client committed more tokens past its
    chain than a step catches up is fed by the prefill (prefill.behind), not in a step."""
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    _hello(server, b"a")
    prompt = list(range(1, CATCH_UP + 4))
    server.dispatch(b"a", W.Open("s", 0, prompt, stream=True, window=40), time.time(), "p")
    server.dispatch(b"a", W.Commits([W.CommitRow("s", 0, 0, 5)]), time.time(), "p")
    sock, t_end = Sock(), time.time() + 30
    while not any(isinstance(m, W.Streamed) and m.rows for _, m in sock.sent) and time.time() < t_end:
        server.idle(sock)
    assert server.parts.counts["prefill.prompt"] >= len(prompt) - CATCH_UP and not server.parts.counts["prefill.behind"]
    seq = next(iter(server.drafter.streams()))
    end = len(seq.chain)
    behind = CATCH_UP + 4
    server.dispatch(b"a", W.Commits([W.CommitRow("s", 0, p, 7) for p in range(end, end + behind)]), time.time(), "p")
    server.idle(sock)
    assert server.parts.counts["prefill.behind"] >= behind - CATCH_UP, dict(server.parts.counts)

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
    seq = server.d.seqs.get((b"a", "t"))
    assert errors and all(e.startswith("context:") for e in errors)
    assert seq is None or seq.n <= CAP - 1


def test_an_error_inside_a_step_refuses_its_rows_and_the_server_serves_on(monkeypatch, capsys):
    server = tiny_server(tiny_qwen3(0), rows=4, capacity=CAP)
    for i in (b"a", b"b"):
        _hello(server, i)
        server.dispatch(i, W.Open("s", 0, [1, 2, 3]), time.time(), "p")
    _drive(server)

    def boom(batch):
        raise RuntimeError("device fault")
    monkeypatch.setattr(server.d, "draft", boom)
    for i in (b"a", b"b"):
        server.dispatch(i, W.Rounds([W.Row("s", 0, 3, 0, [4], 3)]), time.time(), "p")
    got = [(i, r) for i, m in _drive(server) for r in m.rows]
    assert sorted(i for i, _ in got) == [b"a", b"b"]
    assert all(r.error == "internal" and r.message.startswith("step: sequence 's': RuntimeError: device fault")
               for _, r in got)
    assert not server.d.seqs and _answers(server)
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
    held = server.d.seqs.get((ident, seq))
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
    assert len(server.d.seqs) + len(server.d.free_rows) == 4



# ------------------------------------------------------------------ one config, from the command line to the server

def test_every_setting_travels_from_the_command_line_to_the_running_server():
    """Each DraftServerConfig field (its limits too) set by a flag, read back from the running server's Welcome
    (limits and sizes) or its config (the rest): no setting dropped or re-guessed on the way."""
    from dataclasses import asdict, fields
    from sdeth.cli import draft_server_config, worker_parser
    from sdeth.wire.draft_client import DraftServerClient
    from sdeth.wire.draft_server import build_server
    from sdeth.wire.server_config import ServerLimits
    from test_draft_server import serving
    lim = dict(sequences_per_client=2, sequences=5, reserve=1, context=60, k=7, rows_per_message=9,
               tokens_per_row=5, batch=3, clients=11, clients_per_key=4, clients_per_peer=6, reply_bytes=1 << 20)
    assert set(lim) == {f.name for f in fields(ServerLimits)}
    argv = ["--role", "draft-server", "--bind", "tcp://127.0.0.1:1", "--rows", "6", "--capacity", "80", "--ttl", "9",
            "--prefill-chunk", "12", "--prefill-budget", "24", "--compile", "none", "--fast", "", "--no-warm",
            "--messages-per-s", "321", "--per-pass", "3"]
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
    assert (told["rows"], told["capacity"], told["ttl_ms"], told["prefill_chunk"], told["prefill_budget"],
            told["messages_per_s"], told["per_pass"]) == (6, 80, 9000, 12, 24, 321, 3)
    assert (server.cfg.compile_mode, server.cfg.fast, server.cfg.warm, server.cfg.spin_s) == ("none", "", False, 0.0)
    assert asdict(server.cfg.limits) == lim and server.d.dec.rows == 6 and server.d.dec.capacity == 80

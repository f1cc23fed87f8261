"""Bad input at the wire: property-based fuzzing of the draft server (one row, `worker --role draft`) and the target
worker with hypothesis. Cases are generated from
the msgspec message types themselves (a message added to sdeth.wire.protocol is fuzzed without a change here):
random bytes, truncated and oversized frames, extra frames, deeply nested containers, the wrong protocol version, unknown and duplicate
request ids, commits out of order, messages for a finished request, and every message with random field values.
Each gets an Error reply or is dropped (with a log line), and the worker serves the next good request."""
import threading
import time
import typing

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from sdeth.models import tokenizer_hash
from sdeth.place.testbed import free_port
from sdeth.wire import protocol as W
from sdeth.wire.draft_client import DraftServerClient
from sdeth.wire.draft_handles import ServerDraft
from sdeth.wire.draft_server import DraftServerConfig, serve_draft_server
from sdeth.wire.target_worker import serve_target
from sdeth.wire.transport import Client

pytestmark = pytest.mark.slow
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MESSAGES = [t for t in typing.get_args(W.Message)]


def _values(tp, vocab: int):
    """A strategy for a field of type tp: edge values beside plausible ones (ids near the vocabulary's ends)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return st.one_of([_values(a, vocab) for a in args])
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.integers(-3, vocab + 3), st.sampled_from([-2 ** 63, 2 ** 63 - 1, 2 ** 31, vocab - 1]))
    if tp is float:
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, -1.0]))
    if tp is bytes:
        return st.binary(max_size=16)
    if tp is str:
        return st.one_of(st.text(max_size=12), st.sampled_from(["r0", "sd", "pipelined", "target-only", "4x4x2"]))
    if origin is list:
        return st.lists(_values(args[0], vocab), max_size=40)
    if origin is dict or tp is dict:
        return st.dictionaries(st.text(max_size=4), _nested_values(), max_size=3)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):      # a struct inside a message (a Rounds' Row)
        return _struct(tp, vocab)
    raise TypeError(f"no strategy for {tp!r}: add one here")


def _struct(cls, vocab: int):
    """A msgspec struct with each field drawn by _values."""
    hints = typing.get_type_hints(cls)
    return st.fixed_dictionaries({f.name: _values(hints[f.name], vocab) for f in msgspec.structs.fields(cls)}
                                 ).map(lambda kw: cls(**kw))


def _nested_values():
    """Free-form values (a Generated record's): scalars, and lists and maps of them nested a few deep."""
    leaf = st.one_of(st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(), st.text(max_size=4), st.none())
    return st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                        max_leaves=12)


def _deep_frame(depth: int, kind: str, tag: str) -> bytes:
    """A message of type `tag` whose `record` (any message's extra field) nests `depth` arrays or maps."""
    inner = (b"\x91" * depth if kind == "array" else b"\x81\xa1k" * depth) + b"\x00"
    head = msgspec.msgpack.encode({"type": tag, "req": "r"})
    return bytes([head[0] + 1]) + head[1:] + b"\xa6record" + inner


def deep_frames():
    """Frames of nested containers, 10 to 200,000 deep, under every message tag."""
    tags = [c.__struct_config__.tag for c in MESSAGES]
    return st.builds(_deep_frame, st.sampled_from([10, 999, 1_000, 5_000, 200_000]), st.sampled_from(["array", "map"]),
                     st.sampled_from(tags))


def messages(vocab: int):
    """Every message type of the protocol with random field values."""
    return st.one_of([_struct(c, vocab) for c in MESSAGES])


def frames(vocab: int):
    """What a peer may put on the socket: a message, its bytes cut short, random bytes, an oversized frame, or
    several frames at once."""
    good = messages(vocab).map(W.encode)
    return st.one_of(
        good.map(lambda b: [b]),
        st.tuples(good, st.integers(0, 30)).map(lambda t: [t[0][:max(len(t[0]) - 1 - t[1], 0)]]),
        st.binary(max_size=64).map(lambda b: [b]),
        st.just([b"\x92" + b"\x00" * (W.MAX_MESSAGE_BYTES + 1)]),
        deep_frames().map(lambda b: [b]),
        st.lists(good, min_size=2, max_size=3))


def _serving(target, args, kwargs) -> threading.Thread:
    t = threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def workers(pair):
    """A draft server of one row (`worker --role draft`) and a target worker that uses it, in threads of this
    process."""
    draft = f"tcp://127.0.0.1:{free_port()}"
    target = f"tcp://127.0.0.1:{free_port()}"
    _serving(serve_draft_server, (draft, pair, DraftServerConfig()), {"max_seconds": 600, "engine_opts": {}})
    _serving(serve_target, (target, pair, draft), {"max_seconds": 600, "draft_timeout_s": 3.0})
    for addr in (draft, target):
        c = Client(addr, timeout_s=60)
        assert isinstance(c.call(W.Ping(0.0)), W.Pong)
        c.close()
    return draft, target


def _hello(pair, **kw):
    h = dict(proto=W.PROTOCOL_VERSION, role="target", model_id="t", vocab_size=pair.vocab_size,
             tokenizer_sha=tokenizer_hash(pair.tokenizer), dtype=pair.config.dtype)
    return W.Hello(**{**h, **kw})


def _dealer(addr: str):
    """A raw socket to a worker: what it sends is not checked on the way out."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    return sock


def _answers(sock, wait_s: float = 0.3) -> list:
    """The replies that come back within wait_s (after the first, whatever else is queued)."""
    out = []
    while sock.poll(int(wait_s * 1000)):
        data = sock.recv()
        out.append(W.decode(data))
        wait_s = 0.05
    return out


def _answers_until(sock, last, wait_s: float = 30.0) -> list:
    """The replies up to and including the first for which last(reply) holds, or all that came within wait_s (a
    worker that drafts between answers may take longer than _answers' 50 ms between two of them on a loaded
    machine)."""
    out, t_end = [], time.time() + wait_s
    while sock.poll(int(max(t_end - time.time(), 0) * 1000)):
        out.append(W.decode(sock.recv()))
        if last(out[-1]):
            break
    return out


def _good_draft_request(addr: str, pair) -> None:
    """A whole sync request against the draft server: handshake, open, two rounds, end."""
    d = ServerDraft(DraftServerClient(addr, _hello(pair), timeout_s=20))
    try:
        d.start([1, 2, 3, 4], 64)
        assert len(d.propose(0, 5, 3)[0]) == 3
        assert len(d.propose(1, 7, 2)[0]) == 2
        d.end()
    finally:
        d.server.close()


def _refusals(sock, seq: str, wait_s: float = 30.0) -> list[str]:
    """The refusal codes of seq's rows in the Drafts that come back, up to the first Drafts that names seq."""
    got = _answers_until(sock, lambda r: isinstance(r, W.Drafts) and any(x.seq == seq for x in r.rows), wait_s)
    return [x.error for r in got if isinstance(r, W.Drafts) for x in r.rows if x.seq == seq]


def _good_generate(addr: str, mode: str = "sd") -> W.Generated:
    c = Client(addr, timeout_s=60)
    try:
        r = c.call(W.Generate("good", [1, 2, 3, 4, 5], 8, mode, 3))
        assert isinstance(r, W.Generated), r
        assert len(r.record["output_ids"]) == 8
        return r
    finally:
        c.close()


@FUZZ
@given(data=st.data())
def test_draft_server_survives_any_frame(pair, workers, data):
    draft, _ = workers
    sock = _dealer(draft)
    try:
        if data.draw(st.booleans(), "handshake first"):
            sock.send(W.encode(_hello(pair)))
            assert isinstance(_answers(sock, 5.0)[0], W.Welcome)
        sent = data.draw(frames(pair.vocab_size), "frames")
        if len(sent) == 1:
            sock.send(sent[0])
        else:
            sock.send_multipart(sent)         # not our framing: dropped with a log line
        for reply in _answers(sock):
            assert isinstance(reply, (W.Error, W.Pong, W.Welcome, W.Drafts, W.Streamed, W.Ended)), reply
            if isinstance(reply, W.Error):
                assert reply.code in ("bad-message", "too-large", "version", "mismatch", "limit",
                                      "internal") and reply.message
        c = Client(draft, timeout_s=20)
        assert isinstance(c.call(W.Ping(0.0)), W.Pong)
        c.close()
    finally:
        sock.close()


@FUZZ
@given(msg=messages(49152))
def test_target_worker_survives_any_message(pair, workers, msg):
    _, target = workers
    sock = _dealer(target)
    try:
        sock.send(W.encode(msg))
        wait = 30.0 if isinstance(msg, W.Generate) else 0.3      # a valid random Generate decodes
        for reply in _answers(sock, wait):
            assert isinstance(reply, (W.Error, W.Pong, W.Generated)), reply
    finally:
        sock.close()


@pytest.mark.parametrize("kind", ["array", "map"])
def test_a_deeply_nested_frame_kills_neither_worker(pair, workers, kind):
    """A 1 KB 'generated' message whose record nests 1,000 arrays (or maps), and a 200,000-deep one, to each
    worker, with and without a handshake: a bad-message reply each, and both serve on."""
    draft, target = workers
    for addr in (draft, target):
        for depth in (1_000, 200_000):
            sock = _dealer(addr)
            try:
                if addr == draft and depth > 1_000:
                    sock.send(W.encode(_hello(pair)))
                    assert isinstance(_answers(sock, 5.0)[0], W.Welcome)
                sock.send(_deep_frame(depth, kind, "generated"))
                got = _answers(sock, 5.0)
                assert len(got) == 1 and isinstance(got[0], W.Error) and got[0].code == "bad-message", got
            finally:
                sock.close()
    _good_draft_request(draft, pair)
    _good_generate(target, "sd")


def test_protocol_abuse_in_sequence_then_good_requests(pair, workers):
    """The named cases, in order, on one connection: wrong version, no handshake, unknown and duplicate sequence
    ids, a k beyond any round, rounds for an ended sequence, commits out of order and for an ended stream, a context
    the server cannot hold; then a whole good request on each worker."""
    draft, target = workers
    c = Client(draft, timeout_s=20)
    row = lambda seq, have, k=3: W.Rounds([W.Row(seq, 0, have, 0, [5], k)])     # noqa: E731
    try:
        assert c.call(row("nobody", 1)).code == "version"                               # no handshake yet
        assert c.call(_hello(pair, proto=W.PROTOCOL_VERSION - 1)).code == "version"
        assert isinstance(c.call(_hello(pair)), W.Welcome)
        assert c.call(row("nobody", 1)).rows[0].error == "desync"                        # an unknown sequence
        for bad, code in ((W.Open("big", 0, [1] * 5000), "limit"),                       # a context it cannot hold
                          (W.Open("oov", 0, [1, 10 ** 9]), "bad-message"),               # ids outside the vocabulary
                          (W.Open("nan", 0, [1, 2], temperature=float("nan")), "bad-message")):
            c.send(bad)
            assert _refusals(c.sock, bad.seq) == [code], bad
        for _ in range(2):                                                              # a duplicate id: reopened
            c.send(W.Open("dup", 0, [1, 2, 3]))
        assert c.call(row("dup", 3, k=99)).rows[0].error == "limit"                     # k beyond any round
        got = c.call(row("dup", 3)).rows[0]
        assert not got.error and len(got.tokens) == 3, got
        assert isinstance(c.call(W.End("dup")), W.Ended)
        assert c.call(row("dup", 4)).rows[0].error == "desync"                           # an ended sequence
        c.send(W.Open("s", 0, [1, 2, 3], stream=True))
        c.send(W.Commits([W.CommitRow("s", 0, 9, 5)]))     # a commit past the draft's chain: refused, not a crash
        assert "desync" in _refusals(c.sock, "s")
        assert isinstance(c.call(W.End("s")), W.Ended)
        c.send(W.Commits([W.CommitRow("s", 0, 1, 5)]))     # for the ended stream
        assert _refusals(c.sock, "s") == ["desync"]
    finally:
        c.close()
    _good_draft_request(draft, pair)
    for bad in (W.Generate("g", [], 8), W.Generate("g", [1], 0), W.Generate("g", [1], 8, "warp"),
                W.Generate("g", [1], 8, k=0), W.Generate("g", [1], 8, top_p=0.0), W.Generate("g", [1], 8, cache="2x"),
                W.Generate("g", [1], 1 << 30)):
        c = Client(target, timeout_s=20)
        r = c.call(bad)
        c.close()
        assert isinstance(r, W.Error) and r.code == "bad-message" and "Generate 'g'" in r.message, (bad, r)
    for mode in ("sd", "pipelined", "target-only"):
        _good_generate(target, mode)


def test_workers_serve_good_requests_after_the_fuzzing(pair, workers):
    """Runs after the fuzz tests (file order): both workers still serve whole requests, SD included."""
    draft, target = workers
    _good_draft_request(draft, pair)
    r = _good_generate(target, "sd")
    assert r.record["tokens_without_draft"] == 0, r.record.get("draft_unavailable")
    time.sleep(0.1)


def test_curve_workers_serve_keyed_clients_only(pair, tmp_path, capfd):
    """Both workers under CURVE: a controller with the deployment's keys gets SD from the target (which reaches
    its draft with the same keys); a client without keys, and one with another deployment's, get nothing, and
    the refusal is logged with the peer."""
    from sdeth.wire.auth import Keys, make_keys
    keys = Keys.load(make_keys(tmp_path / "keys"))
    other = Keys.load(make_keys(tmp_path / "other"))
    draft, target = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    _serving(serve_draft_server, (draft, pair, DraftServerConfig()), {"max_seconds": 120, "keys": keys,
                                                                      "engine_opts": {}})
    _serving(serve_target, (target, pair, draft), {"max_seconds": 120, "draft_timeout_s": 3.0, "keys": keys})
    c = Client(target, timeout_s=60, keys=keys)
    try:
        r = c.call(W.Generate("keyed", [1, 2, 3, 4, 5], 8, "sd", 3))
        assert isinstance(r, W.Generated) and r.record["tokens_without_draft"] == 0, r
    finally:
        c.close()
    for who, addr in ((None, draft), (other, target)):
        c = Client(addr, timeout_s=2.0, keys=who)
        with pytest.raises(TimeoutError):
            c.call(W.Ping(0.0))
        c.close()
    time.sleep(0.6)
    out = capfd.readouterr().out
    assert "refused (auth)" in out and "PLAIN TCP" not in out, out[-2000:]


def test_a_second_target_on_one_row_is_told_at_once(pair, workers):
    """The draft of one row holds one sequence: while one target's sequence holds it, a second target's Open is
    refused at once (`limit`, naming the sequences), not left to time out; once the first ends, the second is
    served."""
    draft, _ = workers
    a, b = Client(draft, timeout_s=20), Client(draft, timeout_s=20)
    try:
        for c in (a, b):
            assert isinstance(c.call(_hello(pair)), W.Welcome)
        a.send(W.Open("first", 0, [1, 2, 3]))
        assert not a.call(W.Rounds([W.Row("first", 0, 3, 0, [4], 3)])).rows[0].error
        b.send(W.Open("second", 0, [4, 5, 6]))
        note, = b.recv(5.0).rows
        assert note.error == "limit" and "sequences" in note.message, note
        assert isinstance(a.call(W.End("first")), W.Ended)
        b.send(W.Open("second", 1, [4, 5, 6]))
        got = b.call(W.Rounds([W.Row("second", 1, 3, 0, [7], 3)])).rows[0]
        assert not got.error and len(got.tokens) == 3, got
        assert isinstance(b.call(W.End("second")), W.Ended)
    finally:
        a.close()
        b.close()


def test_heartbeats_are_answered_while_a_long_prompt_prefills(pair, workers):
    """A long prompt is fed in chunks between the loop's reads: a Ping sent right after its Open and first round is
    answered before the round's Drafts, and the round is answered after the prefill."""
    draft, _ = workers
    c, probe = Client(draft, timeout_s=60), Client(draft, timeout_s=60)
    try:
        assert isinstance(c.call(_hello(pair)), W.Welcome)
        ids = [(7 * i) % 20000 + 10 for i in range(1500)]
        c.send(W.Open("long", 0, ids))
        c.send(W.Rounds([W.Row("long", 0, len(ids), 0, [5], 3)]))
        t0 = time.perf_counter()
        assert isinstance(probe.call(W.Ping(0.0)), W.Pong)
        pong_s = time.perf_counter() - t0
        drafts = c.recv(60)
        drafts_s = time.perf_counter() - t0
        assert isinstance(drafts, W.Drafts) and len(drafts.rows[0].tokens) == 3, drafts
        assert pong_s < drafts_s, (pong_s, drafts_s)
        assert isinstance(c.call(W.End("long")), W.Ended)
    finally:
        c.close()
        probe.close()

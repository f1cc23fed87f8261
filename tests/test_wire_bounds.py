"""The wire's bounds without a model: every frame decodes to a typed message or a ProtocolError (nothing else
escapes, however deep or large), each role takes only its own messages, a frame of the wrong count is answered,
refusals are logged with the peer and rate-limited, and a client whose server's process ends learns it at once."""
import contextlib
import dataclasses
import threading
import time

import msgspec
import pytest
import zmq

from sdeth.place.testbed import free_port
from sdeth.wire import protocol as W
from sdeth.wire.draft_server import DECODE as DRAFT_DECODE
from sdeth.wire.target_worker import DECODE as TARGET_DECODE
from sdeth.wire.serving import serve_requests
from sdeth.wire.transport import Client, Log, PeerGone

DECODERS = [W.decode, DRAFT_DECODE, TARGET_DECODE]


def _deep(depth: int, kind: str) -> bytes:
    """A msgpack value of `depth` nested one-element arrays (or maps), innermost 0."""
    return (b"\x91" * depth if kind == "array" else b"\x81\xa1k" * depth) + b"\x00"


def _generated_with(record: bytes, tag: bytes = b"generated") -> bytes:
    """A 'generated' message (map of type, req, record) whose record is the given msgpack bytes."""
    return b"\x83\xa4type" + bytes([0xa0 + len(tag)]) + tag + b"\xa3req\xa1r\xa6record" + record


@pytest.mark.parametrize("decode", DECODERS, ids=["any", "draft", "target"])
@pytest.mark.parametrize("kind", ["array", "map"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deep_frames_are_refused_not_recursed(decode, kind, depth):
    frame = _generated_with(_deep(depth, kind))
    with pytest.raises(W.ProtocolError) as e:
        decode(frame)
    assert e.value.code == "bad-message"


@pytest.mark.parametrize("decode", DECODERS, ids=["any", "draft", "target"])
def test_garbage_and_truncation_raise_only_protocol_errors(decode):
    good = W.encode(W.Open("r", 0, list(range(50))))
    for frame in [good[:n] for n in range(len(good))] + [b"\xc1", b"\xdd\xff\xff\xff\xff", b"\x92" * 40]:
        with contextlib.suppress(W.ProtocolError):
            decode(frame)


def test_each_role_takes_its_own_messages():
    gen = W.encode(W.Generate("g", [1, 2], 4))
    assert isinstance(TARGET_DECODE(gen), W.Generate)
    with pytest.raises(W.ProtocolError, match="a draft server .*takes Hello, Open, Rounds, Commits, End, Ping"):
        DRAFT_DECODE(gen)
    with pytest.raises(W.ProtocolError, match="a target worker .*takes Generate, Ping"):
        TARGET_DECODE(W.encode(W.Open("r", 0, [1])))
    assert isinstance(DRAFT_DECODE(W.encode(W.Ping(0.0))), W.Ping)


def test_request_ids_and_seeds_are_bounded():
    with pytest.raises(W.ProtocolError, match=r"length <= 128.*\$\.req"):
        DRAFT_DECODE(W.encode(W.End("x" * 129)))
    assert DRAFT_DECODE(W.encode(W.End("x" * 128))).req == "x" * 128
    big = msgspec.msgpack.encode({"type": "generate", "req": "g", "prompt_ids": [1], "max_tokens": 4,
                                  "seed": 2 ** 64 - 1})
    with pytest.raises(W.ProtocolError, match=r"\$\.seed"):
        TARGET_DECODE(big)


def test_the_log_says_when_and_who_and_is_rate_limited(capsys):
    log = Log("draft worker", burst=5, per_s=60)
    for i in range(2000):
        log.refused("10.0.0.9:4444", "bad-message", f"frame {i}")
    log.refused("10.0.0.7:5555", "version", "send Hello first")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6, lines
    assert all("Z sdeth draft worker peer=10.0.0." in line for line in lines)
    assert "peer=10.0.0.7:5555: refused (version)" in lines[-1]


@contextlib.contextmanager
def _server(decode, keys=None):
    """serve_requests in a thread (under CURVE with keys), answering every message with Pong; yields (address, its
    log lines, and a line "served PEER" per message served)."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    lines: list[str] = []

    class Quiet(Log):
        def line(self, text, peer=""):
            lines.append(f"{peer} {text}")

    def run():
        for sock, ident, msg, t1, peer in serve_requests(addr, decode, Quiet("test"), max_seconds=20, keys=keys):
            lines.append(f"served {peer}")
            sock.send_multipart([ident, W.encode(W.Pong(0.0, t1, time.time()))])

    threading.Thread(target=run, daemon=True).start()
    time.sleep(0.3)
    yield addr, lines


def test_frames_of_the_wrong_count_are_answered_and_logged():
    with _server(DRAFT_DECODE) as (addr, lines):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(addr)
        try:
            for frames in ([b"", W.encode(W.Ping(0.0))], [b"a", b"b", b"c"], [W.encode(W.Ping(0.0))] * 2):
                sock.send_multipart(frames)
                assert sock.poll(3000), frames
                err = W.decode(sock.recv_multipart()[-1])     # (after a REQ envelope's empty frame, kept for REQ)
                assert isinstance(err, W.Error) and err.code == "bad-message" and "exactly one frame" in err.message
            sock.send(W.encode(W.Generate("g", [1], 2)))       # a target's message, sent to a draft server
            assert sock.poll(3000)
            assert "takes Hello" in W.decode(sock.recv()).message
        finally:
            sock.close()
        assert any(line.startswith("127.0.0.1 refused (bad-message)") for line in lines), lines
        req = zmq.Context.instance().socket(zmq.REQ)                # a REQ client sees its answer too
        req.setsockopt(zmq.LINGER, 0)
        req.connect(addr)
        try:
            req.send(W.encode(W.Ping(0.0)))
            assert req.poll(3000)
            assert "exactly one frame" in W.decode(req.recv()).message
        finally:
            req.close()


def test_a_client_learns_at_once_that_its_server_is_gone():
    """The server's process ends while a reply is awaited: PeerGone within the heartbeat, not the timeout."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()                      # the server's own context, terminated as a process's would be
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    server.bind(addr)
    client = Client(addr, timeout_s=30, decode=W.Decoder("a controller", W.TARGET_SENDS), gone_fast=True)
    try:
        client.send(W.Ping(0.0))
        assert server.poll(5000)
        server.recv_multipart()
        t0 = time.perf_counter()
        threading.Timer(0.3, lambda: (server.close(), ctx.term())).start()
        with pytest.raises(PeerGone, match="closed the connection"):
            client.call_reply()
        assert time.perf_counter() - t0 < 10
    finally:
        client.close()


def test_curve_serves_only_authorized_keys_and_logs_the_refusals(tmp_path):
    from sdeth.wire.auth import Keys, make_keys
    keys = Keys.load(make_keys(tmp_path / "deploy"))
    other = Keys.load(make_keys(tmp_path / "other"))
    stranger = dataclasses.replace(keys, client_public=other.client_public, client_secret=other.client_secret)
    with _server(DRAFT_DECODE, keys) as (addr, lines):
        good = Client(addr, timeout_s=5, keys=keys)
        assert isinstance(good.call(W.Ping(0.0)), W.Pong)
        good.close()
        assert any(line.startswith("served 127.0.0.1 key=") for line in lines), lines
        for who in (None, other, stranger):        # no key; keys of another deployment; a client key it does not know
            c = Client(addr, timeout_s=1.5, keys=who)
            with pytest.raises(TimeoutError):
                c.call(W.Ping(0.0))
            c.close()
        assert any("refused (auth): CURVE key refused" in line for line in lines), lines
        failed = [line for line in lines if "refused (auth): a peer failed the CURVE handshake" in line]
        assert failed and all(line.startswith(("127.0.0.1 ", "an unknown address ")) for line in failed), lines
        assert any(line.startswith("127.0.0.1 ") for line in failed), failed     # the peer, not this server's endpoint
    assert not any("PLAIN TCP" in line for line in lines)


def test_plain_tcp_is_said_loudly():
    with _server(DRAFT_DECODE) as (addr, lines):
        pass
    assert any("PLAIN TCP" in line and "any process that reaches this port is served" in line for line in lines)


def test_a_key_directory_missing_its_files_names_the_fix(tmp_path):
    from sdeth.wire.auth import Keys, KeysError
    with pytest.raises(KeysError, match="python -m sdeth keys"):
        Keys.load(tmp_path)


def test_a_flooding_peer_is_limited_and_told_once_a_second():
    from sdeth.wire.transport import PeerLimits
    lim = PeerLimits(messages_per_s=100, bytes_per_s=1 << 20)
    verdicts = [lim.check(b"flood", 10, 1000.5) for _ in range(150)]
    assert all(v == (None, False) for v in verdicts[:100])
    assert verdicts[100][1] and verdicts[100][0].startswith("messages_per_s: more than 100 messages")
    assert all(v[0] and not v[1] for v in verdicts[101:])                    # told once
    assert lim.check(b"other", 10, 1000.6) == (None, False)                 # another peer is not affected
    assert lim.check(b"flood", 10, 1001.0) == (None, False)                 # the next second
    assert lim.check(b"big", 2 << 20, 1001.0)[0].startswith("bytes_per_s: more than 1 MiB")   # bytes count too


def test_a_keys_connections_share_one_budget():
    """screen() counts a CURVE key's messages across its connections (another routing id, another address), and
    another key apart; on plain TCP each connection is counted apart (the clients of one host too)."""
    from sdeth.wire.serving import screen
    from sdeth.wire.transport import Log, PeerLimits

    class Frame:
        def __init__(self, data: bytes, peer: str = "", key: str = ""):
            self.bytes, self._props = data, {"Peer-Address": peer, "User-Id": key}

        def __len__(self):
            return len(self.bytes)

        def get(self, name):
            return self._props[name]

    class Sock:
        sent: list = []

        def send_multipart(self, frames):
            self.sent.append(W.decode(frames[-1]))

    lim, sock, ping = PeerLimits(messages_per_s=10), Sock(), W.encode(W.Ping(1.0))
    decode = W.Decoder("a test", (W.Ping,))
    def send(ident, addr, key):
        return screen(sock, [Frame(ident), Frame(ping, addr, key)], decode, Log("t"), lim, 1000.5)
    got = [send(b"r%d" % i, f"10.0.0.{i % 3}", "a") for i in range(12)]      # 12 connections of key a
    assert all(g is not None for g in got[:10]) and got[10] is None and got[11] is None
    assert [m.code for m in sock.sent] == ["limit", "limit"]                # each refused connection told once
    assert send(b"s", "10.0.0.1", "b") is not None                          # key b has its own budget
    assert send(b"t", "10.0.0.7", "") is not None                           # plain TCP: per connection
    assert all(send(b"u%d" % i, "10.0.0.8", "") is not None for i in range(12))   # 12 connections of one host


def test_a_draft_the_heartbeat_marked_down_is_not_waited_for():
    """The pipelined loop's short waits and polls stop at once when the heartbeat has marked the draft down, and the
    request keeps the reason; while it is up, a short wait just finds nothing."""
    from sdeth.runtime.loop import DraftUnavailable
    from sdeth.wire.draft_client import DraftServerClient
    from sdeth.wire.draft_handles import ServerStream

    class Quiet:
        addr, timeout_s = "tcp://draft:5601", 5.0

        def recv(self, timeout_s):
            time.sleep(timeout_s)
            return None

    class Health:
        up, why = True, "heartbeat answered"

    c = DraftServerClient.__new__(DraftServerClient)       # the client without its handshake
    c.client, c.health, c.addr = Quiet(), Health(), Quiet.addr
    s = ServerStream(c)
    assert s.wait(0.02) is False
    Health.up, Health.why = False, "3 heartbeats unanswered (0.5 s each)"
    t0 = time.perf_counter()
    for look in (lambda: s.wait(0.02), s.poll):
        with pytest.raises(DraftUnavailable, match="heartbeat marked the draft server at tcp://draft:5601 down"):
            look()
    assert time.perf_counter() - t0 < 0.5 and "3 heartbeats unanswered" in s.lost


def test_a_client_built_not_to_wait_takes_the_welcome_as_a_message_and_never_blocks_a_send():
    """wait=False (vLLM's proposer): the Hello goes out as given and its Welcome comes later as any message does;
    a frame that is no message comes as its Error; Opens and rows go out in messages of at most `per` rows;
    hello_again says Hello on a fresh socket; a full send queue is PeerGone at once, never a wait."""
    from sdeth.wire.draft_client import DraftServerClient
    hello = W.Hello(W.PROTOCOL_VERSION, "target", "m", 100, "sha", "float32")
    welcome = W.Welcome(W.PROTOCOL_VERSION, "m", 100, "sha", "float32")
    addr = f"tcp://127.0.0.1:{free_port()}"
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.bind(addr)
    try:
        c = DraftServerClient(addr, hello, wait=False)
        assert c.peer is None and c.take(0) is None                    # nothing awaited
        ident, data = sock.recv_multipart()
        assert DRAFT_DECODE(data) == hello                             # no client id of its own
        sock.send_multipart([ident, W.encode(welcome)])
        sock.send_multipart([ident, b"\x00 no message"])
        assert c.take(2) == welcome and c.take(2).code == "bad-message"
        c.send_open("s", 0, [1, 2], stream=True, window=4)
        c.send_rows(W.Commits, [W.CommitRow("s", 0, i, 5) for i in range(5)], per=2)
        got = [DRAFT_DECODE(sock.recv_multipart()[1]) for _ in range(4)]
        assert got[0] == W.Open("s", 0, [1, 2], stream=True, window=4)
        assert [len(m.rows) for m in got[1:]] == [2, 2, 1]
        c.hello_again()
        again, data = sock.recv_multipart()
        assert again != ident and DRAFT_DECODE(data) == hello
        c.close()
    finally:
        sock.close()
    c = DraftServerClient(f"tcp://127.0.0.1:{free_port()}", hello, wait=False)   # no one there: the queue fills
    with pytest.raises(PeerGone, match="send queue full"):
        for _ in range(100_000):
            c.send(W.Ping(0.0))
    c.close()

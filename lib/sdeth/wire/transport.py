"""The transport both workers and the controller use: zmq ROUTER (servers) and DEALER (clients), one
msgpack frame per message (`sdeth.wire.protocol`). Servers bind to the address they are given, never to
every interface by default.
"""
from __future__ import annotations

import collections
import os
import socket
import threading
import time
import uuid

import zmq
import zmq.utils.monitor

from . import protocol
from .auth import DEFAULT_CLIENTS, Keys, plain_tcp_warning, secure_client, secure_server


def reply(sock, ident: bytes, msg) -> None:
    sock.send_multipart([ident, protocol.encode(msg)])


# Busy-polling: a process that sleeps in a blocking poll between messages a few ms apart wakes slowly.
# Measured on a GPU host (two Python processes, loopback TCP): a bare round trip of 0.093 ms back to back,
# 0.40 ms median (p90 0.61) after a 5 ms idle gap, when the receiving side slept. A worker whose device
# does the work (a GPU) can spare a core to spin for `spin_s` after its last message; on a CPU testbed,
# where the cores do the decoding, it must not (spin_s = 0 there).


class Log:
    """A server's log lines: time, peer, what happened. Refusals are rate-limited per (peer, code): at most
    `burst` lines in `per_s` seconds, then one line saying how many were left out."""

    def __init__(self, who: str, burst: int = 5, per_s: float = 10.0):
        self.who, self.burst, self.per_s = who, burst, per_s
        self._seen: dict[tuple, list] = {}      # (peer, kind) -> [window start, lines in it, left out]
        self._lock = threading.Lock()           # the CURVE authenticator's thread logs too

    def line(self, text: str, peer: str = "") -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1e3) % 1000:03d}Z"
        print(f"{stamp} sdeth {self.who}{f' peer={peer}' if peer else ''}: {text}", flush=True)

    def refused(self, peer: str, code: str, text: str, kind: str = "") -> None:
        """kind: rate-limited apart from the code's other refusals (default: the code)."""
        with self._lock:
            self._refused(peer, code, text, kind or code)

    def _refused(self, peer: str, code: str, text: str, kind: str) -> None:
        now = time.time()
        w = self._seen.setdefault((peer, kind), [now, 0, 0])
        if now - w[0] > self.per_s:
            if w[2]:
                self.line(f"{w[2]} more refusals ({code}) left out of the log in {self.per_s:.0f} s", peer)
            w[:] = [now, 0, 0]
        w[1] += 1
        if w[1] <= self.burst:
            self.line(f"refused ({code}): {text}", peer)
        else:
            w[2] += 1
        if len(self._seen) > 4096:              # a flood of peers: forget the oldest windows
            for key in list(self._seen)[:2048]:
                del self._seen[key]


MAX_FRAME_BYTES = 2 * protocol.MAX_MESSAGE_BYTES   # zmq drops a connection that sends a larger frame


class PeerLimits:
    """What one client may send a server in one second: messages and bytes. Over either, its messages in the rest
    of that second are refused (one Error `limit` a second tells it, naming the limit). A client is its own CURVE key
    (all its connections together) where it has one, else its connection (never an address: the clients of one
    host are counted apart)."""

    def __init__(self, messages_per_s: int = 4000, bytes_per_s: int = 64 << 20):
        self.messages_per_s, self.bytes_per_s = messages_per_s, bytes_per_s
        self._used: dict = {}        # peer (its address, or its routing id) -> [second, messages, bytes, told]

    def check(self, ident, nbytes: int, now: float, conn=None) -> tuple[str | None, bool]:
        """(why the message is refused or None, whether to tell the sender now: once a second per connection
        `conn`, so that each connection of a key over its budget hears of it)."""
        second = int(now)
        u = self._used.get(ident)
        if u is None or u[0] != second:
            if len(self._used) > 4096:             # many peers: forget those quiet for a second
                self._used = {k: v for k, v in self._used.items() if v[0] >= second - 1}
            u = self._used[ident] = [second, 0, 0, set()]
        u[1] += 1
        u[2] += nbytes
        if u[1] <= self.messages_per_s and u[2] <= self.bytes_per_s:
            return None, False
        why = (f"messages_per_s: more than {self.messages_per_s} messages" if u[1] > self.messages_per_s else
               f"bytes_per_s: more than {self.bytes_per_s >> 20} MiB")
        why += (" in one second from this peer (the server's per-peer limit): messages refused for the rest of the "
                "second")
        tell = conn not in u[3] and len(u[3]) < 64
        u[3].add(conn)
        return why, tell


def peer_of(frame) -> str:
    """The peer as zmq saw it: its address, and under CURVE `key=NAME`, its key's name (wire.auth: its identity)."""
    try:
        addr = frame.get("Peer-Address") or ""
    except Exception:
        addr = ""
    try:
        key = frame.get("User-Id") or ""
    except Exception:
        key = ""
    return f"{addr} key={key}" if key and key != "anonymous" else addr


def key_of(peer: str) -> str:
    """The CURVE key's name in a peer_of string ('' on plain TCP): the client's identity."""
    return peer.partition(" key=")[2]


IDLE_EVERY_S = 0.001     # while messages keep arriving, background work still runs this often (see serve_requests)
DRAIN = 64               # messages taken off the socket in one pass (serve_requests with per_pass; zmq takes
                         # them from the connections in turn)
QUEUED = 64              # ... and held for one connection at most (more are refused, told once a second)
QUEUED_URGENT = 4096     # ... of the `urgent` types (stream state: never refused below this; the per-second
                         # budget bounds how fast a connection can fill it)
DROPS_LOG_S = 10.0       # a flooding connection's dropped messages: one log line per this many seconds


class Drops:
    """A flooding connection's messages dropped unread (its queue was full): counted per connection, the sender
    told once a second, one log line per DROPS_LOG_S with the count."""

    def __init__(self, log: Log):
        self.log = log
        self.seen: dict[bytes, list] = {}        # ident -> [messages dropped since the last line, when logged, told]
        self.total = 0

    def drop(self, sock, ident: bytes, peer: str, now: float) -> None:
        d = self.seen.setdefault(ident, [0, 0.0, 0])
        d[0] += 1
        self.total += 1
        if int(now) != d[2]:
            d[2] = int(now)
            reply(sock, ident, protocol.Error("limit", self.why()))
        if now - d[1] >= DROPS_LOG_S:
            self.log.refused(peer, "limit", f"{d[0]} messages dropped unread since the last line: {self.why()}",
                             kind="dropped")
            d[0], d[1] = 0, now

    @staticmethod
    def why() -> str:
        return (f"per_pass: {QUEUED} messages of this connection wait to be served (the server takes per_pass of each "
                f"connection's in turn and holds {QUEUED} at most): wait for the answers you have asked for (messages "
                f"past it are dropped unread)")

    def forget(self, ident: bytes) -> None:
        self.seen.pop(ident, None)


def serve_requests(bind: str, decode: protocol.Decoder, log: Log, max_seconds: float = 0, idle=None,
                   spin_s: float = 0.0, keys: Keys | None = None, limits: PeerLimits | None = None,
                   idle_every_s: float = IDLE_EVERY_S, per_pass: int = 0, closed=None, urgent: tuple = (),
                   pump_to=None):
    """The server loop the workers share: bind a ROUTER to exactly `bind`, yield (sock, ident, message,
    receive time, peer) for each well-formed message of the types `decode` takes; anything else gets an
    Error reply here, and a log line. idle(sock) -> bool: background work (the pipelined draft's run-ahead,
    the draft server's steps), one step per call; True while there is more. spin_s: busy-poll for this long after
    each message before sleeping in a blocking poll (see above). keys: serve only the clients whose CURVE keys they
    authorize (wire.auth); None: plain TCP, said in the log. limits: what each client may send in a second
    (PeerLimits' defaults when None). closed(ident): called when the connection that carried ident's messages
    closed (zmq's monitor; a connection whose file descriptor was reused before the event was read may be named
    too: the client then says Hello again).

    per_pass = 0: messages in arrival order, idle() when none waits and, while messages keep arriving, at least
    every idle_every_s. per_pass = N: in passes: up to DRAIN waiting messages into per-connection queues, then at
    most N of each connection's in turn (round-robin), then one idle(): a connection that floods the socket waits
    for its own messages, not its neighbours' (docs/reliability.md). urgent: message types that carry a client's
    state and need no reply (a stream's Commits, End): in their connection's order, but served in the same pass
    whatever per_pass, and held up to QUEUED_URGENT (a refused one would leave the server's state behind the
    client's). pump_to(take), with per_pass: take(timeout_ms) -> messages taken off the socket into those queues,
    decoded and screened but not served (they are served after idle() returns, urgent ones first in their pass):
    idle() calls it while a step runs, so that a message that comes during the step is read then."""
    limits = limits or PeerLimits()
    server = None
    try:
        server = _Server(bind, keys, log, closed)
        args = (server, decode, log, limits, idle, spin_s, max_seconds, per_pass or idle_every_s, closed)
        yield from (_in_turn(*args, urgent, pump_to) if per_pass else _in_order(*args))
    finally:
        if server is not None:
            server.close()


def _idle(idle, sock, log: Log) -> bool:
    """idle(sock), its errors logged, never raised: background work that fails must not end the server."""
    try:
        return bool(idle and idle(sock))
    except Exception as e:          # the server's own containment missed it: say so, serve on
        log.line(f"background work failed, serving on: {type(e).__name__}: {e}")
        return False


def _in_order(server, decode, log, limits, idle, spin_s, max_seconds, idle_every_s, closed):
    t_end = time.time() + max_seconds if max_seconds else float("inf")
    busy, t_last, t_idle = False, 0.0, time.perf_counter()
    while time.time() < t_end:
        spinning = spin_s and time.perf_counter() - t_last < spin_s
        waiting = server.wait(0 if busy or spinning else 500)
        if not waiting or time.perf_counter() - t_idle >= idle_every_s:
            busy, t_idle = _idle(idle, server.sock, log), time.perf_counter()
            server.read_events(closed)
            if not waiting:
                continue
        busy = idle is not None
        frames = server.sock.recv_multipart(copy=False)
        t_recv, t_last = time.time(), time.perf_counter()
        got = screen(server.sock, frames, decode, log, limits, t_recv)
        if got is not None and server.note_fd(got[0], frames[-1]):
            yield server.sock, got[0], got[1], t_recv, got[2]


def _in_turn(server, decode, log, limits, idle, spin_s, max_seconds, per_pass, closed, urgent=(), pump_to=None):
    """serve_requests' passes (per_pass messages of each connection, in turn, then idle once)."""
    t_end = time.time() + max_seconds if max_seconds else float("inf")
    queues: dict[bytes, collections.deque] = {}
    drops, peers = Drops(log), {}            # peers: a queued connection's peer (for the drops' log line)
    urgent_tags = {protocol.tag(t) for t in urgent}

    def gone(ident: bytes) -> None:          # a closed connection's queued messages are dropped, never served
        queues.pop(ident, None), drops.forget(ident), peers.pop(ident, None)
        if closed is not None:
            closed(ident)
    server.closed = gone
    last = [0.0]                             # when the newest message was taken (spin_s counts from it)

    def take(timeout_ms: float = 0) -> int:
        """Up to DRAIN waiting messages into their connections' queues (waiting up to timeout_ms for the first)."""
        n = 0
        for _ in range(DRAIN):
            if not server.sock.poll(timeout_ms if n == 0 else 0):
                break
            frames = server.sock.recv_multipart(copy=False)
            t_recv, last[0], n = time.time(), time.perf_counter(), n + 1
            q = queues.get(frames[0].bytes)
            if q is not None and len(q) >= QUEUED and (len(q) >= QUEUED_URGENT or len(frames) != 2
                                                       or protocol.tag_of(frames[1].buffer) not in urgent_tags):
                drops.drop(server.sock, frames[0].bytes, peers.get(frames[0].bytes, ""), t_recv)   # unread: cheap
                continue
            got = screen(server.sock, frames, decode, log, limits, t_recv)
            if got is None or not server.note_fd(got[0], frames[-1]):
                continue
            q = queues.setdefault(got[0], collections.deque())
            peers[got[0]] = got[2]
            if len(q) < (QUEUED_URGENT if isinstance(got[1], urgent) else QUEUED):
                q.append((got[1], t_recv, got[2]))
            else:                            # (a message that said it was urgent and was not)
                drops.drop(server.sock, got[0], got[2], t_recv)
        return n
    if pump_to is not None:
        take.sock = server.sock
        pump_to(take)
    busy = False
    while time.time() < t_end:
        if not queues:                       # (messages taken during the last step are served before the next)
            spinning = spin_s and time.perf_counter() - last[0] < spin_s
            if not server.wait(0 if busy or spinning else 500):
                busy = _idle(idle, server.sock, log)
                server.read_events()
                continue
        take()
        for ident in list(queues):
            q, served = queues[ident], 0
            while q and queues.get(ident) is q and (served < per_pass or isinstance(q[0][0], urgent)):
                msg, t_recv, peer = q.popleft()
                served += not isinstance(msg, urgent)
                yield server.sock, ident, msg, t_recv, peer
            if not q and queues.get(ident) is q:     # (gone() may have dropped it while its messages were served)
                del queues[ident]
                peers.pop(ident, None)
        busy = _idle(idle, server.sock, log)
        server.read_events()


class _Server:
    """A ROUTER bound to exactly one address; under CURVE, with its authenticator (in a zmq context of its own:
    the ZAP endpoint is one per context); a monitor of its connections (failed handshakes, and with `watch`,
    closed connections)."""

    def __init__(self, bind: str, keys: Keys | None, log: Log, closed=None):
        self.ctx = zmq.Context() if keys else zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)   # larger frames: the connection is dropped
        # plain TCP: a client reconnecting under its routing id takes it over. Not under CURVE: there another authorised
        # key presenting a victim's routing id would take over its replies (its reconnection waits for the old
        # connection's close instead)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 0 if keys else 1)
        self.log, self.auth, self.events, self.closed = log, None, None, closed
        self.fds: dict[int, set] = {}        # a connection's file descriptor -> the routing ids seen on it
        self.addrs: dict[int, str] = {}      # ... -> its peer's address (read when it was accepted)
        self.dead: set[int] = set()          # file descriptors whose close was read (until one is accepted again):
                                             # libzmq still hands out a closed connection's last messages
        self.failed = 0                      # failed handshakes whose connection has not closed yet
        try:
            if keys is None:
                log.line(plain_tcp_warning(bind))
            else:
                # keys refused are logged by the authenticator, with the peer's address; these are handshakes that
                # never reach it (no key, another deployment's server key): logged when their connection closes
                self.auth = secure_server(self.sock, keys, log)
            if keys is not None or closed is not None:
                self.events = self.sock.get_monitor_socket(
                    zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
                self.poller = zmq.Poller()
                self.poller.register(self.sock, zmq.POLLIN)
                self.poller.register(self.events, zmq.POLLIN)
            self.sock.bind(bind)
        except Exception:
            self.close()
            raise

    def wait(self, timeout_ms: int) -> bool:
        """Whether a message waits, after up to timeout_ms; the monitor's events wake it too (and are read), so that
        a new connection's address is read while it is open."""
        if self.events is None or not timeout_ms:
            return bool(self.sock.poll(timeout_ms))
        ready = dict(self.poller.poll(timeout_ms))
        if self.events in ready:
            self.read_events(self.closed)
        return bool(self.sock.poll(0))

    def note_fd(self, ident: bytes, frame) -> bool:
        """The connection (file descriptor) a message came over, so that its close names its routing ids; False for a
        message over a connection already closed (closed(ident) is called again, and the message is to be dropped).
        A new (routing id, fd) pair reads the monitor's events first: a connection's accept is queued there before
        its first message can be received, so a reused fd's old close is read before its new connection is noted."""
        if self.events is None:
            return True
        try:
            fd = frame.get(zmq.SRCFD)
        except Exception:             # (a test's frame, or a libzmq without it)
            return True
        if ident in self.fds.get(fd, ()):
            return True
        self.read_events()
        if fd in self.dead:
            if self.closed is not None:
                self.closed(ident)
            return False
        for held in self.fds.values():
            held.discard(ident)
        self.fds.setdefault(fd, set()).add(ident)
        return True

    def read_events(self, closed=None) -> None:
        """The monitor's events so far: a closed connection's routing ids to closed(ident); a failed handshake
        logged with its peer's address when its connection closes."""
        closed = closed or self.closed
        while self.events is not None and self.events.poll(0):
            event = zmq.utils.monitor.recv_monitor_message(self.events)
            kind, fd = event["event"], int(event["value"])
            if kind == zmq.EVENT_ACCEPTED:
                self.addrs[fd] = _address(fd)
                self.dead.discard(fd)
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self.failed += 1
            elif kind == zmq.EVENT_DISCONNECTED:
                addr, idents = self.addrs.pop(fd, ""), self.fds.pop(fd, set())
                self.dead.add(fd)
                if self.failed and not idents:
                    self.failed -= 1
                    self.log.refused(addr or "an unknown address", "auth", "a peer failed the CURVE handshake (no "
                                     "key, or keys of another deployment)", kind="handshake")   # (rate-limited apart
                                                                                # from the authenticator's refusals)
                for ident in idents if closed else ():
                    closed(ident)

    def close(self) -> None:
        if self.events is not None:
            self.sock.disable_monitor()
            self.events.close()
        self.sock.close()
        if self.auth is not None:
            self.auth.stop()
        if self.ctx is not zmq.Context.instance():
            self.ctx.term()


def _address(fd: int) -> str:
    """The peer address of a connection's file descriptor ('' when it is already closed)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            return s.getpeername()[0]
    except OSError:
        return ""


def screen(sock, frames, decode: protocol.Decoder, log: Log, limits: PeerLimits, now: float):
    """(ident, message, peer) for a well-formed message within its peer's limits; None after answering
    anything else with an Error (and a log line)."""
    ident, peer = frames[0].bytes, peer_of(frames[-1])
    key = key_of(peer)        # one budget per client: its own CURVE key across its connections, else its connection
    budget = ("key", key) if key and key not in DEFAULT_CLIENTS else ident
    over, tell = limits.check(budget, sum(len(f) for f in frames[1:]), now, ident)
    if over:
        if tell:
            log.refused(peer, "limit", over)
            reply(sock, ident, protocol.Error("limit", over))
        return None
    if len(frames) != 2:           # not one frame per message (a REQ envelope, a multipart send)
        why = (f"{len(frames) - 1} frames in one message: send each message as exactly one frame "
               f"(a DEALER socket's send(); a REQ socket's empty envelope frame is not taken)")
        log.refused(peer, "bad-message", why)
        envelope = [b""] if len(frames) > 2 and not len(frames[1]) else []     # so that a REQ socket sees it
        sock.send_multipart([ident, *envelope, protocol.encode(protocol.Error("bad-message", why))])
        return None
    try:
        return ident, decode(frames[1].bytes), peer
    except protocol.ProtocolError as e:
        log.refused(peer, e.code, str(e)[:300])
        reply(sock, ident, protocol.Error(e.code, str(e)))
        return None


class PeerGone(ConnectionError):
    """The server's connection closed while a reply was awaited (its process ended, or the link dropped)."""


class Client:
    """A DEALER socket with request/reply, a timeout, and byte counters. After a timeout the socket is
    replaced (a late reply must not be taken for the next one). decode: the replies this client takes
    (protocol.DRAFT_SENDS for a draft worker's, TARGET_SENDS for a target's). gone_fast: while a reply is
    awaited, a closed connection raises PeerGone at once instead of waiting out the timeout (zmq heartbeats
    close a connection whose peer stopped answering within HEARTBEAT_S)."""
    HEARTBEAT_S = 2.0

    def __init__(self, addr: str, timeout_s: float = 5.0, spin_s: float = 0.0,
                 decode: protocol.Decoder = protocol.decode, gone_fast: bool = False, keys: Keys | None = None):
        self.addr, self.timeout_s, self.spin_s = addr, timeout_s, spin_s   # spin_s: busy-poll a reply this long
        self.decode, self.gone_fast, self.keys = decode, gone_fast, keys     # keys: CURVE (wire.auth)
        self.sent = self.received = 0
        self.on_reopen = None          # called after each reopen (a client's Hello on its fresh socket)
        self._open()

    def _open(self):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # a fixed routing id per socket: after a dropped TCP connection (a relay restarted) zmq
        # reconnects and the server still knows this peer's handshake
        self.sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        if self.keys is not None:
            secure_client(self.sock, self.keys)
        self.monitor = None
        if self.gone_fast:
            ms = int(self.HEARTBEAT_S * 1000)
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, ms // 2)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ms)
            self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self.poller = zmq.Poller()
            self.poller.register(self.sock, zmq.POLLIN)
            self.poller.register(self.monitor, zmq.POLLIN)
        self.sock.connect(self.addr)

    def call(self, msg, timeout_s: float | None = None):
        self.forget_gone()
        self.send(msg)
        return self.call_reply(timeout_s)

    def forget_gone(self) -> None:
        """Drop disconnects seen before now (zmq has reconnected since): they concern no reply awaited now."""
        while self.monitor is not None and self.monitor.poll(0):
            self.monitor.recv_multipart()

    def call_reply(self, timeout_s: float | None = None):
        """The reply to a message already sent (see call)."""
        reply = self.recv(timeout_s or self.timeout_s)
        if reply is None:
            self.reopen()
            raise TimeoutError(f"no answer from {self.addr} within {timeout_s or self.timeout_s:.1f} s")
        return reply

    def reopen(self):
        """A fresh socket (and routing id): what the old one still receives is never taken; then on_reopen()."""
        self._close()
        self._open()
        if self.on_reopen is not None:
            self.on_reopen()

    def send(self, msg) -> None:
        data = protocol.encode(msg)
        self.sock.send(data)
        self.sent += len(data)

    def recv(self, timeout_s: float):
        """The next message, or None after timeout_s (0: only what has already arrived)."""
        t_spin = time.perf_counter() + min(self.spin_s, timeout_s)
        while not self.sock.poll(0):
            if time.perf_counter() >= t_spin:
                if not self._wait(max(timeout_s - self.spin_s, 0)):
                    return None
                break
        data = self.sock.recv()
        self.received += len(data)
        return self.decode(data)

    def _wait(self, timeout_s: float) -> bool:
        """Block until a message is waiting (True) or timeout_s passes (False); PeerGone when gone_fast
        and the connection closes first."""
        if self.monitor is None:
            return bool(self.sock.poll(int(timeout_s * 1000)))
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        if self.sock in ready:
            return True
        if self.monitor in ready:
            self.monitor.recv_multipart()
            self.reopen()
            raise PeerGone(f"{self.addr} closed the connection while a reply was awaited (its process ended "
                           f"or the link dropped)")
        return False

    def _close(self):
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close()
        self.sock.close()

    def close(self):
        self._close()

"""The server side of the transport, the loop the workers share (`serve_requests`): one zmq ROUTER bound to exactly
the address it is given (under CURVE with its authenticator; a monitor of its connections), each message screened
(its peer's limits, one frame, a type the server takes) and served in arrival order or per connection in turn, with
the server's background work between. What servers and clients share, and the client: wire.transport.
"""
from __future__ import annotations

import collections
import os
import socket
import time

import zmq
import zmq.utils.monitor

from . import protocol
from .auth import DEFAULT_CLIENTS, Keys, plain_tcp_warning, secure_server
from .transport import Log, PeerLimits, key_of, peer_of, reply


# Busy-polling: a process that sleeps in a blocking poll between messages a few ms apart wakes slowly.
# Measured on a GPU host (two Python processes, loopback TCP): a bare round trip of 0.093 ms back to back,
# 0.40 ms median (p90 0.61) after a 5 ms idle gap, when the receiving side slept. A worker whose device
# does the work (a GPU) can spare a core to spin for `spin_s` after its last message; on a CPU testbed,
# where the cores do the decoding, it must not (spin_s = 0 there).

MAX_FRAME_BYTES = 2 * protocol.MAX_MESSAGE_BYTES   # zmq drops a connection that sends a larger frame

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

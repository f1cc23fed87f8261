"""The transport both workers and the controller use: zmq ROUTER (servers) and DEALER (clients), one
msgpack frame per message (`sdeth.wire.protocol`). Servers bind to the address they are given, never to
every interface by default.

Here what servers and clients share (a reply, the log, a peer's identity and what it may send in a second) and the
client (`Client`); the server's socket and the loop that serves it: wire.serving.
"""
from __future__ import annotations

import threading
import time
import uuid

import zmq

from . import protocol
from .auth import Keys, secure_client


def reply(sock, ident: bytes, msg) -> None:
    sock.send_multipart([ident, protocol.encode(msg)])


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


class PeerGone(ConnectionError):
    """The server's connection closed while a reply was awaited (its process ended, or the link dropped)."""


class Client:
    """A DEALER socket with request/reply, a timeout, and byte counters. After a timeout the socket is
    replaced (a late reply must not be taken for the next one). decode: the replies this client takes
    (protocol.SERVER_SENDS for a draft server's, TARGET_SENDS for a target's). gone_fast: while a reply is
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
        # a send waits at most timeout_s: a DEALER with no connection to hand a message to (its handshake refused,
        # e.g. an unknown CURVE key) would otherwise wait for ever
        self.sock.setsockopt(zmq.SNDTIMEO, max(int(self.timeout_s * 1000), 1))
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

    def send(self, msg, flags: int = 0) -> None:
        """flags: zmq's (zmq.NOBLOCK: zmq.Again rather than a wait while the send queue is full). Without it a send
        waits at most timeout_s for a connection to take it, then raises TimeoutError."""
        data = protocol.encode(msg)
        try:
            self.sock.send(data, flags)
        except zmq.Again:
            if flags & zmq.NOBLOCK:
                raise
            raise TimeoutError(f"could not send to {self.addr} within {self.timeout_s:.1f} s: no connection took the "
                               f"message (the server refused the handshake, or is not there)") from None
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

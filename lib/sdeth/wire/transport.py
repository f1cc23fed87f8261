"""The transport both workers and the controller use: zmq ROUTER (servers) and DEALER (clients), one
msgpack frame per message (`sdeth.wire.protocol`). Servers bind to the address they are given, never to
every interface by default.
"""
from __future__ import annotations

import time
import uuid

import zmq

from . import protocol


def reply(sock, ident: bytes, msg) -> None:
    sock.send_multipart([ident, protocol.encode(msg)])


# Busy-polling: a process that sleeps in a blocking poll between messages a few ms apart wakes slowly.
# Measured on a GPU host (two Python processes, loopback TCP): a bare round trip of 0.093 ms back to back,
# 0.40 ms median (p90 0.61) after a 5 ms idle gap, when the receiving side slept. A worker whose device
# does the work (a GPU) can spare a core to spin for `spin_s` after its last message; on a CPU testbed,
# where the cores do the decoding, it must not (spin_s = 0 there).


def serve_requests(bind: str, max_seconds: float = 0, idle=None, spin_s: float = 0.0):
    """The server loop both workers share: bind a ROUTER to exactly `bind`, yield (sock, ident, message,
    receive time) for each well-formed message; malformed or oversized ones get an Error reply here.
    idle(sock) -> bool: background work (the pipelined draft's run-ahead), one step per call, done
    only when no message is waiting; True while there is more. spin_s: busy-poll for this long after
    each message before sleeping in a blocking poll (see above)."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(bind)
    t_end = time.time() + max_seconds if max_seconds else float("inf")
    busy, t_last = False, 0.0
    try:
        while time.time() < t_end:
            spinning = spin_s and time.perf_counter() - t_last < spin_s
            if not sock.poll(0 if busy or spinning else 500):
                busy = bool(idle and idle(sock))
                continue
            busy = idle is not None
            frames = sock.recv_multipart()
            t_recv, t_last = time.time(), time.perf_counter()
            if len(frames) != 2:           # not a DEALER peer speaking our framing: nothing to answer
                print(f"sdeth: dropped a message of {len(frames)} frames (expected an identity and one frame)", flush=True)
                continue
            ident, data = frames
            try:
                msg = protocol.decode(data)
            except protocol.ProtocolError as e:
                reply(sock, ident, protocol.Error(e.code, str(e)))
                continue
            yield sock, ident, msg, t_recv
    finally:
        sock.close()


class Client:
    """A DEALER socket with request/reply, a timeout, and byte counters. After a timeout the socket is
    replaced (a late reply must not be taken for the next one)."""

    def __init__(self, addr: str, timeout_s: float = 5.0, spin_s: float = 0.0):
        self.addr, self.timeout_s, self.spin_s = addr, timeout_s, spin_s   # spin_s: busy-poll a reply this long
        self.sent = self.received = 0
        self._open()

    def _open(self):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # a fixed routing id per socket: after a dropped TCP connection (a relay restarted) zmq
        # reconnects and the server still knows this peer's handshake
        self.sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        self.sock.connect(self.addr)

    def call(self, msg, timeout_s: float | None = None):
        self.send(msg)
        return self.call_reply(timeout_s)

    def call_reply(self, timeout_s: float | None = None):
        """The reply to a message already sent (see call)."""
        reply = self.recv(timeout_s or self.timeout_s)
        if reply is None:
            self.sock.close()
            self._open()
            raise TimeoutError(f"no answer from {self.addr} within {timeout_s or self.timeout_s:.1f} s")
        return reply

    def send(self, msg) -> None:
        data = protocol.encode(msg)
        self.sock.send(data)
        self.sent += len(data)

    def recv(self, timeout_s: float):
        """The next message, or None after timeout_s (0: only what has already arrived)."""
        t_spin = time.perf_counter() + min(self.spin_s, timeout_s)
        while not self.sock.poll(0):
            if time.perf_counter() >= t_spin:
                if not self.sock.poll(int(max(timeout_s - self.spin_s, 0) * 1000)):
                    return None
                break
        data = self.sock.recv()
        self.received += len(data)
        return protocol.decode(data)

    def close(self):
        self.sock.close()

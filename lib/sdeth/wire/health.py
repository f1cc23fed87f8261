"""The target's view of its draft server's health: a heartbeat on its own socket, in a thread, so that a
request never waits for a draft that is away, and a draft that comes back is used again within about a second.

While the draft is up it is pinged every `interval_s`; `misses` unanswered pings in a row (each given
`timeout_s`) mark it down. While it is down it is pinged with back-off (from `interval_s`, doubling, at most
`max_backoff_s`); the first Pong marks it up. A draft that comes back is therefore seen within max_backoff_s +
timeout_s (1.5 s by default). The loops also report what they see (`mark_down` when a request lost its draft),
so the view never waits for the heartbeat to learn of a death the target has already met.
"""
from __future__ import annotations

import threading
import time

from . import protocol
from .transport import Client, PeerGone


class DraftHealth:
    def __init__(self, addr: str, interval_s: float = 0.25, timeout_s: float = 0.5, misses: int = 3,
                 max_backoff_s: float = 1.0, keys=None):
        self.addr, self.interval_s, self.timeout_s, self.keys = addr, interval_s, timeout_s, keys
        self.misses, self.max_backoff_s = misses, max_backoff_s
        self.up = False
        self.since = time.time()
        self.why = "no heartbeat answered yet"   # what the last change of state was seen by
        self.events: list[dict] = []        # {"event": "draft up" | "draft down", "at": unix time, "why": ...}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._checked = threading.Event()   # set after the first heartbeat (answered or not)
        self._thread = threading.Thread(target=self._run, name="draft-heartbeat", daemon=True)
        self._thread.start()

    def _set(self, up: bool, why: str) -> None:
        with self._lock:
            if up != self.up:
                self.up, self.since, self.why = up, time.time(), why
                self.events.append({"event": "draft up" if up else "draft down", "at": self.since, "why": why})
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
                print(f"{stamp} sdeth target worker health: draft at {self.addr} {'up' if up else 'down'} ({why})",
                      flush=True)

    def mark_down(self, why: str) -> None:
        self._set(False, why)

    def wait_first(self, timeout_s: float = 2.0) -> bool:
        """Wait for the first heartbeat's answer (a worker's start); True if the draft is up."""
        self._checked.wait(timeout_s)
        return self.up

    def events_since(self, t: float) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["at"] >= t]

    def _run(self) -> None:
        client = Client(self.addr, timeout_s=self.timeout_s, keys=self.keys)
        missed, backoff = 0, self.interval_s
        try:
            while not self._stop.is_set():
                try:
                    ok = isinstance(client.call(protocol.Ping(time.time()), timeout_s=self.timeout_s), protocol.Pong)
                except (TimeoutError, ConnectionError, protocol.ProtocolError):
                    ok = False
                self._checked.set()
                if ok:
                    missed, backoff = 0, self.interval_s
                    self._set(True, "heartbeat answered")
                    self._stop.wait(self.interval_s)
                    continue
                missed += 1
                if self.up and missed >= self.misses:
                    self._set(False, f"{missed} heartbeats unanswered ({self.timeout_s:.1f} s each)")
                if not self.up:
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.timeout_s + self.max_backoff_s)


def bare_rtt_ms(client: Client, n: int = 10, timeout_s: float = 1.0) -> float | None:
    """The median round trip (ms) of n bare Ping/Pong on a connection that said Hello: the transport's floor (None:
    no Pong; a draft gone quiet says so at its first wait)."""
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            if isinstance(client.call(protocol.Ping(time.time()), timeout_s=timeout_s), protocol.Pong):
                ts.append((time.perf_counter() - t0) * 1e3)
        except (TimeoutError, PeerGone):
            break
    return sorted(ts)[len(ts) // 2] if ts else None

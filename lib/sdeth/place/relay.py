"""The delay relay: a user-space TCP relay that holds each chunk for a fixed one-way delay per direction (no
dependence on the kernel's netem), with the link faults of a LinkFaults besides (jitter, stalls, resets, a cut), each
printed as a line `fault {json}`. The testbed runs it as a process of its own on the target's node
(`python -m sdeth.place.testbed relay --listen HOST:PORT --to HOST:PORT --up-ms MS --down-ms MS ...`)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
import socket
import time


@dataclass
class LinkFaults:
    """What the relay does to the link besides its fixed delay (all off by default). TCP turns packet loss into
    retransmit stalls, so loss is modelled as stalls; bytes are never dropped inside a stream (that would break
    framing): a reset closes the connection (zmq reconnects; what was in flight is lost), a cut closes it and
    refuses new connections for a while.
      jitter_ms   each chunk waits an extra uniform 0..jitter_ms (order kept)
      stall_ms    each stall holds all forwarding for a uniform stall_ms[0]..stall_ms[1] ms
      stall_every mean seconds between stalls (exponential gaps; 0: none)
      reset_every mean seconds between connection resets (0: none)
      cut_at, cut_s  one cut of cut_s seconds, cut_at seconds after the relay starts (0: none)"""
    jitter_ms: float = 0.0
    stall_ms: tuple = (200.0, 2000.0)
    stall_every: float = 0.0
    reset_every: float = 0.0
    cut_at: float = 0.0
    cut_s: float = 0.0
    seed: int = 0

    def args(self) -> list[str]:
        return ["--jitter-ms", str(self.jitter_ms), "--stall-ms", f"{self.stall_ms[0]},{self.stall_ms[1]}",
                "--stall-every", str(self.stall_every), "--reset-every", str(self.reset_every),
                "--cut-at", str(self.cut_at), "--cut-s", str(self.cut_s), "--seed", str(self.seed)]

    @property
    def any(self) -> bool:
        return bool(self.jitter_ms or self.stall_every or self.reset_every or self.cut_s)


class DelayProxy:
    """TCP relay adding a fixed one-way delay per direction (up: client -> server), and the faults of a
    LinkFaults. Each fault it injects is printed as a line `fault {json}` (Testbed.fault_events reads them)."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], up_ms: float, down_ms: float,
                 faults: LinkFaults | None = None):
        import random
        self.listen, self.upstream, self.up, self.down = listen, upstream, up_ms / 1e3, down_ms / 1e3
        self.faults = faults or LinkFaults()
        self.rng = random.Random(self.faults.seed)
        self.stall_until = 0.0           # loop time until which nothing is forwarded
        self.cut_until = 0.0             # loop time until which the link is down
        self.conns: list = []            # open (client writer, server writer) pairs

    def _event(self, kind: str, **kw) -> None:
        import json
        print("fault " + json.dumps({"event": kind, "at": time.time(), **kw}), flush=True)

    async def _pipe(self, reader, writer, delay: float) -> None:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        jitter = self.faults.jitter_ms / 1e3

        async def pump():
            last_due = 0.0
            while True:
                t, data = await q.get()
                if data is None:
                    break
                due = max(t + delay + (self.rng.uniform(0, jitter) if jitter else 0.0), last_due)
                last_due = due
                while True:              # a stall or cut holds everything behind it
                    due = max(due, self.stall_until, self.cut_until)
                    if due - loop.time() > 0.002:
                        await asyncio.sleep(due - loop.time() - 0.001)
                    while loop.time() < due:       # the last millisecond by spinning: sleep overshoots
                        await asyncio.sleep(0)
                    if loop.time() >= max(self.stall_until, self.cut_until):
                        break
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.create_task(pump())
        try:
            while data := await reader.read(1 << 16):
                q.put_nowait((loop.time(), data))
        except (ConnectionError, OSError):
            pass
        q.put_nowait((0.0, None))
        await task

    async def _handle(self, c_reader, c_writer) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self.cut_until:
            c_writer.close()             # the link is cut: nothing gets through
            return
        s_reader, s_writer = await asyncio.open_connection(*self.upstream)
        for w in (c_writer, s_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = (c_writer, s_writer)
        self.conns.append(pair)
        try:
            await asyncio.gather(self._pipe(c_reader, s_writer, self.up), self._pipe(s_reader, c_writer, self.down),
                                 return_exceptions=True)
        finally:
            self.conns.remove(pair)

    def _drop_connections(self) -> int:
        n = len(self.conns)
        for c, srv in list(self.conns):
            for w in (c, srv):
                try:
                    w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                except OSError:
                    pass
                w.transport.abort()      # an RST, as a middlebox or a dying peer would send
        return n

    async def _faults(self) -> None:
        """Stalls, resets and the cut, at their times."""
        f, loop = self.faults, asyncio.get_running_loop()
        t0 = loop.time()
        nxt_stall = t0 + self.rng.expovariate(1 / f.stall_every) if f.stall_every else float("inf")
        nxt_reset = t0 + self.rng.expovariate(1 / f.reset_every) if f.reset_every else float("inf")
        cut_at = t0 + f.cut_at if f.cut_s else float("inf")
        while True:
            now = loop.time()
            if now >= nxt_stall:
                ms = self.rng.uniform(*f.stall_ms)
                self.stall_until = now + ms / 1e3
                self._event("stall", ms=round(ms, 1))
                nxt_stall = now + ms / 1e3 + self.rng.expovariate(1 / f.stall_every)
            if now >= nxt_reset:
                self._event("reset", connections=self._drop_connections())
                nxt_reset = now + self.rng.expovariate(1 / f.reset_every)
            if now >= cut_at:
                self.cut_until = now + f.cut_s
                self._event("cut", s=f.cut_s, connections=self._drop_connections())
                cut_at = float("inf")
            await asyncio.sleep(0.01)

    async def serve(self) -> None:
        server = await asyncio.start_server(self._handle, *self.listen)
        if self.faults.any:
            asyncio.create_task(self._faults())
        async with server:
            await server.serve_forever()

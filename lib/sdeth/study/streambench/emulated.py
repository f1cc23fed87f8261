"""Emulated targets, each in a process of its own (Targets, target_main): B streams each, sync rounds
(emulated_sync.Emulated) or pipelined streams (emulated_pipelined.EmulatedPipelined)."""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback

from .emulated_pipelined import DRAFT_WAIT_S, FORESEEN_WAIT_S, EmulatedPipelined  # noqa: F401
from .emulated_sync import Emulated  # noqa: F401


def target_main(conn) -> None:
    """An emulated target's process: points until told None (cmd "mode": "pipelined" for pipelined streams)."""
    while (cmd := conn.recv()) is not None:
        try:
            res = (EmulatedPipelined if cmd.get("mode") == "pipelined" else Emulated)(**cmd).run(conn)
        except Exception as e:                   # noqa: BLE001 (the parent records it)
            res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        conn.send(res)


class Targets:
    """n emulated-target processes (spawn), kept across points; a point uses the first N."""

    def __init__(self, n: int):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for i in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=target_main, args=(b,), daemon=True, name=f"emulated-target-{i}")
            p.start()
            self.conns.append(a), self.procs.append(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(2)

    @staticmethod
    def _recv(conn, timeout: float):
        if not conn.poll(timeout):
            raise TimeoutError(f"no answer from an emulated target within {timeout:.0f} s")
        return conn.recv()

    def point(self, N: int, cmd: dict, seconds: float, timeout: float = 120) -> tuple[list[dict], list[dict], float]:
        """(each target's 'ready', each target's record, the common start time): targets 0..N-1 open their
        streams and run one cold round; then all start together for `seconds`."""
        conns = self.conns[:N]
        for i, c in enumerate(conns):
            c.send({**cmd, "index": i, "seed": cmd["seed"] * 1000 + i})
        ready = [self._recv(c, timeout) for c in conns]
        start_at = time.time() + 0.05
        for c, r in zip(conns, ready):
            if "error" not in r:
                c.send((start_at, seconds))
        recs = [r if "error" in r else self._recv(c, seconds + timeout) for c, r in zip(conns, ready)]
        return ready, recs, start_at

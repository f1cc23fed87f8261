"""The processes of the vLLM study (study.vllm.study): vLLM's OpenAI server, a draft server and the testbed's relay
between them, each in its own process group with its output in a log file, stopped with its children."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .measurement import Endpoint, StudyError

RELAY_VARIANTS = ("plain", "slowed", "jittered")


def tail(path: Path, n: int = 25) -> str:
    """The last n lines of a log ('(no log)' when there is none)."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(no log)"


def spawn(args: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """args as the leader of their own process group (start_new_session), stdout and stderr into log_path."""
    with open(log_path, "w") as log:              # the child keeps its own copy
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ),
                                start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    """Kill proc's whole process group (its children too, even where proc itself has exited) and reap it."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:                    # the group is gone already
        pass
    proc.wait(30)


def start_vllm(engine: dict, env: dict, log_path: Path, timeout_s: float = 900) -> tuple:
    """vLLM's OpenAI server with these engine arguments (vllm_baseline.engine_args); (process, Endpoint,
    seconds to /health)."""
    from ...place.testbed import free_port
    from .baseline import _wait_healthy, server_args
    port = free_port()
    proc = spawn(server_args(engine, port), log_path, env)
    try:
        with open(log_path) as log:
            start_s = _wait_healthy(proc, log, f"http://127.0.0.1:{port}", timeout_s, engine["kv_cache_memory_bytes"])
    except Exception:
        stop(proc)
        raise
    return proc, Endpoint(f"http://127.0.0.1:{port}", model=engine["model"]), start_s


def start_draft_server(pair: str, rows: int, log_path: Path, timeout_s: float = 300, addr: str = "",
                       max_seconds: float = 0) -> tuple:
    """`python -m sdeth worker --role draft-server` with one thread (beside vLLM on a few cores two threads wait
    for each other's core), bound to addr (default a free loopback port), exiting after max_seconds (0: when
    stopped); (process, address) once it answers a Ping. StudyError with its log's tail if it does not."""
    from ...place.testbed import free_port
    from ...wire import protocol as W
    from ...wire.transport import Client
    addr = addr or f"tcp://127.0.0.1:{free_port()}"
    proc = spawn([sys.executable, "-m", "sdeth", "worker", "--role", "draft-server", "--bind", addr, "--pair", pair,
                  "--kv-rows", str(rows), "--limit-reserve", "0", "--max-seconds", str(max_seconds)], log_path,
                 {**os.environ, "SDETH_THREADS": "1"})
    t_end = time.time() + timeout_s
    while time.time() < t_end and proc.poll() is None:
        c = Client(addr, timeout_s=1.0)
        try:
            if isinstance(c.call(W.Ping(time.time())), W.Pong):
                return proc, addr
        except TimeoutError:
            pass
        finally:
            c.close()
    stop(proc)
    raise StudyError(f"the draft server did not answer a Ping within {timeout_s:.0f} s; its log:\n{tail(log_path)}")


def start_relay(port: int, to: str, log_path: Path, down_ms: float = 0.0, jitter_ms: float = 0.0,
                seed: int = 0) -> subprocess.Popen:
    """The testbed's TCP relay on 127.0.0.1:port in front of `to` (tcp://HOST:PORT): each chunk from the draft
    server held down_ms plus a uniform 0..jitter_ms (place.relay.DelayProxy, LinkFaults.jitter_ms)."""
    proc = spawn([sys.executable, "-m", "sdeth.place.testbed", "relay", "--listen", f"127.0.0.1:{port}", "--to",
                  to.removeprefix("tcp://"), "--down-ms", str(down_ms), "--jitter-ms", str(jitter_ms), "--seed",
                  str(seed)], log_path)
    t_end = time.time() + 60
    while time.time() < t_end and proc.poll() is None:
        if "relay " in log_path.read_text():
            return proc
        time.sleep(0.2)
    stop(proc)
    raise StudyError(f"the relay did not start; its log:\n{tail(log_path)}")


class Relay:
    """The relay in front of the draft server, restarted on its port for each variant (zmq reconnects): plain
    (+0 ms), slowed (+slow_ms a reply), jittered (uniform 0..jitter_ms a reply)."""

    def __init__(self, port: int, to: str, slow_ms: float, jitter_ms: float, logs: Path):
        self.port, self.to, self.logs, self.proc, self.variant = port, to, logs, None, ""
        self.delays = {"plain": (0.0, 0.0), "slowed": (slow_ms, 0.0), "jittered": (0.0, jitter_ms)}
        self.set("plain")

    def set(self, variant: str) -> None:
        from ...wire.vllm_settings import RETRY_S
        stop(self.proc)
        down, jitter = self.delays[variant]
        self.proc = start_relay(self.port, self.to, self.logs / f"relay-{variant}.log", down, jitter)
        self.variant = variant
        time.sleep(1.5 * RETRY_S)        # past the proposer's RETRY_S: its next step says Hello again

    def close(self) -> None:
        stop(self.proc)

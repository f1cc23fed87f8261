"""The embedded two-node testbed: draft and target workers in two network namespaces joined by a
veth pair (root), or two processes on loopback (no root: results say so).

    with Testbed(up_ms=5, down_ms=20) as tb:     # up = target -> draft, down = draft -> target
        tb.target_addr                           # the controller talks to the target here (ipc://)

One-way delay is added in user space by `DelayProxy` (place.relay; no dependence on the kernel's netem): a TCP
relay in front of the draft server, on the target's node, holding each chunk for the set delay per
direction. `rate_mbit` caps the veth with `tc tbf`. Everything started is torn down on exit,
also on error or Ctrl-C: processes (their process groups), namespaces (the veth goes with them),
the ipc directory.

Its command line (`python -m sdeth.place.testbed relay|down`) runs the relay and deletes namespaces left
behind; the link probe on the testbed (probe_link) is here too.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .relay import DelayProxy, LinkFaults

DRAFT_PORT = 5601
NS_PREFIX = "sdeth"


class TestbedError(RuntimeError):
    pass


def can_use_netns() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode:
        raise TestbedError(f"`{' '.join(cmd)}` failed: {p.stderr.strip()}")
    return p


class Testbed:
    __test__ = False   # not a pytest class
    def __init__(self, pair: str = "embedded", up_ms: float = 0.0, down_ms: float = 0.0, rate_mbit: float = 0,
                 netns: bool | None = None, device: str = "cpu", draft_timeout_s: float = 5.0,
                 draft_die_after: int = 0, threads: int = 1, start_workers: bool = True,
                 target: str | None = None, draft: str | None = None, relay: bool = False,
                 draft_device: str | None = None, worker_config: dict | None = None, ready_timeout_s: float = 180.0,
                 targets: int = 1, draft_server: bool = False, verdict_cache: str = "off"):
        self.pair, self.up_ms, self.down_ms, self.rate_mbit = pair, up_ms, down_ms, rate_mbit
        self.draft_server = draft_server       # the draft node's server is batched (--role draft-server), not one row
        self.verdict_cache = verdict_cache     # ... with this verdict cache (its --verdict-cache: off, on, FxDxB)
        self.netns = can_use_netns() if netns is None else netns
        if self.netns and not can_use_netns():
            raise TestbedError("network namespaces need root and iproute2 (`ip`); run as root or pass netns=False "
                               "for two processes on loopback")
        self.device, self.draft_timeout_s, self.die_after, self.threads = device, draft_timeout_s, draft_die_after, threads
        self.draft_device = draft_device or device      # e.g. cuda:1 beside a target on cuda:0
        # both workers' run configuration (study.config.RunConfig.worker_config(), plain data), passed whole
        self.worker_config = {**(worker_config or {}), "pair": pair, "target": target, "draft": draft,
                              "device": self.device, "draft_device": self.draft_device}
        self.ready_timeout_s = ready_timeout_s           # workers load (and on a GPU capture/compile) first
        self.start_workers = start_workers
        self.relay = relay or bool(up_ms or down_ms)   # a relay even at 0 ms lets set_delay() change the delay
        self.faults = LinkFaults()
        tag = f"{os.getpid() % 100000}"            # (leftovers(pid) finds them by it)
        self.ns_draft, self.ns_target = f"{NS_PREFIX}-{tag}-d", f"{NS_PREFIX}-{tag}-t"
        self.veth_d, self.veth_t = f"sd{tag}d", f"sd{tag}t"
        octet = os.getpid() % 250 + 1
        self.ip_draft, self.ip_target = f"10.77.{octet}.1", f"10.77.{octet}.2"
        self.procs: dict[str, subprocess.Popen] = {}
        self.tmp = tempfile.mkdtemp(prefix="sdeth-")
        # target workers on the target node: "target" (at target_addr), then "target1", ... (one request at a time each)
        self.target_names = ["target"] + [f"target{i}" for i in range(1, targets)]
        self.target_addrs = [f"ipc://{self.tmp}/{name}.sock" for name in self.target_names]
        self.target_addr = self.target_addrs[0]
        self._namespaces: list[str] = []

    # ------------------------------------------------------------ description
    def describe(self) -> dict:
        return {"kind": "netns+veth" if self.netns else "loopback (no root: both workers on 127.0.0.1)",
                "draft_node": self.ns_draft if self.netns else "localhost",
                "target_node": self.ns_target if self.netns else "localhost",
                "link": f"veth {self.ip_target} <-> {self.ip_draft}" if self.netns else "loopback",
                "one_way_delay_ms": {"target->draft": self.up_ms, "draft->target": self.down_ms},
                "delay": "user-space TCP relay (sdeth.place.relay.DelayProxy)",
                "rate_mbit": self.rate_mbit or None, "torch_threads_per_worker": self.threads,
                "devices": {"target": self.device, "draft": self.draft_device}, "worker_config": self.worker_config,
                "target_workers": len(self.target_names), "draft_role": self._draft_role,
                **({"verdict_cache": self.verdict_cache} if self.draft_server else {}),
                "shared_cpu": "both nodes share this machine's cores"}

    # ------------------------------------------------------------ set-up / tear-down
    def __enter__(self) -> "Testbed":
        self._old_int = signal.getsignal(signal.SIGINT)
        try:
            if self.netns:
                self._make_namespaces()
            if self.start_workers:
                self._start_workers()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make_namespaces(self) -> None:
        for ns in (self.ns_draft, self.ns_target):
            _sh("ip", "netns", "add", ns)
            self._namespaces.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", self.veth_d, "type", "veth", "peer", "name", self.veth_t)
        for dev, ns, ip in ((self.veth_d, self.ns_draft, self.ip_draft), (self.veth_t, self.ns_target, self.ip_target)):
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            if self.rate_mbit:
                _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                    f"{self.rate_mbit}mbit", "burst", "32kbit", "latency", "50ms")

    def run_in(self, node: str, args: list[str], name: str, log: bool = True) -> subprocess.Popen:
        """Start `python -m ...args` on a node ('draft' or 'target'), in its own process group."""
        cmd = [sys.executable, *args]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.ns_draft if node == "draft" else self.ns_target, *cmd]
        out = open(os.path.join(self.tmp, f"{name}.log"), "w") if log else subprocess.DEVNULL
        env = {**os.environ, "SDETH_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.procs[name] = p
        return p

    def draft_bind(self) -> str:
        return f"tcp://{self.ip_draft}:{DRAFT_PORT}" if self.netns else f"tcp://127.0.0.1:{self._draft_port}"

    def draft_addr_for_target(self) -> str:
        """Where the target reaches the draft: directly, or through the delay relay on its own node."""
        return self._relay_addr or self.draft_bind()

    def _start_workers(self) -> None:
        self._draft_port = free_port()
        self._relay_addr = ""
        self._launch_draft()
        if self.relay:
            self._relay_port = free_port()
            self._start_relay()
            self._relay_addr = f"tcp://127.0.0.1:{self._relay_port}"
        for name, addr in zip(self.target_names, self.target_addrs):
            self.run_in("target", ["-m", "sdeth", "worker", "--role", "target", "--bind", addr,
                                   "--config", json.dumps(self.worker_config), "--draft-addr", self.draft_addr_for_target(),
                                   "--draft-timeout", str(self.draft_timeout_s)], name)
        self.wait_ready(self.ready_timeout_s)

    def _start_relay(self) -> None:
        upstream = self.draft_bind().removeprefix("tcp://")
        self.run_in("target", ["-m", "sdeth.place.testbed", "relay", "--listen", f"127.0.0.1:{self._relay_port}",
                               "--to", upstream, "--up-ms", str(self.up_ms), "--down-ms", str(self.down_ms),
                               *self.faults.args()], "relay")
        _wait_for(self, "relay", "relay ")

    def set_faults(self, faults: "LinkFaults") -> None:
        """Restart the relay (same port, same delays) with these link faults (LinkFaults() for none)."""
        if not self.relay:
            raise TestbedError("set_faults needs the relay: create the Testbed with relay=True")
        self.kill("relay")
        self.faults = faults
        self._start_relay()

    def fault_events(self, t0: float = 0.0, t1: float = float("inf")) -> list[dict]:
        """The faults the relay injected between unix times t0 and t1 (its `fault {json}` lines)."""
        import json
        out = []
        for line in self.log("relay").splitlines():
            if line.startswith("fault "):
                e = json.loads(line[6:])
                if t0 <= e["at"] <= t1:
                    out.append(e)
        return out

    def set_delay(self, up_ms: float, down_ms: float) -> None:
        """Change the injected one-way delays between requests: the relay restarts on the same port and
        the target's connection to the draft comes back by itself (zmq reconnects, same routing id)."""
        if not self.relay:
            raise TestbedError("set_delay needs the relay: create the Testbed with relay=True")
        self.kill("relay")
        self.up_ms, self.down_ms = up_ms, down_ms
        self._start_relay()

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until the workers print their banners (they load the pair first) and each target's heartbeat has
        found the draft (a request sent before that would decode alone)."""
        _wait_for(self, "draft", self._draft_banner, timeout_s)
        for name in self.target_names:
            _wait_for(self, name, "sdeth target worker:", timeout_s)
            _wait_for(self, name, " up (heartbeat answered)", 30)

    def start_draft(self) -> None:
        """(Re)start the draft server on its node and port (after kill('draft')); returns once it serves."""
        self._launch_draft()
        _wait_for(self, "draft", self._draft_banner, self.ready_timeout_s)

    @property
    def _draft_role(self) -> str:
        return "draft-server" if self.draft_server else "draft"

    _draft_banner = "sdeth draft server:"

    def _launch_draft(self) -> None:
        self.run_in("draft", ["-m", "sdeth", "worker", "--role", self._draft_role, "--bind", self.draft_bind(),
                              "--config", json.dumps(self.worker_config),
                              *(["--verdict-cache", self.verdict_cache] if self.draft_server else []),
                              *(["--die-after", str(self.die_after)] if self.die_after else [])], "draft")

    def log(self, name: str) -> str:
        try:
            return open(os.path.join(self.tmp, f"{name}.log")).read()
        except OSError:
            return ""

    def exit_status(self, name: str) -> int | None:
        """A worker's exit status (negative: the signal that ended it), or None while it runs."""
        p = self.procs.get(name)
        return p.poll() if p is not None else None

    def kill(self, name: str) -> None:
        p = self.procs.get(name)
        if p and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        self.procs.clear()
        for ns in self._namespaces:
            _sh("ip", "netns", "del", ns, check=False)
        self._namespaces.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


def leftovers(pid: int | None = None) -> list[str]:
    """This project's namespaces still present (for `down`); pid: only those a testbed of that process made (a
    test's own, not those of another run on the same machine)."""
    if not shutil.which("ip"):
        return []
    out = _sh("ip", "netns", "list", check=False).stdout.split("\n")
    prefix = NS_PREFIX + "-" + (f"{pid % 100000}-" if pid is not None else "")
    return [line.split()[0] for line in out if line.startswith(prefix)]


def _hostport(v: str) -> tuple[str, int]:
    host, port = v.rsplit(":", 1)
    return host, int(port)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m sdeth.place.testbed")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("relay", help="TCP relay with a one-way delay per direction")
    r.add_argument("--listen", required=True), r.add_argument("--to", required=True)
    r.add_argument("--up-ms", type=float, default=0.0), r.add_argument("--down-ms", type=float, default=0.0)
    r.add_argument("--jitter-ms", type=float, default=0.0), r.add_argument("--stall-ms", default="200,2000")
    r.add_argument("--stall-every", type=float, default=0.0), r.add_argument("--reset-every", type=float, default=0.0)
    r.add_argument("--cut-at", type=float, default=0.0), r.add_argument("--cut-s", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=0)
    sub.add_parser("down", help="delete this project's network namespaces left behind")
    a = ap.parse_args(argv)
    if a.cmd == "down":
        for ns in leftovers():
            _sh("ip", "netns", "del", ns, check=False)
            print("deleted", ns)
        return 0
    print(f"relay {a.listen} -> {a.to}: +{a.up_ms} ms up, +{a.down_ms} ms down", flush=True)
    faults = LinkFaults(a.jitter_ms, tuple(float(x) for x in a.stall_ms.split(",")), a.stall_every, a.reset_every,
                        a.cut_at, a.cut_s, a.seed)
    asyncio.run(DelayProxy(_hostport(a.listen), _hostport(a.to), a.up_ms, a.down_ms, faults).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------- the link probe on the testbed

# (name, server flags, client flags, relay (up_ms, down_ms) or None, server clock skew ms, samples)
LINK_SCENARIOS = [
    ("direct, TCP_NODELAY", [], [], None, 0.0, 200),
    ("Nagle + delayed ACK (split writes, no TCP_NODELAY)", ["--split", "--no-nodelay"], ["--split", "--no-nodelay"],
     None, 0.0, 40),
    ("new TCP connection per request", [], ["--new-conn"], None, 0.0, 100),
    ("through a user-space proxy (like a port-forward), +0 ms", [], [], (0.0, 0.0), 0.0, 200),
    ("injected 5 ms target->draft, 20 ms draft->target", [], [], (5.0, 20.0), 0.0, 100),
    ("injected 150 ms each way, draft clock 65 ms behind", [], [], (150.0, 150.0), -65.0, 12),
]


def probe(tb: Testbed, server_flags=(), client_flags=(), relay=None, skew_ms=0.0, n=100, timeout_s=300) -> list[dict]:
    """Run the netprobe server on the draft node and its client on the target node; return samples."""
    import json
    port = free_port()
    bind = f"{tb.ip_draft}:{port}" if tb.netns else f"127.0.0.1:{port}"
    srv = tb.run_in("draft", ["-m", "sdeth.place.netprobe", "serve", "--bind", bind, "--skew-ms", str(skew_ms),
                              "--max-seconds", str(timeout_s), *server_flags], f"probe-server-{port}")
    to, names = bind, [f"probe-server-{port}"]
    try:
        _wait_for(tb, names[0], "netprobe server on")
        if relay is not None:
            rport = free_port()
            tb.run_in("target", ["-m", "sdeth.place.testbed", "relay", "--listen", f"127.0.0.1:{rport}", "--to", bind,
                                 "--up-ms", str(relay[0]), "--down-ms", str(relay[1])], f"probe-relay-{port}")
            names.append(f"probe-relay-{port}")
            _wait_for(tb, names[-1], "relay ")
            to = f"127.0.0.1:{rport}"
        out = os.path.join(tb.tmp, f"probe-{port}.json")
        cli = tb.run_in("target", ["-m", "sdeth.place.netprobe", "measure", "--to", to, "--n", str(n), "--json", out,
                                   *client_flags], f"probe-client-{port}")
        if cli.wait(timeout=timeout_s) != 0:
            raise TestbedError(f"probe client failed: {tb.log(f'probe-client-{port}')[-1500:]}")
        return json.load(open(out))
    finally:
        for name in names:
            tb.kill(name)
        del srv


def _wait_for(tb: Testbed, name: str, banner: str, timeout_s: float = 30) -> None:
    """Until process `name` prints `banner`; TestbedError with its exit code or the timeout, and its log."""
    t_end = time.time() + timeout_s
    while banner not in tb.log(name):
        p = tb.procs[name]
        if p.poll() is not None:
            raise TestbedError(f"{name} exited with {p.returncode} before serving:\n{tb.log(name)[-2000:]}")
        if time.time() > t_end:
            raise TestbedError(f"{name} not ready after {timeout_s:.0f} s; its log:\n{tb.log(name)[-2000:]}")
        time.sleep(0.05)


def probe_link(tb: Testbed, scenarios=LINK_SCENARIOS, scale: float = 1.0) -> list[dict]:
    """Every scenario, analysed twice: with the true clock offset (0: one host) and with NTP's estimate."""
    from .netprobe import analyse
    rows = []
    for name, sflags, cflags, relay, skew, n in scenarios:
        samples = probe(tb, sflags, cflags, relay, skew, max(5, int(n * scale)))
        rows.append({"scenario": name, "injected": {"up_ms": relay[0], "down_ms": relay[1]} if relay else None,
                     "server_clock_skew_ms": skew, "naive": analyse(samples, 0.0), "ntp": analyse(samples, None),
                     "true_offset": analyse(samples, skew / 1e3)})
    return rows

"""Link probe: round trips and one-way delays between the two nodes, and the artifacts that fake them.

Four timestamps per exchange (NTP): client sends at t0, server receives at t1 and replies at t2
(server clock), client receives at t3. Then
    rtt    = (t3 - t0) - (t2 - t1)
    offset = ((t1 - t0) + (t2 - t3)) / 2        server clock minus client clock, IF the path is symmetric
    up     = t1 - t0 - offset_true,   down = t3 - t2 + offset_true
With synchronised clocks (offset_true = 0, e.g. two namespaces of one host, or PTP-synced nodes) the raw
differences ARE the one-way delays. With unknown offset they are not identifiable: NTP's estimate
assumes symmetry and so always returns up = down = rtt/2, and an uncorrected clock offset moves delay
from one direction to the other one-for-one. 85 ms vs 215 ms is exactly a symmetric 150/150 ms path
seen through clocks 65 ms apart.

    python -m sdeth.place.netprobe serve --bind HOST:PORT [--skew-ms S] [--split --no-nodelay]
    python -m sdeth.place.netprobe measure --to HOST:PORT --n 200 [--split --no-nodelay --new-conn] --json OUT
"""
from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import threading
import time

_REQ = struct.Struct("!Id")      # length, t0
_REP = struct.Struct("!ddd")     # t0, t1, t2


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


def _send(sock: socket.socket, data: bytes, split: bool) -> None:
    if split:  # header and body as two writes: what triggers Nagle + delayed ACK stalls
        sock.sendall(data[:4])
        sock.sendall(data[4:])
    else:
        sock.sendall(data)


def serve(bind: tuple[str, int], skew_s: float = 0.0, split: bool = False, nodelay: bool = True,
          max_seconds: float = 600) -> None:
    """Echo server stamping t1/t2 with its own clock (+ skew_s to simulate an unsynchronised node)."""
    srv = socket.create_server(bind)
    srv.settimeout(1.0)
    t_end = time.time() + max_seconds
    print(f"netprobe server on {bind}, skew {skew_s * 1e3:.1f} ms, split={split}, nodelay={nodelay}", flush=True)

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
        try:
            while True:
                n, t0 = _REQ.unpack(_recv_exact(conn, _REQ.size))
                t1 = time.time() + skew_s
                _recv_exact(conn, n)                        # payload
                _send(conn, _REP.pack(t0, t1, time.time() + skew_s), split)
        except (ConnectionError, OSError):
            conn.close()

    while time.time() < t_end:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def measure(to: tuple[str, int], n: int = 100, size: int = 64, split: bool = False, nodelay: bool = True,
            new_conn: bool = False, gap_s: float = 0.005) -> list[dict]:
    """n exchanges; each sample has t0..t3 and, with new_conn, the connect time."""
    out, sock = [], None
    for _ in range(n):
        tc = time.time()
        if sock is None or new_conn:
            if sock is not None:
                sock.close()
            sock = socket.create_connection(to, timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
        t0 = time.time()
        _send(sock, _REQ.pack(size, t0) + b"x" * size, split)
        r0, t1, t2 = _REP.unpack(_recv_exact(sock, _REP.size))
        t3 = time.time()
        out.append({"t0": t0, "t1": t1, "t2": t2, "t3": t3, "connect_s": t0 - tc if new_conn or len(out) == 0 else 0.0,
                    "first_on_connection": new_conn or len(out) == 0})
        time.sleep(gap_s)
    sock.close()
    return out


def analyse(samples: list[dict], clock_offset_s: float | None = 0.0) -> dict:
    """Distributions (ms). clock_offset_s: the known server-minus-client offset (0 for one host);
    None = unknown, so use NTP's estimate from the minimum-RTT samples (which assumes symmetry)."""
    ms = lambda v: v * 1e3  # noqa: E731
    rtt = [(s["t3"] - s["t0"]) - (s["t2"] - s["t1"]) for s in samples]
    raw_up = [s["t1"] - s["t0"] for s in samples]
    raw_down = [s["t3"] - s["t2"] for s in samples]
    ntp = [((s["t1"] - s["t0"]) + (s["t2"] - s["t3"])) / 2 for s in samples]
    best = sorted(range(len(samples)), key=lambda i: rtt[i])[:max(1, len(samples) // 4)]
    ntp_offset = statistics.median(ntp[i] for i in best)
    off = ntp_offset if clock_offset_s is None else clock_offset_s

    def dist(xs):
        xs = sorted(xs)
        if not xs:
            return None
        return {"p50": ms(statistics.median(xs)), "p10": ms(xs[len(xs) // 10]), "p90": ms(xs[(9 * len(xs)) // 10]),
                "min": ms(xs[0]), "max": ms(xs[-1]), "mean": ms(statistics.mean(xs))}
    return {"n": len(samples), "rtt_ms": dist(rtt),
            "raw_up_ms": dist(raw_up), "raw_down_ms": dist(raw_down),      # t1-t0, t3-t2: naive one-way
            "ntp_offset_ms": ms(ntp_offset), "offset_used_ms": ms(off),
            "up_ms": dist([u - off for u in raw_up]), "down_ms": dist([d + off for d in raw_down]),
            "connect_ms": dist([s["connect_s"] for s in samples if s["first_on_connection"]])}


def answer(link: list[dict], link_kind: str) -> str:
    """M0's question (85 ms one way, 215 ms the other) answered from a probe run's scenarios (testbed.probe_link)."""
    med = lambda r, view, d: r[view][f"{d}_ms"]["p50"]  # noqa: E731
    asym = next(r for r in link if r["injected"] and r["injected"]["up_ms"] != r["injected"]["down_ms"])
    skew = next(r for r in link if r["server_clock_skew_ms"])
    nagle = next(r for r in link if r["scenario"].startswith("Nagle"))
    direct = next(r for r in link if r["scenario"].startswith("direct"))
    newconn = next(r for r in link if r["scenario"].startswith("new TCP"))
    proxy = next(r for r in link if "proxy" in r["scenario"] and r["injected"] == {"up_ms": 0.0, "down_ms": 0.0})
    return f"""Answer (numbers from this run, {link_kind}):
- A one-way delay cannot be read off two machines' timestamps unless their clocks agree: an offset moves delay
  from one direction to the other, one for one. Injected {skew['injected']['up_ms']:.0f} ms each way with the draft
  clock {-skew['server_clock_skew_ms']:.0f} ms behind, the naive reading is {med(skew, 'naive', 'up'):.1f} ms target->draft and
  {med(skew, 'naive', 'down'):.1f} ms draft->target; NTP's correction gives {med(skew, 'ntp', 'up'):.1f} / {med(skew, 'ntp', 'down'):.1f} ms.
- NTP's correction only works by assuming symmetry: with a real {asym['injected']['up_ms']:.0f}/{asym['injected']['down_ms']:.0f} ms asymmetry it reports
  {med(asym, 'ntp', 'up'):.1f}/{med(asym, 'ntp', 'down'):.1f} ms; synchronised clocks (one host here, PTP on a cluster) recover
  {med(asym, 'true_offset', 'up'):.2f}/{med(asym, 'true_offset', 'down'):.2f} ms.
- Real but symmetric or one-off: Nagle + delayed ACK (a message written in two pieces without TCP_NODELAY) takes the
  RTT from {direct['naive']['rtt_ms']['p50']:.2f} to {nagle['naive']['rtt_ms']['p50']:.1f} ms; a new TCP connection per request costs
  {newconn['naive']['connect_ms']['p50']:.2f} ms to open, then {med(newconn, 'naive', 'up') - med(direct, 'naive', 'up'):.2f} ms more on its request; a user-space proxy (like a port-forward) adds
  {proxy['naive']['rtt_ms']['p50'] - direct['naive']['rtt_ms']['p50']:.2f} ms of RTT.
So 85 ms / 215 ms is most likely an unsynchronised-clock artifact (clocks ~65 ms apart on a symmetric ~300 ms round
trip), not a property of the network. On the cluster, run the probe (00_provision, placement k8s) and read the RTT:
~300 ms means a slow but symmetric path; a small RTT means the 300 ms came from connection set-up, Nagle or a proxy."""


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m sdeth.place.netprobe", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--skew-ms", type=float, default=0.0, help="pretend this node's clock is off by this much")
    s.add_argument("--max-seconds", type=float, default=600)
    m = sub.add_parser("measure")
    m.add_argument("--to", required=True)
    m.add_argument("--n", type=int, default=100)
    m.add_argument("--size", type=int, default=64, help="request payload bytes")
    m.add_argument("--new-conn", action="store_true", help="a new TCP connection for every request")
    m.add_argument("--json", required=True)
    for p in (s, m):
        p.add_argument("--split", action="store_true", help="write header and body separately")
        p.add_argument("--no-nodelay", action="store_true", help="leave Nagle on (no TCP_NODELAY)")
    a = ap.parse_args(argv)
    host, port = a.bind.rsplit(":", 1) if a.cmd == "serve" else a.to.rsplit(":", 1)
    if a.cmd == "serve":
        serve((host, int(port)), a.skew_ms / 1e3, a.split, not a.no_nodelay, a.max_seconds)
        return 0
    samples = measure((host, int(port)), a.n, a.size, a.split, not a.no_nodelay, a.new_conn)
    with open(a.json, "w") as f:
        json.dump(samples, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

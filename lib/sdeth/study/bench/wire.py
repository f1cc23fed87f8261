"""What CURVE costs on the link, plain TCP against CURVE (encrypted, authenticated).

Round trips of the protocol's own messages to a server that answers at once, on loopback in one process (the
server in a thread), so that the difference is the encryption and its framing, not a model.
`python -m sdeth bench wire --json out.json`.

Messages timed: a Ping (a bare link probe, ~20 bytes), a frame the size of a streamed draft token (~80 bytes),
and an Open of 4,095 prompt ids (~12 KB, the largest a round sends).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import threading
import time

from ...hardware import describe as describe_hardware
from ...wire import protocol
from ...wire.auth import Keys, make_keys
from ...wire.serving import serve_requests
from ...wire.transport import Client, Log

SIZES = {"ping": protocol.Ping(0.0), "drafted-size": protocol.Ping(0.0, b"x" * 64),
         "open-4095-ids": protocol.Open("r", 0, list(range(1000, 5095)))}


class _Quiet(Log):
    def line(self, text, peer=""):
        pass


def _serve(addr: str, keys, seconds: float) -> None:
    decode = protocol.Decoder("a bench server", (protocol.Ping, protocol.Open))
    for sock, ident, msg, t1, peer in serve_requests(addr, decode, _Quiet("bench"), max_seconds=seconds, keys=keys):
        sock.send_multipart([ident, protocol.encode(protocol.Pong(0.0, t1, t1))])


def round_trips_us(addr: str, keys, msg, n: int) -> list[float]:
    """n round trips of msg (after 50 untimed), in microseconds."""
    c = Client(addr, timeout_s=5.0, keys=keys)
    try:
        out = []
        for i in range(n + 50):
            t0 = time.perf_counter()
            c.call(msg)
            if i >= 50:
                out.append((time.perf_counter() - t0) * 1e6)
        return out
    finally:
        c.close()


def bench_curve(n: int = 2000, port: int = 0) -> dict:
    """Median and p90 round trip (us) per message size, plain and CURVE, and CURVE's added cost."""
    from ...place.testbed import free_port
    rows = []
    with tempfile.TemporaryDirectory() as d:
        keys = Keys.load(make_keys(pathlib.Path(d) / "keys"))
        for mode, k in (("plain", None), ("curve", keys)):
            addr = f"tcp://127.0.0.1:{port or free_port()}"
            threading.Thread(target=_serve, args=(addr, k, 120), daemon=True).start()
            time.sleep(0.3)
            for name, msg in SIZES.items():
                rtt = round_trips_us(addr, k, msg, n)
                rows.append({"link": mode, "message": name, "bytes": len(protocol.encode(msg)), "n": n,
                             "median_us": statistics.median(rtt), "p90_us": statistics.quantiles(rtt, n=10)[-1]})
    plain = {r["message"]: r for r in rows if r["link"] == "plain"}
    for r in rows:
        if r["link"] == "curve":
            r["added_median_us"] = r["median_us"] - plain[r["message"]]["median_us"]
    return {"kind": "measured", "what": "round trips on loopback TCP, server in a thread of the same process",
            "date": time.strftime("%Y-%m-%d"), "hardware": describe_hardware(), "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sdeth bench wire", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="timed round trips per message and link")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    res = bench_curve(a.n)
    for r in res["rows"]:
        extra = f"  (+{r['added_median_us']:.0f} us)" if "added_median_us" in r else ""
        print(f"{r['link']:5s} {r['message']:15s} {r['bytes']:6d} B  median {r['median_us']:7.0f} us  "
              f"p90 {r['p90_us']:7.0f} us{extra}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

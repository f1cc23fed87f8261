"""link: what Ethernet costs on the device: speedup against the link's round trip, per target size, measured
through the real draft server with an injected delay, and the event model between the points.

One draft server (the draft shape, random bf16 weights) in a process of its own on the device; in front of it, for
each injected round trip `injected_rtt_ms` in turn, a user-space TCP relay (place.relay.DelayProxy, half the
delay each way) in a process of its own; N emulated pipelined targets of B streams each (emulated.EmulatedPipelined,
t_v(B, m) of the 8B / 32B / 72B fp8 shapes from `bench targets`) connect through the relay. Each point runs under each
step policy of the grid in turn (as the pipelined part does), for about --min-steps target steps, with its 95%
interval. Each injected round trip also records the round trip a Ping through the relay took (`probe_rtt_ms`: the
relay's own cost included). With --colocated-emulated, colocated SD in the same harness (real draft steps, each
target's t_v in series) runs first: the line the remote curve is held against.

Modelled (`link_model`): per target and policy, costmodel.simulate_pipelined fed the lowest injected point's measured
components (the server's step and period, the commit's one-way transit) with the transit grown by half of each
further round trip: the curve between the measured points, and measured over modelled at each of them.

    python -m sdeth bench streams --call 13 --only-link --link-rtts 0.02,0.5,1,2 --link-targets \\
        Qwen3-8B,Qwen3-32B,Qwen2.5-72B --link-points 1:1 --policy policy,sync --min-steps 1000 --max-s 10 \\
        --colocated-emulated Qwen3-8B,Qwen3-32B,Qwen2.5-72B --batches 1 --colocated-ks 3 --colocated-s 4 \\
        --models-compile default --compile "" --json reports/gpu/bench_streams_link_13.json
"""
from __future__ import annotations

import subprocess
import sys
import time

from ...wire.draft_client import ping_ms
from ..bench.targets import DRAFT_ALPHA
from .common import PIPELINED_K, hello
from .emulated import Targets
from .remote import model_of, pipelined_part, start_server
from .target import big_tv

LINK_CURVE_MS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0)   # the modelled curve's round trips

LINK_NOTES = [
    "Emulated targets (t_v of each shape from `bench targets`, graph replays), the real draft server with random "
    "bf16 weights of the draft shape, synthetic acceptance (a coin per drafted token at the draft's alpha).",
    "injected_rtt_ms: the delay the relay adds, half each way (a user-space TCP relay in its own process on the "
    "same host); probe_rtt_ms: a Ping's round trip through the relay (the relay's own cost and loopback included).",
    "model: costmodel.simulate_pipelined under the point's step policy, fed the lowest injected point's measured "
    "server step, period and commit transit, the transit grown by half of each further injected round trip "
    "(a prediction from one point's components, not a fit to the others); measured_over_scaled_model: the same "
    "curve scaled by the lowest point's measured over modelled (the curve's shape against the measured points).",
]


def start_relay(upstream: str, rtt_ms: float, seconds: float = 900) -> tuple[subprocess.Popen, str]:
    """A delay relay (rtt_ms / 2 each way) to the draft server at `upstream`, in a process of its own, up once its
    port takes a connection: (process, its address). stop_relay ends it."""
    import socket
    from ...place.testbed import free_port
    port, up = free_port(), upstream.rsplit(":", 1)[1]
    proc = subprocess.Popen(["timeout", str(int(seconds)), sys.executable, "-m", "sdeth.place.testbed", "relay",
                             "--listen", f"127.0.0.1:{port}", "--to", f"127.0.0.1:{up}", "--up-ms", str(rtt_ms / 2),
                             "--down-ms", str(rtt_ms / 2)])
    deadline = time.time() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the delay relay for {rtt_ms} ms exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"tcp://127.0.0.1:{port}"
        except OSError:
            if time.time() > deadline:
                stop_relay(proc)
                raise RuntimeError(f"the delay relay for {rtt_ms} ms took no connection in 30 s") from None
            time.sleep(0.05)


def stop_relay(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def link_points(res: dict, name: str, addr: str, pool: Targets, vocab: int, g, t_end: float, progress, save) -> None:
    """Every injected round trip, target and (B, N) of the grid under each step policy, through a relay each."""
    out = res["link"]
    tvs = {}
    for model in g.link_targets:
        try:
            tvs[model] = big_tv(model, sorted({b for b, _ in g.link_points}), PIPELINED_K)
            out["targets"][model] = {"t_v_ms": {f"{b},{m}": v for (b, m), v in tvs[model].items()}}
        except ValueError as e:
            out["targets"][model] = {"error": str(e)}
            progress(f"{model}: {e}")
    try:
        for rtt in g.link_rtts:
            round_trip(res, name, addr, pool, vocab, g, t_end, progress, save, rtt, tvs)
    finally:                                 # (once, when the round trips end or a failure cuts them short)
        out["model"] = link_model(out["points"], tvs)
        save()


def round_trip(res: dict, name: str, addr: str, pool: Targets, vocab: int, g, t_end: float, progress, save,
               rtt: float, tvs: dict) -> None:
    """One injected round trip: a relay in front of the server, a Ping through it, every target's points through
    it; a failure is recorded in res['link']['errors'] and the next round trip goes on."""
    out = res["link"]
    try:
        relay, raddr = start_relay(addr, rtt, max(t_end - time.time(), 60) + 30)
    except RuntimeError as e:
        out.setdefault("errors", []).append(str(e))
        progress(str(e))
        return
    try:
        probe_ms = ping_ms(raddr, hello(vocab), n=20, timeout_s=5.0)
        progress(f"link {rtt:g} ms injected: Ping through the relay {probe_ms:.3f} ms")
        for model, tv in tvs.items():
            label = (f"emulated target (measured t_v of the {model} shape), pipelined streams, real draft server "
                     f"through a delay relay ({rtt:g} ms injected round trip)")
            pts = pipelined_part(res, name, raddr, pool, tv, vocab, g, t_end, progress, save,
                                 points=g.link_points, key=None, label=label)
            for p in pts:
                p.update(target=model, injected_rtt_ms=rtt, probe_rtt_ms=round(probe_ms, 4))
            out["points"] += pts
            save()
    except Exception as e:                   # noqa: BLE001 (recorded; the next round trip goes on)
        out.setdefault("errors", []).append(f"{rtt:g} ms: {type(e).__name__}: {e}"[:500])
        progress(f"link {rtt:g} ms: {type(e).__name__}: {e}")
    finally:
        stop_relay(relay)


def link_model(points: list[dict], tvs: dict) -> list[dict]:
    """Per target, (B, N) and policy: the event model between the injected round trips, fed the lowest injected
    point's measured components, the commit's transit grown by half of each further round trip; measured over
    modelled at each measured point."""
    out = []
    keys = sorted({(p["target"], p["B"], p["N"], p["step_policy"]) for p in points if "speedup" in p})
    for target, b, n, policy in keys:
        pts = sorted((p for p in points if (p.get("target"), p["B"], p["N"], p.get("step_policy")) ==
                      (target, b, n, policy) and p.get("model")), key=lambda p: p["injected_rtt_ms"])
        if not pts or target not in tvs:
            continue
        base, tv = pts[0], tvs[target]
        fed, r0 = base["model"]["fed"], base["injected_rtt_ms"]
        alpha, k = base["alpha"], base["k"]

        def at(rtt: float) -> float:
            one_way = fed["one_way_ms"] + (rtt - r0) / 2
            return model_of(tv, b, k, alpha, fed["step_ms"], fed["period_ms"], one_way, policy)["speedup"]

        curve = [{"injected_rtt_ms": r, "speedup": at(r)}     # (from the lowest point up: never below what it fed)
                 for r in sorted({*(x for x in LINK_CURVE_MS if x >= r0), *(p["injected_rtt_ms"] for p in pts)})]
        measured, m0 = [], curve[0]["speedup"]
        scale = base["speedup"] / m0 if m0 else None              # the lowest point's measured over modelled
        for p in pts:
            m = next(c["speedup"] for c in curve if c["injected_rtt_ms"] == p["injected_rtt_ms"])
            measured.append({"injected_rtt_ms": p["injected_rtt_ms"], "speedup": p["speedup"],
                             "speedup_interval": p.get("speedup_interval"), "model": m,
                             "measured_over_model": round(p["speedup"] / m, 3) if m else None,
                             "measured_over_scaled_model": round(p["speedup"] / (m * scale), 3) if m and scale else None})
        out.append({"target": target, "B": b, "N": n, "step_policy": policy, "fed_from_rtt_ms": r0, "fed": fed,
                    "scale_at_lowest": round(scale, 3) if scale else None, "curve": curve, "measured": measured})
    return out


def link_part(res: dict, name: str, device: str, g, t_end: float, progress, save) -> None:
    """The draft server in a process of its own, the emulated targets' processes, every injected round trip."""
    res["link"] = {"draft": name, "alpha": DRAFT_ALPHA[name], "k": PIPELINED_K, "rtts_ms": list(g.link_rtts),
                   "policies": list(g.policies), "points_bn": [list(x) for x in g.link_points],
                   "read_while_stepping": g.read_while_stepping,
                   "address": "loopback TCP through a delay relay", "notes": LINK_NOTES, "targets": {}, "points": []}
    server, addr, ready = start_server(name, device, g, t_end)
    try:
        with Targets(max(n for _, n in g.link_points)) as pool:
            info = ready.get(timeout=600)
            res["link"]["server"] = info
            if "error" in info:
                progress(f"draft server: {info['error']}")
                return
            time.sleep(0.5)
            link_points(res, name, addr, pool, info["vocab"], g, t_end, progress, save)
    finally:
        server.terminate()
        server.join(10)
        save()


MODEL_WITHIN = 0.10       # the goal: each measured point within 10% of the model between


def link_runs() -> dict[str, dict]:
    """The results of reports/gpu that carry a link part (`bench streams --link-rtts ...`), by file stem."""
    from ..results import gpu_results
    return {n: g for n, g in gpu_results().items() if g.get("link", {}).get("points")}


def link_table(runs: dict):
    """One row per measured point: target, policy, the injected and probed round trips, the speedup over the target
    alone with its interval, the restart, the model between at that round trip, and colocated SD of the same call."""
    import pandas as pd
    from .hitcurve import colocated_speedup
    rows = []
    for name, run in runs.items():
        model = {(m["target"], m["B"], m["N"], m["step_policy"], x["injected_rtt_ms"]): x
                 for m in run["link"].get("model", []) for x in m["measured"]}
        for p in (p for p in run["link"]["points"] if "speedup" in p):
            m = model.get((p["target"], p["B"], p["N"], p["step_policy"], p["injected_rtt_ms"]), {})
            rows.append({"call": name, "target": p["target"], "B": p["B"], "N": p["N"], "policy": p["step_policy"],
                         "injected RTT ms": p["injected_rtt_ms"], "Ping RTT ms": p["probe_rtt_ms"],
                         "speedup": p["speedup"], "interval": p.get("speedup_interval"),
                         "restart p50 ms": p["timeline_ms"]["sent_to_arrived"]["p50"],
                         "model": m.get("model"), "measured / model": m.get("measured_over_model"),
                         "colocated SD (same call)": colocated_speedup(run, p["target"], p["B"])})
    return pd.DataFrame(rows)


def link_lines(runs: dict) -> list[str]:
    """Per call, target and policy: the round trips measured (the goal: three or more) and the worst measured over
    modelled (the goal: within 10%), and where remote SD meets colocated SD of the same call."""
    from .hitcurve import colocated_speedup
    out = []
    for name, run in runs.items():
        for m in run["link"].get("model", []):
            worst, worst_scaled = (max((x[key] for x in m["measured"] if x.get(key)), key=lambda r: abs(r - 1),
                                       default=None) for key in ("measured_over_model", "measured_over_scaled_model"))
            colo = colocated_speedup(run, m["target"], m["B"])
            above = [x["injected_rtt_ms"] for x in m["measured"] if colo and x["speedup"] >= colo]
            out.append(f"{name}: {m['target']} B={m['B']} N={m['N']} [{m['step_policy']}]: "
                       f"{len(m['measured'])} round trips measured ("
                       + ", ".join(f"{x['injected_rtt_ms']:g} ms {x['speedup']}x" for x in m["measured"])
                       + f"); measured / model worst {worst} (goal within {MODEL_WITHIN:.0%}: "
                       + ("met" if worst is not None and abs(worst - 1) <= MODEL_WITHIN else "missed")
                       + f"; the model scaled to the lowest point ({m.get('scale_at_lowest')}): worst {worst_scaled}, "
                       + ("within" if worst_scaled is not None and abs(worst_scaled - 1) <= MODEL_WITHIN else "not within")
                       + " 10%)" + (f"; colocated SD {colo}x (same call), " + (f"beaten up to {max(above):g} ms"
                                                                              if above else "not beaten at any round trip")
                                    if colo else ""))
    return out


def link_figure(runs: dict):
    """Speedup over the target alone against the injected round trip, one panel per target: the model between
    (line, per policy), the measured points with their intervals, colocated SD of the same call (dashed)."""
    from .hitcurve import colocated_speedup, finish_panel, point_with_interval, target_panels
    fig, panels = target_panels(m["target"] for run in runs.values() for m in run["link"].get("model", []))
    for ax, target in panels:
        for name, run in runs.items():
            batches = set()
            for m in (m for m in run["link"].get("model", []) if m["target"] == target):
                ln, = ax.plot([c["injected_rtt_ms"] for c in m["curve"]], [c["speedup"] for c in m["curve"]], "-",
                              label=f"{m['step_policy']} B={m['B']} N={m['N']}, model ({name})")
                for x in m["measured"]:
                    point_with_interval(ax, x["injected_rtt_ms"], x["speedup"], x["speedup_interval"], ln.get_color())
                batches.add(m["B"])
            for b in sorted(batches):
                colo = colocated_speedup(run, target, b)
                if colo:
                    ax.axhline(colo, ls="--", color="grey", lw=0.8, label=f"colocated SD B={b} ({name})")
        finish_panel(ax, target, "injected round trip (ms)", 1.0)
    fig.tight_layout()
    return fig


__all__ = ["LINK_CURVE_MS", "link_figure", "link_lines", "link_model", "link_part", "link_points", "link_runs",
           "link_table", "round_trip", "start_relay"]

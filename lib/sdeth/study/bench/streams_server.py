"""The fixed draft server's `bench streams` calls (notebooks/25_draft_server): the stream timeline, the bigger
targets, the sync calls' per-request TPOT, and each goal with each call's figure."""
from __future__ import annotations

from .streams_pareto import bench_runs


def server_runs(latest: int = 2) -> dict[str, dict]:
    """The newest `latest` complete `bench streams` calls of the server with the stream timeline (reports/gpu/
    bench_streams_server_*.json, partial and superseded calls left out), by file stem, oldest first (0: all)."""
    runs = sorted(((g.get("call", 0), n, g) for n, g in bench_runs().items() if n.startswith("bench_streams_server_")),
                  key=lambda x: (x[0], x[1]))
    return {n: g for _, n, g in runs[-latest if latest else 0:]}


def pipelined_table(runs: dict):
    """Each call's pipelined points (emulated Qwen3-8B targets): drafts on offer per target step against the event
    model fed the point's measured server step (never waiting, as the emulated target; 'adaptive': the runtime's
    policy), the speedup over target-only, the server's streams held against the live ones, and the timeline's
    p50 gaps (ms)."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        for p in (p for p in run.get("remote_pipelined", {}).get("points", []) if "tpot_ms" in p):
            t, m = p["timeline_ms"], p.get("model", {})
            rows.append({"call": name, "B": p["B"], "N": p["N"], "offered": p["offered_mean"],
                         "model offered": m.get("verified_per_round"), "tokens/step": p["tokens_per_step"],
                         "speedup": p.get("speedup"), "model speedup": m.get("speedup"),
                         "model speedup (adaptive)": m.get("adaptive", {}).get("speedup"),
                         "held max / live": f"{p['server_streams']['held_max']} / {p['server_streams']['live']}",
                         "sent->read": t["sent_to_read"]["p50"], "read->stepped": t["read_to_stepped"]["p50"],
                         "stepped->arrived": t["stepped_to_arrived"]["p50"], "sent->arrived": t["sent_to_arrived"]["p50"],
                         "sent->arrived p99": t["sent_to_arrived"]["p99"], "server step ms": p["draft_ms_mean"],
                         "target step ms": p["step_ms"]["p50"]})
    return pd.DataFrame(rows)


def big_table(runs: dict):
    """The bigger targets (emulated from `bench targets`' t_v) through the same server: pipelined streams and sync
    rounds at each (B, N), speedup over target-only at the same B."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        for model, part in run.get("big_targets", {}).items():
            for mode in ("pipelined", "sync"):
                for p in (p for p in part.get(mode, []) if "tpot_ms" in p):
                    rows.append({"call": name, "target": model, "mode": mode, "B": p["B"], "N": p["N"], "k": p["k"],
                                 "speedup": p.get("speedup"), "TPOT mean ms": p["tpot_ms"]["mean"],
                                 "TPOT p99 ms": p["tpot_ms"]["p99"], "tok/s/GPU": p["tokens_per_s_per_gpu"],
                                 "offered": p.get("offered_mean")})
    return pd.DataFrame(rows)


def _point(pts: list, B: int, N: int) -> dict:
    return next((p for p in pts if p["B"] == B and p["N"] == N and "tpot_ms" in p), {})


def goal_lines(runs: dict, worker: dict | None = None) -> list[str]:
    """Each goal of the server-streams work with each call's figure; worker: {call stem: the draft worker's
    pipelined speedup measured in the same call}."""
    out = []
    for name, run in runs.items():
        pipe = run.get("remote_pipelined", {}).get("points", [])
        big = run.get("big_targets", {})
        sync = _point(run.get("remote", {}).get("points", []), 1, 1)
        host = [g["host_ms_per_step"] for g in run.get("goal_check", [])]
        b11 = _point(pipe, 1, 1).get("speedup")
        held = all(p["server_streams"]["held_max"] <= p["server_streams"]["live"] for p in pipe if "tpot_ms" in p)
        out.append(
            f"{name}: B=1 N=1 pipelined {b11}x (draft worker, same call: {(worker or {}).get(name, 'n/a')}x); "
            f"8B B=4 N=4 {_point(pipe, 4, 4).get('speedup')}x (goal 1.25x); Qwen3-32B B=1 N=4 "
            f"{_point(big.get('Qwen3-32B', {}).get('pipelined', []), 1, 4).get('speedup')}x (goal 1.8x); Qwen2.5-72B "
            f"B=1 N=4 {_point(big.get('Qwen2.5-72B', {}).get('pipelined', []), 1, 4).get('speedup')}x (goal 2.0x); "
            f"server host ms/step at 16 rows {host} (goal 0.3); sync B=1 N=1 {_sync_tpot(sync)} (goal p99 <= 2 p50); "
            f"streams held never above live: {held}")
    return out


def _sync_tpot(p: dict) -> str:
    """A sync point's TPOT: per request where the call recorded it (each sequence's own, as serving benchmarks
    count it), with the per-round figure beside it (a round's tokens over its time: spreads by the 1-4 tokens a
    round gives, so its p99 is a one-token round)."""
    t, r = p.get("tpot_ms", {}), p.get("request_tpot_ms")
    per_round = f"per round p50 {t.get('p50')} / p99 {t.get('p99')} ms"
    if not r or not r.get("n"):
        return "TPOT " + per_round
    tail = "p99" if r["n"] >= 100 else f"max (p99 needs 100 sequences, not {r['n']})"
    return f"TPOT per request p50 {r['p50']} / {tail} {r['p99']} ms over {r['n']} sequences ({per_round})"


def sync_lines() -> list[str]:
    """The long sync-rounds calls (reports/gpu/bench_streams_sync_*.json, bench "streams-sync": B=1 N=1 for about
    a minute, about 100 sequences): the per-request TPOT's p50 and tail. The largest of n values bounds their p99
    from above, so a largest within 2x of the p50 shows the p99 goal."""
    from ..results import gpu_results
    out = []
    for name, run in sorted(gpu_results().items()):
        p = _point(run.get("remote", {}).get("points", []), 1, 1) if run.get("bench") == "streams-sync" else {}
        r = p.get("request_tpot_ms") or {}
        if r.get("n"):
            out.append(f"{name} ({run['hardware'].get('label', '?')}, {run['settings']['grid']['remote_s']:g} s): sync "
                       f"B=1 N=1 {_sync_tpot(p)}; largest / p50 {r['p99'] / r['p50']:.2f} (goal p99 <= 2 p50)")
    return out


def worker_speedups() -> dict[str, float]:
    """The draft worker's pipelined speedup (`bench sd --emulate-target`) measured in each server call, by that
    call's stem (reports/gpu/bench_sd_emulated_worker_<call>.json)."""
    from ..results import gpu_results
    out = {}
    for n, g in gpu_results().items():
        if n.startswith("bench_sd_emulated_worker_"):
            row = next((r for r in g.get("rows", []) if r["mode"] == "pipelined"), None)
            if row:
                out[f"bench_streams_server_{n.rsplit('_', 1)[-1]}"] = round(row["speedup"], 3)
    return out

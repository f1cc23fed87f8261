"""Stream steps launched ahead (wire.stepahead) against inline, measured in the same call: the ssd part run with the
settings `off` (its server's default, launched ahead on a GPU) and `off+inline` (the same server stepping inline),
each point under each step policy (`--ssd-policy offered,policy`):

    python -m sdeth bench streams --call N --only-ssd --verdict-cache off,off+inline --ssd-policy offered,policy \
        --ssd-targets Qwen3-8B,Qwen3-32B,Qwen2.5-72B --ssd-points 1:1,4:4 --ssd-rows 16 --ssd-ranks synthetic:0.9 \
        --ssd-s 5 --budget-s 330 --models-compile default --compile "" --batches 1

Per point: the speedup over the target alone (with its 95% interval), the server's period (between two tokens of one
run, p50) against its device step (p50), and the restart (a rejecting Commits sent to the new run's first draft at
the target) in server periods: p50 less the commit's transit, and p99; then the goals of the floor (`goal_lines`)."""
from __future__ import annotations

from .ssd import INLINE, ssd_runs

PERIOD_OVER_DEVICE_MS = 0.2          # the goal: the server's period at B=1 within this of its device step
RESTART_P50_PERIODS = 1.5            # ... a restart's p50 within one transit and this many periods
RESTART_P99_PERIODS = 3.0            # ... and its p99 within this many periods, at every point with B, N <= 4
SPEED_GOALS = (("Qwen3-8B", 1, 1, 1.40), ("Qwen3-32B", 1, 4, 2.0), ("Qwen2.5-72B", 1, 4, 2.3), ("Qwen3-32B", 4, 4, 1.8))


FIRST_AHEAD_CALL = 18               # the first GPU call whose `off` server launched its steps ahead


def ahead_runs() -> dict[str, dict]:
    """The ssd calls that ran a server inline beside its default (a setting ending in +inline), and the later ones
    with the default alone, by file stem."""
    return {n: r for n, r in ssd_runs().items() if any(c.endswith(INLINE) for c in r["ssd"].get("caches", []))
            or int(r.get("call") or 0) >= FIRST_AHEAD_CALL and "off" in r["ssd"].get("caches", [])}


def _points(run: dict) -> list[dict]:
    return [p for p in run["ssd"]["points"] if "tpot_ms" in p and p["verdict_cache"]["spec"] in ("off", "off" + INLINE)]


def row(name: str, p: dict) -> dict:
    r = p.get("restart_periods") or {}
    return {"call": name, "target": p["target"], "B": p["B"], "N": p["N"], "policy": p.get("step_policy", "offered"),
            "steps": "launched ahead" if p["verdict_cache"]["spec"] == "off" else "inline",
            "speedup": p.get("speedup"), "95% interval": p.get("speedup_interval"),
            "period ms p50": p.get("server_period_ms_p50"), "device step ms p50": p.get("draft_ms_p50"),
            "restart p50 less transit (periods)": r.get("p50_less_transit"), "restart p99 (periods)": r.get("p99"),
            "drafts on offer": p.get("offered_mean"), "rows a step": (p.get("server_batch") or {}).get("mean")}


def ahead_table(runs: dict):
    """One row per point: launched ahead beside inline, each policy (see the module docstring)."""
    import pandas as pd
    rows = [row(name, p) for name, run in runs.items() for p in _points(run)]
    return pd.DataFrame(rows).sort_values(["call", "B", "N", "target", "policy", "steps"]) if rows else pd.DataFrame()


def _best(pts: list[dict], target: str, b: int, n: int, steps: str) -> dict | None:
    got = [p for p in pts if (p["target"], p["B"], p["N"]) == (target, b, n) and
           (p["verdict_cache"]["spec"] == "off") == (steps == "ahead") and p.get("speedup")]
    return max(got, key=lambda p: p["speedup"], default=None)


def _span(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "none"


def goal_lines(runs: dict) -> list[str]:
    """Each goal of the floor per call, from the launched-ahead points (the server's default on a GPU): the period at
    B=1 and the restart at every point (as ranges, with how many points met each), then each speed goal."""
    out = []
    for name, run in runs.items():
        pts = _points(run)
        ahead = [p for p in pts if p["verdict_cache"]["spec"] == "off"]
        over = [p["server_period_ms_p50"] - p["draft_ms_p50"] for p in ahead
                if p["B"] == 1 and p.get("server_period_ms_p50") and p.get("draft_ms_p50")]
        if over:
            met = sum(x <= PERIOD_OVER_DEVICE_MS for x in over)
            out.append(f"{name}: period at B=1 over the device step +{_span(over)} ms (goal <= "
                       f"+{PERIOD_OVER_DEVICE_MS}: met at {met} of {len(over)} points)")
        rs = [p["restart_periods"] for p in ahead if p["B"] <= 4 and p["N"] <= 4 and p.get("restart_periods")]
        if rs:
            met = sum(r["p50_less_transit"] <= RESTART_P50_PERIODS and r["p99"] <= RESTART_P99_PERIODS for r in rs)
            out.append(f"{name}: restart p50 less transit {_span([r['p50_less_transit'] for r in rs])} periods, p99 "
                       f"{_span([r['p99'] for r in rs])} (goal <= {RESTART_P50_PERIODS} and <= {RESTART_P99_PERIODS}: "
                       f"met at {met} of {len(rs)} points)")
        for target, b, n, least in SPEED_GOALS:
            p, q = _best(pts, target, b, n, "ahead"), _best(pts, target, b, n, "inline")
            if p is not None:
                inline = f", {q['speedup']} inline [{q.get('step_policy')}]" if q else ""
                out.append(f"{name}: {target} B={b} N={n}: {p['speedup']} {p.get('speedup_interval')} launched ahead "
                           f"[{p.get('step_policy')}]{inline} (goal >= {least}: "
                           f"{'met' if p['speedup'] >= least else 'missed'})")
    return out

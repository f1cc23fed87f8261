"""The step policies side by side (`bench streams --policy policy,sync,offered`): at each point the same server and
emulated targets play each policy in turn; the restart (a Commits sent to the first draft stepped after it, at the
target) in server periods; the floor goals read from those calls (study.results.POLICY_STREAMS)."""
from __future__ import annotations

import re

from pathlib import Path

TARGETS = {"8B": "Qwen3-8B", "32B": "Qwen3-32B", "72B fp8": "Qwen2.5-72B"}
SPEEDUP_GOALS = (("8B", 1, 1, 1.40), ("32B", 1, 4, 2.0), ("72B fp8", 1, 4, 2.3), ("32B", 4, 4, 1.8))
RESTART_P50, RESTART_P99 = 1.5, 3.0      # server periods (p50: plus one transit)
LOOPBACK_TRANSIT_MS = 0.1                # the transit the p50 goal allows on loopback (one way, both encodings)
PERIOD_OVER_STEP_MS = 0.2                # the server's period at B=1 over the device's draft step
MODEL_WITHIN = 0.10


def policy_runs() -> dict[str, dict]:
    """The calls of study.results.POLICY_STREAMS that are in reports/gpu, by file stem."""
    import json

    from ..results import POLICY_STREAMS
    from ...paths import REPO
    return {Path(r).stem: json.loads((REPO / r).read_text()) for r in POLICY_STREAMS if (REPO / r).exists()}


def points(run: dict):
    """(target label, point) for every pipelined point of a call: the 8B's, then the bigger targets'."""
    yield from (("8B", p) for p in run.get("remote_pipelined", {}).get("points", []))
    for model, part in (run.get("big_targets") or {}).items():
        label = next((k for k, v in TARGETS.items() if v == model), model)
        yield from ((label, p) for p in part.get("pipelined", []))


def policy_table(runs: dict):
    """Each point under each policy: the speedup over the target alone at the same B with its 95% interval, the
    event model's fed the point's measured components, drafts verified a stream-step, the restart in server
    periods (p50, p99) and the server's period against its draft step."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        overlap = run.get("remote_pipelined", {}).get("read_while_stepping")
        for target, p in points(run):
            if "steps" not in p:
                continue
            r, m = p.get("restart_periods") or {}, p.get("model") or {}
            lo, hi = p.get("speedup_interval") or (None, None)
            rows.append({"call": name, "read while stepping": overlap, "target": target, "B": p["B"], "N": p["N"],
                         "policy": p["step_policy"], "speedup": p["speedup"], "low": lo, "high": hi,
                         "model": m.get("speedup"),
                         "measured / model": round(p["speedup"] / m["speedup"], 3) if m.get("speedup") else None,
                         "drafts verified": p["offered_mean"], "model verified": m.get("verified_per_round"),
                         "steps": p["steps"], "restart p50 (periods)": r.get("p50"),
                         "restart p99 (periods)": r.get("p99"), "restart p50 ms": p["timeline_ms"]["sent_to_arrived"]["p50"],
                         "commit to server ms": p["timeline_ms"]["sent_to_read"]["p50"],
                         "period ms": p.get("server_period_ms_p50"), "draft step ms": p.get("draft_ms_p50")})
    return pd.DataFrame(rows)


def device_step_ms(run: dict, batch: int = 1) -> float | None:
    """The draft's device step at `batch` rows and the run's context (draft_step part: graph replays)."""
    ctx = run["settings"]["context"]
    for part in run.get("draft_step", []):
        for q in part.get("points", []):
            if q["B"] == batch and q["context"] == ctx:
                return q["step_ms"]
    return None


def goal_lines(runs: dict) -> list[str]:
    """The floor issue's H200 goals, each call's figure beside each goal."""
    import pandas as pd
    t = policy_table(runs)
    if not len(t):
        return ["no step-policy calls in reports/gpu (bench streams --policy policy,sync,offered)"]
    out = []
    for name, run in runs.items():
        c = t[t["call"] == name]
        pol = c[c["policy"] == "policy"]
        if not len(c):
            continue
        overlap = (run.get("remote_pipelined") or {}).get("read_while_stepping")
        tag = f"{name} (read while stepping {'on' if overlap else 'off'})"
        for target, b, n, least in SPEEDUP_GOALS:
            row = pol[(pol["target"] == target) & (pol["B"] == b) & (pol["N"] == n)]
            if len(row):
                r = row.iloc[0]
                out.append(f"{tag}: {target} B={b} N={n} policy {r['speedup']:.2f}x [{r['low']}, {r['high']}] (goal "
                           f">= {least}: {'met' if r['speedup'] >= least else 'missed'})")
        small = c[(c["B"] <= 4) & (c["N"] <= 4)].dropna(subset=["restart p50 (periods)", "restart p99 (periods)"])
        if not len(small):
            continue
        worst50 = small.loc[small["restart p50 (periods)"].idxmax()]
        worst99 = small.loc[small["restart p99 (periods)"].idxmax()]
        p50_ok = all(r["restart p50 ms"] <= RESTART_P50 * r["period ms"] + LOOPBACK_TRANSIT_MS for _, r in small.iterrows())
        out.append(f"{tag}: restart p50 {small['restart p50 (periods)'].min()}-{worst50['restart p50 (periods)']} "
                   f"periods (worst {worst50['target']} B={worst50['B']} N={worst50['N']} {worst50['policy']}; goal "
                   f"<= {RESTART_P50} + a {LOOPBACK_TRANSIT_MS} ms transit at every point: "
                   f"{'met' if p50_ok else 'missed'}), p99 up to {worst99['restart p99 (periods)']} (goal <= "
                   f"{RESTART_P99}: {'met' if worst99['restart p99 (periods)'] <= RESTART_P99 else 'missed'})")
        step = device_step_ms(run)
        b1 = c[(c["B"] == 1) & (c["N"] == 1)]
        if step and len(b1):
            per = b1["period ms"].median()
            out.append(f"{tag}: server period at B=1 {per:.2f} ms against a {step:.2f} ms device step (+{per - step:.2f}; "
                       f"goal <= +{PERIOD_OVER_STEP_MS}: {'met' if per - step <= PERIOD_OVER_STEP_MS else 'missed'})")
        worse = []
        for (target, b, n), g in c.groupby(["target", "B", "N"]):
            by = {r["policy"]: r for _, r in g.iterrows()}
            if {"policy", "sync", "offered"} <= by.keys():
                best = max(("sync", "offered"), key=lambda k: by[k]["speedup"])
                floor = by[best]["low"] if pd.notna(by[best]["low"]) else by[best]["speedup"]
                if by["policy"]["speedup"] < floor:
                    worse.append(f"{target} B={b} N={n} ({by['policy']['speedup']:.3f} < {best}'s low end {floor})")
        out.append(f"{tag}: policy >= the better of sync and offered less its interval: "
                   + ("met at every point" if not worse else "missed at " + "; ".join(worse)))
        off = pol[(pol["measured / model"] - 1).abs() > MODEL_WITHIN]
        out.append(f"{tag}: policy within {MODEL_WITHIN:.0%} of the event model at {len(pol) - len(off)} of {len(pol)} "
                   "points" + (": not at " + ", ".join(f"{r['target']} B={r['B']} N={r['N']} ({r['measured / model']})"
                                                     for _, r in off.iterrows()) if len(off) else ""))
    return out


CPU_WITHIN = 0.05        # the CPU goal: the policy's tokens/s >= the better corner's less 5%, at 1 and 4 streams


def cpu_lines() -> list[str]:
    """The CPU goals of the step policy from reports/policy_cpu.json and its numbered repeats (policy_cpu_2.json, ...,
    in order; `make bench-policy-cpu [REPEAT=N]`), one block a run: at each stream count, the
    policy's tokens/s against the better corner's, and the restart (at the target: the draft's step, one clock, plus
    a transit) in server periods."""
    from ..results import POLICY_CPU
    from ...paths import REPO
    first = REPO / POLICY_CPU
    if not first.exists():
        return [f"no {POLICY_CPU} (python -m sdeth bench ssd-cpu --specs off --policies policy,sync,offered)"]
    repeats = sorted((int(m[1]), path) for path in first.parent.glob(first.stem + "_*.json")
                     if (m := re.fullmatch(re.escape(first.stem) + r"_(\d+)\.json", path.name)))
    return [line for path in [first, *(path for _, path in repeats)] for line in _cpu_run(path)]


def _cpu_run(path) -> list[str]:
    """One CPU run's block of cpu_lines."""
    import json
    doc = json.loads(path.read_text())
    cpu = doc["measured_cpu"]
    out = [f"CPU testbed, {path.name} ({doc['hardware']['label']}, {doc['created'][:16]}; {doc['models']['target']} "
           f"with {doc['models']['draft']}, the draft server on core {cpu['config']['draft_core']}, greedy, real "
           f"acceptance, {cpu['config']['prompts']} x {cpu['config']['max_tokens']} tokens, k {cpu['config']['k']}):"]
    for n in sorted({p["streams"] for p in cpu["points"]}):
        pts = {p["step_policy"]: p for p in cpu["points"] if p["streams"] == n and p["cache"] == "off"}
        if "policy" not in pts:
            continue
        corners = [pts[x]["tokens_per_s"] for x in ("sync", "offered") if x in pts]
        best = max(corners) if corners else None
        verdict = ("no corner measured" if best is None else
                   "met" if pts["policy"]["tokens_per_s"] >= (1 - CPU_WITHIN) * best else "missed")
        line = (f"  {n} stream(s): tokens/s policy {pts['policy']['tokens_per_s']}, sync "
                f"{pts.get('sync', {}).get('tokens_per_s')}, offered {pts.get('offered', {}).get('tokens_per_s')} "
                f"(goal >= the better corner less 5%: {verdict}); outputs identical to target-only: "
                f"{all(p['greedy_identical'] for p in pts.values())}")
        for pol, p in pts.items():
            r = p.get("restart")
            if r:
                line += (f"\n    restart [{pol}]: p50 {r['p50_ms']} ms = one transit ({r['transit_ms']} ms) + "
                         f"{r['p50_periods_less_transit']} periods of {r['period_ms_p50']} ms (goal <= {RESTART_P50:g}: "
                         f"{'met' if r['met'] else 'missed'}), p99 {r['p99_periods']} periods; as the target's loop "
                         f"took it (between its forwards) p50 {r['taken_by_the_loop_ms']['p50']} ms")
        out.append(line)
    return out

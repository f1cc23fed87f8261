"""Branches sent ahead: speedup over the target alone against the hit rate, per target, measured at the hit rates a
call ran (synthetic ranks at two hit rates, the embedded pair's trace) and the event model between; the hit rates at
which remote SD with branches beats colocated SD (same call, same harness) and matches SSD's published 2.29x; each
of the goals of branches sent ahead, with its figure.

Measured: `bench streams --only-ssd --verdict-cache off,4x4x8+ahead --ssd-ranks synthetic:0.9,synthetic:0.5,trace
--colocated-emulated ...` (streambench.ssd). Modelled: costmodel.simulate_pipelined under the offered policy (the
ssd part's rule) with the cache's terms (costmodel.verdict_terms for the spec: the positions covered, the branch
depth) and P(hit | a rejection at a covered position) swept from 0 to 1, fed the measured components of the call's
point with branches ahead at the highest hit rate (the server's step and period with its branch rows, the commit's
transit). The x axis is the hit rate over all restarts, as the target counts it (the model's and the point's).
"""
from __future__ import annotations

from ...costmodel import CacheTerms, simulate_pipelined, verdict_terms
from ...runtime.verdictcache import VerdictSpec
from .common import PIPELINED_WINDOW
from .ranks import TOP, Ranks
from .ssd import AHEAD, model_cached, server_spec
from .ssd_model import point_costs

SSD_PUBLISHED = 2.29     # SSD (Saguaro, arXiv 2603.03251): Qwen3-32B over the target alone, its own setting
SWEEP = tuple(i / 10 for i in range(11))
AHEAD_GOALS = (          # (ranks, target, B, N, what, least): branches sent ahead, one H200, emulated targets
    ("synthetic:0.9", "Qwen3-32B", 1, 1, "speedup", 2.5), ("synthetic:0.9", "Qwen2.5-72B", 1, 1, "speedup", 2.7),
    ("synthetic:0.9", "Qwen3-8B", 1, 1, "speedup", 1.8), ("trace", "Qwen3-32B", 1, 1, "over plain", 1.1),
)
FULL_SERVER_WITHIN = 0.03     # a full server's live streams with branches ahead against off: within 3%


def _points(run: dict) -> list[dict]:
    return [p for p in run.get("ssd", {}).get("points", []) if "tpot_ms" in p]


def colocated_speedup(run: dict, target: str, b: int = 1) -> float | None:
    """Colocated SD's best speedup over the target alone at B in the same call (the same harness: real draft steps,
    the target's t_v in series): t_v(B, 0) over its mean TPOT per stream."""
    part = run.get("colocated_emulated", {}).get(target, {})
    t1 = part.get("t_v_ms", {}).get(f"{b},0")
    best = [x for x in part.get("best_k", []) if x["B"] == b]
    return round(t1 / best[0]["tpot_ms_mean"], 3) if t1 and best else None


def curve(run: dict, target: str, b: int = 1, n: int = 1) -> dict | None:
    """One target's curve in one call: measured points (the hit rate, the speedup and its interval, per ranks and
    setting), the modelled sweep, and the crossovers (against colocated SD of the same call, and SSD's 2.29x)."""
    from .target import big_tv
    pts = [p for p in _points(run) if p["target"] == target and p["B"] == b and p["N"] == n]
    ahead = [p for p in pts if p["verdict_cache"]["spec"].endswith(AHEAD) and p.get("draft_ms_mean")]
    if not ahead:
        return None
    k = run["ssd"]["k"]
    tv = {tuple(int(x) for x in key.split(",")): v for key, v in
          run.get("colocated_emulated", {}).get(target, {}).get("t_v_ms", {}).items()} or big_tv(target, [b], k)
    if any((b, m) not in tv for m in range(k + 1)):
        tv = big_tv(target, [b], k)
    fed = max(ahead, key=lambda p: p["verdict_cache"]["hit_rate"] or 0.0)
    spec = VerdictSpec.parse(server_spec(fed["verdict_cache"]["spec"]))
    alpha = fed["alpha"]
    shares = Ranks(fed["verdict_cache"]["ranks"], alpha, 0).shares()[:TOP]
    placed = run["ssd"].get("branch_plan") is not None       # (calls before it used the geometric rule)
    base = verdict_terms(alpha, spec.fanout, spec.depth, spec.budget, shares, 1.0, PIPELINED_WINDOW, placed)
    c = point_costs(fed, tv, b, k)
    sweep = []
    for h in SWEEP:
        sim = simulate_pipelined(alpha, c, k, n_tokens=6000, policy="offered",
                                 cache=CacheTerms(base.forks, base.depth, h, 1.0) if h else None)
        sweep.append({"hit_given_covered": h, "hit_rate": round(sim["cache_hit_rate"] or 0.0, 3),
                      "speedup": round(sim["tokens_per_s"] * c.target_step, 3)})
    measured = [{"spec": p["verdict_cache"]["spec"], "ranks": p["verdict_cache"]["ranks"],
                 "hit_rate": p["verdict_cache"]["hit_rate"] or 0.0, "speedup": p.get("speedup"),
                 "speedup_interval": p.get("speedup_interval")} for p in pts]
    colo = colocated_speedup(run, target, b)
    return {"target": target, "B": b, "N": n, "spec": fed["verdict_cache"]["spec"], "fed_from": fed["verdict_cache"]["ranks"],
            "measured": measured, "model": sweep, "colocated_speedup": colo,
            "trace_hit_rate": next((m["hit_rate"] for m in measured if m["ranks"] == "trace" and m["spec"].endswith(AHEAD)),
                                   None),
            "hit_to_beat_colocated": crossing(sweep, colo), "hit_to_match_ssd": crossing(sweep, SSD_PUBLISHED)}


def crossing(sweep: list[dict], level: float | None) -> float | None | str:
    """The least hit rate (over all restarts) at which the modelled speedup reaches `level`, linear between the
    sweep's points: 0.0 when even no hit does, 'not reached' when no hit rate does."""
    if level is None:
        return None
    pts = sorted((s["hit_rate"], s["speedup"]) for s in sweep)
    if pts[0][1] >= level:
        return 0.0
    for (h0, s0), (h1, s1) in zip(pts, pts[1:]):
        if s0 < level <= s1:
            return round(h0 + (level - s0) / (s1 - s0) * (h1 - h0), 3) if s1 > s0 else h1
    return "not reached"


def curves(runs: dict) -> list[dict]:
    """Every call's curve per target at B=1 N=1."""
    out = []
    for name, run in runs.items():
        for target in run.get("ssd", {}).get("targets", []):
            c = curve(run, target)
            if c:
                out.append({"call": name, **c})
    return out


def curve_table(cs: list[dict]):
    """One row per measured point: its hit rate and speedup beside the model at that hit rate."""
    import pandas as pd
    rows = []
    for c in cs:
        for m in c["measured"]:
            model = _at(c["model"], m["hit_rate"]) if m["spec"].endswith(AHEAD) else None
            rows.append({"call": c["call"], "target": c["target"], "setting": m["spec"], "ranks": m["ranks"],
                         "hit rate": m["hit_rate"], "speedup": m["speedup"], "interval": m["speedup_interval"],
                         "model at that hit rate": model,
                         "measured / model": round(m["speedup"] / model, 3) if model and m["speedup"] else None,
                         "colocated SD (same call)": c["colocated_speedup"]})
    return pd.DataFrame(rows)


def _at(sweep: list[dict], h: float) -> float | None:
    pts = sorted((s["hit_rate"], s["speedup"]) for s in sweep)
    for (h0, s0), (h1, s1) in zip(pts, pts[1:]):
        if h0 <= h <= h1:
            return round(s0 + (s1 - s0) * (h - h0) / (h1 - h0), 3) if h1 > h0 else s1
    return None


def crossing_lines(cs: list[dict]) -> list[str]:
    return [f"{c['call']}: {c['target']} B=1 N=1 ({c['spec']}): {_trace(c['trace_hit_rate'])}; modelled, "
            f"{_against_colocated(c)}, and reaches SSD's {SSD_PUBLISHED}x {_from(c['hit_to_match_ssd'])}" for c in cs]


def _trace(hit) -> str:
    if hit is None:
        return "no point of the embedded trace's ranks in this call"
    return f"the trace's hit rate {hit} (a floor: a 135M target and a 6-layer draft)"


def _from(hit) -> str:
    return "at no hit rate up to 1" if hit == "not reached" else f"from a hit rate of {hit}"


def _against_colocated(c: dict) -> str:
    if c["colocated_speedup"] is None:
        return "no colocated SD in this call to hold it against"
    return (f"remote SD with branches beats colocated SD ({c['colocated_speedup']}x, same call) "
            f"{_from(c['hit_to_beat_colocated'])}")


def target_panels(targets):
    """One panel per target shape, the 8B first and the 72B last: (figure, [(axes, target)])."""
    import matplotlib.pyplot as plt
    targets = sorted(set(targets), key=lambda t: ("8B" not in t, "72B" in t))
    fig, axes = plt.subplots(1, len(targets), figsize=(4.2 * len(targets), 3.4), squeeze=False)
    return fig, list(zip(axes[0], targets))


def point_with_interval(ax, x: float, y: float, interval, color, fmt: str = "o") -> None:
    """A measured point and its 95% interval (none drawn when it has none)."""
    lo, hi = interval or [y, y]
    ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt=fmt, color=color)


def finish_panel(ax, target: str, xlabel: str, level: float, level_style: str = ":") -> None:
    """A panel's reference line (SSD's figure, or the target alone), title, axes' labels and legend."""
    ax.axhline(level, ls=level_style, color="black", lw=0.8)
    ax.set_title(target, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup over the target alone")
    ax.legend(fontsize=7)


def figure(cs: list[dict]):
    """Speedup against the hit rate, one panel per target: the model's sweep (line), the measured points (markers,
    with their intervals), colocated SD (dashed) and SSD's 2.29x (dotted), the trace's hit rate marked."""
    fig, panels = target_panels(c["target"] for c in cs)
    for ax, target in panels:
        for c in (c for c in cs if c["target"] == target):
            ln, = ax.plot([s["hit_rate"] for s in c["model"]], [s["speedup"] for s in c["model"]], "-",
                          label=f"model ({c['call']})")
            for m in c["measured"]:
                point_with_interval(ax, m["hit_rate"], m["speedup"], m["speedup_interval"], ln.get_color(),
                                    "o" if m["spec"].endswith(AHEAD) else "x")
            if c["colocated_speedup"]:
                ax.axhline(c["colocated_speedup"], ls="--", color=ln.get_color(), lw=0.8,
                           label=f"colocated SD ({c['call']})")
            if c["trace_hit_rate"] is not None:
                ax.axvline(c["trace_hit_rate"], ls=":", color="grey", lw=0.8)
        finish_panel(ax, target, "hit rate (restarts answered by a branch)", SSD_PUBLISHED)
    fig.tight_layout()
    return fig


def placed_lines(runs: dict) -> list[str]:
    """Each B=1 N=1 point with branches sent ahead, of the calls whose servers placed branches by the geometric rule
    (no `branch_plan`): measured, then modelled twice with the point's measured components (ssd.model_cached): the
    rule it ran, and branches placed by their worth (what the server does now). Modelled, not measured."""
    from .target import big_tv
    out = []
    for name, run in runs.items():
        k = run["ssd"].get("k")
        for p in [] if run["ssd"].get("branch_plan") else run["ssd"]["points"]:
            v = p.get("verdict_cache") or {}
            if p.get("B") != 1 or p.get("N") != 1 or AHEAD not in v.get("spec", "") or "speedup" not in p:
                continue
            tv, ranks = big_tv(p["target"], [1], k), Ranks(v["ranks"], p["alpha"], 0)
            geo, worth = (model_cached(p, v["spec"], ranks, tv, k, placed) for placed in (False, True))
            out.append(f"{name}: {p['target']} {v['ranks']} [{p.get('step_policy', 'offered')}]: measured "
                       f"{p['speedup']}x (hit rate {v['hit_rate']}); modelled: the geometric rule {geo['speedup']}x "
                       f"(hit rate {geo['cache_hit_rate']}), placed by worth {worth['speedup']}x (hit rate "
                       f"{worth['cache_hit_rate']})")
    return out


def goal_lines(runs: dict) -> list[str]:
    """Each goal of branches sent ahead in each call that measured it, and each full server's live streams with
    branches ahead against off (within 3%)."""
    out = []
    for name, run in runs.items():
        pts = _points(run)
        key = lambda p: (p["target"], p["verdict_cache"]["ranks"], p["B"], p["N"], p.get("step_policy"))  # noqa: E731
        off = {key(p): p for p in pts if p["verdict_cache"]["spec"] == "off"}
        ahead = [p for p in pts if p["verdict_cache"]["spec"].endswith(AHEAD)]
        for ranks, target, b, n, what, least in AHEAD_GOALS:
            for p in (p for p in ahead if key(p)[:4] == (target, ranks, b, n)):
                base = off.get(key(p))
                fig = p.get("speedup") if what == "speedup" else (
                    round(base["tpot_ms"]["mean"] / p["tpot_ms"]["mean"], 3) if base else None)
                ci = p.get("speedup_interval") if what == "speedup" else None
                out.append(f"{name}: {target} B={b} N={n} {ranks} {p['verdict_cache']['spec']}: {what} {fig}"
                           f"{f' {ci}' if ci else ''} (goal >= {least}: {'met' if fig and fig >= least else 'missed'}; "
                           f"hit rate {p['verdict_cache']['hit_rate']})")
        rows = run["ssd"].get("server_rows")
        for p in (p for p in ahead if p["B"] * p["N"] == rows):
            base = off.get(key(p))
            if base:
                r = round(p["tokens_per_s"] / base["tokens_per_s"], 3)
                out.append(f"{name}: full server ({rows} rows) {p['target']} B={p['B']} N={p['N']} "
                           f"{p['verdict_cache']['ranks']}: live tokens/s with branches ahead / off {r} (goal within "
                           f"{FULL_SERVER_WITHIN:.0%}: {'met' if abs(r - 1) <= FULL_SERVER_WITHIN else 'missed'}; "
                           f"branch rows/step {p['verdict_cache']['branch_rows_per_step']})")
    return out


__all__ = ["AHEAD_GOALS", "SSD_PUBLISHED", "crossing", "crossing_lines", "curve", "curve_table", "curves",
           "figure", "finish_panel", "goal_lines", "placed_lines", "point_with_interval", "target_panels"]

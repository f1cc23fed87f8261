"""The verdict cache's goals modelled for the H200 (no device run): the event model (costmodel.simulate_pipelined
with costmodel.verdict_terms) over the H200 components the study measured, and the same model checked against a
CPU run's own components (streambench.ssd_cpu).

Inputs, each named in the output: the 1.7B draft server's step, period and commit transit at each goal's (B, N)
(`bench streams` calls in study.results.SERVER_STREAMS: remote_pipelined for the 8B, big_targets for the 32B),
the server's batched step at live + branch rows (the same calls' draft_step grid, context 512: the branch rows'
cost), the targets' t_v(B, m) (`bench targets`, streambench.target.big_tv), alpha 0.71, k 4, window 8, the
"offered" policy of the emulated targets. Not measured by anyone, so left out of the model (and said): the
fork's KV prefix copy per branch, and the target's wait for a restart's answer (the model never waits).
"""
from __future__ import annotations

from ...costmodel import CacheTerms, Costs, sd_tokens_per_s, simulate_pipelined, verdict_terms
from ...runtime.verdictcache import VerdictSpec
from ..results import SERVER_STREAMS, SSD_CPU   # the calls the model reads; where the CPU run writes
from .common import PIPELINED_K, PIPELINED_WINDOW
from .ranks import TOP, Ranks
from .ssd import GOALS, SSD_ALPHA

ALPHA = SSD_ALPHA
MODEL_SPECS = ("4x4x8", "8x4x16")
MODEL_POINTS = (("Qwen3-8B", 1, 1), ("Qwen3-32B", 1, 1), ("Qwen3-32B", 1, 4))
HIT_SOURCES = ("trace", "cpu-measured", "synthetic:0.9")
N_TOKENS = 6000
CHECK_TOLERANCE = 0.15

MODELLED_LABEL = ("modelled: the event model (costmodel.simulate_pipelined, verdict_terms) over H200 components "
                  "measured by `bench streams` (1.7B draft server) and `bench targets` (t_v); no GPU run of the cache")
NOT_MEASURED = ["the fork's KV prefix copy per branch on the H200 (left out: the branch rows' cost is the batched "
                "step's at live + branch rows)",
                "the target's wait for a restart's answer (hit or missed) with the cache on (the model never waits)",
                "the hit rate of the Qwen3 pair's own ranks (the embedded pair's trace and CPU run stand in for it)"]


def server_point(run: dict, target: str, b: int, n: int) -> dict | None:
    """The pipelined streams point of a `bench streams` call at (target, B, N)."""
    pts = (run.get("remote_pipelined", {}).get("points", []) if target == run.get("settings", {}).get("target")
           else run.get("big_targets", {}).get(target, {}).get("pipelined", []))
    return next((p for p in pts if p.get("B") == b and p.get("N") == n and p.get("draft_ms_mean")), None)


def step_at(run: dict, rows: int, context: int = 512) -> float:
    """The draft server's batched step (ms) at `rows` rows, context 512, from the call's draft_step grid (linear
    between measured rows, extrapolated from the last two past the largest)."""
    pts = sorted((p["B"], p["step_ms"]) for part in run.get("draft_step", []) for p in part["points"]
                 if p.get("context") == context and p.get("step_ms"))
    if not pts:
        raise ValueError("no draft_step grid in the call: run `bench streams` with its step grid")
    lo = max((p for p in pts if p[0] <= rows), default=pts[0])
    hi = min((p for p in pts if p[0] > rows), default=None)
    if hi is None:
        (b0, s0), (b1, s1) = pts[-2], pts[-1]
        return s1 + (s1 - s0) / (b1 - b0) * (rows - b1)
    return lo[1] + (hi[1] - lo[1]) * (rows - lo[0]) / (hi[0] - lo[0])


def point_costs(p: dict, tv: dict, b: int, k: int, row_cost: float = 1.0) -> Costs:
    """Costs of a measured streams point: the server's step and period (times row_cost: the branch rows), the
    commit's transit both ways, the target's t_v(B, m)."""
    step = p["draft_ms_mean"] * row_cost
    one_way = (p["timeline_ms"]["sent_to_read"]["p50"] or 0.0) / 1e3
    return Costs(tv[(b, 0)] / 1e3, step / 1e3, {m + 1: tv[(b, m)] / 1e3 for m in range(1, k + 1)}, rtt=2 * one_way,
                 draft_period=max((p.get("server_period_ms_p25") or 0) * row_cost, step) / 1e3)


def cpu_hits(cpu: dict) -> dict:
    """The CPU run's measured hit rate per cache spec (its 1-stream point)."""
    return {p["cache"]: p["verdict_cache"]["hit_rate"] for p in cpu.get("points", [])
            if p["streams"] == 1 and p.get("verdict_cache")}


def terms_for(source: str, spec: str, hits: dict) -> tuple[CacheTerms | None, str]:
    """The cache's terms for a hit source, and what it is: the trace's or the synthetic model's rank shares through
    verdict_terms (the fan-out rule), or the CPU-measured hit rate over all restarts (every position covered)."""
    v = VerdictSpec.parse(spec)
    if source == "cpu-measured":
        hit = hits.get(spec)
        if hit is None:
            return None, f"no CPU point with cache {spec}"
        return (CacheTerms(PIPELINED_WINDOW, v.depth, hit, 1.0),
                f"hit rate {hit} measured on the CPU (embedded pair, real ranks, its own alpha), every position")
    ranks = Ranks(source, ALPHA, 0)
    return (verdict_terms(ALPHA, v.fanout, v.depth, v.budget, ranks.shares()[:TOP], 1.0, PIPELINED_WINDOW),
            ranks.label)


def colocated_per_gpu(run: dict, tv: dict, k: int) -> dict:
    """Modelled colocated SD at batch 1 on one GPU (sync rounds, the best k up to 4): the 1.7B's step at one row
    and the target's t_v, their times added on the one GPU."""
    c = Costs(tv[(1, 0)] / 1e3, step_at(run, 1) / 1e3, {m + 1: tv[(1, m)] / 1e3 for m in range(1, k + 1)})
    best = max(range(1, k + 1), key=lambda j: sd_tokens_per_s(ALPHA, j, c))
    return {"k": best, "tokens_per_s_per_gpu": round(sd_tokens_per_s(ALPHA, best, c), 1),
            "label": "modelled colocated SD (sync rounds, best k <= 4; 1.7B step at 1 row + t_v on one GPU)"}


def _row(call: str, run: dict, target: str, b: int, n: int, tv: dict, hits: dict) -> list[dict]:
    """Plain pipelined and each (spec, hit source) at one goal point of one call."""
    p = server_point(run, target, b, n)
    if p is None:
        return [{"call": call, "target": target, "B": b, "N": n, "missing": "no pipelined streams point"}]
    k = PIPELINED_K
    c = point_costs(p, tv, b, k)
    plain = simulate_pipelined(ALPHA, c, k, n_tokens=N_TOKENS, policy="offered")
    live = b * n
    coloc = colocated_per_gpu(run, tv, k) if n > 1 else None
    inputs = {"draft_ms_mean": p["draft_ms_mean"], "server_period_ms_p25": p.get("server_period_ms_p25"),
              "commit_one_way_ms_p50": p["timeline_ms"]["sent_to_read"]["p50"],
              "t_v_ms": {str(m): tv[(b, m)] for m in range(k + 1)}, "measured_tokens_per_step": p.get("tokens_per_step"),
              "measured_speedup": p.get("speedup")}
    out = []
    for spec in MODEL_SPECS:
        v = VerdictSpec.parse(spec)
        rows = live + min(v.budget * live, 128 - live)
        row_cost = step_at(run, rows) / step_at(run, live)
        cs = point_costs(p, tv, b, k, row_cost)
        for source in HIT_SOURCES:
            terms, what = terms_for(source, spec, hits)
            r = {"call": call, "target": target, "B": b, "N": n, "cache": spec, "hit_source": source, "hit_label": what,
                 "inputs": inputs, "row_cost": round(row_cost, 4), "rows_stepped_model": rows}
            if terms is None:
                out.append({**r, "missing": what})
                continue
            sim = simulate_pipelined(ALPHA, cs, k, n_tokens=N_TOKENS, policy="offered", cache=terms)
            r.update({"terms": terms._asdict(), "plain_tokens_per_round": round(plain["tokens_per_round"], 3),
                      "ssd_tokens_per_round": round(sim["tokens_per_round"], 3),
                      "model_hit_rate": sim["cache_hit_rate"] and round(sim["cache_hit_rate"], 3),
                      "plain_speedup_vs_target_only": round(plain["tokens_per_s"] * c.target_step, 3),
                      "ssd_speedup_vs_target_only": round(sim["tokens_per_s"] * c.target_step, 3),
                      "ssd_over_plain": round(sim["tokens_per_s"] / plain["tokens_per_s"], 3)})
            if coloc:
                per_gpu = sim["tokens_per_s"] * live / (n + 1)
                r.update({"ssd_tokens_per_s_per_gpu": round(per_gpu, 1), "colocated": coloc,
                          "ssd_over_colocated_per_gpu": round(per_gpu / coloc["tokens_per_s_per_gpu"], 3)})
            out.append(r)
    return out


def modelled(cpu: dict, calls: tuple = SERVER_STREAMS) -> dict:
    """Every goal point of every `bench streams` call, with each spec and hit source; the goals' verdicts."""
    from ...paths import REPO
    from .target import big_tv
    import json
    hits = cpu_hits(cpu)
    rows = []
    for path in calls:
        f = REPO / path
        if not f.exists():
            continue
        run = json.loads(f.read_text())
        for target, b, n in MODEL_POINTS:
            tv = big_tv(target, [b], PIPELINED_K)
            rows += _row(f.stem, run, target, b, n, tv, hits)
    return {"label": MODELLED_LABEL, "alpha": ALPHA, "k": PIPELINED_K, "window": PIPELINED_WINDOW,
            "policy": "offered (verify what is on offer, never wait)", "n_tokens": N_TOKENS,
            "calls": [p for p in calls if (REPO / p).exists()], "not_measured": NOT_MEASURED, "points": rows,
            "goals": goal_verdicts(rows)}


def goal_verdicts(rows: list[dict]) -> list[dict]:
    """Each of streambench.ssd.GOALS (and the per-GPU goal) against the modelled rows: the best spec's figure per
    hit source, the mean over calls."""
    out = []
    what_key = {"on / off": "ssd_over_plain", "speedup vs target-only": "ssd_speedup_vs_target_only"}
    goals = [(r, t, b, n, what_key[w], least) for r, t, b, n, w, least in GOALS]
    goals.append(("synthetic:0.9", "Qwen3-32B", 1, 4, "ssd_over_colocated_per_gpu", 1.0))
    for ranks, target, b, n, key, least in goals:
        for source in HIT_SOURCES:
            sel = [r for r in rows if r.get(key) is not None and r["target"] == target and r["B"] == b
                   and r["N"] == n and r["hit_source"] == source]
            if not sel:
                continue
            best = {}
            for r in sel:
                best.setdefault(r["cache"], []).append(r[key])
            spec, figs = max(best.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
            fig = round(sum(figs) / len(figs), 3)
            out.append({"goal_ranks": ranks, "hit_source": source, "target": target, "B": b, "N": n, "figure": key,
                        "least": least, "modelled": fig, "cache": spec, "met": fig >= least,
                        "as_stated": source == ranks})
    return out


def model_check(cpu: dict) -> dict:
    """The event model fed a CPU run's own components (its target forwards by width, the draft's wall period, the
    link's round trip, its alpha; cache on: its measured hit rate at every position) and the policy the client
    played (FixedPolicy's choice: the pipelined loop observes no draft step, so AdaptivePolicy.costs() stays None
    and choose_m verifies what is on offer, waiting for one): predicted tokens per target step against the
    measured, within CHECK_TOLERANCE or not."""
    out = []
    for p in cpu.get("points", []):
        comp, alpha = p["components"], p.get("alpha")
        verify = {int(m): s for m, s in comp["verify_s"].items()}
        if not verify or not comp["draft_period_ms"] or alpha is None or not p.get("tokens_per_target_step"):
            out.append({"cache": p["cache"], "streams": p["streams"], "missing": "components not measured"})
            continue
        t1 = verify.get(1) or min(verify.values())
        period = comp["draft_period_ms"] / 1e3
        c = Costs(t1, period, verify, rtt=(comp["link_rtt_ms"] or 0.0) / 1e3, draft_period=period)
        v = p.get("verdict_cache")
        terms = CacheTerms(PIPELINED_WINDOW, VerdictSpec.parse(p["cache"]).depth, v["hit_rate"] or 0.0, 1.0) if v else None
        k = cpu["config"]["k"]
        sim = simulate_pipelined(alpha, c, k, n_tokens=2000, cache=terms, policy="fixed")
        ratio = p["tokens_per_target_step"] / sim["tokens_per_round"]
        out.append({"cache": p["cache"], "streams": p["streams"], "alpha": alpha,
                    "measured_tokens_per_step": p["tokens_per_target_step"],
                    "model_tokens_per_step": round(sim["tokens_per_round"], 3), "measured_over_model": round(ratio, 3),
                    "within_15pct": abs(ratio - 1) <= CHECK_TOLERANCE})
    return {"label": "the event model fed the CPU run's own measured components, the client's policy as it ran "
                     "(fixed: verify what is on offer, waiting for one); steady state (2000 tokens) against short "
                     "requests", "points": out,
            "all_within_15pct": all(r.get("within_15pct") for r in out if "missing" not in r)}


def ssd_cpu_results() -> dict | None:
    """reports/ssd_cpu.json (streambench.ssd_cpu), or None before its first run."""
    import json
    from ...paths import REPO
    f = REPO / SSD_CPU
    return json.loads(f.read_text()) if f.exists() else None


def cpu_table(doc: dict):
    """The CPU-measured points: cache spec, streams, identity with target-only, tokens per target step, restarts,
    the hit rate (overall and by position), branches, branch rows per step, CPU wall ms per token, the model's
    tokens per step from the run's own components."""
    import pandas as pd
    check = {(r["cache"], r["streams"]): r for r in doc.get("model_check_cpu", {}).get("points", [])}
    rows = []
    for p in doc["measured_cpu"]["points"]:
        v, m = p.get("verdict_cache") or {}, check.get((p["cache"], p["streams"]), {})
        rows.append({"cache": p["cache"], "streams": p["streams"], "identical to target-only": p["greedy_identical"],
                     "alpha": p["alpha"], "tokens/target step": p["tokens_per_target_step"],
                     "model tokens/step": m.get("model_tokens_per_step"), "measured / model": m.get("measured_over_model"),
                     "restarts": p["restarts"], "hit rate": v.get("hit_rate"),
                     "hit rate by position": v.get("hit_rate_by_position"), "branches": v.get("branches"),
                     "branch rows/step": v.get("branch_rows_per_step"), "CPU ms/token (a stream)": p["wall_ms_per_token"],
                     "CPU ms/token (all streams)": p.get("wall_ms_per_token_all_streams")})
    return pd.DataFrame(rows)


def modelled_table(doc: dict):
    """The modelled H200 points: call, target, (B, N), spec, hit source, plain and SSD speedups over target-only,
    SSD over plain, and per GPU against modelled colocated SD at N = 4."""
    import pandas as pd
    rows = [{"call": r["call"], "target": r["target"], "B": r["B"], "N": r["N"], "cache": r.get("cache"),
             "hit source": r.get("hit_source"), "model hit rate": r.get("model_hit_rate"), "row cost": r.get("row_cost"),
             "plain vs target-only": r.get("plain_speedup_vs_target_only"),
             "SSD vs target-only": r.get("ssd_speedup_vs_target_only"), "SSD / plain": r.get("ssd_over_plain"),
             "SSD / colocated per GPU": r.get("ssd_over_colocated_per_gpu")}
            for r in doc["modelled"]["points"] if "missing" not in r]
    return pd.DataFrame(rows)


def goals_table(doc: dict):
    import pandas as pd
    # (no "goal" in the cells: a rendered page states each goal's figure once, from status.sources.GOALS)
    return pd.DataFrame([{"point": f"{g['target']} B={g['B']} N={g['N']}", "figure": g["figure"].replace("_", " "),
                          "at least": g["least"], "issue's ranks": g["goal_ranks"], "hit source": g["hit_source"],
                          "modelled": g["modelled"], "best cache": g["cache"], "reached (modelled)": g["met"]}
                         for g in doc["modelled"]["goals"]])


def answer_line(doc: dict) -> str:
    """One sentence: what verdict speculation changes, from the JSON (labels kept)."""
    pts = [p for p in doc["measured_cpu"]["points"] if p.get("verdict_cache")]
    best = max(pts, key=lambda p: p["verdict_cache"]["hit_rate"] or 0, default=None)
    off = {p["streams"]: p for p in doc["measured_cpu"]["points"] if p["cache"] == "off"}
    ident = all(p["greedy_identical"] for p in doc["measured_cpu"]["points"])
    g = {(x["goal_ranks"], x["target"], x["N"], x["figure"], x["hit_source"]): x for x in doc["modelled"]["goals"]}
    t32 = g.get(("trace", "Qwen3-32B", 1, "ssd_over_plain", "trace"))
    s32 = g.get(("synthetic:0.9", "Qwen3-32B", 1, "ssd_over_plain", "synthetic:0.9"))
    c32 = g.get(("trace", "Qwen3-32B", 1, "ssd_over_plain", "cpu-measured"))
    cpu = (f"measured on the CPU (embedded pair, real ranks): hit rate {best['verdict_cache']['hit_rate']:.0%} of "
           f"restarts with {best['cache']}, tokens per target step {best['tokens_per_target_step']} against "
           f"{off[best['streams']]['tokens_per_target_step']} without, greedy output "
           f"{'identical to' if ident else 'DIFFERENT from'} target-only") if best and best["streams"] in off else \
        "no CPU point with the cache on"
    mod = (f"modelled on H200 components (alpha 0.71): {t32['modelled']}x over plain pipelined at the Qwen3-32B with "
           f"the embedded trace's ranks ({'reaching' if t32['met'] else 'short of'} the issue's {t32['least']}), "
           f"{c32['modelled'] if c32 else 'n/a'}x at the CPU-measured hit rate, {s32['modelled']}x at a synthetic 0.9 "
           f"hit rate ({'reaching' if s32['met'] else 'short of'} {s32['least']})") if t32 and s32 else \
        "no modelled 32B point"
    return (f"Verdict speculation: {mod}; {cpu}. The embedded pair's hit rate is a floor, not a forecast (a 135M "
            f"target and a 6-layer distilled draft); the H200 calls' measured cache points are in the table above.")

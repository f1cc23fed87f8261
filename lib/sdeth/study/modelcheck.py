"""The event model against every pipelined measurement on GPUs: predicted and measured speedup side by side.

`costmodel.simulate_pipelined` predicts a pipelined run from its own component costs. A run's prediction is
stored when it is made; this re-predicts each stored measurement with the model as it is now, so a change to
the model is judged on all the measurements at once (`recheck`), and says where each input came from:

- a `bench sd` run keeps its per-request records: it is summarized again (`summary.summarize`). Records made
  before the link's own round trip was kept (`link_rtt_ms`) take the link probe's figure from the same
  session's RTT sweep at no added delay (its first point).
- a `bench rtt` point made since keeps its costs; an older one borrows the costs of the same session's
  `bench sd` run of the same pair and mode (verify widths, the draft's device step and period, the target's
  host work per round), with the point's own alpha and probed round trip (the round trip as the target lived
  it moved by the probe's difference).
"""
from __future__ import annotations

from dataclasses import fields

from pathlib import Path

from .. import costmodel
from ..paths import REPO
from ..runtime.pipeline import parse_cache
from .config import RunConfig
from .summary import draft_period, rank_shares, summarize


def _config(d: dict) -> RunConfig:
    names = {f.name for f in fields(RunConfig)}
    return RunConfig(**{k: v for k, v in d.items() if k in names})


def _costs(d: dict) -> costmodel.Costs:
    return costmodel.Costs(**{**d, "verify_s": {int(m): v for m, v in d["verify_s"].items()}})


def _probe_at_zero(sweeps: list[dict], pair: str) -> float | None:
    pts = [p for b in sweeps if b["config"]["pair"] == pair for p in b["points"] if p["rtt_set_ms"] == 0]
    return pts[0]["rtt_probe_ms"] if pts else None


def _trace(path: str | None) -> str | None:
    """A stored run's trace path (relative to the repository where it was made) as it is found here."""
    if not path or Path(path).exists():
        return path
    return str(REPO / path) if (REPO / path).exists() else path


def _predict_point(p: dict, c: costmodel.Costs, k_max: int, trace: str | None, target_step: float, ttft_s: float,
                   n: int) -> tuple[float, float | None]:
    """The model's speedup over target-only for requests of n tokens, each paying its TTFT (as measured
    speedups do), and its hit rate."""
    terms = None
    if p["mode"] == "cached":
        fanout, depth, ranks = parse_cache(p.get("cache") or "on")
        shares = rank_shares(trace) if trace else [0.0, p.get("cache_hit_rate") or 0.0]
        terms = costmodel.cache_terms(fanout, depth, ranks if trace else 1, shares, {})
    sim = costmodel.simulate_pipelined(p["alpha"], c, k_max, n_tokens=4000, cache=terms)
    return (ttft_s + (n - 1) * target_step) / (ttft_s + (n - 1) / sim["tokens_per_s"]), sim["cache_hit_rate"]


def recheck(results: dict[str, dict]) -> list[dict]:
    """results: name -> a `bench sd` or `bench rtt` JSON (report.gpu_results()). One row per pipelined
    measurement (with or without the outcome cache) on two devices: measured speedup with its interval,
    the model's prediction when the run was made, the model's now, the hit rates, and the inputs' source."""
    sweeps = [b for b in results.values() if b.get("bench") == "rtt"]
    benches = {n: b for n, b in results.items() if b.get("bench") == "sd" and b.get("runs")}
    rows = []
    for name, b in benches.items():
        if not b.get("draft_hardware") or b["draft_hardware"].get("device") == b["hardware"].get("device"):
            continue                             # both workers on one device: contended, not what the model is
        probe = _probe_at_zero(sweeps, b["config"]["pair"])
        base = b["runs"]["target-only"]
        for mode, run in b["runs"].items():
            if run["summary"]["mode"] != "pipelined":
                continue
            reqs = [dict(r) for r in run["requests"]]
            source, valid = "own records", True
            if probe is not None and all(r.get("link_rtt_ms") is None for r in reqs):
                for r in reqs:
                    r["link_rtt_ms"] = probe
                source += f", link {probe:.2f} ms from the session's probe"
            if not any(r.get("draft_period_ms") for r in reqs):
                source += ", draft period estimated"
                if b["draft_hardware"].get("device") == "cpu":
                    source += " (not valid: a CPU draft prefills for seconds inside the decode)"
                    valid = False
            s = summarize(reqs, _config({**run["config"], "synthetic_trace": _trace(run["config"].get("synthetic_trace"))}))
            if not s.get("predicted_tokens_per_s"):
                continue                         # nothing to predict from (no draft token in the run)
            row = next(r for r in b["rows"] if r["mode"] == mode)
            rows.append({"run": name, "pair": b["config"]["pair"], "mode": mode, "rtt probe ms": probe,
                         "measured": row["speedup"], "95% low": row["speedup_ci95"][0], "95% high": row["speedup_ci95"][1],
                         "predicted then": row["predicted_speedup"],
                         "predicted now": s["predicted_tokens_per_s"] / base["summary"]["predicted_tokens_per_s"],
                         "hit rate": s.get("cache_hit_rate"), "hit rate predicted": s.get("predicted_cache_hit_rate"),
                         "inputs": source, "valid": valid})
    for sw_name, sw in results.items():
        if sw.get("bench") != "rtt":
            continue
        pair = sw["config"]["pair"]
        lender = next((b for b in benches.values() if b["config"]["pair"] == pair and b.get("draft_hardware")
                       and b["draft_hardware"].get("device") != b["hardware"].get("device")), None)
        for p in sw["points"]:
            if p["mode"] not in ("pipelined", "cached"):
                continue
            if p.get("costs") and sw.get("target_only"):
                c, source = _costs(p["costs"]), "own costs"
                step, ttft = sw["target_only"]["target_step"], sw["target_only"]["ttft_s"]
            elif lender is not None:
                run = lender["runs"]["cached" if p["mode"] == "cached" else "pipelined"]
                s0 = run["summary"]
                c = _costs(s0["costs"])
                c.draft_period = c.draft_period or draft_period(run["requests"], c.draft_step)
                probe0 = _probe_at_zero(sweeps, pair) or 0.0
                c.rtt = c.rtt + (p["rtt_probe_ms"] - probe0) / 1e3
                c.link_rtt = p["rtt_probe_ms"] / 1e3
                ref = lender["runs"]["target-only"]["summary"]
                step, ttft = ref["costs"]["target_step"], ref["ttft_ms"] / 1e3
                source = "costs of the session's bench sd run (draft period estimated), own alpha and probe"
            else:
                continue
            trace = _trace(sw["config"].get("synthetic_trace"))
            pred, hit = _predict_point(p, c, sw.get("k_max", 8), trace, step, ttft, sw["config"]["max_tokens"])
            rows.append({"run": sw_name, "pair": pair, "mode": p["mode"], "rtt probe ms": p["rtt_probe_ms"],
                         "measured": p["speedup"], "95% low": p["speedup_ci95"][0], "95% high": p["speedup_ci95"][1],
                         "predicted then": p["predicted_speedup"], "predicted now": pred,
                         "hit rate": p.get("cache_hit_rate"), "hit rate predicted": hit if p["mode"] == "cached" else None,
                         "inputs": source, "valid": True})
    for r in rows:
        r["error now"] = r["predicted now"] / r["measured"] - 1
        r["error then"] = r["predicted then"] / r["measured"] - 1 if r["predicted then"] else None
    return rows


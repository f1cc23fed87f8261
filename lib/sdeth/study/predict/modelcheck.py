"""The event model against every measurement on two GPUs: predicted and measured speedup side by side.

`costmodel.simulate_pipelined` predicts a pipelined run from its own component costs (the other modes have the
closed-form round model, `costmodel`). A run's prediction is stored when it is made (*stored*); `recheck`
predicts each stored measurement again with the model as it is now (*current*), so a change to the model is judged
on all the measurements at once, and says where each input came from:

- a `bench sd` run keeps its per-request records: it is summarized again (`summary.summarize`). Records that kept
  no link round trip of their own (`link_rtt_ms`) take the link probe's figure from the RTT sweep of the same pair
  at no added delay (its first point).
- a `bench rtt` point that kept its costs is predicted from them; one that did not borrows the costs of the
  `bench sd` run of the same pair and mode (verify widths, the draft's device step and period, the target's host
  work per round), with the point's own alpha and probed round trip (the round trip as the target lived it moved
  by the probe's difference).

A row is *valid* when the model describes what was run; `why not` says why not (e.g. a CPU draft whose prefill
takes seconds inside the decode, which the model does not charge).
"""
from __future__ import annotations

from dataclasses import fields

from pathlib import Path

from ... import costmodel
from ...paths import REPO
from ...runtime.specs import AHEAD, parse_branch_spec
from ..config import RunConfig
from ..summary import draft_period, rank_shares, summarize


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
    speedups do), and its hit rate; the model plays the step policy the point recorded."""
    terms, shape = None, p.get("cache") or "on"
    if p["mode"] == "cached" and shape not in ("off", AHEAD):    # (branches sent ahead: not modelled here)
        # a stored point's branches as its sweep wrote them: FANOUTxDEPTHxRANKS, 'on' for 4x4x2
        fanout, depth, ranks = parse_branch_spec(shape, "cache", "4x4x2", "RANKS")
        shares = rank_shares(trace) if trace else [0.0, p.get("cache_hit_rate") or 0.0]
        terms = costmodel.cache_terms(fanout, depth, ranks if trace else 1, shares, {})
    sim = costmodel.simulate_pipelined(p["alpha"], c, k_max, n_tokens=4000, cache=terms,
                                       policy=p.get("step_policy") or "")   # runs before it played "adaptive"
    return (ttft_s + (n - 1) * target_step) / (ttft_s + (n - 1) / sim["tokens_per_s"]), sim["cache_hit_rate"]


def _fill_link(reqs: list[dict], probe: float | None) -> str:
    """Give records without their own link round trip the sweep's probe; returns the inputs' description."""
    if probe is not None and all(r.get("link_rtt_ms") is None for r in reqs):
        for r in reqs:
            r["link_rtt_ms"] = probe
        return f"own records, link {probe:.2f} ms from the same pair's RTT sweep"
    return "own records"


def _bench_rows(name: str, b: dict, sweeps: list[dict], modes) -> list[dict]:
    """One row per SD run of a `bench sd` result on two devices (modes: the summary modes to keep; None: all)."""
    if not b.get("draft_hardware") or b["draft_hardware"].get("device") == b["hardware"].get("device"):
        return []                                # both workers on one device: contended, not what the model is
    probe = _probe_at_zero(sweeps, b["config"]["pair"])
    base = b["runs"]["target-only"]
    rows = []
    for mode, run in b["runs"].items():
        kind = run["summary"]["mode"]
        if kind == "target-only" or (modes and kind not in modes):
            continue
        reqs = [dict(r) for r in run["requests"]]
        source, why_not = _fill_link(reqs, probe), ""
        if kind == "pipelined" and not any(r.get("draft_period_ms") for r in reqs):
            source += ", draft period estimated"
            if b["draft_hardware"].get("device") == "cpu":
                why_not = "a CPU draft prefills for seconds inside the decode, which the model does not charge"
        s = summarize(reqs, _config({**run["config"], "synthetic_trace": _trace(run["config"].get("synthetic_trace"))}))
        base_pred = base["summary"].get("predicted_tokens_per_s")
        if not (s.get("predicted_tokens_per_s") and base_pred):
            why_not = "its records give the model nothing to predict from (no component costs)"
        row = next(r for r in b["rows"] if r["mode"] == mode)
        rows.append({"run": name, "bench": "sd", "pair": b["config"]["pair"], "mode": mode, "kind": kind,
                     "rtt probe ms": probe,
                     "measured": row["speedup"], "95% low": row["speedup_ci95"][0], "95% high": row["speedup_ci95"][1],
                     "stored": row["predicted_speedup"],
                     "current": s["predicted_tokens_per_s"] / base_pred if s.get("predicted_tokens_per_s") and base_pred
                     else None,
                     "hit rate": s.get("cache_hit_rate"), "hit rate predicted": s.get("predicted_cache_hit_rate"),
                     "inputs": source, "valid": not why_not, "why not": why_not})
    return rows


def _borrowed_costs(lender: dict, p: dict, probe0: float) -> tuple[costmodel.Costs, float, float]:
    """A sweep point without costs of its own: the lender's (a `bench sd` run of the same pair) at the point's
    probed round trip. Returns (costs, target step s, TTFT s)."""
    run = lender["runs"]["cached" if p["mode"] == "cached" else "pipelined"]
    c = _costs(run["summary"]["costs"])
    c.draft_period = c.draft_period or draft_period(run["requests"], c.draft_step)
    c.rtt = c.rtt + (p["rtt_probe_ms"] - probe0) / 1e3
    c.link_rtt = p["rtt_probe_ms"] / 1e3
    ref = lender["runs"]["target-only"]["summary"]
    return c, ref["costs"]["target_step"], ref["ttft_ms"] / 1e3


def _sweep_rows(name: str, sw: dict, benches: dict[str, dict], sweeps: list[dict]) -> list[dict]:
    """One row per pipelined point (with or without the outcome cache) of a `bench rtt` sweep."""
    pair = sw["config"]["pair"]
    lender = next((b for b in benches.values() if b["config"]["pair"] == pair and b.get("draft_hardware")
                   and b["draft_hardware"].get("device") != b["hardware"].get("device")), None)
    rows = []
    for p in sw["points"]:
        if p["mode"] not in ("pipelined", "cached"):
            continue
        if p.get("costs") and sw.get("target_only"):
            c, source = _costs(p["costs"]), "own costs"
            step, ttft = sw["target_only"]["target_step"], sw["target_only"]["ttft_s"]
        elif lender is not None:
            c, step, ttft = _borrowed_costs(lender, p, _probe_at_zero(sweeps, pair) or 0.0)
            source = "costs of the same pair's bench sd run (draft period estimated), own alpha and probe"
        else:
            continue
        trace = _trace(sw["config"].get("synthetic_trace"))
        pred, hit = _predict_point(p, c, sw.get("k_max", 8), trace, step, ttft, sw["config"]["max_tokens"])
        rows.append({"run": name, "bench": "rtt", "pair": pair, "mode": p["mode"], "kind": "pipelined",
                     "rtt probe ms": p["rtt_probe_ms"],
                     "measured": p["speedup"], "95% low": p["speedup_ci95"][0], "95% high": p["speedup_ci95"][1],
                     "stored": p["predicted_speedup"], "current": pred,
                     "hit rate": p.get("cache_hit_rate"), "hit rate predicted": hit if p["mode"] == "cached" else None,
                     "inputs": source, "valid": True, "why not": ""})
    return rows


def recheck(results: dict[str, dict], modes: tuple | None = ("pipelined",)) -> list[dict]:
    """results: name -> a `bench sd` or `bench rtt` JSON (report.gpu_results()). One row per measurement on two
    devices whose summary mode is in `modes` (None: every SD mode; RTT sweeps give pipelined points): measured
    speedup with its interval, the model's stored and current predictions, their errors, the hit rates, the
    inputs' source and whether the model is valid for the run."""
    sweeps = [b for b in results.values() if b.get("bench") == "rtt"]
    benches = {n: b for n, b in results.items() if b.get("bench") == "sd" and b.get("runs")}
    rows = [r for name, b in benches.items() for r in _bench_rows(name, b, sweeps, modes)]
    rows += [r for name, sw in results.items() if sw.get("bench") == "rtt" for r in _sweep_rows(name, sw, benches, sweeps)]
    for r in rows:
        r["error current"] = r["current"] / r["measured"] - 1 if r["current"] else None
        r["error stored"] = r["stored"] / r["measured"] - 1 if r["stored"] else None
    return rows

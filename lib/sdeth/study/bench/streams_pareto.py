"""The H200 figures of `python -m sdeth bench streams` set on the TPOT Pareto axes (notebooks/25_draft_server):
each call's points beside replicas and EAGLE-3, the event model's check, the answer, and tokens/s per unit of GPU price.
"""
from __future__ import annotations

import statistics


def bench_runs() -> dict[str, dict]:
    """The `bench streams` results of reports/gpu (bench_streams_*.json), by file stem; a call that stopped part
    way (a name with 'partial') and one a later call superseded (its JSON says why) are left out."""
    from ..results import gpu_results
    return {n: g for n, g in gpu_results().items()
            if g.get("bench") == "streams" and "partial" not in n and "superseded" not in g}


def tables_of(run: dict):
    """pareto.Tables from one `bench streams` call: t(B) and t_v(B, k) of the target (graph replays), the
    draft's batch step at the run's context; rtt: the loopback network share the remote points measured."""
    from ..predict import pareto
    pts = run["target"]["points"]
    draft = run["settings"]["drafts"][0]
    part = next(p for p in run["draft_step"] if p.get("draft") == draft and "points" in p)
    ctx = run["settings"]["context"]
    net = [p["split_ms_p50"]["network"] for p in run.get("remote", {}).get("points", []) if "split_ms_p50" in p]
    shape = run["settings"]["shapes"][run["settings"]["target"]]
    return pareto.Tables(
        {p["B"]: p["replay_ms"] / 1e3 for p in pts if not p["k"] and "replay_ms" in p},
        {(p["B"], p["k"]): p["replay_ms"] / 1e3 for p in pts if p["k"] and "replay_ms" in p},
        {p["B"]: p["step_ms"] / 1e3 for p in part["points"] if p["context"] == ctx},
        shape["num_hidden_layers"], rtt_s=max(statistics.median(net), 0.0) / 1e3 if net else 0.0,
        source=f"measured: {run['hardware'].get('label', 'one GPU')}, random weights")


def _measured(kind: str, label: str, p: dict, n: int, gpus: int) -> dict:
    return {"kind": kind, "B": p["B"], "N": n, "k": p["k"], "tpot_ms": p["tpot_ms"]["mean"],
            "tpot_p99_ms": p["tpot_ms"]["p99"], "tok_s_per_gpu": p["tokens_per_s_per_gpu"], "gpus": gpus,
            "label": label}


def pareto_rows(run: dict, alpha: float) -> list[dict]:
    """Every point of one call on the Pareto axes: replicas (measured t(B)), colocated SD, remote shared SD with
    sync rounds and with pipelined streams (emulated targets against the real draft server), all measured; and
    EAGLE-3 (modelled from the measured t(B): pareto.eagle_points)."""
    from ..predict import pareto
    t = tables_of(run)
    hw = run["hardware"].get("label", "one GPU")
    rows = [dict(r, label=f"target-only replicas (measured t(B), {hw})") for r in pareto.replica_points(t)]
    for part in run.get("colocated", [])[:1]:
        rows += [_measured("colocated", f"colocated SD, {part['draft']} shape (measured, one GPU)", p, 1, 1)
                 for p in part["points"] if "tpot_ms" in p]
    for key, kind, what in (("remote", "remote", "sync rounds"), ("remote_pipelined", "pipelined", "pipelined streams")):
        pts = [p for p in run.get(key, {}).get("points", []) if "tpot_ms" in p]
        rows += [_measured(kind, f"remote shared SD, {what} (emulated targets, real draft server)", p, p["N"],
                           p["N"] + 1) for p in pts]
    rows += pareto.eagle_points(t)
    return rows


def goal_table(runs: dict):
    """Each call's draft batch step and host time at the goal's rows, against the goals."""
    import pandas as pd
    rows = [{"call": name, **{k: v for k, v in g.items() if k != "draft"}} for name, run in runs.items()
            for g in run.get("goal_check", [])]
    return pd.DataFrame(rows)


def step_table(runs: dict, draft: str | None = None):
    """The draft's batch step (device ms) by rows and context, one column per call."""
    import pandas as pd
    out = {}
    for name, run in runs.items():
        d = draft or run["settings"]["drafts"][0]
        for part in run.get("draft_step", []):
            if part.get("draft") != d or "points" not in part:
                continue
            for p in part["points"]:
                out.setdefault((part["compile"], p["context"], p["B"]), {})[f"{name} step ms"] = p["step_ms"]
                out[(part["compile"], p["context"], p["B"])][f"{name} host ms/step"] = p.get("host_ms_per_step")
    df = pd.DataFrame(out).T
    df.index.names = ["compile", "context", "rows"]
    return df


def target_table(runs: dict):
    """The target's t(B) and t_v(B, k) (device ms, graph replays), one column per call."""
    import pandas as pd
    out = {}
    for name, run in runs.items():
        for p in run["target"]["points"]:
            out.setdefault((p["B"], p["k"] or 0), {})[name] = p.get("replay_ms")
    df = pd.DataFrame(out).T
    df.index.names = ["B", "k (0: a plain step)"]
    return df


def model_check(run: dict, alpha: float, rounds: int = 600) -> "object":
    """Each measured remote point beside the event model's prediction from the same call's measured steps (sync
    rounds: pareto.simulate_shared; pipelined streams: pareto.pipelined_round), and whether it is within 15%."""
    import pandas as pd
    from ..predict import pareto
    t = tables_of(run)
    rows = []
    for p in (p for p in run.get("remote", {}).get("points", []) if "tpot_ms" in p):
        sim = pareto.simulate_shared(t, alpha, p["k"], p["B"], p["N"], rounds=rounds)
        rows.append({"mode": "sync rounds", "B": p["B"], "N": p["N"], "k": p["k"],
                     "measured TPOT ms": p["tpot_ms"]["mean"], "model TPOT ms": sim["tpot_ms_mean"],
                     "measured tok/s/GPU": p["tokens_per_s_per_gpu"], "model tok/s/GPU": sim["tok_s_per_gpu"]})
    for p in (p for p in run.get("remote_pipelined", {}).get("points", []) if "tpot_ms" in p):
        T, m = pareto.pipelined_round(t, alpha, p["k"], p["B"], p["N"])
        tpot = T / pareto.expected_tokens(alpha, m) * 1e3
        rows.append({"mode": "pipelined streams", "B": p["B"], "N": p["N"], "k": p["k"],
                     "measured TPOT ms": p["tpot_ms"]["mean"], "model TPOT ms": tpot,
                     "measured tok/s/GPU": p["tokens_per_s_per_gpu"],
                     "model tok/s/GPU": p["N"] * p["B"] / (tpot / 1e3) / (p["N"] + 1)})
    df = pd.DataFrame(rows)
    if len(df):
        df["model / measured (TPOT)"] = df["model TPOT ms"] / df["measured TPOT ms"]
        df["within 15%"] = (df["model / measured (TPOT)"] - 1).abs() <= 0.15
    return df


def answer(runs: dict, alpha: float) -> dict:
    """pareto.answer for each call (its own measured t(1) as the reference), with the call's compile setting and
    the pipelined streams' drafts on offer per target step (mean over its points)."""
    from ..predict import pareto
    out = {}
    for name, run in runs.items():
        rows = pareto_rows(run, alpha)
        t1 = tables_of(run).t(1) * 1e3
        offered = [p["offered_mean"] for p in run.get("remote_pipelined", {}).get("points", []) if "offered_mean" in p]
        out[name] = {"t1_ms": t1, "hardware": run["hardware"].get("label"), "compile": run["settings"]["compile"],
                     "pipelined_offered_per_step": statistics.fmean(offered) if offered else None,
                     "at_t1": {k: pareto.throughput_at([r for r in rows if r["kind"] == k], t1) for k in pareto.KINDS},
                     **pareto.answer(rows, t1)}
    return out


def compiled_calls(ans: dict) -> list[str]:
    """The calls whose models ran compiled (as the draft server is meant to run on a GPU), oldest first."""
    return sorted(n for n, a in ans.items() if not str(a.get("compile", "")).startswith("none"))


def answer_lines(ans: dict) -> str:
    """The answer in words, each call on its own line."""
    def x(v):
        return f"{v:.2f}x" if v is not None else "n/a"

    def tps(v):
        return f"{v:.0f}" if v is not None else "unreachable"
    lines = []
    for name, a in ans.items():
        thr = a["tok_s_per_gpu"]
        cross = {k: v["tpot_ms"] for k, v in a["replicas_win_above_ms"].items()}
        lines.append(
            f"{name} ({a['hardware']}, compile {a['compile']}, t(1) {a['t1_ms']:.2f} ms): at TPOT <= {a['tpot_budget_ms']:.2f} ms (0.9 t(1)), "
            f"tokens/s per GPU: replicas {tps(thr['replica'])}, colocated SD {tps(thr['colocated'])}, remote sync "
            f"{tps(thr['remote'])}, remote pipelined {tps(thr['pipelined'])}, EAGLE-3 (modelled) {tps(thr['eagle3'])}; "
            f"remote pipelined / colocated {x(a['pipelined_over_colocated'])}, remote sync / colocated "
            f"{x(a['remote_over_colocated'])}; replicas give more tokens/s per GPU above TPOT "
            + ", ".join(f"{k} {v:.2f} ms" if v is not None else f"{k}: never" for k, v in cross.items())
            + (f"; pipelined streams found {a['pipelined_offered_per_step']:.2f} drafts on offer per target step"
               if a.get("pipelined_offered_per_step") is not None else ""))
    return "\n".join(lines)


def per_cost(rows: list[dict], draft_price: float = 1.0) -> list[dict]:
    """Pareto rows per unit of GPU price: a target GPU costs 1, the draft server's GPU `draft_price` (1: the same
    GPU). Remote rows (N targets + 1 draft GPU) count N + draft_price; the others their own GPUs. Adds
    tok_s_per_cost; tok_s_per_gpu is kept."""
    out = []
    for r in rows:
        cost = r["N"] + draft_price if r["kind"] in ("remote", "pipelined") else r["gpus"]
        out.append({**r, "cost": cost, "tok_s_per_cost": r["tok_s_per_gpu"] * r["gpus"] / cost})
    return out


def cost_table(run: dict, alpha: float, budgets_ms=(5.0, 6.0, 8.0, 12.0), prices=(1.0, 0.5)):
    """The most tokens/s per unit of GPU price at TPOT <= each budget, per kind, for each draft-GPU price ratio."""
    import pandas as pd
    from ..predict import pareto
    rows = pareto_rows(run, alpha)
    out = []
    for price in prices:
        priced = [dict(r, tok_s_per_gpu=r["tok_s_per_cost"]) for r in per_cost(rows, price)]
        for b in budgets_ms:
            out.append({"draft GPU price": price, "TPOT <= ms": b,
                        **{k: pareto.throughput_at(priced, b, k) for k in pareto.KINDS}})
    return pd.DataFrame(out)

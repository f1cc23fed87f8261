"""Run summaries: timing and acceptance (vLLM's definitions), where the time went, the cost model's
prediction from the run's own alpha and component costs; the sweep's table and model curves."""
from __future__ import annotations

import statistics

from .. import costmodel, metrics
from .config import RunConfig


def identical_outputs(run: dict, reference: dict) -> bool:
    """Whether two results decoded the same token ids for every request (lossless against a reference)."""
    return [q["output_ids"] for q in run["requests"]] == [q["output_ids"] for q in reference["requests"]]


def _widths(reqs: list[dict]) -> dict[int, float]:
    """Mean seconds of a target forward of m tokens during rounds, per m, over a run."""
    tot: dict[int, list] = {}
    for r in reqs:
        for m, (n, sec) in r.get("verify_widths", {}).items():
            t = tot.setdefault(int(m), [0, 0.0])
            t[0] += n
            t[1] += sec
    return {m: sec / n for m, (n, sec) in sorted(tot.items()) if n}


def summarize(reqs: list[dict], cfg: RunConfig) -> dict:
    """Run summary: timing, acceptance (vLLM's definitions), where the time went, and the cost
    model's prediction from this run's own alpha and component costs."""
    sd = cfg.mode != "target-only"
    out = {"mode": cfg.mode, "k": cfg.k if sd else None, "adaptive": cfg.adapts if sd else None,
           "placement": cfg.placement, "rtt_ms": cfg.rtt_ms, **metrics.timing(reqs),
           "tokens_without_draft": sum(r.get("tokens_without_draft", 0) for r in reqs)}
    drafts = sum(r["drafts"] for r in reqs)
    per_pos = [sum(r["accepted_per_pos"][i] for r in reqs) for i in range(cfg.k)] if sd else []
    varying = cfg.mode == "pipelined" or cfg.adapts
    out.update(metrics.acceptance(drafts, sum(r["draft_tokens"] for r in reqs),
                                  sum(r["accepted_tokens"] for r in reqs), per_pos,
                                  sum(r.get("rejections", 0) for r in reqs) if varying else None))
    decode_s = sum(r["e2e_s"] - r["ttft_ms"] / 1e3 for r in reqs)
    draft_s = sum(r["draft_s"] + r["draft_prefill_s"] for r in reqs)
    verify_s = sum(r["verify_s"] for r in reqs)
    wire_s = sum(r["wire_s"] for r in reqs)
    if cfg.mode == "pipelined":   # the draft runs beside the target: only the waiting is on the clock
        out["time_breakdown_s"] = {"prefill": sum(r["ttft_ms"] for r in reqs) / 1e3, "wait for drafts": wire_s,
                                   "verify": verify_s, "other": decode_s - verify_s - wire_s}
        out["draft_compute_overlapped_s"] = draft_s
    else:
        out["time_breakdown_s"] = {"prefill": sum(r["ttft_ms"] for r in reqs) / 1e3, "draft": draft_s, "wire": wire_s,
                                   "verify" if sd else "decode": verify_s,
                                   "other": decode_s - draft_s - verify_s - wire_s}
    n_tokens = [len(r["output_ids"]) for r in reqs]
    ttft = out["ttft_ms"] / 1e3
    if not sd:
        steps = sum(max(n - 1, 0) for n in n_tokens)
        step = decode_s / steps if steps else 0.0
        out["costs"] = costmodel.Costs(target_step=step, draft_step=0.0).to_dict()
        total = sum(ttft + max(n - 1, 0) * step for n in n_tokens)
        out["predicted_tokens_per_s"] = sum(n_tokens) / total if total else None
        return out
    rounds = sum(len(r.get("k_trace") or []) or r["rounds"] for r in reqs)
    out["k_trace"] = [m for r in reqs for m in r.get("k_trace", [])]
    if not drafts or out["alpha"] is None:
        out["predicted_tokens_per_s"] = None
        return out
    widths = _widths(reqs)
    alpha = out["alpha"]
    if cfg.mode == "pipelined":
        streamed = sum(r.get("drafted", 0) for r in reqs)
        rtts = [r["rtt_est_ms"] for r in reqs if r.get("rtt_est_ms") is not None]
        c = costmodel.Costs(
            target_step=widths.get(1, 0.0), draft_step=sum(r["draft_s"] for r in reqs) / max(streamed, 1),
            verify_s=widths, rtt=(statistics.mean(rtts) / 1e3 if rtts else cfg.rtt_ms / 1e3),
            overhead=(decode_s - verify_s - wire_s) / rounds)
        if 1 not in widths:      # no plain step in the run: extrapolate a step from the two narrowest widths
            c.target_step = c.verify(1) if len(widths) > 1 else min(widths.values())
        sim = costmodel.simulate_pipelined(alpha, c, cfg.k, n_tokens=4000, seed=cfg.seed, adaptive=cfg.adapts)
        rate = sim["tokens_per_s"]
        out["plain_steps"] = sum(r.get("plain_steps", 0) for r in reqs)
        out["drafted_tokens"] = streamed
        out["model_pipeline"] = sim
    else:
        draft_prefill = statistics.mean(r["draft_prefill_s"] for r in reqs)
        c = costmodel.Costs(
            target_step=0.0,         # not measured in an SD run (stored as null); pair it with a target-only run
            draft_step=sum(r["draft_s"] for r in reqs) / sum(r["draft_tokens"] for r in reqs),
            verify_s=widths, rtt=wire_s / rounds,
            overhead=(decode_s - draft_s - verify_s - wire_s) / rounds + draft_prefill * len(reqs) / rounds)
        ks = out["k_trace"] or [cfg.k]
        rate = (sum(costmodel.expected_tokens(alpha, k) for k in ks)
                / sum(costmodel.round_time(c, k) for k in ks))
        out["wire_ms_per_round"] = wire_s / rounds * 1e3
        if cfg.placement == "ethernet":    # the wire split by the draft's own timestamps, beside the floor
            out["link_ms_per_round"] = sum(r.get("link_s", 0.0) for r in reqs) / rounds * 1e3
            out["draft_host_ms_per_round"] = sum(r.get("draft_host_s", 0.0) for r in reqs) / rounds * 1e3
            bare = [r["bare_rtt_ms"] for r in reqs if r.get("bare_rtt_ms") is not None]
            out["bare_rtt_ms"] = statistics.median(bare) if bare else None
    draft_run_s = sum(r["draft_s"] for r in reqs)
    waited_prefill_s = 0.0 if cfg.mode == "pipelined" else sum(r["draft_prefill_s"] for r in reqs)
    out["components_ms_per_round"] = {   # where a round's time goes on each side (device time from events on CUDA)
        "target_host": (decode_s - verify_s - wire_s - (0.0 if cfg.mode == "pipelined" else draft_run_s)
                        - waited_prefill_s) / rounds * 1e3,
        "draft_prefill_waited": waited_prefill_s / rounds * 1e3,
        "target_gpu_idle": (decode_s - verify_s) / rounds * 1e3,
        "draft_gpu_idle": max(decode_s - draft_run_s, 0.0) / rounds * 1e3,
        "wire": wire_s / rounds * 1e3}
    if any(r.get("verify_wall_s") for r in reqs):   # sync SD: the target's host work, split
        comp = out["components_ms_per_round"]
        comp["target_verify_overhead"] = sum(r["verify_wall_s"] - r["verify_s"] for r in reqs) / rounds * 1e3
        comp["target_between_rounds"] = sum(r.get("between_s", 0.0) for r in reqs) / rounds * 1e3
    restarts = [x for r in reqs for x in r.get("restarts_ms") or []]
    if restarts:
        out["restart_ms"] = {"mean": statistics.mean(restarts), "median": statistics.median(restarts),
                             "p90": sorted(restarts)[int(0.9 * (len(restarts) - 1))], "n": len(restarts)}
    if cfg.placement == "ethernet":
        out["bytes_per_round"] = sum(r["bytes_sent"] + r["bytes_received"] for r in reqs) / rounds
    out["costs"] = {**c.to_dict(), "target_step": c.target_step or None}
    total = sum(ttft + max(n - 1, 0) / rate for n in n_tokens)
    out["predicted_tokens_per_s"] = sum(n_tokens) / total
    out["predicted_over_measured"] = out["predicted_tokens_per_s"] / out["tokens_per_s"]
    return out


def sweep_table(runs: list[dict]) -> list[dict]:
    """One row per run: measured tokens/s and speedup over the target-only run, and the model's."""
    base = next(r for r in runs if r["config"]["mode"] == "target-only")["summary"]
    rows = []
    for r in runs:
        s, c = r["summary"], r["config"]
        label = {"target-only": "target only", "sd": "sync SD", "pipelined": "pipelined SD"}[c["mode"]]
        rows.append({"mode": label + (" (colocated)" if c["placement"] == "colocated" and c["mode"] == "sd" else ""),
                     "placement": c["placement"], "rtt_ms": c["rtt_ms"], "k": c["k"], "alpha": s.get("alpha"),
                     "tokens_per_s": s["tokens_per_s"], "speedup": s["tokens_per_s"] / base["tokens_per_s"],
                     "predicted_tokens_per_s": s.get("predicted_tokens_per_s"),
                     "predicted_speedup": (s["predicted_tokens_per_s"] / base["predicted_tokens_per_s"]
                                           if s.get("predicted_tokens_per_s") else None),
                     "identical_to_target_only": identical_outputs(r, runs[0])})
    return rows


def model_curves(runs: list[dict], rtts) -> list[dict]:
    """The cost model's speedup against RTT for sync and pipelined SD, from the components measured
    in a sweep: the target step of the target-only run; draft step, verify costs and overhead of the
    sync and pipelined runs over the link at the smallest RTT (the colocated run if there is none).
    `rtts` are the full round trips to model (add the relay's own when comparing to injected RTTs)."""
    base = next(r for r in runs if r["config"]["mode"] == "target-only")["summary"]
    step = base["costs"]["target_step"]

    def first(mode, placement):
        cand = [r for r in runs if r["config"]["mode"] == mode and r["config"]["placement"] == placement]
        return min(cand, key=lambda r: r["config"]["rtt_ms"])["summary"] if cand else None

    sync = first("sd", "ethernet") or first("sd", "colocated")
    pipe = first("pipelined", "ethernet")
    k = next(r["config"]["k"] for r in runs if r["config"]["mode"] != "target-only")
    rows = []
    for rtt in rtts:
        for label, s in (("sync SD", sync), ("pipelined SD", pipe)):
            if s is None or s.get("alpha") is None:
                continue
            c = costmodel.Costs(step, s["costs"]["draft_step"], {int(m): v for m, v in s["costs"]["verify_s"].items()},
                                rtt / 1e3, s["costs"]["overhead"])
            sp = (costmodel.pipelined_speedup(s["alpha"], c, k, n_tokens=3000, adaptive=s.get("adaptive", True) is not False)
                  if label == "pipelined SD"
                  else costmodel.speedup(s["alpha"], k, c))
            rows.append({"rtt_ms": rtt, "mode": label, "speedup": sp})
    return rows

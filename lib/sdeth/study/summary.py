"""Run summaries: timing and acceptance (vLLM's definitions), where the time went, the cost model's
prediction from the run's own alpha and component costs; the sweep's table and model curves.

Terms: a *request record* is one entry of a results JSON's `requests` (runtime.loop.RequestRecord as a dict);
a *round* is one target forward that verifies drafts (sync SD: k of them; pipelined: m >= 0, a plain step at
m = 0); *decode* time is a request's time after its first token. `summarize` is a sequence of named steps,
each a function of the records (and the run configuration) that can be called alone: `timing_and_acceptance`,
`Seconds.of`, `time_breakdown`, then `target_only_model`, or `pipelined_model` (with `cache_model`) or
`sync_model`, and `components`."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from .. import costmodel, metrics
from ..runtime.specs import AHEAD
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


def rank_shares(trace_path: str) -> list[float]:
    """P(rank r | rejection) for r = 0.. of an acceptance trace (rank 0: accepted, so its share is 0): how often
    the target's correction is the draft's 2nd, 3rd, ... choice."""
    from ..runtime.synthetic import AcceptanceTrace
    tr = AcceptanceTrace.load(trace_path)
    rej = [r for s in tr.raw for r in s if r]
    return [0.0] + [rej.count(r) / len(rej) for r in range(1, tr.top + 1)] if rej else [0.0]


def draft_period(reqs: list[dict], draft_step: float) -> float:
    """A pipelined run's draft: wall seconds per step, its host's work included (reading the token, sending it,
    launching the next step), as the draft timed it from one launch to the next (`draft_period_ms`). Records
    made before the draft timed it: estimated, assuming the draft stepped without pause through each request's
    decode, one step more per restart (the step in flight when a correction arrives runs out, unsent): the
    decode time over the steps sent plus the restarts (a draft that paused, its window full or its prefill
    long, reads slower than it was). Never below the device step."""
    timed = [(r["draft_period_ms"], r.get("draft_periods", 1)) for r in reqs if r.get("draft_period_ms")]
    if timed:
        return max(sum(p * n for p, n in timed) / sum(n for _, n in timed) / 1e3, draft_step)
    decode = sum(r["e2e_s"] - r["ttft_ms"] / 1e3 for r in reqs if not r.get("tokens_without_draft"))
    steps = sum(r.get("drafted", 0) + r.get("stream_restarts", 0) for r in reqs if not r.get("tokens_without_draft"))
    return max(decode / steps, draft_step) if steps else draft_step


@dataclass(frozen=True)
class Seconds:
    """A run's wall seconds summed over its requests (sequential requests, batch 1).

    decode: after each request's first token; prefill: to each first token; verify: the target's
    forwards in rounds (its plain steps, target-only); wire: waiting on the link (sync) or for drafts
    (pipelined); draft: the draft's decode steps; draft_prefill: its prefills."""
    decode: float
    prefill: float
    verify: float
    wire: float
    draft: float
    draft_prefill: float
    draft_total: float      # draft + draft_prefill, summed per request

    @classmethod
    def of(cls, reqs: list[dict]) -> "Seconds":
        total = lambda f: sum(r[f] for r in reqs)  # noqa: E731
        return cls(decode=sum(r["e2e_s"] - r["ttft_ms"] / 1e3 for r in reqs),
                   prefill=total("ttft_ms") / 1e3, verify=total("verify_s"), wire=total("wire_s"),
                   draft=total("draft_s"), draft_prefill=total("draft_prefill_s"),
                   draft_total=sum(r["draft_s"] + r["draft_prefill_s"] for r in reqs))


def rounds(reqs: list[dict]) -> int:
    """Verification rounds of an SD run (the k trace's length where k varied)."""
    return sum(len(r.get("k_trace") or []) or r["rounds"] for r in reqs)


def timing_and_acceptance(reqs: list[dict], cfg: RunConfig) -> dict:
    """The run's header, timing and acceptance (vLLM's definitions): what every summary starts with."""
    sd = cfg.mode != "target-only"
    out = {"mode": cfg.mode, "k": cfg.k if sd else None, "adaptive": cfg.adapts if sd else None,
           "placement": cfg.placement, "rtt_ms": cfg.rtt_ms, **metrics.timing(reqs),
           "tokens_without_draft": sum(r.get("tokens_without_draft", 0) for r in reqs)}
    per_pos = [sum(r["accepted_per_pos"][i] for r in reqs) for i in range(cfg.k)] if sd else []
    varying = cfg.mode == "pipelined" or cfg.adapts
    out.update(metrics.vllm_metrics(sum(r["drafts"] for r in reqs), sum(r["draft_tokens"] for r in reqs),
                                    sum(r["accepted_tokens"] for r in reqs), per_pos,
                                    sum(r.get("rejections", 0) for r in reqs) if varying else None))
    return out


def time_breakdown(t: Seconds, mode: str) -> dict:
    """Where the wall time went (seconds). Pipelined: the draft runs beside the target, so only the waiting
    is on the clock and its compute is reported apart (`draft_compute_overlapped_s`)."""
    if mode == "pipelined":
        return {"time_breakdown_s": {"prefill": t.prefill, "wait for drafts": t.wire, "verify": t.verify,
                                     "other": t.decode - t.verify - t.wire},
                "draft_compute_overlapped_s": t.draft_total}
    return {"time_breakdown_s": {"prefill": t.prefill, "draft": t.draft_total, "wire": t.wire,
                                 "verify" if mode == "sd" else "decode": t.verify,
                                 "other": t.decode - t.draft_total - t.verify - t.wire}}


def target_only_model(reqs: list[dict], t: Seconds, ttft_s: float) -> dict:
    """A target-only run's costs (its mean decode step) and the rate they predict, each request taking
    ttft_s (the run's mean) to its first token."""
    n_tokens = [len(r["output_ids"]) for r in reqs]
    steps = sum(max(n - 1, 0) for n in n_tokens)
    step = t.decode / steps if steps else 0.0
    total = sum(ttft_s + max(n - 1, 0) * step for n in n_tokens)
    return {"costs": costmodel.Costs(target_step=step, draft_step=0.0).to_dict(),
            "predicted_tokens_per_s": sum(n_tokens) / total if total else None}


def cache_model(reqs: list[dict], cfg: RunConfig) -> dict:
    """A pipelined run's branch cache figures: what was asked and used, the hit rate, the share of corrections
    among the draft's next choices. With cache 'auto' the target chose per request; the commonest choice is
    reported. A draft server's branches sent ahead are not modelled here (study.streambench.hitcurve does)."""
    out: dict = {}
    spec = cfg.branch_cache()
    used = [r.get("cache", "off" if spec == "auto" else spec) for r in reqs]
    choice = next((r["cache_choice"] for r in reversed(reqs) if r.get("cache_choice")), "")
    if spec == "auto":
        out.update(cache_auto={u: used.count(u) for u in sorted(set(used))}, cache_choice=choice)
        spec = max(sorted(set(used)), key=used.count)
    judged, among = (sum(r.get(f, 0) for r in reqs) for f in ("alt_judged", "alt_among"))
    if judged:
        out["corrections_among_next_choices"] = among / judged
    ahead = AHEAD in used                   # a draft server's branches: measured; modelled elsewhere
    if spec != "off" and used and set(used) == {"off"}:     # asked for, none drafted (the records say why)
        return {**out, "cache": "off", "cache_choice": choice}
    if spec == "off" and not ahead:
        return out
    restarts, hits = (sum(r.get(f, 0) for r in reqs) for f in ("stream_restarts", "cache_hits"))
    out.update(cache=spec, cache_hit_rate=hits / restarts if restarts else None)
    if ahead:
        out.update(cache=AHEAD, cache_model="not modelled here: a draft server's branches sent ahead take its spare "
                   "rows (study.streambench.hitcurve models them against the hit rate)")
    return out


def pipelined_model(reqs: list[dict], cfg: RunConfig, t: Seconds, alpha: float) -> tuple[costmodel.Costs, float, dict]:
    """A pipelined run's costs, the event model's tokens/s from them (decode phase), and its figures."""
    widths, n_rounds = _widths(reqs), rounds(reqs)
    streamed = sum(r.get("drafted", 0) for r in reqs)
    rtts = [r["rtt_est_ms"] for r in reqs if r.get("rtt_est_ms") is not None]
    links = [r["link_rtt_ms"] for r in reqs if r.get("link_rtt_ms") is not None]
    c = costmodel.Costs(
        target_step=widths.get(1, 0.0), draft_step=t.draft / max(streamed, 1),
        verify_s=widths, rtt=(statistics.mean(rtts) / 1e3 if rtts else cfg.rtt_ms / 1e3),
        overhead=(t.decode - t.verify - t.wire) / n_rounds,
        link_rtt=statistics.median(links) / 1e3 if links else None)
    c.draft_period = draft_period(reqs, c.draft_step)
    if 1 not in widths:      # no plain step in the run: extrapolate a step from the two narrowest widths
        c.target_step = c.verify(1) if len(widths) > 1 else min(widths.values())
    out = cache_model(reqs, cfg)
    sim = costmodel.simulate_pipelined(alpha, c, cfg.k, n_tokens=4000, seed=cfg.seed, adaptive=cfg.adapts,
                                       policy=cfg.step_policy)   # (the setting the run played)
    out.update(plain_steps=sum(r.get("plain_steps", 0) for r in reqs), drafted_tokens=streamed, model_pipeline=sim)
    return c, sim["tokens_per_s"], out


def sync_model(reqs: list[dict], cfg: RunConfig, t: Seconds, alpha: float,
               k_trace: list[int]) -> tuple[costmodel.Costs, float, dict]:
    """A sync SD run's costs, the rate they predict for its k's (decode phase), and the wire per round
    (over the link: split by the draft's own timestamps, beside the bare round trip)."""
    n_rounds = rounds(reqs)
    draft_prefill = statistics.mean(r["draft_prefill_s"] for r in reqs)
    c = costmodel.Costs(
        target_step=0.0,         # not measured in an SD run (stored as null); pair it with a target-only run
        draft_step=t.draft / sum(r["draft_tokens"] for r in reqs), verify_s=_widths(reqs), rtt=t.wire / n_rounds,
        overhead=(t.decode - t.draft_total - t.verify - t.wire) / n_rounds
                 + draft_prefill * len(reqs) / n_rounds)
    ks = k_trace or [cfg.k]
    rate = sum(costmodel.expected_tokens(alpha, k) for k in ks) / sum(costmodel.round_time(c, k) for k in ks)
    out = {"wire_ms_per_round": t.wire / n_rounds * 1e3}
    if cfg.placement == "ethernet":
        out["link_ms_per_round"] = sum(r.get("link_s", 0.0) for r in reqs) / n_rounds * 1e3
        out["draft_host_ms_per_round"] = sum(r.get("draft_host_s", 0.0) for r in reqs) / n_rounds * 1e3
        bare = [r["bare_rtt_ms"] for r in reqs if r.get("bare_rtt_ms") is not None]
        out["bare_rtt_ms"] = statistics.median(bare) if bare else None
    return c, rate, out


def components(reqs: list[dict], cfg: RunConfig, t: Seconds) -> dict:
    """Where a round's time goes on each side, ms per round (device time from events on CUDA); the restarts
    of a pipelined stream; bytes per round over the link."""
    n_rounds, pipelined = rounds(reqs), cfg.mode == "pipelined"
    waited_prefill = 0.0 if pipelined else t.draft_prefill
    comp = {"target_host": (t.decode - t.verify - t.wire - (0.0 if pipelined else t.draft) - waited_prefill)
                           / n_rounds * 1e3,
            "draft_prefill_waited": waited_prefill / n_rounds * 1e3,
            "target_gpu_idle": (t.decode - t.verify) / n_rounds * 1e3,
            "draft_gpu_idle": max(t.decode - t.draft, 0.0) / n_rounds * 1e3,
            "wire": t.wire / n_rounds * 1e3}
    if any(r.get("verify_wall_s") for r in reqs):   # sync SD: the target's host work, split
        comp["target_verify_overhead"] = sum(r["verify_wall_s"] - r["verify_s"] for r in reqs) / n_rounds * 1e3
        comp["target_between_rounds"] = sum(r.get("between_s", 0.0) for r in reqs) / n_rounds * 1e3
    out = {"components_ms_per_round": comp}
    restarts = [x for r in reqs for x in r.get("restarts_ms") or []]
    if restarts:
        out["restart_ms"] = {"mean": statistics.mean(restarts), "median": statistics.median(restarts),
                             "p90": sorted(restarts)[int(0.9 * (len(restarts) - 1))], "n": len(restarts)}
    if cfg.placement == "ethernet":
        out["bytes_per_round"] = sum(r["bytes_sent"] + r["bytes_received"] for r in reqs) / n_rounds
    return out


def summarize(reqs: list[dict], cfg: RunConfig) -> dict:
    """Run summary: timing and acceptance (vLLM's definitions), where the time went, and the cost model's
    prediction from this run's own alpha and component costs (the event model's, pipelined)."""
    out, t = timing_and_acceptance(reqs, cfg), Seconds.of(reqs)
    out.update(time_breakdown(t, cfg.mode))
    if cfg.mode == "target-only":
        return {**out, **target_only_model(reqs, t, out["ttft_ms"] / 1e3)}
    out["k_trace"] = [k for r in reqs for k in r.get("k_trace", [])]
    if not sum(r["drafts"] for r in reqs) or out["alpha"] is None:
        return {**out, "predicted_tokens_per_s": None}
    if cfg.mode == "pipelined":
        c, rate, figures = pipelined_model(reqs, cfg, t, out["alpha"])
    else:
        c, rate, figures = sync_model(reqs, cfg, t, out["alpha"], out["k_trace"])
    out.update(**figures, **components(reqs, cfg, t), costs={**c.to_dict(), "target_step": c.target_step or None})
    n_tokens = [len(r["output_ids"]) for r in reqs]
    out["predicted_tokens_per_s"] = sum(n_tokens) / sum(out["ttft_ms"] / 1e3 + max(n - 1, 0) / rate for n in n_tokens)
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


def testbed_line(testbed: dict | None) -> str:
    """The testbed a run used, in one line (nested fields as key=value), not a raw dict."""
    if not testbed:
        return "none (one process)"
    def val(v):
        return ", ".join(f"{k} {x}" for k, x in v.items()) if isinstance(v, dict) else str(v)
    return "; ".join(f"{k.replace('_', ' ')}: {val(v)}" for k, v in testbed.items())


def identical_to(runs: dict[str, dict], reference: dict) -> dict[str, bool]:
    """Each run's output tokens against the reference run's (label -> identical)."""
    return {label: identical_outputs(r, reference) for label, r in runs.items()}


def find_run(runs: list[dict], mode: str, placement: str, rtt_ms: float) -> dict:
    """The run of a sweep with this mode, placement and injected round trip."""
    for r in runs:
        c = r["config"]
        if c["mode"] == mode and c["placement"] == placement and c["rtt_ms"] == rtt_ms:
            return r
    raise KeyError(f"no run with mode {mode!r}, placement {placement!r}, rtt {rtt_ms} ms")


def rate_difference(a: dict, b: dict) -> dict:
    """Two runs' draft acceptance rates compared by a two-proportion test (each draft token an accept or
    not): the difference, one standard error, and whether they agree within two."""
    import math
    sa, sb = a["summary"], b["summary"]
    na, nb = (sum(q["draft_tokens"] for q in r["requests"]) for r in (a, b))
    ra, rb = sa["draft_acceptance_rate"], sb["draft_acceptance_rate"]
    se = math.sqrt(ra * (1 - ra) / na + rb * (1 - rb) / nb)
    return {"rates": [ra, rb], "alphas": [sa["alpha"], sb["alpha"]],
            "per position": [sa["per_position_acceptance"], sb["per_position_acceptance"]],
            "difference": ra - rb, "one standard error": se, "within 2 SE": abs(ra - rb) <= 2 * se,
            "draft tokens": [na, nb]}


def k_sweep(base: dict, by_k: dict[int, dict]) -> dict:
    """A k sweep of sync SD against target-only: per k the measured rate, alpha, speedup and the cost
    model's; the cost model's components from the runs (verify costs of every width seen) and its best k."""
    from .. import costmodel
    b = base["summary"]
    rows = [{"k": k, "rate": r["summary"]["draft_acceptance_rate"], "alpha": r["summary"]["alpha"],
             "speedup": r["summary"]["tokens_per_s"] / b["tokens_per_s"],
             "predicted": r["summary"]["predicted_tokens_per_s"] / b["predicted_tokens_per_s"]}
            for k, r in sorted(by_k.items())]
    last = by_k[max(by_k)]["summary"]["costs"]
    c = costmodel.Costs(b["costs"]["target_step"], last["draft_step"], {}, last["rtt"], last["overhead"])
    for r in by_k.values():
        c.verify_s.update({int(m): v for m, v in r["summary"]["costs"]["verify_s"].items()})
    alpha0 = rows[0]["alpha"]
    return {"rows": rows, "costs": c, "alpha": alpha0, "best_k": costmodel.best_k(alpha0, c, k_max=max(by_k))}


def beats_up_to(rows: list[dict], mode: str, col: str = "speedup") -> float | None:
    """The largest round trip (ms) at which `mode` is above 1 in `col` (None: at none)."""
    above = [r["rtt_ms"] for r in rows if r["mode"] == mode and r[col] > 1.0]
    return max(above) if above else None


def crossover(table: list[dict], curves: list[dict]) -> dict:
    """Up to which round trip each link mode beats target-only, measured and by the model."""
    link = [r for r in table if r["placement"] == "ethernet"]
    out = {mode: {"measured_beats_target_only_up_to_ms": beats_up_to(link, mode),
                  "measured_above_1_at_ms": [r["rtt_ms"] for r in link if r["mode"] == mode and r["speedup"] > 1.0],
                  "measured_at_or_below_1_at_ms": [r["rtt_ms"] for r in link if r["mode"] == mode and r["speedup"] <= 1.0],
                  "model_beats_target_only_up_to_ms": beats_up_to(curves, mode)} for mode in ("sync SD", "pipelined SD")}
    col = next(r for r in table if r["mode"] == "sync SD (colocated)")
    out["colocated SD beats target-only"] = bool(col["speedup"] > 1)
    # a run with nothing to predict from (no draft verified: every step plain) has no prediction
    out["largest_model_gap"] = max((abs(r["predicted_speedup"] / r["speedup"] - 1) for r in table
                                    if r.get("predicted_speedup")), default=None)
    return out


def crossover_lines(c: dict) -> str:
    """Where each link mode is above the target alone: the measured round trips on each side of 1x (noise can put
    a small round trip below and a larger one above), and the model's crossover."""
    said = lambda v: "at no round trip" if v is None else f"up to {v:g} ms"  # noqa: E731
    at = lambda xs: ", ".join(f"{x:g}" for x in xs) + " ms" if xs else "none"  # noqa: E731
    lines = [f"{mode} over the link against target-only, measured: above 1x at {at(c[mode].get('measured_above_1_at_ms', []))}"
             f"; at or below 1x at {at(c[mode].get('measured_at_or_below_1_at_ms', []))}; model: above 1x "
             f"{said(c[mode]['model_beats_target_only_up_to_ms'])}" for mode in ("sync SD", "pipelined SD")]
    lines += [f"colocated SD beats target-only: {c['colocated SD beats target-only']}",
              "largest gap between predicted and measured speedup over the sweep: "
              + (f"{c['largest_model_gap']:.1%}" if c["largest_model_gap"] is not None else "no prediction")]
    return "\n".join(lines)


def ethernet_status(hw: dict, testbed: dict | None, runs: dict[str, dict], rtt_ms: float, model_gap: float,
                    identical: dict | None, link: list[dict]) -> str:
    """20_ethernet's one-line status (the reports index shows it)."""
    base, sd = runs["target-only (target node)"]["summary"], runs["SD colocated"]["summary"]
    sync = runs[f"sync SD over the link, rtt {rtt_ms} ms"]["summary"]
    pipe = runs[f"pipelined SD over the link, rtt {rtt_ms} ms"]["summary"]
    skew = link[-1]["naive"]
    return (f"{hw['label']}, {testbed['kind'] if testbed else 'colocated'}: target-only {base['tokens_per_s']:.1f} tok/s, "
            f"colocated SD {sd['tokens_per_s']:.1f}, over the link at rtt {rtt_ms} ms sync SD {sync['tokens_per_s']:.1f} "
            f"({sync['bytes_per_round']:.0f} B/round), pipelined SD {pipe['tokens_per_s']:.1f} tok/s; "
            + (f"model within {model_gap:.0%} over the sweep" if model_gap is not None else "no model prediction")
            + "; greedy identical: "
            f"{all(identical.values()) if identical is not None else 'n/a'}; "
            f"probe: clock skew 65 ms turns 150/150 into {skew['up_ms']['p50']:.0f}/{skew['down_ms']['p50']:.0f} ms")

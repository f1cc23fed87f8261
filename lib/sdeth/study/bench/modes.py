"""Benchmarks that compare decoding modes, with intervals: `python -m sdeth bench sd ...`.

    python -m sdeth bench sd --pair random-qwen3-8b/1.7b --synthetic-alpha 0.71 --device cuda:0 \
        --draft-device cuda:1 --impl fast --compile default --json reports/gpu/bench_sd_1.7b.json

Every mode decodes the same requests (prompt i drawn from its own seed; with synthetic acceptance each
prompt keys its own accept/reject sequence), at least `requests x max_tokens` generated tokens. A
speedup is tokens/s over target-only's on the same requests, with a 95% paired bootstrap interval over
requests; alpha has its interval too; the cost model's predicted speedup stands beside each. The JSON
says what acceptance was (synthetic on random weights, or real) and holds the resolved configs, the
hardware and the per-request records. Public functions only: any host with the package installed runs it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, replace

from ... import hardware, metrics
from ..config import RunConfig
from ..runs.experiment import run, testbed_for
from ..summary import identical_outputs

# name -> the RunConfig fields that make the mode (k: the run's k; k_max: the most, where k adapts)
MODES = {
    "target-only": dict(mode="target-only", placement="ethernet"),
    "colocated": dict(mode="sd", placement="colocated", adaptive=False),
    "sync": dict(mode="sd", placement="ethernet", adaptive=False),
    "adaptive": dict(mode="sd", placement="ethernet", adaptive=True),
    "pipelined": dict(mode="pipelined", placement="ethernet", adaptive=True, cache="off"),
    "cached": dict(mode="pipelined", placement="ethernet", adaptive=True),   # pipelined with branches ahead
    "auto": dict(mode="pipelined", placement="ethernet", adaptive=True, cache="auto"),   # asked wherever the server branches
    # pipelined under another step policy (costmodel.POLICIES; "pipelined" plays the step policy): its corners,
    # sync (always wait for k) and offered (go with what is on offer), and one round's best rate
    **{f"pipelined-{p}": dict(mode="pipelined", placement="ethernet", adaptive=True, cache="off", policy=p)
       for p in ("sync", "offered", "adaptive")},
}
ADAPTS = ("adaptive", "pipelined", "cached", "auto", "pipelined-sync", "pipelined-offered", "pipelined-adaptive")


def mode_config(base: RunConfig, name: str, k_max: int) -> RunConfig:
    if name not in MODES:
        raise ValueError(f"mode {name!r}: use some of {list(MODES)}")
    cfg = replace(base, **MODES[name], k=k_max if name in ADAPTS else base.k)
    if name == "cached":
        cfg = replace(cfg, cache="on")       # (branches ahead from the draft server, in its own shape)
    return cfg


def branch_draft(base: RunConfig, modes) -> dict:
    """The testbed's draft for a bench of these modes: 'cached' asks for branches sent ahead, which only the
    batched draft server drafts (experiment.can_branch); any other bench gets the draft of one row."""
    from ..runs.experiment import can_branch
    if "cached" not in modes:
        return {}
    if not can_branch(base):
        raise ValueError("mode 'cached' (branches sent ahead) needs the batched draft server, which drafts a "
                         "fast-decoder draft with real acceptance only (--impl fast; no --synthetic-alpha, --trace or "
                         "--draft-emulate): drop 'cached' from --modes, or run it on such a pair")
    return dict(draft_server=True, verdict_cache="on")


def per_request(res: dict) -> dict:
    """The per-request lists the intervals resample."""
    reqs = res["requests"]
    return {"tokens": [len(r["output_ids"]) for r in reqs], "seconds": [r["e2e_s"] for r in reqs],
            "accepted": [r["accepted_tokens"] for r in reqs],
            "judged": [r["accepted_tokens"] + r.get("rejections", 0) for r in reqs]}


def compare(results: dict[str, dict]) -> list[dict]:
    """One row per mode: tokens/s, speedup over target-only with its interval, alpha with its interval,
    the model's predicted speedup, and whether the output equals target-only's."""
    base = results["target-only"]
    b = per_request(base)
    rows = []
    for name, res in results.items():
        p, s = per_request(res), res["summary"]
        sp = metrics.ratio_ci(p["tokens"], p["seconds"], b["tokens"], b["seconds"])
        row = {"mode": name, "tokens_per_s": s["tokens_per_s"], "output_tokens": sum(p["tokens"]),
               "speedup": sp[0], "speedup_ci95": [sp[1], sp[2]],
               "resolves_10pct": (sp[2] - sp[1]) < 0.10 * sp[0],
               "predicted_speedup": (s["predicted_tokens_per_s"] / base["summary"]["predicted_tokens_per_s"]
                                     if s.get("predicted_tokens_per_s") and base["summary"].get("predicted_tokens_per_s")
                                     else None),
               "identical_to_target_only": identical_outputs(res, base),
               "step_policy": next((r["step_policy"] for r in res["requests"] if r.get("step_policy")), None)}
        if sum(p["judged"]):
            a = metrics.ratio_ci(p["accepted"], p["judged"])
            row.update(alpha=a[0], alpha_ci95=[a[1], a[2]])
        for key in ("wire_ms_per_round", "link_ms_per_round", "draft_host_ms_per_round", "bare_rtt_ms",
                    "tokens_without_draft", "plain_steps", "time_breakdown_s", "components_ms_per_round",
                    "restart_ms", "cache_hit_rate", "predicted_cache_hit_rate", "cache", "costs", "cache_auto",
                    "cache_choice", "corrections_among_next_choices"):
            if key in s:
                row[key] = s[key]
        rows.append(row)
    return rows


def emulation_record(emulated, vocab: int) -> dict:
    """The emulated target's description, with the host's argmax time per width over the pair's `vocab` columns as
    the bench process times it (host_argmax_ms_bench_process: the colocated mode's target runs here; each target
    worker times its own, on its host, and takes that off its pace)."""
    from ...runtime.emulated import host_argmax_s, ms_by_width
    return {**emulated.describe(),
            "host_argmax_ms_bench_process": ms_by_width(host_argmax_s(vocab, emulated.max_width))}


def bench_sd(base: RunConfig, modes=tuple(MODES), k_max: int = 8, warmup_tokens: int = 32, pair=None,
             progress: bool = False) -> dict:
    """Run each mode on base's requests (ethernet modes on one testbed, colocated in this process) and
    compare them. base: pair, devices, engine options, prompts (e.g. random:16:512), max_tokens, k."""
    from ...models.presets import load_pair
    base = base.check()
    if "target-only" not in modes:
        modes = ("target-only", *modes)
    for name in modes:              # every mode's configuration, before anything runs (k_max within the target's)
        mode_config(base, name, k_max).check()
    draft_kw = branch_draft(base, modes)
    pair = pair or load_pair(base.pair, base.target, base.draft, device=colocated_device(base),
                             roles=colocated_roles(base) if "colocated" in modes else ())
    length = base.prompt_spec.length or 64       # random:N:LEN: the prompts' own length
    warm = replace(base, prompts=f"random:1:{length}:999983", max_tokens=warmup_tokens)
    results: dict[str, dict] = {}
    t0 = time.time()
    link = [m for m in modes if MODES[m]["placement"] == "ethernet"]
    if link:
        with testbed_for(base, ready_timeout_s=1200, draft_timeout_s=300, **draft_kw) as tb:
            for name in link:
                run(mode_config(warm, name, k_max), pair, False, tb)          # first use of each width
                results[name] = run(mode_config(base, name, k_max), pair, progress, tb)
    if "colocated" in modes:
        run(mode_config(warm, "colocated", k_max), pair, False)
        results["colocated"] = run(mode_config(base, "colocated", k_max), pair, progress)
    rows = compare({m: results[m] for m in modes})
    emulated = base.target_emulation
    for row in rows if emulated else ():
        row["label"] = f"{row['mode']}: {emulated.label}"
    fast = {r: base.fast_options(r).spec() for r in ("draft", "target")} if base.impl == "fast" else None
    return {"schema": "sdeth.bench/1", "bench": "sd", "config": asdict(base), "k_max": k_max, "fast_options": fast,
            "target_emulation": emulation_record(emulated, pair.vocab_size) if emulated else None,
            "acceptance": acceptance_label(base), "acceptance_kind": base.acceptance_kind, "hardware": hardware.describe(base.device),
            "draft_hardware": hardware.describe(base.draft_device) if base.draft_device else None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": time.time() - t0,
            "rows": rows, "runs": results}


def colocated_roles(cfg: RunConfig) -> tuple:
    """The models the colocated mode loads in this process: an emulated target has none."""
    return ("draft",) if cfg.target_emulate else ("target", "draft")


def colocated_device(cfg: RunConfig) -> str:
    """Where the colocated mode's models go: the target's device, or the draft's beside an emulated target."""
    return (cfg.draft_device or cfg.device) if cfg.target_emulate else cfg.device


def probe_rtt_ms(addr: str, n: int = 30) -> float:
    """The link's round trip as the link probe sees it: the median of n bare Ping/Pong exchanges with the draft
    worker through the same path the target uses (the delay relay included)."""
    from ...wire import protocol
    from ...wire.auth import Keys
    from ...wire.transport import Client
    client = Client(addr, timeout_s=2.0, keys=Keys.from_env())
    try:
        rtts = []
        for _ in range(n):
            t0 = time.perf_counter()
            if isinstance(client.call(protocol.Ping(time.time()), timeout_s=2.0), protocol.Pong):
                rtts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(rtts)
    finally:
        client.close()


RTT_SWEEP = (0.0, 0.2, 0.5, 1.0, 2.0, 5.0)


def bench_rtt(base: RunConfig, rtts=RTT_SWEEP, modes=("sync", "pipelined", "cached"), k_max: int = 8,
              warmup_tokens: int = 32, pair=None) -> dict:
    """The RTT sweep: target-only once, then each link mode at each added round trip (the user-space relay's
    delay, set between points), on one testbed. Each point reports the round trip the link probe measures
    (the relay's own cost included), each mode's speedup over target-only with its interval, and the cost
    model's; `break_even` is each mode's largest round trip that still beats target-only (measured, by the
    probe's round trip, interpolated between points)."""
    from ...models.presets import load_pair
    base = base.check()
    draft_kw = branch_draft(base, modes)
    pair = pair or load_pair(base.pair, base.target, base.draft, device=base.device, roles=())
    length = base.prompt_spec.length or 64       # random:N:LEN: the prompts' own length
    warm = replace(base, prompts=f"random:1:{length}:999983", max_tokens=warmup_tokens)
    t0 = time.time()
    points = []
    with testbed_for(base, up_ms=0.0, down_ms=0.0, relay=True, ready_timeout_s=1200, draft_timeout_s=300,
                     **draft_kw) as tb:
        for name in ("target-only", *modes):
            run(mode_config(warm, name, k_max), pair, False, tb)
        ref = run(mode_config(base, "target-only", k_max), pair, False, tb)
        for rtt in rtts:
            tb.set_delay(rtt / 2, rtt / 2)
            probe = probe_rtt_ms(tb.draft_addr_for_target())
            results = {"target-only": ref}
            for name in modes:
                results[name] = run(replace(mode_config(base, name, k_max), rtt_ms=rtt), pair, False, tb)
            for row in compare(results)[1:]:
                points.append({"rtt_set_ms": rtt, "rtt_probe_ms": probe, **{k: v for k, v in row.items()}})
    return {"schema": "sdeth.bench/1", "bench": "rtt", "config": asdict(base), "k_max": k_max, "modes": list(modes),
            "acceptance": acceptance_label(base), "acceptance_kind": base.acceptance_kind,
            "hardware": hardware.describe(base.device),
            "draft_hardware": hardware.describe(base.draft_device) if base.draft_device else None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": time.time() - t0,
            "target_only_tokens_per_s": ref["summary"]["tokens_per_s"],
            "target_only": {"target_step": ref["summary"]["costs"]["target_step"], "ttft_s": ref["summary"]["ttft_ms"] / 1e3},
            "points": points,
            "break_even": break_even(points, modes)}


def break_even(points: list[dict], modes) -> dict:
    """Per mode: the largest probed round trip (ms) at which it still beats target-only, linearly interpolated
    to speedup 1 between the last point above and the first below (None: below at every point; '>' the
    largest: above at every point)."""
    out = {}
    for m in modes:
        pts = sorted((p["rtt_probe_ms"], p["speedup"]) for p in points if p["mode"] == m)
        if not pts or pts[0][1] <= 1:
            out[m] = None
            continue
        out[m] = f">{pts[-1][0]:.2f}"
        for (r0, s0), (r1, s1) in zip(pts, pts[1:]):
            if s0 > 1 >= s1:
                out[m] = round(r0 + (s0 - 1) / (s0 - s1) * (r1 - r0), 3)
                break
    return out


def acceptance_label(cfg: RunConfig) -> str:
    if cfg.acceptance_kind == "trace-driven":
        from ...runtime.synthetic import AcceptanceTrace
        tr = AcceptanceTrace.load(cfg.synthetic_trace, cfg.synthetic_alpha)
        return (f"trace-driven: random weights, the draft replays the acceptance trace of {tr.source} "
                f"(alpha {tr.alpha0:.3f} recorded" + (f", scaled to {tr.alpha:.3f})" if cfg.synthetic_alpha is not None
                                                      else ")"))
    if cfg.acceptance_kind == "synthetic":
        return (f"synthetic: random weights, each draft token accepted with probability {cfg.synthetic_alpha} "
                "(sdeth.runtime.synthetic)")
    return "real: the pair's own models"


def _interval_and_model(row: dict) -> tuple[str, str]:
    pred = f"{row['predicted_speedup']:.3f}" if row["predicted_speedup"] else "-"
    return "[{:.3f}, {:.3f}]".format(*row["speedup_ci95"]), pred


def modes_table(res: dict) -> str:
    """The comparison as aligned text (the CLI prints it)."""
    target = res.get("target_emulation")
    out = [f"{res['acceptance']}; {res['hardware'].get('label')}" + (f"; {target['label']}" if target else ""),
           f"{'mode':12s} {'tok/s':>8s} {'speedup':>8s} {'95% interval':>15s} {'predicted':>9s} {'alpha':>6s} "
           f"{'tokens':>7s} identical"]
    for r in res["rows"]:
        ci, pred = _interval_and_model(r)
        alpha = f"{r['alpha']:.3f}" if "alpha" in r else "-"
        out.append(f"{r['mode']:12s} {r['tokens_per_s']:8.1f} {r['speedup']:8.3f} {ci:>15s} {pred:>9s} {alpha:>6s} "
                   f"{r['output_tokens']:7d} {r['identical_to_target_only']}")
    return "\n".join(out)


def rtt_table(res: dict) -> str:
    """The RTT sweep as aligned text (the CLI prints it)."""
    out = [f"{res['acceptance']}; {res['hardware'].get('label')}; target-only {res['target_only_tokens_per_s']:.1f} tok/s",
           f"{'set ms':>6s} {'probe ms':>8s} {'mode':10s} {'speedup':>8s} {'95% interval':>15s} {'predicted':>9s} "
           f"{'hits':>5s} identical"]
    for p in res["points"]:
        ci, pred = _interval_and_model(p)
        hits = f"{p['cache_hit_rate']:.2f}" if p.get("cache_hit_rate") is not None else "-"
        out.append(f"{p['rtt_set_ms']:6.1f} {p['rtt_probe_ms']:8.3f} {p['mode']:10s} {p['speedup']:8.3f} {ci:>15s} "
                   f"{pred:>9s} {hits:>5s} {p['identical_to_target_only']}")
    out.append("break-even round trip (probe ms): " + ", ".join(f"{m} {v}" for m, v in res["break_even"].items()))
    return "\n".join(out)

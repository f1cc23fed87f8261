"""M4: which draft hardware makes SD over Ethernet pay (notebooks/40_heterogeneous).

The design map is the event model (sdeth.costmodel: sync rounds, and the pipelined protocol simulated
event by event) over a grid of draft step times and round trips, for a target whose step is measured
(Qwen3-8B on an H200) or modelled from its bytes (a device profile). Device profiles place each draft
device on it; measured and emulated runs are checked against it. Kinds are kept apart in every row:
measured, emulated (paced replay of a real draft's tokens), modelled (a formula).
"""
from __future__ import annotations

from ... import costmodel, devices

VERIFY_SLOPE = 0.0125      # measured on the H200 8B step: verify of 8 tokens = 1.09 steps -> +1.25% per token
HOST_S = 0.3e-3            # measured target host work per sync round on the H200 (reports/gpu/bench_sd_1.7b.json)
ALLREDUCE_S = 10e-6        # modelled: one all-reduce of a hidden state over NVLink, two per layer (tensor parallel)


def target_steps(measured_8b_h200_s: float | None = None) -> dict[str, dict]:
    """The targets of the map: Qwen3-8B on an H200 (measured when given) and on an A100, and a 70B-class
    target on two H200s (tensor parallel), each {step_s, kind, how}."""
    h200, a100 = devices.load("h200"), devices.load("a100")
    w, kv, layers = devices.model_bytes("Qwen3-8B")
    out = {"Qwen3-8B on H200": {"step_s": measured_8b_h200_s or h200.step_s(w, kv, layers),
                                "kind": "measured" if measured_8b_h200_s else "modelled",
                                "how": "sdeth bench sd, target-only" if measured_8b_h200_s else "profile h200"},
           "Qwen3-8B on A100": {"step_s": a100.step_s(w, kv, layers), "kind": "modelled", "how": "profile a100"}}
    w, kv, layers = devices.model_bytes("Llama-3.1-70B")
    half = (w + kv) / 2
    step = half / h200.offchip_Bps + layers * h200.per_layer_s + 2 * layers * ALLREDUCE_S + h200.host_link_s
    out["70B-class on 2x H200"] = {"step_s": step, "kind": "modelled",
                                   "how": "half the bytes per GPU, profile h200, two all-reduces per layer"}
    return out


def costs(target_step_s: float, draft_step_s: float, rtt_s: float) -> costmodel.Costs:
    return costmodel.Costs(target_step_s, draft_step_s,
                           {m: target_step_s * (1 + VERIFY_SLOPE * (m - 1)) for m in range(2, 18)}, rtt_s, HOST_S)


def predict(alpha: float, target_step_s: float, draft_step_s: float, rtt_s: float, k_max: int = 8,
            n_tokens: int = 3000) -> dict:
    """Speedup over target-only of sync SD (best k) and pipelined SD (the event model), modelled."""
    c = costs(target_step_s, draft_step_s, rtt_s)
    k, sync = costmodel.best_k(alpha, c, k_max)
    return {"sync": sync, "sync_k": k, "pipelined": costmodel.pipelined_speedup(alpha, c, k_max, n_tokens=n_tokens)}


def design_map(alpha: float, target_step_s: float, draft_steps_s, rtts_s, mode: str = "pipelined") -> list[list[float]]:
    """Speedup (rows: draft step, columns: round trip) of `mode`, modelled."""
    return [[predict(alpha, target_step_s, d, r)[mode] for r in rtts_s] for d in draft_steps_s]


def device_points(shape: str = "Qwen3-1.7B") -> list[dict]:
    """Each device profile as a draft of `shape` in bf16 and fp8: its modelled step and where the weights sit."""
    rows = []
    for key, p in devices.all_profiles().items():
        for fmt, bpp in (("bf16", 2.0), ("fp8", 1.0)):
            w, kv, layers = devices.model_bytes(shape, bpp)
            rows.append({"device": key, "draft": f"{shape} {fmt}", "step_ms": p.step_s(w, kv, layers) * 1e3,
                         "memory": p.memory(w, kv), "kind": "modelled (profile)"})
    return rows


def needed_draft_step(alpha: float, target_step_s: float, rtt_s: float, goal: float, mode: str = "pipelined",
                      lo: float = 10e-6, hi: float = 20e-3) -> float | None:
    """The slowest draft step (s) at which `mode` still reaches `goal` x (None: not even with a free draft)."""
    f = lambda d: predict(alpha, target_step_s, d, rtt_s, n_tokens=2000)[mode]  # noqa: E731
    if f(lo) < goal:
        return None
    for _ in range(12):                      # speedup falls as the draft slows: bisect (in log steps, ~4%)
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if f(mid) >= goal else (lo, mid)
    return lo


def economics(speedup: float, base_tokens_per_s: float) -> dict:
    """SD over Ethernet spends a second device on one stream: per-request latency against tokens/s per
    device, beside using that device as a second target replica (two streams, each at the base speed)."""
    return {"per-request speedup": speedup, "SD tokens/s per device": base_tokens_per_s * speedup / 2,
            "replica tokens/s per device": base_tokens_per_s,
            "SD throughput per device vs replica": speedup / 2,
            "worth it when": "latency of one stream matters more than throughput" if speedup < 2 else
            "if the modelled speedup held (modelled, not measured; at equal device prices): faster per request and "
            "no less throughput per device"}


def answer(alphas: dict[str, float], targets: dict[str, dict], rtt_s: float, points: list[dict], measured: dict) -> dict:
    """M4's answer: per target and alpha, the draft step that reaches 2x and 3x at this round trip (modelled),
    which device profiles get there, and the measured anchors. Returns {"text", "needed"}."""
    needed = []
    for aname, a in alphas.items():
        for tname, t in targets.items():
            row = {"alpha": f"{a:.2f} ({aname})", "target": tname, "target step ms": t["step_s"] * 1e3,
                   "target kind": t["kind"]}
            for g in (2, 3):
                d = needed_draft_step(a, t["step_s"], rtt_s, g)
                row[f"draft step for {g}x (ms)"] = None if d is None else d * 1e3
            needed.append(row)
    best8 = max((r for r in needed if r["target"].startswith("Qwen3-8B on H200")), key=lambda r: r["alpha"])
    d2 = best8["draft step for 2x (ms)"]
    fast = [p for p in points if d2 and p["step_ms"] <= d2]
    text = (f"At a {rtt_s * 1e3:g} ms round trip (modelled; measured round trips: 20_ethernet's link probe), pipelined SD over "
            f"Ethernet reaches 2x over a Qwen3-8B target on an H200 only with a draft whose step is at most "
            f"{d2:.2f} ms at alpha {best8['alpha']}" if d2 else "Pipelined SD reaches 2x at no draft speed")
    text += ("; 3x is out of reach at these alphas for every target with today's protocol (no outcome cache: each "
             "round's expected tokens cap it)"
             if all(r["draft step for 3x (ms)"] is None for r in needed) else "")
    text += (". Among the device profiles only " + ", ".join(f"{p['device']} ({p['draft']}, {p['step_ms']:.2f} ms, "
             f"{p['memory']})" for p in fast) + " is that fast" if fast else ". No device profile is that fast")
    for r in needed:
        if r["target"] != best8["target"] and r["alpha"] == best8["alpha"] and r["draft step for 2x (ms)"]:
            ok = [p["device"] + " " + p["draft"].split()[-1] for p in points if p["step_ms"] <= r["draft step for 2x (ms)"]]
            text += (f"; for {r['target']} ({r['target kind']} step {r['target step ms']:.1f} ms) 2x needs a draft step of "
                     f"at most {r['draft step for 2x (ms)']:.2f} ms: " + (", ".join(ok) or "no profile"))
    text += (f"; a GPU draft as our decoder runs it today ({measured.get('gpu_draft_step_ms', float('nan')):.2f} ms, "
             f"measured) gives {measured.get('gpu_pipelined', float('nan')):.2f}x (measured, synthetic alpha 0.71).")
    return {"text": text, "needed": needed}


def profiles_table():
    import pandas as pd
    rows = []
    for key, p in devices.all_profiles().items():
        rows.append({"profile": key, "device": p.name, "on-chip GB": p.onchip_bytes / 1e9,
                     "on-chip TB/s": p.onchip_Bps / 1e12, "off-chip GB": p.offchip_bytes / 1e9,
                     "off-chip TB/s": p.offchip_Bps / 1e12, "per layer us": p.per_layer_s * 1e6,
                     "host link us": p.host_link_s * 1e6, "sources": "; ".join(f"{k}: {v}" for k, v in p.sources.items())})
    return pd.DataFrame(rows).set_index("profile")


def testbed_runs(cfg, pair, emulations: list[str], chains_path: str, progress: bool = False) -> dict[str, dict]:
    """On the testbed: target-only (on the target node's worker, as the link modes' target), then sync and
    pipelined SD over the link with the pair's own draft (measured) and with each emulated draft device (the
    draft's recorded tokens, paced by the profile: emulated)."""
    from dataclasses import replace
    from ..runs import experiment
    runs = {"target-only": experiment.run(replace(cfg, mode="target-only", placement="ethernet"), pair, progress)}
    for label, extra in [("draft: this machine's CPU (measured)", {})] + [
            (f"draft: {e} (emulated)", {"draft_emulate": e, "draft_chains": chains_path}) for e in emulations]:
        for mode in ("sd", "pipelined"):
            runs[f"{mode}, {label}"] = experiment.run(replace(cfg, mode=mode, placement="ethernet", **extra), pair, progress)
    return runs


def runs_table(runs: dict[str, dict]):
    """testbed_runs' results, a row each (speedups against its first run, target-only: summary.sweep_table)."""
    import pandas as pd
    from ..summary import sweep_table
    rows = []
    for (label, r), t in zip(runs.items(), sweep_table(list(runs.values()))):
        rows.append({"run": label, "kind": "emulated" if "emulated" in label else "measured",
                     "tokens/s": t["tokens_per_s"], "speedup": t["speedup"], "predicted": t["predicted_speedup"],
                     "alpha": t["alpha"], "draft step ms": (r["summary"].get("costs") or {}).get("draft_step", 0) * 1e3,
                     "identical to target-only": t["identical_to_target_only"]})
    return pd.DataFrame(rows).set_index("run")


def model_check(bench_rows: list[dict], testbed: "object") -> "object":
    """Measured and emulated points against the model's prediction for each (within 15% is the goal)."""
    import pandas as pd
    rows = [{"point": f"{'H200 target, CPU draft' if 'cpu_draft' in b['run'] else 'two H200s'}, {b['run']}: {b['mode']}",
             "kind": "measured", "measured": b["speedup"], "predicted": b["predicted"]}
            for b in bench_rows if b["mode"] != "target-only" and b.get("predicted")]
    for label, r in testbed.iterrows():
        if label != "target-only" and r["predicted"]:
            rows.append({"point": f"testbed, {label}", "kind": r["kind"], "measured": r["speedup"], "predicted": r["predicted"]})
    df = pd.DataFrame(rows).set_index("point")
    df["gap"] = df["predicted"] / df["measured"] - 1
    df["within 15%"] = df["gap"].abs() <= 0.15
    return df


# ---------------------------------------------------------------- bigger targets, measured (reports/gpu/bench_targets_*.json)


def load_targets(pattern: str = "reports/gpu/bench_targets_*.json") -> list[dict]:
    """Every call's results of `python -m sdeth bench targets` (one H200 each), oldest first."""
    import glob
    import json
    from ...paths import REPO
    paths = sorted(glob.glob(pattern if pattern.startswith("/") else str(REPO / pattern)))
    if not paths:
        raise FileNotFoundError(f"no big-target results match {pattern!r} under {REPO}: run "
                                "`python -m sdeth bench targets --call N --json reports/gpu/bench_targets_N.json` on a GPU")
    return [json.load(open(p)) for p in paths]


def modelled_step_s(shape: str, weight_bytes: float, profile: str = "h200", context: int = 512) -> float:
    """The event model's step for a shape on a device profile: the weights as stored plus the context's keys and
    values (bf16) over the profile's bandwidth, a fixed cost per layer, the host link (devices.DeviceProfile)."""
    from ...models.presets import shape as shape_config
    c = shape_config(shape)
    kv = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * 2 * context
    return devices.load(profile).step_s(weight_bytes, kv, c["num_hidden_layers"])


def target_rows(runs: list[dict]) -> list[dict]:
    """One row per call and measured target: step, verify of 3/5/8 (one sequence), t(16) and t_v(16, 8) (rows of one
    prefix), the bytes floor, kernels per step; the event model's step for the same bytes beside it (modelled)."""
    rows = []
    for run in runs:
        for t in run["targets"]:
            if "step_ms" not in t:
                continue
            pts = {(p["B"], p["k"], p["path"]): p for p in t["points"]}
            cell = lambda key: (pts[key].get("replay_ms") or pts[key]["forward_ms"]) if key in pts else None  # noqa: E731
            model = modelled_step_s(t["model"], t["weight_bytes"]) * 1e3
            rows.append({"target": t["model"], "weights": t["weights"], "call": run["call"], "date": run["created"][:10],
                         "gpu": run["hardware"].get("gpu"), "step ms (measured)": t["step_ms"],
                         **{f"verify k={k} ms": cell((1, k, "chain")) for k in (3, 5, 8)},
                         "t(16) ms": cell((16, None, "rows")), "t_v(16,8) ms": cell((16, 8, "rows")),
                         "bytes floor ms": t["bytes_floor_ms"], "step / floor": t["step_over_floor"],
                         "kernels": (t.get("kernels") or {}).get("kernels_per_step"),
                         "step ms (modelled, profile h200)": round(model, 3),
                         "measured / modelled": round(t["step_ms"] / model, 3)})
    return rows


def measured_step_s(runs: list[dict], model: str, weights: str) -> float | None:
    """The median over calls of a target's measured step (s), or None where none was measured."""
    import statistics
    s = [t["step_ms"] for r in runs for t in r["targets"] if t.get("model") == model and t.get("weights") == weights
         and "step_ms" in t]
    return statistics.median(s) / 1e3 if s else None


def targets_with_measured(runs: list[dict], measured_8b_h200_s: float | None = None) -> dict[str, dict]:
    """target_steps() (the design map's targets) with the bigger targets measured on one H200 added, labelled
    measured; the modelled 70B-class on two H200s stays beside them."""
    out = target_steps(measured_8b_h200_s)
    for model, weights, label in (("Qwen3-14B", "bf16", "Qwen3-14B on H200"), ("Qwen3-32B", "bf16", "Qwen3-32B on H200"),
                                  ("Qwen2.5-72B", "fp8", "70B-class (Qwen2.5-72B fp8) on 1x H200")):
        s = measured_step_s(runs, model, weights)
        if s:
            calls = sum(1 for r in runs for t in r["targets"] if t.get("model") == model and "step_ms" in t
                        and t.get("weights") == weights)
            out[label] = {"step_s": s, "kind": "measured",
                          "how": f"sdeth.study.bench.targets, random {weights} weights, median of {calls} calls"}
    return out


def sd_rows(runs: list[dict]) -> list[dict]:
    """Colocated SD over the big targets, one row per call, target, draft and acceptance kind (measured)."""
    return [{"target": f"{r['target']} {r['target_weights']}", "draft": r["draft"], "acceptance": r["acceptance"],
             "call": run["call"], "speedup": r["speedup"], "95% low": r["speedup_ci95"][0], "95% high": r["speedup_ci95"][1],
             "predicted": r["predicted_speedup"], "alpha": r["alpha"], "target-only tok/s": r["target_only_tokens_per_s"],
             "kind": f"measured speed, {r['acceptance']} acceptance (colocated, one H200)"}
            for run in runs for r in run["sd"] if "speedup" in r]


def check_70b_claim(runs: list[dict], alpha: float, rtt_s: float, draft_step_s: float) -> dict:
    """The modelled claim '70B-class on two H200s reaches 2x with a GPU draft' against the big targets measured on
    one H200: (1) the profile's step beside the measured bf16 steps (14B, 32B); (2) the 70B-class step on two H200s,
    modelled and modelled-from-measured (the profile's step scaled by the 32B's measured / modelled ratio); (3) the
    72B in fp8 on one H200, measured, which holds the same ~70 GB a GPU. For each: the pipelined speedup with the GPU
    draft at this round trip and the draft step 2x needs (event model), beside colocated SD measured on it."""
    measured_32b = measured_step_s(runs, "Qwen3-32B", "bf16")
    bytes_32b = next((t["weight_bytes"] for r in runs for t in r["targets"]
                      if t.get("model") == "Qwen3-32B" and t.get("weights") == "bf16" and "weight_bytes" in t), None)
    ratio = measured_32b / modelled_step_s("Qwen3-32B", bytes_32b) if measured_32b and bytes_32b else None
    tp = target_steps()["70B-class on 2x H200"]["step_s"]
    fp8 = measured_step_s(runs, "Qwen2.5-72B", "fp8")
    cases = [("70B-class on 2x H200 (bf16, tensor parallel)", tp, "modelled")]
    if ratio:
        cases.append(("70B-class on 2x H200 (bf16, tensor parallel)", tp * ratio,
                      f"modelled-from-measured (x{ratio:.3f}, the 32B's measured / modelled step)"))
    if fp8:
        cases.append(("Qwen2.5-72B fp8 on 1x H200", fp8, "measured"))
    rows = []
    for target, step, kind in cases:
        p = predict(alpha, step, draft_step_s, rtt_s)
        need = needed_draft_step(alpha, step, rtt_s, 2.0)
        rows.append({"target": target, "step ms": round(step * 1e3, 3), "step kind": kind,
                     "pipelined speedup (modelled)": round(p["pipelined"], 3), "sync speedup (modelled)": round(p["sync"], 3),
                     "draft step for 2x (ms, modelled)": None if need is None else round(need * 1e3, 3)})
    sd = [r for r in sd_rows(runs) if r["target"] == "Qwen2.5-72B fp8" and r["draft"] == "Qwen3-1.7B"
          and r["acceptance"] == "synthetic"]
    reach = [r for r in rows if r["pipelined speedup (modelled)"] >= 2.0]
    text = (f"Event model, pipelined SD at alpha {alpha:.2f}, a {rtt_s * 1e3:g} ms round trip and a GPU draft step of "
            f"{draft_step_s * 1e3:.2f} ms (measured): " + "; ".join(
                f"{r['pipelined speedup (modelled)']:.2f}x over {r['target']} ({r['step kind']} step "
                f"{r['step ms']:.1f} ms)" for r in rows)
            + (". The modelled 2x holds with each of these steps" if len(reach) == len(rows) else
               ". The modelled 2x holds with the " + ", ".join(f"{r['step kind']} step of {r['target']}" for r in reach)
               if reach else ". The modelled 2x holds with none of these steps")
            + " (a speedup from the model, not a run on two GPUs)")
    if sd:
        text += ("; colocated SD on one H200 with the 1.7B draft measured " + ", ".join(
            f"{r['speedup']:.2f}x [{r['95% low']:.2f}, {r['95% high']:.2f}] (call {r['call']})" for r in sd)
            + " over the fp8 72B (synthetic alpha 0.71, random weights)")
    return {"rows": rows, "text": text + "."}


def big_target_summary(runs: list[dict], claim: dict) -> dict:
    """40_heterogeneous's summary figures of the bigger targets (one H200, random weights): the median measured step
    of the 32B (bf16) and the 72B (fp8), and the pipelined speedup the event model gives a 70B-class target on two
    H200s with its step scaled by the 32B's measured / modelled ratio (the per-call figures stay in their files)."""
    scaled = next((r for r in claim["rows"] if r["step kind"].startswith("modelled-from-measured")), None)
    steps = {"step_ms_qwen3_32b": measured_step_s(runs, "Qwen3-32B", "bf16"),
             "step_ms_qwen25_72b_fp8": measured_step_s(runs, "Qwen2.5-72B", "fp8")}
    return {**{k: None if v is None else v * 1e3 for k, v in steps.items()},
            "pipelined_70b_2xh200_modelled_from_measured": scaled["pipelined speedup (modelled)"] if scaled else None}

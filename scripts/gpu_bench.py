"""Every GPU figure of the GPU issue, on a device machine (one script; `scripts/gpu_run.sh` drives it).

    python3 scripts/gpu_bench.py engine --models Qwen3-8B --device cuda:0 --json E.json
    python3 scripts/gpu_bench.py sd --engine-json E.json --json S.json        # needs two GPUs
    python3 scripts/gpu_bench.py real --json R.json                            # SDETH_GGUF: the embedded target

engine: Qwen3-0.6B/1.7B/8B shapes with random bf16 weights at a 512-token context, batch 1: the step and
        verify forwards (widths 1, 2, 4, 8) for each engine variant, as CUDA-graph replays (GPU time, events)
        and as the runtime sees them (Engine.forward wall time, host work included); compile times; the
        fast decoder's logits against transformers'; the HBM floor from a measured copy bandwidth.
sd:     SD across two GPUs (target worker on cuda:0, draft worker on cuda:1, TCP on loopback) with
        SYNTHETIC acceptance (sdeth.synthetic): target-only, sync SD (fixed and adaptive k), pipelined
        SD, and colocated SD (both models on cuda:0, one process), each with the cost model's prediction.
real:   the embedded pair (SmolLM2-135M-Instruct and its distilled draft) with real weights on the GPU:
        greedy SD and pipelined SD must equal target-only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from sdeth.runtime.engine import Engine, prefill  # noqa: E402
from sdeth.models import QWEN3_SHAPES, random_model  # noqa: E402

CONTEXT, CAPACITY = 512, 1024
VARIANTS = {  # name -> Engine options
    "hf-graph": dict(impl="hf"),
    "fast-graph": dict(impl="fast"),
    "fast-compile": dict(impl="fast", compile_mode="default"),
    "fast-autotune": dict(impl="fast", compile_mode="max-autotune-no-cudagraphs"),
}


def env() -> dict:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().splitlines()
    except FileNotFoundError:
        smi = []
    import transformers
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {"gpus": smi, "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "triton": tv, "python": platform.python_version(), "host_cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def copy_bandwidth(device: str, gb: float = 2.0) -> float:
    """Bytes read + written per second by a large device-to-device copy (the HBM ceiling)."""
    n = int(gb * 2 ** 30 / 2)
    a = torch.randn(n, device=device, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * a.numel() * 2 / statistics.median(times)


def _timed_replays(graph, n: int = 50) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    s.record()
    for _ in range(n):
        graph.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def bench_engine(name: str, variants: list[str], device: str, widths=(1, 2, 4, 8), reps: int = 40,
                 deadline: float = float("inf")) -> list[dict]:
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(device)
    model = random_model(name, device, torch.bfloat16 if cuda else torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    kv_bytes = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * CONTEXT * 2
    ids = torch.randint(0, cfg.vocab_size, (CONTEXT + 16,), generator=torch.Generator().manual_seed(0)).tolist()
    rows, ref_logits = [], None
    for v in variants:
        if time.time() > deadline:
            rows.append({"model": name, "variant": v, "skipped": "out of time"})
            continue
        row = {"model": name, "variant": v, "params": n_params, "weight_bytes": n_params * 2, "kv_bytes_512": kv_bytes}
        try:
            eng = Engine(model, name, capacity=CAPACITY, **VARIANTS[v])
            eng.start(CAPACITY)
            prefill(eng, ids[:CONTEXT])
            for m in widths:
                t0 = time.perf_counter()
                logits = eng.forward(ids[CONTEXT:CONTEXT + m])      # first use: compile + capture
                row[f"first_m{m}_s"] = time.perf_counter() - t0
                eng.rollback(CONTEXT)
                if m == 4:
                    if ref_logits is None:
                        ref_logits = logits
                    else:
                        row["rel_err_vs_first_variant_m4"] = float((logits - ref_logits).norm() / ref_logits.norm())
                        row["argmax_agree_m4"] = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    eng.forward(ids[CONTEXT:CONTEXT + m])
                    ts.append(time.perf_counter() - t0)
                    eng.rollback(CONTEXT)
                row[f"forward_m{m}_ms"] = statistics.median(ts) * 1e3
                if m in eng.graphs:
                    row[f"replay_m{m}_ms"] = _timed_replays(eng.graphs[m][0])
            del eng
        except Exception as e:  # record and go on with the next variant
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        if cuda:
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def cmd_engine(a) -> None:
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(a.device)
    deadline = time.time() + a.budget_s
    out = {"env": env(), "device": a.device, "context": CONTEXT, "capacity": CAPACITY,
           "copy_bandwidth_Bps": copy_bandwidth(a.device) if cuda else None,
           "note": "random bf16 weights (Qwen3 shapes), batch 1, 512-token context; medians"}
    out["rows"] = []
    for name in a.models.split(","):
        out["rows"] += bench_engine(name, a.variants.split(","), a.device, deadline=deadline)
        json.dump(out, open(a.json, "w"), indent=1)
    print("wrote", a.json)


def _prompts(n: int, length: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(f"random-{i}", torch.randint(0, vocab, (length,), generator=g).tolist()) for i in range(n)]


def cmd_sd(a) -> None:
    """Two-GPU SD with synthetic acceptance, on the engine variant given."""
    from dataclasses import replace

    from sdeth import costmodel
    from sdeth.study import experiment
    from sdeth.study.experiment import RunConfig
    from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
    from sdeth.models import load_pair
    from sdeth.runtime.synthetic import SyntheticEngine
    from sdeth.place.testbed import Testbed
    from sdeth.runtime.verify import Sampling
    variant = a.variant
    opts = VARIANTS[variant]
    if a.devices.startswith("cuda"):
        torch.cuda.set_device(a.devices.split(",")[0])
    wargs = ["--impl", opts["impl"], "--capacity", str(CAPACITY)] + (
        ["--compile", opts["compile_mode"]] if opts.get("compile_mode") else [])
    out = {"env": env(), "variant": variant, "context": CONTEXT, "max_tokens": a.max_tokens, "prompts": a.n_prompts,
           "synthetic": True, "runs": []}
    deadline = time.time() + a.budget_s
    dev_t, dev_d = a.devices.split(",")
    from sdeth.models import get_pair_config
    for spec in a.pairs.split(","):
        pair, alpha = spec.rsplit(":", 1)
        alpha = float(alpha)
        if time.time() > deadline:
            break
        prompts = _prompts(a.n_prompts, CONTEXT, get_pair_config(pair).vocab_size)
        syn = ["--synthetic-alpha", str(alpha), "--synthetic-seed", "7"]
        base = RunConfig(pair=pair, k=a.k, max_tokens=a.max_tokens, placement="ethernet", device=dev_t)
        modes = [("target-only", None, a.k), ("sd", False, a.k), ("sd", True, a.k_max), ("pipelined", True, a.k_max)]
        with Testbed(pair, netns=False, device=dev_t, draft_device=dev_d, worker_args=wargs + syn,
                     draft_timeout_s=300, ready_timeout_s=500) as tb:
            for mode, adaptive, k in modes:   # warm-up: compile and capture every width the mode uses
                experiment.run_requests(replace(base, mode=mode, adaptive=adaptive, k=k, max_tokens=48),
                                         prompts[:1], testbed=tb)
            for mode, adaptive, k in modes:
                cfg = replace(base, mode=mode, adaptive=adaptive, k=k)
                try:
                    reqs, desc = experiment.run_requests(cfg, prompts, testbed=tb)
                except Exception:
                    print("target log:", tb.log("target")[-4000:], "\ndraft log:", tb.log("draft")[-4000:], flush=True)
                    raise
                out["runs"].append({"pair": pair, "alpha_set": alpha, "placement": f"two devices ({dev_t} target, {dev_d} draft)",
                                    "config": {**cfg.__dict__}, "summary": experiment.summarize(reqs, cfg),
                                    "testbed": desc})
                print(pair, mode, adaptive, round(out["runs"][-1]["summary"]["tokens_per_s"], 1), flush=True)
                json.dump(out, open(a.json, "w"), indent=1)
        # colocated: both models on the target's device in this process
        p = load_pair(pair, device=dev_t)
        s = Sampling()
        kw = dict(capacity=CAPACITY, **opts)
        tgt = SyntheticEngine(p.target, "target", "target", alpha, 7, **kw)
        drf = Drafter(SyntheticEngine(p.draft, "draft", "draft", alpha, 7, **kw), s)
        tgt.warm(a.k + 2), drf.engine.warm(4)
        cfg = replace(base, mode="sd", placement="colocated")
        generate_sd(tgt, drf, prompts[0][1], 48, a.k, s, None)                 # warm-up
        reqs = [generate_sd(tgt, drf, ids, a.max_tokens, a.k, s, None, prompt_id=pid).__dict__ for pid, ids in prompts]
        out["runs"].append({"pair": pair, "alpha_set": alpha, "placement": f"colocated ({dev_t})", "config": {**cfg.__dict__},
                            "summary": experiment.summarize(reqs, cfg)})
        print(pair, "colocated", round(out["runs"][-1]["summary"]["tokens_per_s"], 1), flush=True)
        del tgt, drf, p
        if dev_t.startswith("cuda"):
            torch.cuda.empty_cache()
        json.dump(out, open(a.json, "w"), indent=1)
    # the speedups, and the model's predictions beside them
    for r in out["runs"]:
        base_run = next(x for x in out["runs"] if x["pair"] == r["pair"] and x["config"]["mode"] == "target-only")
        r["speedup"] = r["summary"]["tokens_per_s"] / base_run["summary"]["tokens_per_s"]
        pred = r["summary"].get("predicted_tokens_per_s")
        r["predicted_speedup"] = pred / base_run["summary"]["predicted_tokens_per_s"] if pred else None
    json.dump(out, open(a.json, "w"), indent=1)
    print("wrote", a.json)


def cmd_real(a) -> None:
    """The embedded pair with real weights on the GPU: lossless checks and tokens/s."""
    from sdeth.study import experiment
    from sdeth.study.experiment import RunConfig
    from sdeth.place.testbed import Testbed
    from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
    from sdeth.models import load_pair
    from sdeth.runtime.verify import Sampling
    dev_t, dev_d = a.devices.split(",")
    out = {"env": env(), "devices": a.devices, "runs": {}}
    pair = load_pair("embedded", device=dev_t)
    cfg = RunConfig(prompts=f"sharegpt:{a.n_prompts}", max_tokens=a.max_tokens, device=dev_t)
    prompts = experiment.encode_prompts(cfg, pair.tokenizer)
    eos = pair.tokenizer.eos_token_id
    s = Sampling()
    for impl in ("hf", "fast"):
        tgt = Engine(pair.target, "target", impl=impl, capacity=CAPACITY)
        drf = Drafter(Engine(pair.draft, "draft", impl=impl, capacity=CAPACITY), s)
        ref = [generate_target_only(tgt, ids, a.max_tokens, s, eos, prompt_id=pid).__dict__ for pid, ids in prompts]
        sd = [generate_sd(tgt, drf, ids, a.max_tokens, 3, s, eos, prompt_id=pid).__dict__ for pid, ids in prompts]
        same = [r["output_ids"] for r in ref] == [r["output_ids"] for r in sd]
        out["runs"][impl] = {"target_only": experiment.summarize(ref, RunConfig(mode="target-only")),
                             "sd_k3": experiment.summarize(sd, RunConfig(mode="sd", k=3)),
                             "identical": same, "outputs": [r["output_ids"] for r in ref]}
        print(impl, "identical:", same, flush=True)
    json.dump(out, open(a.json, "w"), indent=1)
    # pipelined across the two GPUs, real weights
    ref = out["runs"]["fast"]["outputs"]
    with Testbed("embedded", netns=False, device=dev_t, draft_device=dev_d,
                 worker_args=["--impl", "fast", "--capacity", str(CAPACITY)], draft_timeout_s=60) as tb:
        for mode, adaptive in (("sd", False), ("pipelined", True), ("pipelined", False)):
            c = RunConfig(mode=mode, k=3, adaptive=adaptive, placement="ethernet", prompts=cfg.prompts,
                          max_tokens=a.max_tokens, device=dev_t)
            reqs, desc = experiment.run_requests(c, prompts, testbed=tb)
            same = [r["output_ids"] for r in reqs] == ref
            out["runs"][f"two-gpu {mode} adaptive={adaptive}"] = {"summary": experiment.summarize(reqs, c),
                                                                  "identical": same}
            print(mode, adaptive, "identical:", same, flush=True)
            json.dump(out, open(a.json, "w"), indent=1)
    print("wrote", a.json)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--models", default="Qwen3-0.6B,Qwen3-1.7B,Qwen3-8B")
    e.add_argument("--variants", default=",".join(VARIANTS))
    e.add_argument("--device", default="cuda:0")
    e.add_argument("--budget-s", type=float, default=480)
    e.add_argument("--json", required=True)
    s = sub.add_parser("sd")
    s.add_argument("--variant", default="fast-compile")
    s.add_argument("--pairs", default="random-qwen3-8b/1.7b:0.71,random-qwen3-8b/0.6b:0.56", help="PAIR:alpha,...")
    s.add_argument("--devices", default="cuda:0,cuda:1", help="target device,draft device")
    s.add_argument("--k", type=int, default=3)
    s.add_argument("--k-max", type=int, default=8)
    s.add_argument("--n-prompts", type=int, default=4)
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--budget-s", type=float, default=400)
    s.add_argument("--json", required=True)
    r = sub.add_parser("real")
    r.add_argument("--n-prompts", type=int, default=16)
    r.add_argument("--max-tokens", type=int, default=32)
    r.add_argument("--devices", default="cuda:0,cuda:1", help="target device,draft device")
    r.add_argument("--json", required=True)
    a = ap.parse_args()
    {"engine": cmd_engine, "sd": cmd_sd, "real": cmd_real}[a.cmd](a)


if __name__ == "__main__":
    main()

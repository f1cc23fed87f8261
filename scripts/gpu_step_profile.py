"""Where the draft step's device time goes, and a GEMV sweep inside CUDA graphs (one run).

    PYTHONPATH=lib python3 scripts/gpu_step_profile.py --out profile_step_kernels.json [--budget-s 330] [--models M,..]

1. GEMVs: every weight shape of the Qwen3-0.6B / 1.7B / 8B (qkv, o, gate_up, down, the output layer) at M = 1
   and 16 rows, random bf16 weights: cuBLAS (F.linear), the fused Triton GEMV with the configuration
   kernels.gemv_config chooses (chosen_*: the measured table's where it applies, else the rule's), and
   a sweep of configurations of the same kernel (BLOCK_N, BLOCK_K, SPLIT_K, tl.sum or tl.dot, warps). Each is
   timed inside one CUDA graph of back-to-back launches over enough copies of the weights that they do not sit
   in L2 (as in a step, where every layer reads its own), so launch gaps are the graph's, not the host's.
   Reported: us per call, GB/s of weight and activation bytes, the fraction of the copy bandwidth.
2. The decode step (kernelstep.kernel_chain / kernel_rows, their graph replays profiled by torch.profiler):
   kernel families (cuBLAS GEMM/GEMV, fused GEMV, attention, norms, elementwise, sampling, copies) with
   counts, us and share of a step, for kernels=torch and all (every fused kernel) at batch 1 and 16 rows,
   context 512.
3. The step with kernels=attn at a cache of context + 128 slots and at the engine's default capacity (4096):
   the attention's live-length split (each row's live slots cut into the splits, not the cache's).
Stops starting new measurements after --budget-s; whatever was measured is written (every section saves).
"""
import argparse
import json
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from sdeth import hardware
from sdeth.models.presets import shape
from sdeth.runtime import kernels as K
from sdeth.study.bench import kernelstep as KS
from sdeth.study.bench import step as SB

MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-8B")


def gemv_shapes(name: str) -> dict:
    """(N, K) of each GEMV of a model's decode step."""
    c = shape(name)
    h, hd, nq, nkv, i = (c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"],
                         c["intermediate_size"])
    return {"qkv": ((nq + 2 * nkv) * hd, h), "o": (h, nq * hd), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (c["vocab_size"], h)}


def candidates(m: int) -> list[dict]:
    """The configurations swept at m rows (m = 1: tl.sum; m = 16: tl.dot tiles of 16 rows, and tl.sum)."""
    out = []
    if m == 1:
        for bn, bk, warps in ((2, 1024, 4), (4, 512, 4), (4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 256, 4),
                              (16, 512, 8), (4, 2048, 8)):
            for split in (1, 2, 4):
                out.append(dict(BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, DOT=False, SPLIT_K=split, num_warps=warps,
                                num_stages=2))
    else:
        for bn in (16, 32, 64):
            for bk in (64, 128):
                for split in (1, 2, 4, 8):
                    out.append(dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, DOT=True, SPLIT_K=split, num_warps=4,
                                    num_stages=3))
        for bn, bk in ((4, 128),):
            for split in (1, 4):
                out.append(dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, DOT=False, SPLIT_K=split, num_warps=4,
                                num_stages=2))
    return out


def graph_us(fn, copies: int, launches: int) -> float:
    """us per call of fn(i) (i: the weight copy), `launches` calls captured in one CUDA graph, replayed."""
    for i in range(min(copies, 3)):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(launches):
            fn(j % copies)
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / launches)
    del g
    return statistics.median(times)


def sweep_gemvs(res: dict, bw: float, t_end: float, save, models=MODELS) -> None:
    dev = torch.device("cuda")
    res["gemv"] = []
    for name in models:
        for part, (n, k) in gemv_shapes(name).items():
            wbytes = n * k * 2
            copies = max(1, min(128, math.ceil(512e6 / wbytes)))
            launches = max(copies, 16)
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            for m in (1, 16):
                if time.time() > t_end:
                    res["gemv"].append({"model": name, "gemv": part, "m": m, "skipped": "out of time"})
                    continue
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                moved = wbytes + (m * k + m * n) * 2
                row = {"model": name, "gemv": part, "n": n, "k": k, "m": m, "weight_copies": copies,
                       "launches_per_graph": launches}
                ref = F.linear(x, ws[0]).float()
                row["cublas_us"] = round(graph_us(lambda i: F.linear(x, ws[i]), copies, launches), 2)
                row["chosen_config"] = {a: b for a, b in K.gemv_config(m, n, k, dev).items()}
                row["chosen_us"] = round(graph_us(lambda i: K.gemv(x, ws[i]), copies, launches), 2)
                tried = []
                for cfg in candidates(m):
                    if cfg["SPLIT_K"] > 1 and k // cfg["SPLIT_K"] < cfg["BLOCK_K"]:
                        continue
                    try:
                        y = K._launch_gemv(x, ws[0], config=cfg).float()
                        err = ((y - ref).abs().max() / ref.abs().max()).item()
                        us = graph_us(lambda i, c=cfg: K._launch_gemv(x, ws[i], config=c), copies, launches)
                        tried.append({**cfg, "us": round(us, 2), "rel_err": round(err, 4)})
                    except Exception as e:                  # noqa: BLE001 (record and go on)
                        tried.append({**cfg, "error": f"{type(e).__name__}: {e}"[:200]})
                ok = [t for t in tried if "us" in t and t["rel_err"] < 0.05]
                best = min(ok, key=lambda t: t["us"]) if ok else None
                row["best"] = best
                row["sweep"] = sorted(tried, key=lambda t: t.get("us", 1e9))[:12]
                for key in ("cublas", "chosen"):
                    row[f"{key}_GBps"] = round(moved / (row[f"{key}_us"] * 1e-6) / 1e9, 1)
                if best:
                    row["best_GBps"] = round(moved / (best["us"] * 1e-6) / 1e9, 1)
                    row["best_over_cublas"] = round(best["us"] / row["cublas_us"], 3)
                    row["best_frac_of_copy_bw"] = round(moved / (best["us"] * 1e-6) / bw, 3)
                row["cublas_frac_of_copy_bw"] = round(moved / (row["cublas_us"] * 1e-6) / bw, 3)
                res["gemv"].append(row)
                print(name, part, m, "cublas", row["cublas_us"], "chosen", row["chosen_us"], "best",
                      best and {a: best[a] for a in ("BLOCK_N", "BLOCK_K", "SPLIT_K", "DOT", "num_warps", "us")},
                      flush=True)
                save(res)
            del ws
            torch.cuda.empty_cache()


def step_profiles(res: dict, bw: float, t_end: float, save, models=MODELS[:2]) -> None:
    from sdeth.runtime.randomweights import fused_random
    res["steps"] = []
    plan = [("chain", "torch", 0), ("chain", "all", 0), ("rows", "torch", 0), ("rows", "all", 0),
            ("chain", "attn", 0), ("chain", "attn", 4096)]
    for name in models:
        model = fused_random(name, "cuda:0")
        for kind, lever, cap in plan:
            if time.time() > t_end:
                res["steps"].append({"model": name, "lever": lever, "kind": kind, "capacity": cap,
                                     "skipped": "out of time"})
                continue
            try:
                if kind == "chain":
                    row, _ = KS.kernel_chain(model, name, lever, 512, "default", bw, 64, True, capacity=cap)
                else:
                    row, _ = KS.kernel_rows(model, name, lever, 16, 512, "default", bw, True)
                row["kind"] = kind
            except Exception as e:                          # noqa: BLE001
                traceback.print_exc()
                row = {"model": name, "lever": lever, "kind": kind, "error": f"{type(e).__name__}: {e}"[:400]}
            res["steps"].append(row)
            print({a: row.get(a) for a in ("model", "lever", "rows", "capacity", "step_ms", "replay_ms",
                                           "kernels_per_step")}, flush=True)
            print("   ", {f: (v["per_step"], v["us_per_step"], v["share"]) for f, v in row.get("families", {}).items()},
                  flush=True)
            save(res)
        del model
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the results JSON")
    ap.add_argument("--budget-s", type=float, default=200, help="no new measurement after this many seconds")
    ap.add_argument("--sections", default="gemv,steps", help="comma-separated: gemv, steps")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated shapes (of {', '.join(MODELS)}); "
                    "the steps section takes the first two")
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        print(f"--models {a.models!r}: give some of {','.join(MODELS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    t0 = time.time()
    t_end = t0 + a.budget_s
    bw = SB.copy_bandwidth("cuda:0")
    res = {"schema": "sdeth.profile/1", "bench": "step-kernel-profile", "date": time.strftime("%Y-%m-%d"),
           "hardware": hardware.describe("cuda:0"), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "measured": True,
           "weights": "random bf16 on Qwen3 shapes (timing does not depend on their values)",
           "copy_bandwidth_Bps": bw, "models": models,
           "gemv_method": "each variant: back-to-back launches in one CUDA graph over enough weight copies "
                          "(>= 512 MB, at most 128) to defeat L2; us per call = replay time / launches, median of 3",
           "step_method": "sdeth.study.bench.kernelstep.kernel_chain (batch 1, context 512, capacity 0 = context + 128, or 4096) and "
                          "kernel_rows (16 rows, context 512); families from torch.profiler over 10 graph replays"}

    def save(r):
        r["wall_s"] = round(time.time() - t0, 1)
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)

    sections = a.sections.split(",")
    if "gemv" in sections:
        sweep_gemvs(res, bw, t0 + a.budget_s * (0.5 if "steps" in sections else 1.0), save, models)
    if "steps" in sections:
        step_profiles(res, bw, t_end, save, models[:2])
    save(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

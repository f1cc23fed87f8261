"""Where a step's device time goes: the kernels of a captured CUDA graph's replays (torch.profiler), grouped by
name and by family (the fused GEMV or attention, cuBLAS's GEMMs, torch's attention, norms, elementwise, sampling,
copies). Used by `bench step` (study.bench.step), the big-target study and scripts/gpu_step_profile.py.
"""
from __future__ import annotations

import torch


def kernel_profile(graph, replays: int = 10, top: int = 14) -> dict:
    """Where a step's device time goes: kernels of `replays` graph replays grouped by name (us per step)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    by: dict[str, list] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = by.setdefault(ev.name[:90], [0, 0.0])
            k[0] += 1
            k[1] += ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
    return summarize(by, replays, top)


def summarize(by: dict, replays: int, top: int = 14) -> dict:
    """Kernels a step, their us a step, each family's count, us and share of a step, and the `top` kernels, from
    by: kernel name -> [launches, us] over `replays` steps."""
    rows = sorted(by.items(), key=lambda kv: -kv[1][1])
    total = sum(v[1] for v in by.values()) / replays
    fam: dict[str, list] = {}
    for n, (c, t) in by.items():
        f = fam.setdefault(kernel_family(n), [0, 0.0])
        f[0] += c
        f[1] += t
    return {"kernels_per_step": sum(v[0] for v in by.values()) / replays, "kernel_us_per_step": round(total, 1),
            "families": {f: {"per_step": c / replays, "us_per_step": round(t / replays, 1),
                             "share": round(t / replays / total, 3) if total else 0.0}
                         for f, (c, t) in sorted(fam.items(), key=lambda kv: -kv[1][1])},
            "top": [{"name": n, "per_step": c / replays, "us_per_step": round(t / replays, 1)} for n, (c, t) in rows[:top]]}


def kernel_family(name: str) -> str:
    """A device kernel's family from its name: the fused GEMV or attention (Triton), cuBLAS's GEMM/GEMV, torch's
    attention, norms, elementwise, sampling (argmax / max reductions), copies and indexing, or other."""
    n = name.lower()
    if "_gemv_kernel" in n:
        return "gemv (fused Triton)"
    if "_attention_kernel" in n or "_combine_kernel" in n:
        return "attention (fused Triton)"
    if any(s in n for s in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitkreduce")):
        return "gemm/gemv (cuBLAS)"
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa", "softmax", "bmm")):
        return "attention (torch)"
    if "rsqrt" in n or "norm" in n or "mean" in n:
        return "norms"
    if n.startswith(("triton_poi", "triton_per", "triton_red")):
        return "elementwise"                    # torch.compile's other fused kernels (RoPE, SiLU*mul, adds)
    if any(s in n for s in ("argmax", "argmin", "max_", "reduce_kernel", "topk", "sort")):
        return "sampling/reductions"
    if any(s in n for s in ("copy", "memcpy", "memset", "index", "gather", "scatter", "cat_", "fill")):
        return "copies/indexing"
    if any(s in n for s in ("elementwise", "vectorized", "unrolled", "silu", "mul", "add")):
        return "elementwise"
    return "other"

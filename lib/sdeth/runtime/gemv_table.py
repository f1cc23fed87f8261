"""The fused GEMV's measured configurations (GEMV_TABLE) and the choice of a configuration for a GEMV's shape:
the table's entry where it applies, else a rule (gemv_rule). Plain Python over torch (no Triton), so that
fastmodel.kernel_levers can ask whether the fused GEMVs pay without importing the kernels.

Each table was measured on one GPU model (GEMV_TABLES: the H200's GEMV_TABLE, the H100's GEMV_TABLE_H100): its
timings say nothing of another, so it applies only on a device of that name; elsewhere kernels='auto' keeps cuBLAS's
GEMVs and kernels='gemv'/'all' take the rule's configurations.
"""
from __future__ import annotations

import torch

MAX_ROWS = 32                      # rows (tokens) one GEMV call takes (runtime.kernels.MAX_ROWS)
GEMV_TABLE_DEVICE = "NVIDIA H200"  # torch.cuda.get_device_name of the GPU the table was measured on

_SMS: dict = {}


def sm_count(device: torch.device) -> int:
    """The device's multiprocessors (4 for a CPU device: the interpreter's tests)."""
    if device.type != "cuda":
        return 4
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as triton.next_power_of_2."""
    return 1 << max(0, int(n) - 1).bit_length()


def _cfg(block_m: int, block_n: int, block_k: int, split_k: int, warps: int) -> dict:
    dot = block_m >= 16
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, SPLIT_K=split_k, num_warps=warps,
                num_stages=3 if dot else 2)


# Measured GEMV configurations: (rows bucket, N, K) -> (block sizes, us a call, cuBLAS's us a call), the fastest of
# a sweep of the kernel's configurations (BLOCK_N, BLOCK_K, SPLIT_K, tl.sum or tl.dot, warps) for each GEMV of the
# Qwen3-0.6B / 1.7B / 8B (qkv, o, gate_up, down, output layer) at 1 and 16 rows, each timed as back-to-back calls in
# one CUDA graph over weights that do not fit in L2 (measured on an H200, 2026-12-02, random bf16 weights, Triton
# 3.6; scripts/gpu_step_profile.py, reports/gpu/profile_step_kernels.json). A plain GEMV: the fused prologues
# (norm, SiLU) are not in these figures. At 1 row tl.sum over weight tiles of 2-8 rows x 1024-2048 wins; at 16 rows
# tl.dot on 16 x 32 tiles of 128, with K split in 4 or 8 where N is small (1024-4096).
GEMV_TABLE: dict[tuple[int, int, int], tuple[dict, float, float]] = {
    (1, 4096, 1024): (_cfg(1, 2, 1024, 1, 4), 4.5, 4.91),  # Qwen3-0.6B qkv
    (16, 4096, 1024): (_cfg(16, 16, 128, 1, 4), 5.97, 5.39),  # Qwen3-0.6B qkv
    (1, 1024, 2048): (_cfg(1, 4, 2048, 1, 8), 3.69, 12.68),  # Qwen3-0.6B o
    (16, 1024, 2048): (_cfg(16, 32, 128, 8, 4), 5.51, 5.89),  # Qwen3-0.6B o
    (1, 6144, 1024): (_cfg(1, 4, 1024, 1, 4), 5.88, 6.0),  # Qwen3-0.6B gate_up
    (16, 6144, 1024): (_cfg(16, 32, 128, 1, 4), 6.69, 6.15),  # Qwen3-0.6B gate_up
    (1, 1024, 3072): (_cfg(1, 2, 1024, 1, 4), 4.99, 6.67),  # Qwen3-0.6B down
    (16, 1024, 3072): (_cfg(16, 32, 128, 8, 4), 6.06, 7.04),  # Qwen3-0.6B down
    (1, 151936, 1024): (_cfg(1, 8, 1024, 1, 4), 72.55, 78.93),  # Qwen3-0.6B lm_head
    (16, 151936, 1024): (_cfg(16, 64, 128, 1, 4), 78.2, 81.89),  # Qwen3-0.6B lm_head
    (1, 4096, 2048): (_cfg(1, 4, 1024, 1, 4), 6.96, 7.38),  # Qwen3-1.7B qkv
    (16, 4096, 2048): (_cfg(16, 64, 128, 4, 4), 8.58, 7.33),  # Qwen3-1.7B qkv
    (1, 2048, 2048): (_cfg(1, 2, 1024, 1, 4), 5.01, 6.16),  # Qwen3-1.7B o
    (16, 2048, 2048): (_cfg(16, 32, 128, 4, 4), 6.63, 6.13),  # Qwen3-1.7B o
    (1, 12288, 2048): (_cfg(1, 4, 1024, 1, 4), 15.39, 15.97),  # Qwen3-1.7B gate_up
    (16, 12288, 2048): (_cfg(16, 32, 128, 1, 4), 15.42, 16.1),  # Qwen3-1.7B gate_up
    (1, 2048, 6144): (_cfg(1, 4, 2048, 1, 8), 10.07, 11.11),  # Qwen3-1.7B down
    (16, 2048, 6144): (_cfg(16, 32, 128, 8, 4), 10.72, 11.35),  # Qwen3-1.7B down
    (1, 151936, 2048): (_cfg(1, 8, 1024, 1, 4), 140.17, 150.78),  # Qwen3-1.7B lm_head
    (16, 151936, 2048): (_cfg(16, 32, 128, 1, 4), 150.17, 155.87),  # Qwen3-1.7B lm_head
    (1, 6144, 4096): (_cfg(1, 8, 1024, 1, 4), 15.68, 15.87),  # Qwen3-8B qkv
    (16, 6144, 4096): (_cfg(16, 32, 128, 2, 4), 17.19, 16.37),  # Qwen3-8B qkv
    (1, 4096, 4096): (_cfg(1, 4, 1024, 1, 4), 11.97, 13.44),  # Qwen3-8B o
    (16, 4096, 4096): (_cfg(16, 32, 128, 4, 4), 12.68, 13.05),  # Qwen3-8B o
    (1, 24576, 4096): (_cfg(1, 8, 1024, 1, 4), 50.9, 50.43),  # Qwen3-8B gate_up
    (16, 24576, 4096): (_cfg(16, 64, 128, 1, 4), 49.89, 51.27),  # Qwen3-8B gate_up
    (1, 4096, 12288): (_cfg(1, 8, 1024, 2, 4), 28.72, 29.55),  # Qwen3-8B down
    (16, 4096, 12288): (_cfg(16, 64, 128, 4, 4), 28.81, 28.86),  # Qwen3-8B down
    (1, 151936, 4096): (_cfg(1, 8, 1024, 1, 4), 286.47, 297.91),  # Qwen3-8B lm_head
    (16, 151936, 4096): (_cfg(16, 32, 128, 1, 4), 291.51, 303.36),  # Qwen3-8B lm_head
}


# The same sweep on one H100 (80GB HBM3, 2026-12-06, random bf16 weights, Triton 3.6; scripts/gpu_step_profile.py
# --models Qwen3-1.7B,Qwen3-0.6B, reports/gpu/profile_step_kernels_h100.json): the Qwen3-1.7B / 0.6B GEMVs (the 8B's
# were not swept there: cuBLAS's). Each entry the faster of the sweep's best and the rule's configuration. At one row
# the fused GEMV took 0.69-0.95x cuBLAS's time a call; at 16 rows 0.85-1.15x.
GEMV_TABLE_H100_DEVICE = "NVIDIA H100 80GB HBM3"
GEMV_TABLE_H100: dict[tuple[int, int, int], tuple[dict, float, float]] = {
    (1, 4096, 2048): (_cfg(1, 4, 1024, 1, 4), 7.62, 8.37),  # Qwen3-1.7B qkv
    (16, 4096, 2048): (_cfg(16, 32, 128, 4, 4), 9.94, 8.63),  # Qwen3-1.7B qkv
    (1, 2048, 2048): (_cfg(1, 2, 1024, 1, 4), 5.34, 6.37),  # Qwen3-1.7B o
    (16, 2048, 2048): (_cfg(16, 32, 128, 4, 4), 6.96, 6.39),  # Qwen3-1.7B o
    (1, 12288, 2048): (_cfg(1, 2, 1024, 1, 4), 19.18, 20.13),  # Qwen3-1.7B gate_up
    (16, 12288, 2048): (_cfg(16, 32, 128, 1, 4), 19.92, 20.47),  # Qwen3-1.7B gate_up
    (1, 2048, 6144): (_cfg(1, 4, 2048, 1, 8), 11.38, 12.84),  # Qwen3-1.7B down
    (16, 2048, 6144): (_cfg(16, 32, 128, 4, 4), 12.96, 12.98),  # Qwen3-1.7B down
    (1, 151936, 2048): (_cfg(1, 4, 2048, 1, 8), 197.9, 217.29),  # Qwen3-1.7B lm_head
    (16, 151936, 2048): (_cfg(16, 64, 128, 1, 4), 211.82, 222.42),  # Qwen3-1.7B lm_head
    (1, 4096, 1024): (_cfg(1, 2, 1024, 1, 4), 5.13, 5.66),  # Qwen3-0.6B qkv
    (16, 4096, 1024): (_cfg(16, 16, 128, 1, 4), 6.23, 5.72),  # Qwen3-0.6B qkv
    (1, 1024, 2048): (_cfg(1, 4, 2048, 1, 8), 3.98, 5.76),  # Qwen3-0.6B o
    (16, 1024, 2048): (_cfg(16, 32, 128, 8, 4), 5.73, 5.78),  # Qwen3-0.6B o
    (1, 6144, 1024): (_cfg(1, 2, 1024, 1, 4), 6.45, 7.08),  # Qwen3-0.6B gate_up
    (16, 6144, 1024): (_cfg(16, 16, 128, 1, 4), 7.38, 7.16),  # Qwen3-0.6B gate_up
    (1, 1024, 3072): (_cfg(1, 2, 1024, 1, 4), 5.28, 6.92),  # Qwen3-0.6B down
    (16, 1024, 3072): (_cfg(16, 32, 128, 8, 4), 6.05, 7.14),  # Qwen3-0.6B down
    (1, 151936, 1024): (_cfg(1, 4, 1024, 1, 4), 101.14, 111.27),  # Qwen3-0.6B lm_head
    (16, 151936, 1024): (_cfg(16, 64, 128, 1, 4), 108.55, 115.77),  # Qwen3-0.6B lm_head
}

GEMV_TABLES = {GEMV_TABLE_DEVICE: GEMV_TABLE, GEMV_TABLE_H100_DEVICE: GEMV_TABLE_H100}   # GPU name -> its table


def m_bucket(m: int) -> int:
    """The table's row bucket of m rows: 1, 2, 4, 8, 16 or 32."""
    return min(MAX_ROWS, next_pow2(max(1, m)))


def device_table(device: torch.device) -> dict | None:
    """The table measured on `device`'s GPU model (GEMV_TABLES), or None: a CPU, or a GPU no table was measured on."""
    return GEMV_TABLES.get(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def table_applies(device: torch.device) -> bool:
    """Whether a table's timings hold on `device`: a CUDA device of a model one was measured on."""
    return device_table(device) is not None


def fused_gemv_pays(m: int, shapes, device: torch.device) -> bool:
    """Whether the fused GEMVs, with the table's configurations, take no longer than cuBLAS's over the GEMVs of
    shapes [(N, K), ...] at m rows on `device`: False where a shape (or m's bucket) was not measured, or on a
    device the table was not measured on (table_applies)."""
    table = device_table(device)
    if table is None:
        return False
    hits = [table.get((m_bucket(m), n, k)) for n, k in shapes]
    if not hits or any(h is None for h in hits):
        return False
    return sum(h[1] for h in hits) <= sum(h[2] for h in hits)


def table_config(m: int, n: int, k: int, device: torch.device) -> dict | None:
    """The table's configuration for [m, k] x [n, k]^T on `device` (a copy), or None: no entry for (m's bucket, n,
    k), a bucket of tl.dot tiles too small for m, or a device the table was not measured on."""
    hit = (device_table(device) or {}).get((m_bucket(m), n, k))
    if hit is None or (m > 4 and hit[0]["BLOCK_M"] < m):
        return None
    return dict(hit[0])


def gemv_rule(m: int, n: int, k: int, sms: int) -> dict:
    """The rule's configuration for [m, k] x [n, k]^T on a GPU of `sms` multiprocessors, read off the sweep at 1
    and 16 rows (2-4, 5-8 and 17-32 rows were not swept: extrapolated): up to 4 rows a broadcast
    GEMV (tl.sum) over tiles of 4 (8 for N past 8192) weight rows x 1024; more rows tl.dot on 16 or 32 x 32 x 128
    tiles, K split so that every SM gets about two programs (up to 8 splits)."""
    if m <= 4:
        return dict(BLOCK_M=next_pow2(m), BLOCK_N=8 if n > 8192 else 4, BLOCK_K=min(1024, next_pow2(k)), DOT=False,
                    SPLIT_K=1, num_warps=4, num_stages=2)
    block_m = max(16, next_pow2(m))
    block_n, block_k = 32, min(128, max(16, next_pow2(k)))
    tiles = _cdiv(n, block_n) * _cdiv(m, block_m)
    split = 1
    while split < 8 and tiles * split * 2 <= 2 * sms and k // (split * 2) >= block_k:
        split *= 2
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT=True, SPLIT_K=split, num_warps=4,
                num_stages=3)


def chosen_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """A GPU's configuration for [m, k] x [n, k]^T: the table's where it applies (table_config), else the rule's."""
    return table_config(m, n, k, device) or gemv_rule(m, n, k, sm_count(device))

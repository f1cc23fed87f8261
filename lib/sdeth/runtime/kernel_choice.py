"""Which fused kernels a forward of the fast decoder runs under FastOptions.kernels (kernel_levers, fused_head; the
measured AUTO_GEMV_TOKENS), and check_kernels, which refuses them where they cannot run."""
from __future__ import annotations

import torch

from .settings import FastOptions, FastOptionsError


def kernel_levers(kernels: str, rows: int, width: int, chain: bool = True, gemv_shapes=(),
                  device: torch.device | None = None) -> tuple[bool, bool]:
    """(fused attention, fused GEMVs) for a forward of `rows` x `width` tokens under FastOptions.kernels: the
    attention kernel for chains (each row's own slots up to its position) of up to 16 tokens a row, the GEMVs
    for up to 32 tokens in all; wider forwards (prefill) keep torch's kernels. 'auto': the fused GEMVs up to
    AUTO_GEMV_TOKENS tokens where runtime.gemv_table.fused_gemv_pays says so for the layer's GEMV shapes
    gemv_shapes [(N, K), ...] on `device` (a table measured per shape and row count on each GPU model it holds; a
    shape not measured there, or a GPU model without a table: cuBLAS's)."""
    attn = kernels in ("attn", "all", "auto") and chain and width <= 16
    gemv = kernels in ("gemv", "all") and rows * width <= 32
    if kernels == "auto" and rows * width <= AUTO_GEMV_TOKENS and gemv_shapes and device is not None:
        from .gemv_table import fused_gemv_pays
        gemv = fused_gemv_pays(rows * width, gemv_shapes, device)
    return attn, gemv


def fused_head(kernels: str, rows: int, lm_head, device: torch.device, gemv_k: bool) -> bool:
    """Whether the output layer (final norm and lm_head, `rows` rows) runs as one fused norm_gemv: with the layers'
    fused GEMVs (gemv_k) and bf16 weights; under 'auto' only where the table says it pays for its own shape too
    (a pruned head's shape was not measured: cuBLAS's)."""
    if not gemv_k or not isinstance(lm_head, torch.Tensor):
        return False
    if kernels != "auto":
        return True
    from .gemv_table import fused_gemv_pays
    return fused_gemv_pays(rows, [tuple(lm_head.shape)], device)


# kernels='auto': the attention kernel wherever it applies; the fused GEMVs up to AUTO_GEMV_TOKENS tokens, where the
# measured table (runtime.gemv_table.GEMV_TABLE, used on the GPU model it was measured on) has the layer's shapes at
# that row count and their sum is no more than cuBLAS's (the output layer: its own shape, fused_head). Measured on an
# H200 (2026-12-02, random bf16 weights; reports/gpu/profile_step_kernels.json, bench_step_kernels_4.json,
# _8b_2.json): with the table's configurations the fused GEMV takes 0.3-1.0x cuBLAS's time
# a call at one row on every GEMV of the Qwen3-0.6B / 1.7B / 8B, and the step at batch 1 (context 512) went 0.6B
# 1.585 -> 1.078 ms, 8B 5.138 -> 4.757. At 16 rows a plain GEMV is at parity (0.86-1.17x) but the fused prologues
# (RMSNorm, SiLU*mul) cost more than the kernels they remove: 0.6B 'all' 1.843 ms against 'attn' 1.527, so the
# tokens' cap keeps cuBLAS's there; 2 to 15 tokens were not measured.
AUTO_GEMV_TOKENS = 1


def check_kernels(o: FastOptions, weights: str, device: torch.device, head_dim: int) -> None:
    """Refuse kernels=... where they cannot run: weights other than bf16, a whole-model compile, no Triton, heads
    the attention kernel does not take."""
    if weights != "bf16":
        raise FastOptionsError(f"fast options {o}: kernels={o.kernels} needs bf16 weights (these are {weights}); "
                               f"use kernels=torch with weights={weights}, or weights=bf16")
    if o.scope == "model":
        raise FastOptionsError(f"fast options {o}: kernels={o.kernels} compiles the torch parts around its kernels "
                               "layer by layer; use scope=layer")
    try:
        from .kernels import MIN_HEAD_DIM, unavailable
    except ImportError as e:
        raise FastOptionsError(f"kernels={o.kernels} needs Triton ({e}): pip install triton, "
                               "or use kernels=torch") from e
    why = unavailable(device)
    if not why and o.kernels in ("attn", "all", "auto") and (head_dim < MIN_HEAD_DIM or head_dim & (head_dim - 1)):
        why = (f"the attention kernel takes head dims of powers of two from {MIN_HEAD_DIM} "
               f"(this model's: {head_dim})")
    if why:
        raise FastOptionsError(f"kernels={o.kernels}: {why}; or use kernels=torch")

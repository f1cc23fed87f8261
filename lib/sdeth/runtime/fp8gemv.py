"""Weight-only fp8: y = x @ (q * s)^T with the e4m3 weights q [N, K] dequantized inside the product (a Triton
kernel on a GPU), so that a step reads one byte a weight and the activations keep bf16.

    y = fp8w_linear(x, q, s)       # x [M, K] bf16, q [N, K] float8_e4m3fn, s [N] float32 (per-row scale)

The kernel tiles N (BLOCK_N rows of weights a program) and the rows of x (BLOCK_M, at least 16 for the
matrix instruction): a decode step (M = 1) reads each weight once; M above BLOCK_M re-reads the weights
once per block of rows. Registered as a torch custom op, so torch.compile and CUDA graphs treat it as
one opaque call. On a CPU the same product is computed by dequantizing (tests).
"""
from __future__ import annotations

import torch

_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def fp8w_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
            n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
            m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
                x = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
                acc += tl.dot(x, tl.trans(w.to(tl.bfloat16)))
            s = tl.load(s_ptr + n, mask=n < N, other=0.0)
            y = acc * s[None, :]
            tl.store(y_ptr + m[:, None] * N + n[None, :], y.to(tl.bfloat16), mask=(m[:, None] < M) & (n[None, :] < N))

        _KERNEL = fp8w_kernel
    return _KERNEL


def block_m(m: int) -> int:
    """Rows of x a program takes: 16 at least (the matrix instruction), 128 at most."""
    return min(128, max(16, 1 << (m - 1).bit_length()))


@torch.library.custom_op("sdeth::fp8w_linear", mutates_args=())
def fp8w_linear(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 times the fp8 weight q [N, K] with per-row scale s [N] -> [M, N] bf16."""
    if not x.is_cuda:
        return (x.float() @ (q.float() * s[:, None]).t()).to(x.dtype)
    x = x.contiguous()
    M, K = x.shape
    N = q.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=torch.bfloat16)
    bm, bn, bk = block_m(M), 64, 128
    grid = ((N + bn - 1) // bn, (M + bm - 1) // bm)
    _kernel()[grid](x, q, s, y, M, N, K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=4)
    return y.to(x.dtype)


@fp8w_linear.register_fake
def _(x, q, s):
    return x.new_empty(x.shape[0], q.shape[0])

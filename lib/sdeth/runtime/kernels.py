"""Fused decode kernels (Triton) for the fast decoder's step: about six kernels a layer instead of ~15.

    qkv = norm_gemv(x, carry, in_norm, wqkv, bqkv, eps, x_out=x_new)   # x_new = x + carry; rmsnorm; @ wqkv.T + b
    o = decode_attention(qkv, kc, vc, positions, slots, cos, sin, q_norm, k_norm, shape)   # attention_kernels
    x = gemv(o, wo, residual=x_new)                                     # O-projection + residual
    gu = norm_gemv(x, None, post_norm, w_gate_up, None, eps)
    mlp = silu_gemv(gu, w_down)                                         # silu(gate) * up, @ w_down.T

Terms: T tokens (rows x width, row-major), H hidden size, nq / nkv query / key-value heads, hd head dim,
G = nq // nkv query heads per kv head, S cache slots. Weights are [N, K] (torch's linear layout), stored
in the model's dtype (bf16 on a GPU); products accumulate in fp32 and each result is rounded to the
model's dtype where the torch path (fastmodel.block) rounds it, so the two agree to a few bf16 ulps.

- norm_gemv / gemv / silu_gemv: one kernel over [T, K] x [N, K]^T, for T = 1..32 rows. Each program
  owns BLOCK_N outputs of BLOCK_M rows over a split of K, and (norm_gemv) first recomputes its rows' RMS
  from the small input. Up to 4 rows the product is a broadcast multiply and sum (a GEMV); more rows use
  tl.dot. With K split (SPLIT_K > 1) each split stores an fp32 partial and the last split of a tile to
  finish (a ticket counter, reset by it) sums them in order and writes the output: one launch, deterministic.
  Block sizes and splits come from runtime.gemv_table: its GEMV_TABLE (measured per shape and row count inside
  CUDA graphs on an H200; used on that GPU only), else its rule.
- decode_attention (runtime.attention_kernels): one program per (row, kv head), the row's new keys and values
  written at their slots, then online-softmax attention over its own row's slots (that module has the rest).

Where no CUDA device is present, Triton's interpreter runs the kernels on CPU tensors (for tests): it
must be switched on before Triton is first imported, which this module does when it is imported first
(otherwise set TRITON_INTERPRET=1 in the environment).
"""
import os
import sys

import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton                      # noqa: E402
import triton.language as tl       # noqa: E402

from .gemv_table import MAX_ROWS, chosen_config    # noqa: E402  (MAX_ROWS: rows (tokens) one GEMV call takes)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_WIDTH = 16                     # tokens per row the attention kernel takes
MIN_HEAD_DIM = 32                  # the attention kernel's dots take half a head: 16 or more on a GPU


def unavailable(device: torch.device) -> str | None:
    """Why the kernels cannot run on `device` (None: they can)."""
    if device.type == "cuda" or INTERPRET:
        return None
    return (f"Triton kernels need a CUDA device (got {device}), or Triton's interpreter: set TRITON_INTERPRET=1 "
            "before Python starts")


# ---------------------------------------------------------------- GEMV with fused prologue / epilogue

@triton.jit
def _residual_tile(x_ptr, carry_ptr, rows, ks, mask, stride, CARRY: tl.constexpr):
    """x + carry (rounded to x's dtype, as torch's add) for rows x ks: [BLOCK_M, BLOCK_K] fp32."""
    offs = rows[:, None] * stride + ks[None, :]
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if CARRY:
        v = v + tl.load(carry_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = v.to(x_ptr.dtype.element_ty).to(tl.float32)
    return v


@triton.jit
def _row_rstd(x_ptr, carry_ptr, x_out_ptr, rows, M, K, stride, eps, write_m,
              CARRY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / RMS of each row of x + carry: [BLOCK_M] fp32. Writes x + carry to x_out for rows below write_m."""
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask = (rows[:, None] < M) & (ks[None, :] < K)
        v = _residual_tile(x_ptr, carry_ptr, rows, ks, mask, stride, CARRY)
        if CARRY:
            tl.store(x_out_ptr + rows[:, None] * stride + ks[None, :], v.to(x_out_ptr.dtype.element_ty),
                     mask=(rows[:, None] < write_m) & (ks[None, :] < K))
        ss += tl.sum(v * v, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _input_tile(x_ptr, carry_ptr, norm_ptr, rows, ks, M, K, stride, rstd,
                NORM: tl.constexpr, CARRY: tl.constexpr, SILU: tl.constexpr):
    """The GEMV's input for rows x ks, in x's dtype: x, rmsnorm(x + carry) * norm, or silu(x[:, k]) * x[:, K + k]."""
    mask = (rows[:, None] < M) & (ks[None, :] < K)
    dt = x_ptr.dtype.element_ty
    if NORM:
        v = _residual_tile(x_ptr, carry_ptr, rows, ks, mask, stride, CARRY)
        nw = tl.load(norm_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        a = ((v * rstd[:, None]).to(dt).to(tl.float32) * nw[None, :]).to(dt)
    elif SILU:
        offs = rows[:, None] * stride + ks[None, :]
        g = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + offs + K, mask=mask, other=0.0).to(tl.float32)
        a = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * u).to(dt)
    else:
        a = tl.load(x_ptr + rows[:, None] * stride + ks[None, :], mask=mask, other=0.0)
    return a


@triton.jit
def _mac(acc, a, w, DOT: tl.constexpr, F32: tl.constexpr):
    """acc [BM, BN] += a [BM, BK] @ w [BN, BK]^T (fp32 accumulation)."""
    if DOT:
        if F32:
            acc += tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(w))
    else:
        acc += tl.sum(a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return acc


@triton.jit
def _gemv_store(acc, bias_ptr, res_ptr, y_ptr, rows, cols, M, N, stride_y, BIAS: tl.constexpr, RES: tl.constexpr):
    """The GEMV's epilogue: acc [BLOCK_M, BLOCK_N] fp32 (+ bias), rounded to y's dtype (+ residual), into y."""
    if BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out_mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * stride_y + cols[None, :]
    y = acc.to(y_ptr.dtype.element_ty)
    if RES:     # torch rounds the product, then the sum
        y = (y.to(tl.float32) + tl.load(res_ptr + offs, mask=out_mask, other=0.0).to(tl.float32)).to(y.dtype)
    tl.store(y_ptr + offs, y, mask=out_mask)


@triton.jit
def _gemv_kernel(x_ptr, carry_ptr, x_out_ptr, norm_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, part_ptr, count_ptr,
                 M, N, K, stride_x, stride_y, eps, k_split,
                 NORM: tl.constexpr, CARRY: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr,
                 RES: tl.constexpr, DOT: tl.constexpr, F32: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                 NORM_K: tl.constexpr):
    """y [M, N] = input(x) [M, K] @ w [N, K]^T (+ bias [N]) (+ res [M, N]); see _input_tile for the input.
    Program (n, m, s) owns BLOCK_N outputs of BLOCK_M rows over K's elements s*k_split..(s+1)*k_split - 1 (NORM:
    it first reads its rows whole, NORM_K at a time, for their RMS: wide tiles, so few dependent loads). With
    SPLIT_K > 1 each split stores its fp32 partial in part [SPLIT_K, grid_m * BLOCK_M, N] and takes a ticket
    from count [grid_m * grid_n] (int32, zero between calls); the last of the tile's splits sums the partials
    in split order (deterministic), writes y and sets the count back to zero for the next call."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:
        rstd = _row_rstd(x_ptr, carry_ptr, x_out_ptr, rows, M, K, stride_x, eps,
                         tl.where((pid_n == 0) & (pid_k == 0), M, 0), CARRY, BLOCK_M, NORM_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = _input_tile(x_ptr, carry_ptr, norm_ptr, rows, ks, M, K, stride_x, rstd, NORM, CARRY, SILU)
        w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=(cols[:, None] < N) & (ks[None, :] < K),
                    other=0.0)
        acc = _mac(acc, a, w, DOT, F32)
    if SPLIT_K == 1:
        _gemv_store(acc, bias_ptr, res_ptr, y_ptr, rows, cols, M, N, stride_y, BIAS, RES)
    else:
        m_pad = tl.num_programs(1) * BLOCK_M
        part = part_ptr + rows[:, None] * N + cols[None, :]
        tl.store(part + pid_k * m_pad * N, acc, mask=cols[None, :] < N)
        tl.debug_barrier()      # every thread's partial stored before the (release) ticket
        count = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count, 1) == SPLIT_K - 1:
            tl.debug_barrier()
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part + s * m_pad * N, mask=cols[None, :] < N, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count, 0)
            _gemv_store(acc, bias_ptr, res_ptr, y_ptr, rows, cols, M, N, stride_y, BIAS, RES)


def gemv_config(m: int, n: int, k: int, device: torch.device) -> dict:
    """Block sizes for [m, k] x [n, k]^T: on a GPU gemv_table.chosen_config's (the measured table's entry where it
    applies to the device, else the rule's; the sweep measured 1 and 16 rows only: 9-15 rows take the 16 rows'
    entry, 2-8 and 17-32 rows the rule, extrapolated from them); in Triton's interpreter few, large programs (its cost is per program and per
    operation)."""
    if INTERPRET:
        dot = m > 4
        block_m = max(16, triton.next_power_of_2(m)) if dot else triton.next_power_of_2(m)
        return dict(BLOCK_M=block_m, BLOCK_N=min(triton.next_power_of_2(n), 64),
                    BLOCK_K=min(triton.next_power_of_2(k), 64), DOT=dot, SPLIT_K=1)
    return chosen_config(m, n, k, device)


_SCRATCH: dict = {}                 # device -> (split-K partials, tickets)
_OUTGROWN: list = []                # scratch replaced by a larger one: kept, a captured graph may still use it


def _split_scratch(device: torch.device, parts: int, counts: int):
    """The device's split-K partials (fp32, `parts` elements) and tickets (int32, `counts`, zero between calls):
    grown when too small, the old ones kept alive (a CUDA graph captured with them replays into them). One pair per
    device: its GEMVs run one after another (the runtime's forwards, their warm-ups and graph replays are ordered
    on one stream), and each call's last split sets its tickets back to zero. Never allocated inside a CUDA-graph
    capture (there the zeroing would run only when that graph replays): the engines warm the same forward on a
    side stream before they capture it, which allocates it; a capture that would allocate raises instead."""
    part, count = _SCRATCH.get(device, (None, None))
    grow_p = part is None or part.numel() < parts
    grow_c = count is None or count.numel() < counts
    if (grow_p or grow_c) and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"fused GEMV: split-K scratch ({parts} partials, {counts} tickets) first needed inside a "
                           "CUDA-graph capture; run the same forward once before capturing it")
    if grow_p:
        if part is not None:
            _OUTGROWN.append(part)
        part = torch.empty(max(parts, 1 << 16), dtype=torch.float32, device=device)
    if grow_c:
        if count is not None:
            _OUTGROWN.append(count)
        count = torch.zeros(max(counts, 1024), dtype=torch.int32, device=device)
    _SCRATCH[device] = (part, count)
    return part, count


def _launch_gemv(x, w, *, carry=None, x_out=None, norm=None, bias=None, residual=None, eps=0.0, silu=False,
                 config: dict | None = None):
    """The shared launcher: x [M, K] (silu: [M, 2K]), w [N, K] -> y [M, N] in x's dtype. config: block sizes
    (BLOCK_M, BLOCK_N, BLOCK_K, DOT, SPLIT_K, num_warps, num_stages) instead of gemv_config's."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"fused GEMV: weights of format {w[0]!r} are not supported; use weights=bf16")
    M, N, K = x.shape[0], w.shape[0], w.shape[1]
    if M > MAX_ROWS:
        raise ValueError(f"fused GEMV of {M} rows: at most {MAX_ROWS}; run wider forwards on the torch path")
    if x.shape[1] != (2 * K if silu else K) or not x.is_contiguous() or not w.is_contiguous():
        raise ValueError(f"fused GEMV: input {tuple(x.shape)} (contiguous) does not fit weights {tuple(w.shape)}")
    if residual is not None and (residual.shape != (M, N) or not residual.is_contiguous()):
        raise ValueError(f"fused GEMV: residual {tuple(residual.shape)} should be contiguous ({M}, {N})")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    cfg = dict(config or gemv_config(M, N, K, x.device))
    split = cfg.pop("SPLIT_K", 1)
    if split < 1:
        raise ValueError(f"fused GEMV: SPLIT_K={split} should be 1 or more")
    k_split = triton.cdiv(triton.cdiv(K, split), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    split = triton.cdiv(K, k_split)             # no empty split
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]), split)
    part, count = (_split_scratch(x.device, split * grid[1] * cfg["BLOCK_M"] * N, grid[0] * grid[1])
                   if split > 1 else (y, y))
    _gemv_kernel[grid](x, carry if carry is not None else x, x_out if x_out is not None else x,
                       norm if norm is not None else x, w, bias if bias is not None else x,
                       residual if residual is not None else x, y, part, count, M, N, K, x.stride(0), N, eps, k_split,
                       NORM=norm is not None, CARRY=carry is not None, SILU=silu, BIAS=bias is not None,
                       RES=residual is not None, F32=INTERPRET or x.dtype == torch.float32, SPLIT_K=split,
                       NORM_K=cfg["BLOCK_K"] if INTERPRET else min(triton.next_power_of_2(K), 8192 // cfg["BLOCK_M"]),
                       **cfg)
    return y


def norm_gemv(x, carry, norm, w, bias, eps: float, x_out=None) -> torch.Tensor:
    """rmsnorm(x + carry) * norm @ w.T (+ bias): x, carry [M, K] (carry may be None), norm [K], w [N, K],
    bias [N] or None -> [M, N]. With carry, x + carry is also written to x_out [M, K] (the new residual)."""
    if carry is not None and x_out is None:
        raise ValueError("norm_gemv with a carry needs x_out, where x + carry is written")
    return _launch_gemv(x, w, carry=carry, x_out=x_out, norm=norm, bias=bias, eps=eps)


def gemv(x, w, residual=None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T (+ residual [M, N]) -> [M, N]."""
    return _launch_gemv(x, w, residual=residual)


def silu_gemv(gate_up, w) -> torch.Tensor:
    """(silu(gate) * up) @ w.T where gate_up [M, 2K] = [gate | up], w [N, K] -> [M, N]."""
    return _launch_gemv(gate_up, w, silu=True)

"""Fused decode attention with the cache write (Triton): the fast decoder's attention kernel, one of the fused
decode kernels (runtime.kernels has the others, the GEMVs, and the terms: T tokens, nq / nkv heads, hd, G, S).

- decode_attention: one program per (row, kv head): the row's new keys (per-head RMSNorm, RoPE) and
  values written at their slots, then online-softmax attention (fp32) of the G*W query rows over
  slots 0..position of its own row only (no padded span, no mask tensor); K and V are read once per
  group of query heads. Within a row token w sees the slots up to its own position, so a width of 2
  (a catch-up) is causal between its tokens. With few (row, kv head) programs (one row: as many as kv
  heads) the slots are split among programs (flash-decoding) and a second kernel combines the splits.

runtime.kernels switches Triton's interpreter on where no CUDA device is present (for tests), before Triton is
first imported: this module imports it before Triton.
"""
import torch

from .kernels import INTERPRET, MAX_WIDTH, MIN_HEAD_DIM   # first: it switches Triton's interpreter on (see above)

import triton                      # noqa: E402
import triton.language as tl       # noqa: E402


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    """a @ b with fp32 accumulation (F32: operands in fp32, IEEE products: fp32 models and the interpreter)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _norm_rope(x1, x2, pos, norm_ptr, cos_ptr, sin_ptr, stride_rope, eps,
               HD: tl.constexpr, QK_NORM: tl.constexpr):
    """Heads split in halves x1, x2 [B, HD/2] (fp32) at positions pos [B]: per-head RMSNorm (QK_NORM, weights
    norm [HD]), then rotate-half RoPE from the tables cos, sin [P, HD]. Returns the halves, fp32."""
    HALF: tl.constexpr = HD // 2
    dt = cos_ptr.dtype.element_ty
    d = tl.arange(0, HALF)
    if QK_NORM:
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HD + eps)
        n1 = tl.load(norm_ptr + d).to(tl.float32)
        n2 = tl.load(norm_ptr + HALF + d).to(tl.float32)
        x1 = ((x1 * rstd[:, None]).to(dt).to(tl.float32) * n1[None, :]).to(dt).to(tl.float32)
        x2 = ((x2 * rstd[:, None]).to(dt).to(tl.float32) * n2[None, :]).to(dt).to(tl.float32)
    at = pos[:, None] * stride_rope + d[None, :]
    c1 = tl.load(cos_ptr + at).to(tl.float32)
    s1 = tl.load(sin_ptr + at).to(tl.float32)
    c2 = tl.load(cos_ptr + at + HALF).to(tl.float32)
    s2 = tl.load(sin_ptr + at + HALF).to(tl.float32)
    return x1 * c1 - x2 * s1, x2 * c2 + x1 * s2


@triton.jit
def _write_new_kv(qkv_ptr, kc_ptr, vc_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, kn_ptr, r, h,
                  stride_t, stride_cr, stride_ch, stride_cs, stride_rope, eps, sp, chunk, last,
                  W: tl.constexpr, W_PAD: tl.constexpr, NQ: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr,
                  QK_NORM: tl.constexpr):
    """Row r's W new keys (normed, rotated) and values of kv head h, from qkv [T, (NQ + 2 NKV) HD], written to
    the caches [R, NKV, S, HD] at the tokens' slots: those in split sp's slots (slot // chunk == sp, the slots
    past the last split's in it), the split that reads them."""
    HALF: tl.constexpr = HD // 2
    w = tl.arange(0, W_PAD)
    t = r * W + w
    slot = tl.load(slot_ptr + t, mask=w < W, other=0)
    mine = (w < W) & (tl.minimum(slot // chunk, last) == sp)
    live = mine[:, None]
    pos = tl.load(pos_ptr + t, mask=mine, other=0)
    d = tl.arange(0, HALF)
    k_at = qkv_ptr + t[:, None] * stride_t + (NQ + h) * HD + d[None, :]
    k1 = tl.load(k_at, mask=live, other=0.0).to(tl.float32)
    k2 = tl.load(k_at + HALF, mask=live, other=0.0).to(tl.float32)
    k1, k2 = _norm_rope(k1, k2, pos, kn_ptr, cos_ptr, sin_ptr, stride_rope, eps, HD, QK_NORM)
    c_at = r * stride_cr + h * stride_ch + slot[:, None] * stride_cs + d[None, :]
    tl.store(kc_ptr + c_at, k1.to(kc_ptr.dtype.element_ty), mask=live)
    tl.store(kc_ptr + c_at + HALF, k2.to(kc_ptr.dtype.element_ty), mask=live)
    v = tl.load(qkv_ptr + t[:, None] * stride_t + (NQ + NKV + h) * HD + d[None, :], mask=live, other=0.0)
    v2 = tl.load(qkv_ptr + t[:, None] * stride_t + (NQ + NKV + h) * HD + HALF + d[None, :], mask=live, other=0.0)
    tl.store(vc_ptr + c_at, v, mask=live)
    tl.store(vc_ptr + c_at + HALF, v2, mask=live)


@triton.jit
def _load_queries(qkv_ptr, pos, qn_ptr, cos_ptr, sin_ptr, r, h, stride_t, stride_rope, eps,
                  W: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, QK_NORM: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    """The G*W query rows of kv head h in row r (row i: head h*G + i // W, token i % W), normed and rotated,
    in the model's dtype: two halves [BLOCK_M, HD/2]."""
    HALF: tl.constexpr = HD // 2
    i = tl.arange(0, BLOCK_M)
    live = (i < G * W)[:, None]
    t = r * W + i % W
    d = tl.arange(0, HALF)
    at = qkv_ptr + t[:, None] * stride_t + (h * G + i // W)[:, None] * HD + d[None, :]
    q1 = tl.load(at, mask=live, other=0.0).to(tl.float32)
    q2 = tl.load(at + HALF, mask=live, other=0.0).to(tl.float32)
    q1, q2 = _norm_rope(q1, q2, tl.maximum(pos, 0), qn_ptr, cos_ptr, sin_ptr, stride_rope, eps, HD, QK_NORM)
    return q1.to(qkv_ptr.dtype.element_ty), q2.to(qkv_ptr.dtype.element_ty)


@triton.jit
def _attend(q1, q2, pos, k_ptr, v_ptr, stride_cs, scale, lo, end,
            HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F32: tl.constexpr):
    """Online softmax over slots lo..end-1 of one row's cache of one kv head (k, v at slot s: ptr + s *
    stride_cs): query row i (halves q1, q2 [BLOCK_M, HD/2]) sees the slots up to pos[i]. Returns (unnormalised
    output halves [BLOCK_M, HD/2] fp32, the softmax denominators and running maxima [BLOCK_M])."""
    HALF: tl.constexpr = HD // 2
    d = tl.arange(0, HALF)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    hi = tl.minimum(tl.max(pos, axis=0) + 1, end)
    for s0 in range(lo, hi, BLOCK_N):
        s = s0 + tl.arange(0, BLOCK_N)
        live = (s < hi)[:, None]
        k_at = k_ptr + s[:, None] * stride_cs + d[None, :]
        k1 = tl.load(k_at, mask=live, other=0.0)
        k2 = tl.load(k_at + HALF, mask=live, other=0.0)
        scores = (_dot(q1, tl.trans(k1), F32) + _dot(q2, tl.trans(k2), F32)) * scale
        scores = tl.where(s[None, :] <= pos[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_at = v_ptr + s[:, None] * stride_cs + d[None, :]
        v1 = tl.load(v_at, mask=live, other=0.0)
        v2 = tl.load(v_at + HALF, mask=live, other=0.0)
        acc1 = acc1 * alpha[:, None] + _dot(p.to(v1.dtype), v1, F32)
        acc2 = acc2 * alpha[:, None] + _dot(p.to(v2.dtype), v2, F32)
        m_i = m_new
    return acc1, acc2, l_i, m_i


@triton.jit
def _attention_kernel(qkv_ptr, o_ptr, part_ptr, kc_ptr, vc_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
                      stride_t, stride_o, stride_cr, stride_ch, stride_cs, stride_rope, eps, scale, chunk,
                      W: tl.constexpr, W_PAD: tl.constexpr, G: tl.constexpr, NQ: tl.constexpr, NKV: tl.constexpr,
                      HD: tl.constexpr, QK_NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      F32: tl.constexpr, SPLITS: tl.constexpr):
    """Program (r, h, sp): row r's new keys and values of kv head h that fall in split sp's slots into the cache,
    then its G*W query rows' attention over the row's slots sp*chunk..(sp+1)*chunk - 1 up to each one's position:
    into o [T, NQ * HD] when there is one split (chunk: every slot), else as partials (running max, denominator,
    unnormalised output) for _combine_kernel, the chunk cut from the row's live length (its highest position)."""
    r, h, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if SPLITS > 1:              # the row's live slots in SPLITS chunks of whole tiles (every program of the row agrees)
        w = tl.arange(0, W_PAD)
        live_len = tl.max(tl.load(pos_ptr + r * W + w, mask=w < W, other=0), axis=0) + 1
        chunk = ((live_len + SPLITS - 1) // SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    _write_new_kv(qkv_ptr, kc_ptr, vc_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, kn_ptr, r, h,
                  stride_t, stride_cr, stride_ch, stride_cs, stride_rope, eps, sp, chunk, SPLITS - 1,
                  W, W_PAD, NQ, NKV, HD, QK_NORM)
    tl.debug_barrier()          # this program's cache writes, visible to all its threads before attention reads
    i = tl.arange(0, BLOCK_M)
    live = i < G * W
    t = r * W + i % W
    pos = tl.load(pos_ptr + t, mask=live, other=-1)
    q1, q2 = _load_queries(qkv_ptr, pos, qn_ptr, cos_ptr, sin_ptr, r, h, stride_t, stride_rope, eps,
                           W, G, HD, QK_NORM, BLOCK_M)
    base = r * stride_cr + h * stride_ch
    acc1, acc2, l_i, m_i = _attend(q1, q2, pos, kc_ptr + base, vc_ptr + base, stride_cs, scale, sp * chunk,
                                   (sp + 1) * chunk, HD, BLOCK_M, BLOCK_N, F32)
    HALF: tl.constexpr = HD // 2
    d = tl.arange(0, HALF)
    if SPLITS == 1:
        l_i = tl.where(l_i > 0, l_i, 1.0)
        at = o_ptr + t[:, None] * stride_o + (h * G + i // W)[:, None] * HD + d[None, :]
        tl.store(at, (acc1 / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=live[:, None])
        tl.store(at + HALF, (acc2 / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=live[:, None])
    else:
        _store_partial(part_ptr, ((r * NKV + h) * SPLITS + sp) * BLOCK_M, acc1, acc2, l_i, m_i, HD, BLOCK_M)


@triton.jit
def _store_partial(part_ptr, row0, acc1, acc2, l_i, m_i, HD: tl.constexpr, BLOCK_M: tl.constexpr):
    """One split's partials at rows row0..row0+BLOCK_M-1 of part [*, HD + 2] (fp32): output, denominator, max."""
    HALF: tl.constexpr = HD // 2
    i = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HALF)
    at = part_ptr + (row0 + i)[:, None] * (HD + 2)
    tl.store(at + d[None, :], acc1)
    tl.store(at + HALF + d[None, :], acc2)
    tl.store(part_ptr + (row0 + i) * (HD + 2) + HD, l_i)
    tl.store(part_ptr + (row0 + i) * (HD + 2) + HD + 1, m_i)


@triton.jit
def _combine_kernel(part_ptr, o_ptr, stride_o, W: tl.constexpr, G: tl.constexpr, NKV: tl.constexpr,
                    HD: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr):
    """Program (r, h): the splits' partials of row r's kv head h, rescaled to their common max and summed, into
    o [T, NQ * HD] (flash-decoding's reduction)."""
    r, h = tl.program_id(0), tl.program_id(1)
    HALF: tl.constexpr = HD // 2
    i = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HALF)
    m = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    for sp in range(SPLITS):
        rows = ((r * NKV + h) * SPLITS + sp) * BLOCK_M + i
        m_s = tl.load(part_ptr + rows * (HD + 2) + HD + 1)
        l_s = tl.load(part_ptr + rows * (HD + 2) + HD)
        m_new = tl.maximum(m, m_s)
        a, b = tl.exp(m - m_new), tl.exp(m_s - m_new)
        at = part_ptr + rows[:, None] * (HD + 2) + d[None, :]
        acc1 = acc1 * a[:, None] + tl.load(at) * b[:, None]
        acc2 = acc2 * a[:, None] + tl.load(at + HALF) * b[:, None]
        l_sum = l_sum * a + l_s * b
        m = m_new
    live = i < G * W
    l_sum = tl.where(l_sum > 0, l_sum, 1.0)
    t = r * W + i % W
    at = o_ptr + t[:, None] * stride_o + (h * G + i // W)[:, None] * HD + d[None, :]
    tl.store(at, (acc1 / l_sum[:, None]).to(o_ptr.dtype.element_ty), mask=live[:, None])
    tl.store(at + HALF, (acc2 / l_sum[:, None]).to(o_ptr.dtype.element_ty), mask=live[:, None])


SPLIT_BELOW = 64                   # fewer (row, kv head) programs than this: the attention is split along the slots
MAX_SPLITS = 16


def attention_splits(rows: int, nkv: int, slots: int, block_n: int) -> int:
    """The splits of an attention over a cache of `slots` slots for `rows` x `nkv` (row, kv head) pairs: one when
    there are SPLIT_BELOW pairs or more (enough programs), else enough for about SPLIT_BELOW programs (at most
    MAX_SPLITS, and no more than the cache has tiles of block_n slots); each row's live slots are then cut into
    that many chunks in the kernel. At one row of 8 kv heads the unsplit kernel has 8 programs on a GPU of 132
    multiprocessors (measured on an H200: ~12 us a layer)."""
    if rows * nkv >= SPLIT_BELOW:
        return 1
    return min(MAX_SPLITS, max(1, SPLIT_BELOW // (rows * nkv)), triton.cdiv(slots, block_n))


def _check_attention(qkv, kc, vc, positions, slots, cos, sin, shape) -> None:
    nq, nkv, hd, _, _ = shape
    if vc.shape != kc.shape or vc.stride() != kc.stride() or sin.shape != cos.shape or sin.stride() != cos.stride():
        raise ValueError(f"fused attention: the value cache {tuple(vc.shape)} and sin {tuple(sin.shape)} should "
                         f"have the key cache's {tuple(kc.shape)} and cos's {tuple(cos.shape)} shapes and strides")
    R, W = positions.shape
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"fused attention of width {W}: 1 to {MAX_WIDTH} tokens a row; run wider forwards on the "
                         "torch path")
    if hd & (hd - 1) or hd < MIN_HEAD_DIM or nq % nkv:
        raise ValueError(f"fused attention: head dim {hd} must be a power of two of at least {MIN_HEAD_DIM} (tl.dot "
                         f"takes 16 or more per half-head) and {nq} query heads a multiple of {nkv} kv heads")
    if qkv.shape != (R * W, (nq + 2 * nkv) * hd) or not qkv.is_contiguous():
        raise ValueError(f"fused attention: qkv {tuple(qkv.shape)} should be contiguous "
                         f"({R * W}, {(nq + 2 * nkv) * hd})")
    if kc.dim() != 4 or kc.shape[0] < R or kc.shape[1] != nkv or kc.shape[3] != hd or kc.stride(3) != 1:
        raise ValueError(f"fused attention: cache {tuple(kc.shape)} should be [>= {R} rows, {nkv}, slots, {hd}]")
    if slots.shape != positions.shape or not positions.is_contiguous() or not slots.is_contiguous() \
            or cos.stride(1) != 1:
        raise ValueError("fused attention: positions and slots should be contiguous [rows, width] of one shape")


def decode_attention(qkv, k_cache, v_cache, positions, slots, cos, sin, q_norm, k_norm, shape,
                     splits: int = 0) -> torch.Tensor:
    """One layer's attention for R rows of W tokens: qkv [R*W, (nq + 2 nkv) hd] (token (r, w) at r*W + w);
    k_cache, v_cache [R, nkv, S, hd] (or [nkv, S, hd]: one row); positions, slots [R, W] (long): token (r, w)
    at position positions[r, w] writes its key and value at slot slots[r, w] of row r, and attends to row
    r's slots 0..positions[r, w]; cos, sin [P, hd] RoPE tables indexed by position; q_norm, k_norm [hd] or
    None; shape (nq, nkv, hd, eps, scale); splits: the slots' splits (0: attention_splits chooses; a live
    token's slot is its position, or past every position read: the scratch slot). Returns o [R*W, nq*hd]."""
    if splits < 0:
        raise ValueError(f"splits={splits}: 0 (chosen here) or a number of splits of the slots")
    nq, nkv, hd, eps, scale = shape
    kc, vc = (k_cache, v_cache) if k_cache.dim() == 4 else (k_cache[None], v_cache[None])
    _check_attention(qkv, kc, vc, positions, slots, cos, sin, shape)
    R, W = positions.shape
    g = nq // nkv
    o = torch.empty((R * W, nq * hd), dtype=qkv.dtype, device=qkv.device)
    qk = q_norm is not None
    block_m, block_n = max(16, triton.next_power_of_2(g * W)), 64 if hd <= 128 else 32
    n_splits = splits or attention_splits(R, nkv, kc.shape[2], block_n)
    chunk = kc.shape[2]         # one split: every slot (more: the kernel cuts each row's live slots)
    part = (torch.empty((R * nkv * n_splits * block_m, hd + 2), dtype=torch.float32, device=qkv.device)
            if n_splits > 1 else o)
    _attention_kernel[(R, nkv, n_splits)](
        qkv, o, part, kc, vc, positions, slots, cos, sin, q_norm if qk else qkv, k_norm if qk else qkv,
        qkv.stride(0), o.stride(0), kc.stride(0), kc.stride(1), kc.stride(2), cos.stride(0), eps, scale, chunk,
        W=W, W_PAD=triton.next_power_of_2(W), G=g, NQ=nq, NKV=nkv, HD=hd, QK_NORM=qk, BLOCK_M=block_m,
        BLOCK_N=block_n, F32=INTERPRET or qkv.dtype == torch.float32, SPLITS=n_splits, num_warps=4)
    if n_splits > 1:
        _combine_kernel[(R, nkv)](part, o, o.stride(0), W=W, G=g, NKV=nkv, HD=hd, BLOCK_M=block_m, SPLITS=n_splits,
                                  num_warps=4)
    return o

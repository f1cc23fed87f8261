"""The fast decoder's layers as plain functions over one layer's fused weights: a decoder block (torch's, or with
the fused kernels around it: kernel_block) and the output layer (output_logits)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .quant import linear


def _norm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def pre_attention(x, carry, L: dict, eps: float):
    """The residual add and the input norm, then q/k/v: x, carry [m, H] -> (x + carry, qkv [m, (nq + 2 nkv) hd])."""
    x = x + carry
    return x, linear(_norm(x, L["in_norm"], eps), L["wqkv"], L["bqkv"])


def attention(qkv, L: dict, kc, vc, slots, cos, sin, visible, shape: tuple):
    """q/k norms, RoPE, the cache write at `slots` and attention over the `visible` slots:
    qkv [m, (nq + 2 nkv) hd] -> o [m, nq*hd]."""
    nq, nkv, hd, eps, scale = shape
    m = qkv.shape[0]
    group = nq // nkv
    q = qkv[:, :nq * hd].view(m, nq, hd)
    k = qkv[:, nq * hd:(nq + nkv) * hd].view(m, nkv, hd)
    v = qkv[:, (nq + nkv) * hd:].view(m, nkv, hd)
    if L["q_norm"] is not None:
        q, k = _norm(q, L["q_norm"], eps), _norm(k, L["k_norm"], eps)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    kc.index_copy_(1, slots, k.transpose(0, 1))
    vc.index_copy_(1, slots, v.transpose(0, 1))
    # GQA without copies: the query heads that share a kv head form one [group*m, hd] block
    # (measured: torch's fused attention and compiler-fused reductions were no faster at batch 1)
    qg = q.view(m, nkv, group, hd).permute(1, 2, 0, 3).reshape(nkv, group * m, hd)
    scores = torch.matmul(qg, kc.transpose(1, 2)).float() * scale                    # [nkv, g*m, slots]
    scores = scores.masked_fill(~visible.repeat(group, 1), float("-inf"))
    o = torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), vc)                  # [nkv, g*m, hd]
    return o.view(nkv, group, m, hd).permute(2, 0, 1, 3).reshape(m, nq * hd)


def post_attention(x, o, L: dict, eps: float):
    """The O-projection and its residual, then the MLP: x [m, H], o [m, nq*hd] -> (x, this layer's MLP output)."""
    x = x + linear(o, L["wo"])
    gate, up = linear(_norm(x, L["post_norm"], eps), L["w_gate_up"]).chunk(2, dim=-1)
    return x, linear(F.silu(gate) * up, L["w_down"])


def block(x, carry, L: dict, kc, vc, slots, cos, sin, visible, shape: tuple):
    """One decoder layer. `carry` is the previous layer's MLP output, added here so that the add
    and this layer's norm fuse into one kernel when each block is compiled on its own. Returns
    (x after attention, this layer's MLP output)."""
    eps = shape[3]
    x, qkv = pre_attention(x, carry, L, eps)
    return post_attention(x, attention(qkv, L, kc, vc, slots, cos, sin, visible, shape), L, eps)


def kernel_block(x, carry, L: dict, attend, eps: float, gemv: bool, parts=(pre_attention, post_attention)):
    """One decoder layer with the fused kernels (runtime.kernels): x, carry [T, H]; attend(qkv) -> o [T, nq*hd]
    (the fused attention kernel or torch's `attention`). gemv: the norms, residual adds and SiLU fused into the
    GEMVs (about six kernels a layer with the fused attention); otherwise `parts` (pre_attention, post_attention,
    compiled or not) around attend. Returns (x after attention, this layer's MLP output), as block does."""
    if not gemv:
        pre, post = parts
        x, qkv = pre(x, carry, L, eps)
        return post(x, attend(qkv), L, eps)
    from .kernels import gemv, norm_gemv, silu_gemv
    x_new = torch.empty_like(x)
    qkv = norm_gemv(x, carry, L["in_norm"], L["wqkv"], L["bqkv"], eps, x_out=x_new)
    x = gemv(attend(qkv), L["wo"], residual=x_new)
    gate_up = norm_gemv(x, None, L["post_norm"], L["w_gate_up"], None, eps)
    return x, silu_gemv(gate_up, L["w_down"])


def output_logits(x, carry, final_norm, lm_head, eps: float, gemv_k: bool = False) -> torch.Tensor:
    """The final norm of x + carry [m, H] and the output layer: logits [m, V'] (float32). gemv_k: one fused kernel."""
    if gemv_k and isinstance(lm_head, torch.Tensor):
        from .kernels import norm_gemv
        x, carry = x.contiguous(), carry.contiguous()
        return norm_gemv(x, carry, final_norm, lm_head, None, eps, x_out=torch.empty_like(x)).float()
    return linear(_norm(x + carry, final_norm, eps), lm_head).float()

"""A weight's formats for the fast decoder: bf16 as it is, fp8 (W8A8, or weight-only 'fp8w') or int8, each with
per-row scales (quantize), and the linear layer over each (linear)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize(w: torch.Tensor, kind: str):
    """A weight [N, K] as the linear layer of `kind` uses it: the tensor itself, or (kind, q, scale [N])."""
    if kind == "bf16":
        return w
    wf = w.float()
    if kind in ("fp8", "fp8w"):     # fp8w: the same weights, weight-only (runtime.fp8gemv)
        s = wf.abs().amax(-1).clamp(min=1e-12) / FP8_MAX
        return (kind, (wf / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), s)
    s = wf.abs().amax(-1).clamp(min=1e-12) / 127.0
    return ("int8", torch.round(wf / s[:, None]).clamp(-127, 127).to(torch.int8), s)


def linear(x: torch.Tensor, w, bias=None) -> torch.Tensor:
    """x [m, K] times a weight from quantize()."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, bias)
    kind, q, s = w
    if kind == "fp8w":      # weight-only fp8, dequantized inside the product
        from .fp8gemv import fp8w_linear
        y = fp8w_linear(x, q, s)
    elif kind == "int8":      # weight-only: dequantize in the product (bytes read are the int8 ones)
        y = F.linear(x, q.to(x.dtype)) * s.to(x.dtype)
    else:                   # W8A8: per-token activation scale, per-row weight scale
        xf = x.float()
        sx = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        xq = (xf / sx).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        if x.is_cuda:
            y = torch._scaled_mm(xq, q.t(), scale_a=sx, scale_b=s[None, :], out_dtype=x.dtype)
        else:               # the same products on a CPU (fp32 accumulation), for tests and alpha figures
            y = ((xq.float() * sx) @ (q.float() * s[:, None]).t()).to(x.dtype)
    return y if bias is None else y + bias

"""Random-weight models of any named shape, built already fused on the device (for timing only).

    m = fused_random("Qwen2.5-72B", "cuda:0", fmt="fp8")     # ~73 GB: fits one H200, never on the host
    Engine(m, impl="fast")                                    # the fast decoder uses these tensors as they are

A transformers model of a 70B-class shape would need its bf16 weights (145 GB) before any could be
converted; here each layer's weights are drawn on the device as the fast decoder holds them (q/k/v as one
matrix, gate/up as one), converted to the format at once (fp8: per-row scaled e4m3, fastmodel.quantize)
and the bf16 draw freed, so the peak is the final weights plus one layer. Timing does not depend on the
values (normal, std 0.02, as transformers initialises); the logits mean nothing.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..models.presets import shape
from .fastmodel import quantize

FORMATS = ("bf16", "fp8", "fp8w")   # fp8: W8A8 through torch._scaled_mm; fp8w: weight-only (runtime.fp8gemv)


class FusedModel:
    """What the engine and the fast decoder read of a model: config, parameters(), model.embed_tokens /
    norm / rotary_emb, and `fused` (the decoder's layer dicts and output layer, used without a copy)."""

    def __init__(self, name: str, config, embed: torch.Tensor, norm: torch.Tensor, fused: dict):
        self.name, self.config, self.fused = name, config, fused
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, device=embed.device).float()
                                                / config.head_dim))
        self.model = SimpleNamespace(embed_tokens=SimpleNamespace(weight=embed), norm=SimpleNamespace(weight=norm),
                                     rotary_emb=SimpleNamespace(inv_freq=inv_freq, attention_scaling=1.0))

    def parameters(self):
        """Every stored tensor once (quantized ones as stored; the first is bf16, for the engine's device and dtype;
        a tied output layer is the embedding table)."""
        seen = set()
        for w in [self.model.embed_tokens.weight, self.model.norm.weight, self.fused["lm_head"]] + \
                [v for L in self.fused["layers"] for v in L.values()]:
            for t in [w] if isinstance(w, torch.Tensor) else (w[1:] if w is not None else []):
                if id(t) not in seen:
                    seen.add(id(t))
                    yield t

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def _draw(rows: int, cols: int, device, gen) -> torch.Tensor:
    w = torch.empty(rows, cols, device=device, dtype=torch.bfloat16)
    return w.normal_(0.0, 0.02, generator=gen)


def _layer(c: SimpleNamespace, fmt: str, device, gen) -> dict:
    h, hd, nq, nkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    ones = lambda n: torch.ones(n, device=device, dtype=torch.bfloat16)  # noqa: E731
    qkv = (nq + 2 * nkv) * hd
    return {"in_norm": ones(h), "wqkv": quantize(_draw(qkv, h, device, gen), fmt),
            "bqkv": _draw(1, qkv, device, gen)[0] if c.qkv_bias else None,
            "q_norm": ones(hd) if c.qk_norm else None, "k_norm": ones(hd) if c.qk_norm else None,
            "wo": quantize(_draw(h, nq * hd, device, gen), fmt), "post_norm": ones(h),
            "w_gate_up": quantize(_draw(2 * c.intermediate_size, h, device, gen), fmt),
            "w_down": quantize(_draw(h, c.intermediate_size, device, gen), fmt)}


def fused_random(name: str, device: str = "cuda:0", fmt: str = "bf16", seed: int = 0,
                 layers: int | None = None) -> FusedModel:
    """A model of shape `name` (models.presets.shape) with random weights drawn on `device` in format `fmt`
    (the output layer too; the embedding table stays bf16). layers: build only this many decoder layers
    (a layer subset, for a step scaled by layer count)."""
    if fmt not in FORMATS:
        raise ValueError(f"weights format {fmt!r}: use one of {FORMATS}")
    if torch.device(device).type != "cuda" and fmt != "bf16":
        raise ValueError(f"fp8 weights need a CUDA device (got {device!r}): torch._scaled_mm runs there")
    c = SimpleNamespace(**shape(name), rope_theta=1e6)
    if layers is not None:
        c.num_hidden_layers = layers
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        embed = _draw(c.vocab_size, c.hidden_size, device, gen)
        fused = {"format": fmt, "layers": [_layer(c, fmt, device, gen) for _ in range(c.num_hidden_layers)],
                 "lm_head": quantize(embed if c.tie_word_embeddings else _draw(c.vocab_size, c.hidden_size, device, gen), fmt)}
        norm = torch.ones(c.hidden_size, device=device, dtype=torch.bfloat16)
    return FusedModel(name, c, embed, norm, fused)

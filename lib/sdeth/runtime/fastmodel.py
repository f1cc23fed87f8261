"""A lean decoder for Llama/Qwen3-family models, for the GPU engine (gpt-fast's shape).

Built from a transformers model's own weights (so it computes the same function, checked against
it in tests/test_fastmodel.py), with what makes batch-1 decode fast on a GPU:
- fused projections: one matrix for q, k and v, one for gate and up (fewer, larger GEMVs);
- a static KV cache of plain tensors [kv heads, capacity, head dim] per layer, written at the given
  positions with index_copy_ (no Python-side state, so a width's forward captures as a CUDA graph and
  rollback is free: entries past the position are masked and overwritten later);
- attention over the whole cache with a position mask (the same kernels for any width), the query
  heads of one kv head batched together (GQA without copying the cache);
- RoPE from a precomputed table (the transformers model's own inv_freq and scaling, so Llama-3.1's
  rope scaling comes along);
- torch.compile-friendly: no data-dependent shapes for a fixed width.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FastDecoder(nn.Module):
    def __init__(self, hf_model, capacity: int):
        super().__init__()
        cfg = hf_model.config
        base = hf_model.model
        p = next(hf_model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        self.lm_head = hf_model.lm_head.weight
        self.has_qk_norm = hasattr(base.layers[0].self_attn, "q_norm")
        self.layers = []
        with torch.no_grad():
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                biases = [x.bias for x in (a.q_proj, a.k_proj, a.v_proj)]
                self.layers.append({
                    "in_norm": layer.input_layernorm.weight,
                    "wqkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    "bqkv": torch.cat(biases) if biases[0] is not None else None,
                    "q_norm": a.q_norm.weight if self.has_qk_norm else None,
                    "k_norm": a.k_norm.weight if self.has_qk_norm else None,
                    "wo": a.o_proj.weight,
                    "post_norm": layer.post_attention_layernorm.weight,
                    "w_gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                    "w_down": m.down_proj.weight,
                })
            rot = base.rotary_emb
            self._inv_freq = rot.inv_freq.float().to(self.device)
            self._rope_scaling = float(getattr(rot, "attention_scaling", 1.0))
        self.reset(capacity)

    def reset(self, capacity: int) -> None:
        """A cache (and RoPE table) of `capacity` tokens; the fused weights stay."""
        self.capacity = capacity
        freqs = torch.outer(torch.arange(capacity, device=self.device, dtype=torch.float32), self._inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * self._rope_scaling).to(self.dtype)
        self.sin = (emb.sin() * self._rope_scaling).to(self.dtype)
        # one tensor per layer: a compiled step then writes each in place, where slices of one big
        # tensor would make the compiler copy the whole cache for every layer's write
        shape = (self.n_kv, capacity, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.slots = torch.arange(capacity, device=self.device)

    def rewind(self, pos: int) -> None:
        """Nothing to do: entries past `pos` are masked by position and overwritten by later writes."""

    def _norm(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    @staticmethod
    def _rope(x, cos, sin):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """ids [m], positions [m] (increasing) -> next-token logits [m, V] (float32)."""
        m = ids.shape[0]
        x = F.embedding(ids, self.embed)                                  # [m, H]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]   # [m, 1, hd]
        nq, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        group = nq // nkv
        rowmask = (self.slots[None, :] <= positions[:, None]).repeat(group, 1)   # [group*m, capacity]
        for i, L in enumerate(self.layers):
            h = self._norm(x, L["in_norm"])
            qkv = F.linear(h, L["wqkv"], L["bqkv"])
            q = qkv[:, :nq * hd].view(m, nq, hd)
            k = qkv[:, nq * hd:(nq + nkv) * hd].view(m, nkv, hd)
            v = qkv[:, (nq + nkv) * hd:].view(m, nkv, hd)
            if self.has_qk_norm:
                q, k = self._norm(q, L["q_norm"]), self._norm(k, L["k_norm"])
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            self.k_cache[i].index_copy_(1, positions, k.transpose(0, 1))
            self.v_cache[i].index_copy_(1, positions, v.transpose(0, 1))
            # GQA without copies: the query heads that share a kv head form one [group*m, hd] block
            qg = q.view(m, nkv, group, hd).permute(1, 2, 0, 3).reshape(nkv, group * m, hd)
            scores = torch.matmul(qg, self.k_cache[i].transpose(1, 2)).float() * self.scale   # [nkv, g*m, cap]
            scores = scores.masked_fill(~rowmask, float("-inf"))
            o = torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), self.v_cache[i])     # [nkv, g*m, hd]
            o = o.view(nkv, group, m, hd).permute(2, 0, 1, 3).reshape(m, nq * hd)
            x = x + F.linear(o, L["wo"])
            h = self._norm(x, L["post_norm"])
            gate, up = F.linear(h, L["w_gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, L["w_down"])
        return F.linear(self._norm(x, self.final_norm), self.lm_head).float()

"""A lean decoder for Llama/Qwen3-family models, for the GPU engine (gpt-fast's shape).

Built from a transformers model's own weights (so it computes the same function, checked against
it in tests/test_fastmodel.py), with what makes batch-1 decode fast on a GPU:
- fused projections: one matrix for q, k and v, one for gate and up (fewer, larger GEMVs);
- a static KV cache of plain tensors [kv heads, slots, head dim] per layer, written at the given
  slots with index_copy_ (no Python-side state, so a width's forward captures as a CUDA graph and
  rollback is free: entries past the position are masked and overwritten later);
- attention over the cache with a visibility mask (the same kernels for any width), the query
  heads of one kv head batched together (GQA without copying the cache);
- RoPE from a precomputed table (the transformers model's own inv_freq and scaling, so Llama-3.1's
  rope scaling comes along);
- torch.compile-friendly: no data-dependent shapes for a fixed width.

Rows: forward() also takes explicit cache slots and a visibility mask, so one forward can decode
several rows that share the cached prefix but not each other's tokens (each row writes to its own
slots in a scratch region past `capacity`): the drafts of several likely outcomes in one step.

Levers (FastOptions; `--draft-fast`/`--target-fast` on the command line), each measured alone by
`python -m sdeth bench step` (reports/gpu/bench_step.json; AGENT_LOG says which paid):
- scope='layer' (the default): torch.compile one decoder block (all layers share its code) instead of the
  whole model: the same step for a tenth of the compile time, the residual add carried into the next
  block's norm so that the two still fuse; scope='model' compiles the whole step as one graph;
- weights='fp8' (per-row scaled e4m3 weights and per-token scaled activations, torch._scaled_mm on a
  GPU) or 'int8' (weight-only, per-row scales): fewer bytes per step. A draft's numerics change how
  often it is accepted, never the output (the target verifies);
- head=N: a draft's output layer restricted to N token ids (the target's most frequent, from a
  ranking file, or the first N ids for timing-only shapes). Lossless: a kept-out token's draft
  probability is zero and the target verifies against its full vocabulary.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


class FastOptionsError(ValueError):
    pass


@dataclass(frozen=True)
class FastOptions:
    scope: str = "layer"        # what torch.compile compiles: 'layer' (one block, reused) or 'model' (one graph)
    weights: str = "bf16"       # 'bf16' (the model's own dtype), 'fp8' (W8A8, scaled), 'int8' (weight-only)
    head: int = 0               # keep this many output rows (0: all)
    head_rank: str = ""         # JSON list of token ids, most frequent first (empty: ids 0..head-1)

    CHOICES = {"scope": ("layer", "model"), "weights": ("bf16", "fp8", "int8")}

    @classmethod
    def parse(cls, spec: "str | FastOptions | None") -> "FastOptions":
        """'scope=layer,weights=fp8,head=32768' -> FastOptions; '' -> the defaults."""
        if isinstance(spec, FastOptions):
            return spec
        kw: dict = {}
        names = {f.name: f.type for f in fields(cls)}
        for part in filter(None, (spec or "").split(",")):
            key, _, val = part.partition("=")
            key, val = key.strip(), val.strip()
            if key not in names or not val:
                raise FastOptionsError(f"fast option {part!r}: use key=value with keys {sorted(names)}")
            if key in cls.CHOICES and val not in cls.CHOICES[key]:
                raise FastOptionsError(f"fast option {key}={val!r}: use one of {cls.CHOICES[key]}")
            if key == "head":
                if not val.isdigit():
                    raise FastOptionsError(f"fast option head={val!r}: the number of output rows to keep (0: all)")
                val = int(val)
            kw[key] = val
        return cls(**kw)

    def spec(self) -> str:
        """Every option, defaults included (what a results JSON records)."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.name != "head_rank" or self.head_rank)

    def __str__(self) -> str:
        d = FastOptions()
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if getattr(self, f.name) != getattr(d, f.name)) or "defaults"


# ---------------------------------------------------------------- weights: bf16, fp8, int8

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


# ---------------------------------------------------------------- one decoder block

def _norm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def block(x, carry, L: dict, kc, vc, slots, cos, sin, visible, shape: tuple):
    """One decoder layer. `carry` is the previous layer's MLP output, added here so that the add
    and this layer's norm fuse into one kernel when each block is compiled on its own. Returns
    (x after attention, this layer's MLP output)."""
    nq, nkv, hd, eps, scale = shape
    m = x.shape[0]
    group = nq // nkv
    x = x + carry
    h = _norm(x, L["in_norm"], eps)
    qkv = linear(h, L["wqkv"], L["bqkv"])
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
    o = o.view(nkv, group, m, hd).permute(2, 0, 1, 3).reshape(m, nq * hd)
    x = x + linear(o, L["wo"])
    h = _norm(x, L["post_norm"], eps)
    gate, up = linear(h, L["w_gate_up"]).chunk(2, dim=-1)
    return x, linear(F.silu(gate) * up, L["w_down"])


def head_ids(n: int, rank_file: str, vocab: int) -> torch.Tensor:
    """The n output rows a draft keeps, sorted: the first n of a ranking (most frequent first), or ids 0..n-1."""
    if n <= 0 or n >= vocab:
        raise FastOptionsError(f"head={n}: keep between 1 and {vocab - 1} of the {vocab} output rows (0: all)")
    if not rank_file:
        return torch.arange(n)
    ranked = json.load(open(rank_file))
    ranked = ranked["ranked_ids"] if isinstance(ranked, dict) else ranked
    if len(ranked) < n:
        raise FastOptionsError(f"head={n}: the ranking {rank_file} has only {len(ranked)} ids")
    return torch.tensor(sorted(int(i) for i in ranked[:n]))


class FastDecoder:
    """The engine's model interface (forward, rewind, reset), over weights taken from a transformers model."""

    def __init__(self, hf_model, capacity: int, options: FastOptions | str | None = None, scratch: int = 0):
        self.options = o = FastOptions.parse(options)
        cfg = hf_model.config
        base = hf_model.model
        p = next(hf_model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.shape = (self.n_heads, self.n_kv, self.head_dim, self.eps, self.head_dim ** -0.5)
        self.scratch = scratch          # extra cache slots past capacity, for rows (see forward)
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        fused = getattr(hf_model, "fused", None)   # weights already fused, in their format (runtime.randomweights)
        if fused and (o.head or o.weights != "bf16"):
            raise FastOptionsError(f"fast options {o}: a fused model's weights are already {fused['format']} with its "
                                   "full output layer; build it in the format wanted instead")
        self.vocab = cfg.vocab_size if fused else hf_model.lm_head.weight.shape[0]
        with torch.no_grad():
            if fused:
                self.keep, self.lm_head, self.layers = None, fused["lm_head"], fused["layers"]
            else:
                self._fuse(hf_model, o)
            rot = base.rotary_emb
            self._inv_freq = rot.inv_freq.float().to(self.device)
            self._rope_scaling = float(getattr(rot, "attention_scaling", 1.0))
        self._compiled = None
        self.reset(capacity)

    def _fuse(self, hf_model, o: FastOptions) -> None:
        """The transformers model's weights, fused (q/k/v, gate/up) and in the format of o.weights."""
        self.keep = head_ids(o.head, o.head_rank, self.vocab).to(self.device) if o.head else None
        lm = hf_model.lm_head.weight if self.keep is None else hf_model.lm_head.weight[self.keep]
        self.lm_head = quantize(lm, o.weights)
        self.layers = []
        for layer in hf_model.model.layers:
            a, m = layer.self_attn, layer.mlp
            biases = [x.bias for x in (a.q_proj, a.k_proj, a.v_proj)]
            qk = hasattr(a, "q_norm")
            self.layers.append({
                "in_norm": layer.input_layernorm.weight,
                "wqkv": quantize(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), o.weights),
                "bqkv": torch.cat(biases) if biases[0] is not None else None,
                "q_norm": a.q_norm.weight if qk else None,
                "k_norm": a.k_norm.weight if qk else None,
                "wo": quantize(a.o_proj.weight, o.weights),
                "post_norm": layer.post_attention_layernorm.weight,
                "w_gate_up": quantize(torch.cat([m.gate_proj.weight, m.up_proj.weight]), o.weights),
                "w_down": quantize(m.down_proj.weight, o.weights),
            })

    def weight_bytes(self) -> int:
        """Bytes of weights one step reads (the embedding row aside)."""
        def nbytes(w):
            if w is None:
                return 0
            return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else nbytes(w[1]) + nbytes(w[2])
        return sum(nbytes(v) for L in self.layers for v in L.values()) + nbytes(self.lm_head) + nbytes(self.final_norm)

    def compile(self, mode: str) -> None:
        """scope='layer': compile the block once (every layer runs the same code on its own weights).
        Compiled blocks share one code object, so each decoder's options and widths add entries to one
        cache: its limit is raised to hold a few decoders side by side."""
        import torch._dynamo.config as dc
        for limit in ("recompile_limit", "cache_size_limit"):
            if hasattr(dc, limit):
                setattr(dc, limit, max(getattr(dc, limit), 64))
        self._compiled = torch.compile(block, mode=mode, fullgraph=True, dynamic=None)

    def compiled_forward(self, ids, positions, slots=None, visible=None) -> torch.Tensor:
        """forward() with the compiled block (after compile()); forward() itself stays eager (prefill)."""
        return self.forward(ids, positions, slots, visible, self._compiled)

    def reset(self, capacity: int) -> None:
        """A cache (and RoPE table) of `capacity` tokens plus the scratch slots; the weights stay."""
        self.capacity = capacity
        slots = capacity + self.scratch
        freqs = torch.outer(torch.arange(capacity, device=self.device, dtype=torch.float32), self._inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * self._rope_scaling).to(self.dtype)
        self.sin = (emb.sin() * self._rope_scaling).to(self.dtype)
        # one tensor per layer: a compiled step then writes each in place, where slices of one big
        # tensor would make the compiler copy the whole cache for every layer's write
        shape = (self.n_kv, slots, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.slots = torch.arange(slots, device=self.device)

    def rewind(self, pos: int) -> None:
        """Nothing to do: entries past `pos` are masked by position and overwritten by later writes."""

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move cache entries from slots src to slots dst (a branch's rows, adopted into the chain)."""
        for kc, vc in zip(self.k_cache, self.v_cache):
            kc.index_copy_(1, dst, kc.index_select(1, src))
            vc.index_copy_(1, dst, vc.index_select(1, src))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | None = None,
                visible: torch.Tensor | None = None, block_fn=None) -> torch.Tensor:
        """ids [m], positions [m] -> next-token logits [m, V] (float32).

        A chain (the default): token i sits at positions[i] (increasing), is written to that slot and
        sees every slot up to it. Rows: `slots` [m] says where each token's keys go and `visible`
        [m, capacity + scratch] (bool) which slots each token attends to (its own included)."""
        m = ids.shape[0]
        if slots is None:
            slots = positions
            visible = self.slots[None, :] <= positions[:, None]
        x = F.embedding(ids, self.embed)                                  # [m, H]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]   # [m, 1, hd]
        carry = torch.zeros_like(x)
        run = block_fn or block
        for i, L in enumerate(self.layers):
            x, carry = run(x, carry, L, self.k_cache[i], self.v_cache[i], slots, cos, sin, visible, self.shape)
        h = _norm(x + carry, self.final_norm, self.eps)
        logits = linear(h, self.lm_head).float()
        if self.keep is None:
            return logits
        # a kept-out token gets no probability: the draft never proposes it, the target still may
        return torch.full((m, self.vocab), float("-inf"), device=logits.device).index_copy_(1, self.keep, logits)

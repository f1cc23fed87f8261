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
- kernels='attn' (q/k norms, RoPE, the cache write and attention over each row's own length in one
  Triton kernel), 'gemv' (residual adds, RMSNorm and SiLU*mul fused into the GEMVs around it) or 'all'
  (both: about six kernels a layer), or 'auto' (the attention kernel, and the fused GEMVs at one token
  (AUTO_GEMV_TOKENS) where their measured table, runtime.gemv_table.GEMV_TABLE, says they beat cuBLAS's on the
  model's shapes on the GPU it was measured on), runtime.kernels; for steps
  and verifies of up to 16 tokens (chains: rows with explicit slots keep torch's attention), bf16 weights; the
  rest of the block stays torch's
  (compiled with the engine's compile mode);
- head=N: a draft's output layer restricted to N token ids (the target's most frequent, from a
  ranking file, or the first N ids for timing-only shapes). Lossless: a kept-out token's draft
  probability is zero and the target verifies against its full vocabulary.
"""
from __future__ import annotations

import json
from functools import partial

import torch
import torch.nn.functional as F

from .settings import FastOptions, FastOptionsError  # noqa: F401  (the fast decoder's levers: plain data)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


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
        if o.kernels != "torch":
            check_kernels(o, fused["format"] if fused else o.weights, self.device, self.head_dim)
        with torch.no_grad():
            if fused:
                self.keep, self.lm_head, self.layers = None, fused["lm_head"], fused["layers"]
            else:
                self._fuse(hf_model, o)
            rot = base.rotary_emb
            self._inv_freq = rot.inv_freq.float().to(self.device)
            self._rope_scaling = float(getattr(rot, "attention_scaling", 1.0))
        self._compiled = None
        self._parts = (pre_attention, post_attention, attention)
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

    @property
    def gemv_shapes(self) -> tuple:
        """(N, K) of a layer's GEMVs (qkv, o, gate_up, down): what kernels='auto' looks up; () for quantized weights."""
        L = self.layers[0] if self.layers else {}
        ws = [L.get(k) for k in ("wqkv", "wo", "w_gate_up", "w_down")]
        return tuple(tuple(w.shape) for w in ws) if all(isinstance(w, torch.Tensor) for w in ws) else ()

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
        if self.options.kernels != "torch":     # the torch parts around the kernels, compiled on their own
            self._parts = tuple(torch.compile(f, mode=mode, fullgraph=True, dynamic=None)
                                for f in (pre_attention, post_attention, attention))

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
        attn_k, gemv_k = kernel_levers(self.options.kernels, 1, m, chain=slots is None, gemv_shapes=self.gemv_shapes,
                                       device=self.embed.device)
        if slots is None:
            slots = positions
            visible = None if attn_k else self.slots[None, :] <= positions[:, None]
        x = F.embedding(ids, self.embed)                                  # [m, H]
        carry = torch.zeros_like(x)
        if attn_k or gemv_k:
            x, carry = self._kernel_layers(x, carry, positions, slots, visible, attn_k, gemv_k, block_fn is not None)
        else:
            cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]   # [m, 1, hd]
            run = block_fn or block
            for i, L in enumerate(self.layers):
                x, carry = run(x, carry, L, self.k_cache[i], self.v_cache[i], slots, cos, sin, visible, self.shape)
        head_k = fused_head(self.options.kernels, m, self.lm_head, self.embed.device, gemv_k)
        logits = output_logits(x, carry, self.final_norm, self.lm_head, self.eps, head_k)
        if self.keep is None:
            return logits
        # a kept-out token gets no probability: the draft never proposes it, the target still may
        return torch.full((m, self.vocab), float("-inf"), device=logits.device).index_copy_(1, self.keep, logits)

    def _kernel_layers(self, x, carry, positions, slots, visible, attn_k: bool, gemv_k: bool, compiled: bool):
        """The layers through kernel_block: the fused attention kernel over the chain (attn_k) or torch's."""
        from .attention_kernels import decode_attention
        pre, post, torch_attention = self._parts if compiled else (pre_attention, post_attention, attention)
        if not attn_k:
            cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        chain = positions[None]                                           # one row of m tokens
        for i, L in enumerate(self.layers):
            kc, vc = self.k_cache[i], self.v_cache[i]
            if attn_k:
                attend = partial(decode_attention, k_cache=kc, v_cache=vc, positions=chain, slots=chain,
                                 cos=self.cos, sin=self.sin, q_norm=L["q_norm"], k_norm=L["k_norm"], shape=self.shape)
            else:
                attend = partial(torch_attention, L=L, kc=kc, vc=vc, slots=slots, cos=cos, sin=sin, visible=visible,
                                 shape=self.shape)
            x, carry = kernel_block(x, carry, L, attend, self.eps, gemv_k, (pre, post))
        return x, carry


def kernel_levers(kernels: str, rows: int, width: int, chain: bool = True, gemv_shapes=(),
                  device: torch.device | None = None) -> tuple[bool, bool]:
    """(fused attention, fused GEMVs) for a forward of `rows` x `width` tokens under FastOptions.kernels: the
    attention kernel for chains (each row's own slots up to its position) of up to 16 tokens a row, the GEMVs
    for up to 32 tokens in all; wider forwards (prefill) keep torch's kernels. 'auto': the fused GEMVs up to
    AUTO_GEMV_TOKENS tokens where runtime.gemv_table.fused_gemv_pays says so for the layer's GEMV shapes
    gemv_shapes [(N, K), ...] on `device` (a table measured per shape and row count on one GPU model; a shape not
    measured, or another device: cuBLAS's)."""
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


def output_logits(x, carry, final_norm, lm_head, eps: float, gemv_k: bool = False) -> torch.Tensor:
    """The final norm of x + carry [m, H] and the output layer: logits [m, V'] (float32). gemv_k: one fused kernel."""
    if gemv_k and isinstance(lm_head, torch.Tensor):
        from .kernels import norm_gemv
        x, carry = x.contiguous(), carry.contiguous()
        return norm_gemv(x, carry, final_norm, lm_head, None, eps, x_out=torch.empty_like(x)).float()
    return linear(_norm(x + carry, final_norm, eps), lm_head).float()


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

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

from .fastblock import (_norm, _rope, attention, block, kernel_block, output_logits, post_attention,  # noqa: F401
                        pre_attention)
from .kernel_choice import AUTO_GEMV_TOKENS, check_kernels, fused_head, kernel_levers  # noqa: F401
from .quant import FP8, FP8_MAX, linear, quantize  # noqa: F401
from .settings import FastOptions, FastOptionsError  # noqa: F401  (the fast decoder's levers: plain data)


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

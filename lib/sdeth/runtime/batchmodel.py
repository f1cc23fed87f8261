"""Batched decoding of independent sequences: the fast decoder's weights over a cache of rows.

    dec = BatchDecoder(fast, rows=32, capacity=4096)     # fast: a fastmodel.FastDecoder (its weights)
    logits = dec.step(ids, positions, slots)            # [R, W] each -> the last column's logits [R, V]
    logits = dec.forward(ids, positions, slots, row0=r)  # any shape, eager (a prompt's chunk into row r)

Each sequence owns one cache row (per layer [rows, kv heads, capacity + 1, head dim]) and its own length:
token (r, w) sits at positions[r, w], its keys go to slots[r, w] of row row0 + r, and it attends to the
slots of its own row up to its position (a row sees no other row). The slot past capacity is scratch:
a row of a step that carries no sequence writes there, at position 0, and nothing ever reads it.

step() runs rows 0..R-1 padded to a bucket (1, 2, 4, ..., 128 rows) and the attention over the first
`span` slots (a power of two from 256 up to capacity, the smallest that holds every row's position); on
CUDA each (bucket, width, span) is captured as a CUDA graph on first use (nano-vllm's model runner keeps
one graph per batch size) and replayed after. Widths are 1 (a draft step) and 2, 4, 8, 16 (a catch-up: the
target's token after a round, or the tokens a target that ran ahead committed; a row with fewer new tokens
repeats its first at its own position, which writes the same keys again and reads them once). The block is fastmodel's maths with a batch dimension; tests/test_batchmodel.py checks a row of
a batch against the same row decoded alone and against the fast decoder's chain.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from .engine import ForwardClock
from .fastmodel import (FastDecoder, _norm, _rope, fused_head, kernel_block, kernel_levers, linear, output_logits,
                        post_attention, pre_attention)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFILL_WIDTHS = (16, 32, 64, 128, 256, 384, 512)   # a prompt chunk's graph widths on CUDA (a wider chunk runs eager)
WIDTHS = (1, 2, 4, 8, 16)      # a step's widths: a draft step (1) and a catch-up of up to 16 tokens a row (a
                               # stream further behind is fed a prompt chunk: one row's forward, on a GPU longer
                               # than a whole step's, so 16 rows of them starved the steps)
MIN_SPAN = 256


def bucket(n: int) -> int:
    """The smallest batch bucket that holds n rows."""
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"{n} rows exceed the largest batch bucket {BUCKETS[-1]}")


def width(n: int) -> int:
    """The smallest step width that holds n tokens a row."""
    for w in WIDTHS:
        if n <= w:
            return w
    raise ValueError(f"{n} tokens a row exceed the widest step {WIDTHS[-1]}: feed them as a prompt chunk")


def batch_attention(qkv, L: dict, kc, vc, rows, slots, cos, sin, visible, shape: tuple, pick=None):
    """q/k norms, RoPE, the cache write and attention for R rows of W tokens: qkv [R*W, (nq + 2 nkv) hd] ->
    o [R*W, nq*hd]; the other arguments as batch_block's (pick: see there)."""
    nq, nkv, hd, eps, scale = shape
    R, W = rows.shape
    g = nq // nkv
    q = qkv[:, :nq * hd].view(R, W, nq, hd)
    k = qkv[:, nq * hd:(nq + nkv) * hd].view(R, W, nkv, hd)
    v = qkv[:, (nq + nkv) * hd:].view(R, W, nkv, hd)
    if L["q_norm"] is not None:
        q, k = _norm(q, L["q_norm"], eps), _norm(k, L["k_norm"], eps)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    kc[rows, :, slots] = k                                            # [R, W] index pairs -> [R, W, nkv, hd]
    vc[rows, :, slots] = v
    span = visible.shape[-1]
    if pick is None:
        K, V = kc[:R, :, :span], vc[:R, :, :span]                     # [R, nkv, span, hd], views
    else:                                                             # (rows named on the device: a prefill graph)
        K, V = kc[pick, :, :span], vc[pick, :, :span]
    qg = q.view(R, W, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(R, nkv, g * W, hd)
    scores = torch.matmul(qg, K.transpose(-1, -2)).float() * scale    # [R, nkv, g*W, span]
    scores = scores.masked_fill(~visible.repeat(1, g, 1)[:, None], float("-inf"))
    o = torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), V)    # [R, nkv, g*W, hd]
    return o.view(R, nkv, g, W, hd).permute(0, 3, 1, 2, 4).reshape(R * W, nq * hd)


def batch_block(x, carry, L: dict, kc, vc, rows, slots, cos, sin, visible, shape: tuple, pick=None):
    """One decoder layer over R rows of W tokens (fastmodel.block with a batch dimension). x, carry: [R, W, H];
    kc, vc: this layer's cache rows [R, kv heads, span-or-more, hd] (a view of the whole cache's rows); rows,
    slots: [R, W] where each token's keys go; visible: [R, W, span]. pick: None, or the cache rows [R] (a long
    tensor) that the R rows are, kc and vc then the whole cache (a graph that serves any row)."""
    eps = shape[3]
    R, W, H = x.shape
    x = x + carry
    qkv = linear(_norm(x, L["in_norm"], eps).view(R * W, H), L["wqkv"], L["bqkv"])
    x = x + linear(batch_attention(qkv, L, kc, vc, rows, slots, cos, sin, visible, shape, pick),
                   L["wo"]).view(R, W, H)
    gate, up = linear(_norm(x, L["post_norm"], eps).view(R * W, H), L["w_gate_up"]).chunk(2, dim=-1)
    return x, linear(F.silu(gate) * up, L["w_down"]).view(R, W, H)


def upload(rows: list, device: torch.device) -> torch.Tensor:
    """A long tensor of these host lists on the device, queued without waiting for the device (a pinned copy on a
    GPU: a pageable one would wait for every step queued before it, a step launched ahead too)."""
    t = torch.tensor(rows, dtype=torch.long)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


class BatchDecoder:
    """A cache of `rows` sequences of up to `capacity` tokens each, over a FastDecoder's weights."""

    def __init__(self, fast: FastDecoder, rows: int, capacity: int, graphs: bool | None = None,
                 columns: str = "last", compile_mode: str | None = None):
        """columns: 'last' (a draft: the next token after each row) or 'all' (a target's verify: logits for
        every column, [R, W, V]). compile_mode: torch.compile the block (shapes symbolic, so that the buckets,
        widths and spans share a few compiled variants), run inside the graphs; None: eager kernels."""
        if rows > BUCKETS[-1]:
            raise ValueError(f"rows={rows}: at most {BUCKETS[-1]} sequences in one cache")
        self.fast, self.rows, self.capacity = fast, rows, capacity
        self.device, self.dtype, self.vocab = fast.device, fast.dtype, fast.vocab
        self.graphs_on = self.device.type == "cuda" if graphs is None else graphs
        self.pad_prefill = self.graphs_on      # prompt chunks padded to PREFILL_WIDTHS (to replay their graphs)
        if columns not in ("last", "all"):
            raise ValueError(f"columns={columns!r}: use 'last' or 'all'")
        self.last_only = columns == "last"
        shape = (rows, fast.n_kv, capacity + 1, fast.head_dim)
        # every layer's K and V in one tensor [2, layers, rows, n_kv, slots, hd], each layer's a view of it, so that
        # copy_prefix moves rows of every layer in one indexed copy (it took 2 ms of host time a branch as 56 copies)
        self.kv = torch.zeros((2, fast.n_layers) + shape, dtype=self.dtype, device=self.device)
        self.k_cache, self.v_cache = list(self.kv[0].unbind(0)), list(self.kv[1].unbind(0))
        freqs = torch.outer(torch.arange(capacity, device=self.device, dtype=torch.float32), fast._inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * fast._rope_scaling).to(self.dtype)
        self.sin = (emb.sin() * fast._rope_scaling).to(self.dtype)
        if compile_mode:
            import torch._dynamo.config as dc
            for limit in ("recompile_limit", "cache_size_limit"):      # a variant per size-1 specialisation of
                if hasattr(dc, limit):                                 # rows and width, and per model shape
                    setattr(dc, limit, max(getattr(dc, limit), 64))
        self.block = (torch.compile(batch_block, mode=compile_mode, fullgraph=True, dynamic=True)
                      if compile_mode else batch_block)
        self.kernels = fast.options.kernels     # fused kernels for step() (fastmodel.FastOptions.kernels)
        parts = (pre_attention, post_attention, batch_attention)
        self.parts = (tuple(torch.compile(f, mode=compile_mode, fullgraph=True, dynamic=True) for f in parts)
                      if compile_mode and self.kernels != "torch" else parts)
        self.graphs: dict = {}       # (bucket, width, span) -> (graph, static inputs, static logits)
        self.pool = None
        self.clock = ForwardClock(self.device.type == "cuda")
        self.steps = 0
        self.last_rows = 0           # cache rows the newest step computed (its bucket: rows 0..last_rows-1)

    def span_for(self, top: int) -> int:
        """The attention span (slots read) for rows whose highest position is top - 1."""
        s = MIN_SPAN
        while s < top:
            s *= 2
        return min(s, self.capacity)

    def open_row(self, row: int, prompt_ids: list[int]) -> None:
        """A new sequence takes a row: nothing to do (its old entries are masked by position, then overwritten)."""

    def cache_bytes_per_token(self) -> int:
        f = self.fast
        return 2 * f.n_layers * f.n_kv * f.head_dim * self.k_cache[0].element_size()

    @torch.inference_mode()
    def copy_prefix(self, src: list[int], dst: list[int], n: int) -> None:
        """Rows dst[i] take the first n slots of rows src[i], every layer (a branch of a sequence starts from
        its context; slots past n are stale and masked by position). One indexed copy for every layer, no read."""
        if not src:
            return
        if n > self.capacity or max(src + dst) >= self.rows or min(src + dst) < 0:
            raise ValueError(f"copy of {n} slots between rows {src} -> {dst}: this cache has rows "
                             f"0..{self.rows - 1} of {self.capacity} slots")
        idx = upload([src, dst], self.device)
        self.kv[:, :, idx[1], :, :n] = self.kv[:, :, idx[0], :, :n]    # (sources read whole first: a swap works)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, row0: int = 0,
                span: int | None = None) -> torch.Tensor:
        """Eager: ids, positions, slots [R, W] (long, on the device) into cache rows row0..row0+R-1; the
        last column's next-token logits [R, V] (float32; [R, W, V] with columns='all'). span: slots attended (None: up to the highest
        position)."""
        R, W = ids.shape
        if row0 < 0 or row0 + R > self.rows:
            raise ValueError(f"cache rows {row0}..{row0 + R - 1}: this cache has rows 0..{self.rows - 1}")
        span = span or self.span_for(int(positions.max()) + 1)
        return self._forward(ids, positions, slots, row0, span)

    def _forward(self, ids, positions, slots, row0: int, span: int, fused: bool = False) -> torch.Tensor:
        """fused: the kernels of FastOptions.kernels (a step's small widths; prefill chunks keep torch's)."""
        f = self.fast
        R, W = ids.shape
        attn_k, gemv_k = (kernel_levers(self.kernels, R, W, gemv_shapes=f.gemv_shapes, device=f.embed.device)
                          if fused else (False, False))
        x = F.embedding(ids, f.embed)                                                      # [R, W, H]
        carry = torch.zeros_like(x)
        if attn_k or gemv_k:
            x, carry = self._kernel_layers(x.view(R * W, -1), carry.view(R * W, -1), positions, slots, row0, span,
                                           attn_k, gemv_k)
            x, carry = x.view(R, W, -1), carry.view(R, W, -1)
        else:
            rows, cos, sin, visible = self._attention_inputs(positions, span)
            for i, L in enumerate(f.layers):
                kc, vc = self.k_cache[i][row0:row0 + R], self.v_cache[i][row0:row0 + R]
                x, carry = self.block(x, carry, L, kc, vc, rows, slots, cos, sin, visible, f.shape)
        if self.last_only:
            x, carry = x[:, -1], carry[:, -1]
        x, carry = x.reshape(-1, x.shape[-1]), carry.reshape(-1, x.shape[-1])
        logits = output_logits(x, carry, f.final_norm, f.lm_head, f.eps,
                               fused_head(self.kernels, x.shape[0], f.lm_head, f.embed.device, gemv_k))
        if f.keep is not None:
            logits = torch.full((logits.shape[0], f.vocab), float("-inf"), device=self.device).index_copy_(
                1, f.keep, logits)
        return logits if self.last_only else logits.view(R, W, -1)

    @torch.inference_mode()
    def prefill(self, ids: list[int], start: int, row: int) -> None:
        """A prompt chunk into cache row `row` at positions start.., nothing returned (a prompt's last token goes
        into its first step). With graphs (CUDA), a chunk of up to PREFILL_WIDTHS[-1] tokens replays a graph of the
        smallest width that holds it, padded as a step pads (its first token repeated at its own position), one
        graph per (width, span) for every row: an eager chunk's host time (10-20 ms for 28 layers on a GPU)
        held every stream's step behind it. Eager otherwise."""
        n, top = len(ids), start + len(ids)
        if not 0 <= row < self.rows or not n or start < 0 or top > self.capacity:
            raise ValueError(f"a prompt chunk of {n} tokens at {start}.. into row {row}: this cache has rows "
                             f"0..{self.rows - 1} of {self.capacity} slots")
        w = next((w for w in PREFILL_WIDTHS if n <= w), None) if self.pad_prefill else None
        pos = [start] * ((w or n) - n) + list(range(start, top))
        t = upload([[ids[0]] * ((w or n) - n) + list(ids), pos, pos, [row] * len(pos)], self.device)
        span = self.span_for(top)
        if w is None or not self.graphs_on:
            self._prefill_forward(t, span, self.block)
            return
        key = ("prefill", w, span)
        if key not in self.graphs:
            self._capture_prefill(key)
        graph, static, _ = self.graphs[key]
        static.copy_(t)
        graph.replay()

    def _prefill_forward(self, t, span: int, block=batch_block) -> None:
        """t [4, W]: ids, positions, slots and the row (repeated) of one prompt chunk, through torch's layers
        (block: uncompiled in a graph, where compiling would add a variant to build; the graph removes the host's
        time, and a replay's device time is mostly its many small kernels, so one replay a prompt beats several)."""
        f = self.fast
        ids, positions, slots, pick = t[0:1], t[1:2], t[2:3], t[3, :1]
        x = F.embedding(ids, f.embed)
        carry = torch.zeros_like(x)
        _, cos, sin, visible = self._attention_inputs(positions, span)
        for i, L in enumerate(f.layers):
            x, carry = block(x, carry, L, self.k_cache[i], self.v_cache[i], t[3:4], slots, cos, sin, visible,
                             f.shape, pick)

    def _capture_prefill(self, key) -> None:
        """As _capture, for a prompt chunk's graph: its warm-up writes go to row 0's scratch slot."""
        _, w, span = key
        static = torch.zeros((4, w), dtype=torch.long, device=self.device)
        static[2].fill_(self.capacity)
        graph, _ = self._record(lambda: self._prefill_forward(static, span))
        self.graphs[key] = (graph, static, None)

    def warm_prefill(self, widths=(128,), spans=(MIN_SPAN,)) -> None:
        """Capture the prompt chunks' graphs a server will use now (see prefill)."""
        if not (self.graphs_on and self.pad_prefill):
            return
        for w in widths:
            for s in spans:
                if ("prefill", w, s) not in self.graphs:
                    self._capture_prefill(("prefill", w, s))

    def _attention_inputs(self, positions, span: int) -> tuple:
        """Torch attention's inputs for tokens at positions [R, W]: row ids [R, W], cos, sin [R, W, 1, hd] and
        the visible slots [R, W, span]."""
        R, W = positions.shape
        rows = torch.arange(R, device=self.device)[:, None].expand(R, W)
        visible = torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None]
        return rows, self.cos[positions][:, :, None, :], self.sin[positions][:, :, None, :], visible

    def _kernel_layers(self, x, carry, positions, slots, row0: int, span: int, attn_k: bool, gemv_k: bool):
        """The layers through fastmodel.kernel_block over x, carry [R*W, H]: the fused attention kernel over
        each row's own slots (attn_k) or torch's over the span."""
        from .attention_kernels import decode_attention
        f = self.fast
        R = positions.shape[0]
        pre, post, torch_attention = self.parts
        if not attn_k:
            rows, cos, sin, visible = self._attention_inputs(positions, span)
        positions, slots = positions.contiguous(), slots.contiguous()
        for i, L in enumerate(f.layers):
            kc, vc = self.k_cache[i][row0:row0 + R], self.v_cache[i][row0:row0 + R]
            if attn_k:
                attend = partial(decode_attention, k_cache=kc, v_cache=vc, positions=positions, slots=slots,
                                 cos=self.cos, sin=self.sin, q_norm=L["q_norm"], k_norm=L["k_norm"], shape=f.shape)
            else:
                attend = partial(torch_attention, L=L, kc=kc, vc=vc, rows=rows, slots=slots, cos=cos, sin=sin,
                                 visible=visible, shape=f.shape)
            x, carry = kernel_block(x, carry, L, attend, f.eps, gemv_k, (pre, post))
        return x, carry

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, top: int) -> torch.Tensor:
        """Rows 0..R-1 of the cache (R = ids.shape[0]), padded to a bucket with rows that write to the scratch
        slot; top: the highest position among them + 1 (a number the caller keeps on the host, so that choosing
        the span never reads the device). A CUDA graph per (bucket, width, span) on CUDA. Returns [R, V];
        nothing here waits for the device."""
        R, W = ids.shape
        if top > self.capacity:
            raise ValueError(f"position {top - 1} is past this cache's {self.capacity} slots")
        b = min(bucket(R), self.rows)
        if R < b:
            pad = lambda t, v: torch.cat([t, torch.full((b - R, W), v, dtype=t.dtype, device=t.device)])  # noqa: E731
            ids, positions, slots = pad(ids, 0), pad(positions, 0), pad(slots, self.capacity)
        key = (b, W, self.span_for(top))
        t0 = self.clock.begin()
        if self.graphs_on:
            out = self._replay(key, ids, positions, slots)
        else:
            out = self._forward(ids, positions, slots, 0, key[2], fused=True)
        self.clock.end(t0)
        self.steps += 1
        self.last_rows = b
        return out[:R]

    def _replay(self, key, ids, positions, slots) -> torch.Tensor:
        if key not in self.graphs:
            self._capture(key, (ids, positions, slots))
        graph, static, out = self.graphs[key]
        for s, x in zip(static, (ids, positions, slots)):
            s.copy_(x)
        graph.replay()
        return out

    def _capture(self, key, inputs) -> None:
        """Warm on a side stream, then capture one step of this (bucket, width, span). The scratch slot takes
        the writes (each row's slots are pointed at it), so capture changes no sequence's cache."""
        b, w, span = key
        static = tuple(x.clone() for x in inputs)
        static[2].fill_(self.capacity)
        graph, out = self._record(lambda: self._forward(*static, 0, span, fused=True))
        self.graphs[key] = (graph, static, out)

    def _record(self, run):
        """run() twice on a side stream (warm), then captured as a CUDA graph in this decoder's pool: (graph, what
        the captured run returned)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run()
        return graph, out

    def warm(self, buckets=BUCKETS, widths=WIDTHS, spans=None) -> None:
        """Capture the graphs a server will use now, so that no request pays for it."""
        if not self.graphs_on:
            return
        spans = spans or sorted({self.span_for(s) for s in (MIN_SPAN, 512, 1024, 2048, 4096, self.capacity)})
        for b in (x for x in buckets if x <= self.rows):
            for w in widths:
                for s in spans:
                    z = torch.zeros((b, w), dtype=torch.long, device=self.device)
                    self.step(z, z, z + self.capacity, s)

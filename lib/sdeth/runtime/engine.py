"""One engine for both roles: a causal LM over a preallocated static KV cache.

    eng = Engine(model)              # draft or target, same code
    eng.start(max_len)               # a cache of max_len slots for one request
    logits = eng.forward(ids)        # ids: [m] new tokens -> logits [m, vocab] (float32)
    eng.rollback(pos)                # keep the first `pos` tokens: the position is an integer

Rollback only moves the write position (transformers 5's StaticCache keeps it per layer in a
device tensor, `cumulative_length`); entries past it are masked by the causal mask (it masks by
position) and overwritten by the next forward.
The engine drives one model interface (forward(ids, positions), rewind(pos), reset(capacity)):
HFDecoder adapts the transformers model to it, fastmodel.FastDecoder implements it directly.
On CUDA (cuda_graphs=True, the default there) the cache is allocated once for the engine's lifetime
and each width m (1 for decode, k+1 for verify) is captured as a CUDA graph on first use and replayed
after: ids and positions are copied into static buffers, and the captured `cumulative_length.add_`
keeps the device-side write position in step with `pos`. Prefill (any length) runs eager. The CPU
runs eager: graphs would not help there.

No forward waits for the device: inputs may be device tensors (a drafted token feeds the next step
where it lies), and on CUDA each forward is timed by a pair of CUDA events that are read only when
`forward_s` is read, after the round's one host read (`host_read`) has waited for the work anyway.
"""
from __future__ import annotations

import time

import torch


class CacheFull(ValueError):
    pass


class HostCopy:
    """A device tensor's values on their way to the host: on CUDA a copy into pinned memory queued behind
    the work that makes them, with an event after it; value() waits for that event only, so work queued
    later (the next step) keeps running."""

    def __init__(self, t: torch.Tensor):
        self.t, self.ev, self._v = t, None, None
        if t.device.type == "cuda":
            self.t = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.t.copy_(t, non_blocking=True)
            self.ev = torch.cuda.Event()
            self.ev.record()

    def done(self) -> bool:
        """True when value() would not wait."""
        return self.ev is None or self.ev.query()

    def value(self):
        if self._v is None:
            if self.ev is not None:
                self.ev.synchronize()
            self._v = self.t.tolist()
        return self._v


class HostPart:
    """An element (or a slice) of a HostCopy: several small values that reach the host in one copy."""

    def __init__(self, copy: HostCopy, index):
        self.copy, self.index = copy, index

    def done(self) -> bool:
        return self.copy.done()

    def value(self):
        return self.copy.value()[self.index]


def host_read(t: torch.Tensor):
    """A device tensor's values on the host (a list, or a number for a 0-d tensor): the one read a
    round makes."""
    return HostCopy(t).value()


class ForwardClock:
    """Time spent in an engine's forwards: wall time on the CPU; on CUDA, pairs of events recorded around
    each forward and summed when read (a read waits for the last forward to finish)."""

    def __init__(self, cuda: bool):
        self.cuda, self.settled, self.pending, self._last_s = cuda, 0.0, [], 0.0

    def begin(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def end(self, mark) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pending.append((mark, ev))
        else:
            self._last_s = time.perf_counter() - mark
            self.settled += self._last_s

    @property
    def seconds(self) -> float:
        if self.pending:
            self.pending[-1][1].synchronize()
            self.settled += sum(a.elapsed_time(b) for a, b in self.pending) / 1e3
            self.pending.clear()
        return self.settled

    def reset(self, value: float = 0.0) -> None:
        self.settled, self.pending = value, []

    def last(self):
        """A mark for the newest forward, for elapsed(): its event pair on CUDA, its duration elsewhere."""
        return self.pending[-1] if self.cuda else self._last_s

    def settle_through(self, mark) -> None:
        """The forwards up to mark's (waited for: elapsed(mark)) summed into seconds and no longer held, so that a
        caller that reads marks and never `seconds` (steps launched ahead) keeps no events past them."""
        if self.cuda:
            i = next((j for j, m in enumerate(self.pending) if m is mark), -1) + 1
            self.settled += sum(a.elapsed_time(b) for a, b in self.pending[:i]) / 1e3
            del self.pending[:i]

    def elapsed(self, mark) -> float:
        """Seconds of one forward from its mark (on CUDA this waits for that forward)."""
        if not self.cuda:
            return mark
        mark[1].synchronize()
        return mark[0].elapsed_time(mark[1]) / 1e3


class HFDecoder:
    """The transformers model behind the engine's one model interface (FastDecoder has the same):
    forward(ids [m], positions [m]) -> next-token logits [m, V] float32, over a StaticCache of
    `capacity` tokens; rewind(pos) sets the cache's write position (transformers 5 keeps it per layer
    in a device tensor, `cumulative_length`; the causal mask is by position, so entries past it are
    masked and overwritten by the next forward); reset(capacity) starts a new cache."""

    def __init__(self, model, capacity: int):
        self.model = model
        self.reset(capacity)

    def reset(self, capacity: int) -> None:
        from transformers import StaticCache
        self.capacity = capacity
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids[None], position_ids=positions[None], past_key_values=self.cache, use_cache=True)
        return out.logits[0].float()

    @torch.inference_mode()   # on CUDA the cache's position tensor is born inside inference mode
    def rewind(self, pos: int) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(pos)


class Engine:
    def __init__(self, model, name: str = "model", cuda_graphs: bool | None = None, capacity: int = 4096,
                 max_graph_width: int = 16, impl: str = "hf", compile_mode: str | None = None,
                 vocab: int | None = None, fast=None, scratch: int = 0):
        """impl: the model interface the engine drives: 'hf' the transformers model itself (HFDecoder),
        'fast' sdeth.fastmodel's FastDecoder built from the same weights (fused projections,
        plain-tensor cache). compile_mode (fast only): torch.compile the fixed-width forwards (e.g.
        'max-autotune-no-cudagraphs'), which then run inside this engine's CUDA graphs.
        vocab: cut the logits to the pair's shared tokenizer size (embedding tables padded past it
        have rows no token id reaches; both models are cut alike). None: the model's full width.
        fast (fast only): the decoder's levers, a FastOptions or its spec ('scope=layer,weights=fp8').
        scratch (fast only): cache slots past capacity for forward_rows."""
        from .fastmodel import FastOptions
        if impl not in ("hf", "fast"):
            raise ValueError(f"impl {impl!r}: use 'hf' or 'fast'")
        if compile_mode and impl != "fast":
            raise ValueError("compile_mode needs impl='fast'")
        self.fast = FastOptions.parse(fast)
        if impl != "fast" and (self.fast != FastOptions() or scratch):
            raise ValueError(f"fast options {self.fast} need impl='fast'")
        self.scratch = scratch
        self.model = model
        self.name = name
        self.device = next(model.parameters()).device
        self.graphs_on = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        self.capacity, self.max_graph_width = capacity, max_graph_width
        self.impl, self.compile_mode = impl, compile_mode
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
        if vocab is not None and rows is not None and vocab > rows:
            raise ValueError(f"{name}: vocab {vocab} exceeds the model's {rows} output rows")
        self.vocab = vocab if vocab is not None and vocab != rows else None
        self.net = None         # the model interface: forward(ids, positions), rewind(pos), reset(capacity)
        self._fixed = None      # the fixed-width forward (compiled or not)
        self.graphs: dict = {}  # m or ("rows", m) -> (graph, static inputs, static logits)
        self.pos = 0            # tokens held in the cache
        self.max_len = 0
        self.clock = ForwardClock(self.device.type == "cuda")   # time in forward, for the breakdown
        self.forwards = 0

    @property
    def forward_s(self) -> float:
        """Seconds spent in forwards since the last reset (device time on CUDA; reading it waits for them)."""
        return self.clock.seconds

    @forward_s.setter
    def forward_s(self, value: float) -> None:
        self.clock.reset(value)

    def _build(self, capacity: int) -> None:
        if self.impl == "fast":
            from .fastmodel import FastDecoder
            self.net = FastDecoder(self.model, capacity, self.fast, self.scratch)
        else:
            self.net = HFDecoder(self.model, capacity)
        self._fixed = self.net.forward
        if self.compile_mode and self.fast.scope == "layer":
            self.net.compile(self.compile_mode)      # one block compiled; the step around it runs in the graph
            self._fixed = self.net.compiled_forward
        elif self.compile_mode:
            # dynamic=None: width 1 (the decode step) compiles static; the second width seen
            # recompiles with a symbolic width that serves every other verify width
            self._fixed = torch.compile(self.net.forward, mode=self.compile_mode, fullgraph=True, dynamic=None)

    def start(self, max_len: int) -> None:
        """A cache for one request: on CUDA with graphs, the one engine-lifetime cache of `capacity`,
        rewound to 0; elsewhere a cache sized to the request (attention cost grows with its length)."""
        self.forward_s, self.forwards = 0.0, 0
        if self.graphs_on and max_len > self.capacity:
            raise CacheFull(f"{self.name}: a request of {max_len} tokens exceeds the graph cache of "
                            f"{self.capacity}: create the Engine with a larger capacity")
        cap = self.capacity if self.graphs_on else max_len
        if self.net is None:
            self._build(cap)
        elif self.net.capacity != cap:
            self.net.reset(cap)
        self.max_len = cap
        self.rollback(0)

    def on_device(self, ids) -> torch.Tensor:
        """Token ids on the device as long [m]: a device tensor as it is, host ids through pinned memory
        (a pageable copy would wait for the device)."""
        if isinstance(ids, torch.Tensor) and ids.device == self.device:
            return ids.reshape(-1).long()
        t = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    @torch.inference_mode()
    def forward(self, ids) -> torch.Tensor:
        """Run m new tokens at positions pos..pos+m-1; returns their next-token logits [m, V].
        ids: host ids or a device tensor; nothing here waits for the device."""
        ids = self.on_device(ids)
        m = ids.shape[0]
        if self.pos + m > self.max_len:
            raise CacheFull(f"{self.name}: {self.pos} + {m} tokens exceed the cache of {self.max_len}")
        t0 = self.clock.begin()
        positions = torch.arange(self.pos, self.pos + m, device=self.device)
        fixed = self.pos > 0 and m <= self.max_graph_width      # decode and verify widths; prefill runs eager
        if fixed and self.graphs_on:
            logits = self._replay(m, (ids, positions))
        else:
            logits = (self._fixed if fixed else self.net.forward)(ids, positions)
        if self.vocab is not None:
            logits = logits[:, :self.vocab]
        self.pos += m
        self.clock.end(t0)
        self.forwards += 1
        return logits

    def warm(self, max_width: int) -> None:
        """Capture (and compile) every width 1..max_width now, so that no request pays for it."""
        if not self.graphs_on:
            return
        self.start(min(self.capacity, max_width + 2))
        self.forward([0])
        for m in range(1, min(max_width, self.max_graph_width) + 1):
            self.forward([0] * m)
            self.rollback(1)
        self.rollback(0)

    @torch.inference_mode()
    def forward_rows(self, ids, positions, slots, visible, advance: int = 0) -> torch.Tensor:
        """Several rows in one forward (the fast decoder only): token i at positions[i], its keys written
        to slots[i] (the scratch region past capacity for rows that branch off the cached prefix), and
        attending to the slots visible[i] marks. advance: how many of the rows (the first ones) extend the
        chain, written at its next slots; the chain position moves by that many. Returns [m, V]."""
        if self.impl != "fast":
            raise ValueError(f"{self.name}: rows need impl='fast'")
        ids = self.on_device(ids)
        if self.pos + advance > self.max_len:
            raise CacheFull(f"{self.name}: {self.pos} + {advance} tokens exceed the cache of {self.max_len}")
        dev = lambda t, dt: torch.as_tensor(t, dtype=dt).to(self.device, non_blocking=True)  # noqa: E731
        inputs = (ids, dev(positions, torch.long), dev(slots, torch.long), dev(visible, torch.bool))
        t0 = self.clock.begin()
        if self.graphs_on and ids.shape[0] <= self.max_graph_width:
            logits = self._replay(("rows", ids.shape[0]), inputs)
        else:
            logits = self._fixed(*inputs)
        if self.vocab is not None:
            logits = logits[:, :self.vocab]
        self.pos += advance
        self.clock.end(t0)
        self.forwards += 1
        return logits

    def rows_visible(self, prefix, lo, hi) -> torch.Tensor:
        """Row visibility for forward_rows, built on the device from three numbers per row (host lists, or
        tensors already there): the chain's slots below prefix[i], and the scratch slots lo[i]..hi[i] (the row's
        own branch, itself included)."""
        slots = self.net.slots
        p, a, b = (torch.as_tensor(v, dtype=torch.long).to(self.device, non_blocking=True)[:, None]
                   for v in (prefix, lo, hi))
        return (slots[None, :] < p) | ((slots[None, :] >= a) & (slots[None, :] <= b))

    def scratch_base(self) -> int:
        """The first scratch slot (past the chain's cache)."""
        return self.net.capacity

    def _replay(self, key, inputs) -> torch.Tensor:
        if key not in self.graphs:
            self._capture(key, inputs)
        graph, static, s_logits = self.graphs[key]
        for s_in, x in zip(static, inputs):
            s_in.copy_(x)
        graph.replay()
        return s_logits.clone()

    def _capture(self, key, inputs) -> None:
        """Warm up on a side stream, then capture one forward of this width; the cache's write
        position is restored after each so that capture leaves no trace."""
        static = tuple(x.clone() for x in inputs)
        pos0 = self.pos
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3 if self.compile_mode else 2):   # compiling happens here, off the graph
                self._fixed(*static)
                self.rollback(pos0)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            s_logits = self._fixed(*static)
        self.rollback(pos0)
        self.graphs[key] = (graph, static, s_logits)

    def rollback(self, pos: int) -> None:
        """Forget everything after the first `pos` tokens: the position is an integer."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"{self.name}: cannot roll back to {pos}, cache holds {self.pos}")
        self.net.rewind(pos)
        self.pos = pos


# ---------------------------------------------------------------- the ladder (gpt-fast shape)

def prefill(engine: Engine, prompt_ids: list[int]) -> torch.Tensor:
    """Whole prompt in one forward; returns the logits for the first new token [V]."""
    return engine.forward(prompt_ids)[-1]


def decode_one_token(engine: Engine, token: int) -> torch.Tensor:
    return engine.forward([token])[-1]


def median_forward_s(engine: Engine, ids: list[int], reps: int = 9) -> float:
    """Median seconds of a forward of `ids` from the engine's position (the first of reps + 1 not counted;
    rolled back after each): a step for one id, a verify for several. The cost model's inputs."""
    import statistics
    import time
    pos, ts = engine.pos, []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        host_read(engine.forward(ids)[-1, :1])
        ts.append(time.perf_counter() - t0)
        engine.rollback(pos)
    return statistics.median(ts[1:])

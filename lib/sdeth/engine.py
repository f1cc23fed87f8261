"""One engine for both roles: a causal LM over a preallocated static KV cache.

    eng = Engine(model)              # draft or target, same code
    eng.start(max_len)               # a cache of max_len slots for one request
    logits = eng.forward(ids)        # ids: [m] new tokens -> logits [m, vocab] (float32)
    eng.rollback(pos)                # keep the first `pos` tokens: the position is an integer

Rollback only moves the write position (transformers 5's StaticCache keeps it per layer in a
device tensor, `cumulative_length`); entries past it are masked by the causal mask (it masks by
position) and overwritten by the next forward.
On CUDA a CUDA graph per width m is the next step (GPU issue); the CPU runs eager.
"""
from __future__ import annotations

import time

import torch


class CacheFull(ValueError):
    pass


class Engine:
    def __init__(self, model, name: str = "model"):
        self.model = model
        self.name = name
        self.device = next(model.parameters()).device
        self.cache = None
        self.pos = 0            # tokens held in the cache
        self.max_len = 0
        self.forward_s = 0.0    # wall time spent in forward, for the breakdown
        self.forwards = 0

    def start(self, max_len: int) -> None:
        """A fresh cache for one request (sized to it: attention cost grows with the cache length)."""
        from transformers import StaticCache
        self.cache = StaticCache(config=self.model.config, max_cache_len=max_len)
        self.max_len, self.pos = max_len, 0
        self.forward_s, self.forwards = 0.0, 0

    @torch.inference_mode()
    def forward(self, ids) -> torch.Tensor:
        """Run m new tokens at positions pos..pos+m-1; returns their next-token logits [m, V]."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(1, -1)
        m = ids.shape[1]
        if self.pos + m > self.max_len:
            raise CacheFull(f"{self.name}: {self.pos} + {m} tokens exceed the cache of {self.max_len}")
        t0 = time.perf_counter()
        positions = torch.arange(self.pos, self.pos + m, device=self.device).unsqueeze(0)
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True)
        self.pos += m
        logits = out.logits[0].float()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_s += time.perf_counter() - t0
        self.forwards += 1
        return logits

    def rollback(self, pos: int) -> None:
        """Forget everything after the first `pos` tokens."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"{self.name}: cannot roll back to {pos}, cache holds {self.pos}")
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(pos)
        self.pos = pos


# ---------------------------------------------------------------- the ladder (gpt-fast shape)

def prefill(engine: Engine, prompt_ids: list[int]) -> torch.Tensor:
    """Whole prompt in one forward; returns the logits for the first new token [V]."""
    return engine.forward(prompt_ids)[-1]


def decode_one_token(engine: Engine, token: int) -> torch.Tensor:
    return engine.forward([token])[-1]

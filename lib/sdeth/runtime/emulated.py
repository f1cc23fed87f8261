"""An emulated draft device: the real draft's tokens, replayed, at the pace a device profile gives.

For a draft on hardware we cannot run here (an accelerator card), the draft worker answers with the tokens
the real draft model proposes (recorded on the same prompts by `record_chains`: exact for greedy decoding,
so acceptance is the real pair's and the output stays the target's) and takes the time the device's
profile gives one step (sdeth.devices.DeviceProfile.step_s for the model it stands for). Sleeping can be
faster than computing only because the tokens are replayed: every result says "emulated".

The recording: for each prompt, the target's greedy output t and, from every prefix t[:p], the draft's own
greedy continuation chain_p. Any context the draft sees in SD is t[:p] followed by the first j tokens of
chain_p (after a correction the context is a prefix of t again), so its next token is chain_p[j].
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch

from .engine import Engine
from .synthetic import prompt_key


class ChainsMiss(KeyError):
    pass


class DraftChains:
    """The recorded continuations of a draft, per prompt (keyed by its token ids)."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.by_key = {int(s["key"]): s for s in doc["sequences"]}
        self.depth = int(doc["depth"])

    @classmethod
    def load(cls, path) -> "DraftChains":
        import json
        return cls(json.load(open(path)))

    def next_token(self, key: int, context: list[int]) -> int:
        """The draft's greedy token after the prompt (by key) and `context` (the tokens since the prompt)."""
        seq = self.by_key.get(key)
        if seq is None:
            raise ChainsMiss(f"no recorded chains for this prompt (key {key}): record them on the same prompts")
        t, chains = seq["target"], seq["chains"]
        p = 0
        while p < len(context) and p < len(t) and context[p] == t[p]:
            p += 1
        j = len(context) - p
        if p >= len(chains) or j >= len(chains[p]):
            raise ChainsMiss(f"context of {len(context)} tokens past the recording (target {len(t)}, depth {self.depth})")
        return chains[p][j]


class EmulatedEngine(Engine):
    """An Engine that runs no model: each forward answers with the recorded draft's tokens (one-hot logits)
    and takes `step_s` per new token after the first forward of a request (the prefill takes
    `prefill_s`). Misses (contexts past the recording) answer token 0 and are counted."""

    def __init__(self, model, chains: DraftChains, step_s: float, name: str = "draft", prefill_s: float = 0.0,
                 vocab: int | None = None, **kw):
        super().__init__(model, name, cuda_graphs=False, vocab=vocab, **kw)
        self.chains, self.step_s, self.prefill_s = chains, step_s, prefill_s
        self.vocab_size = int(vocab or model.config.vocab_size)
        self.tokens: list[int] = []
        self.key, self.prompt_len, self.misses = 0, 0, 0

    def start(self, max_len: int) -> None:
        self.forward_s, self.forwards = 0.0, 0
        self.max_len, self.pos, self.tokens = max_len, 0, []

    def rollback(self, pos: int) -> None:
        if not 0 <= pos <= self.pos:
            raise ValueError(f"{self.name}: cannot roll back to {pos}, cache holds {self.pos}")
        self.pos, self.tokens = pos, self.tokens[:pos]

    def _pace(self, t0: float, seconds: float) -> None:
        end = t0 + seconds
        while (left := end - time.perf_counter()) > 0:
            if left > 2e-3:
                time.sleep(left - 1e-3)

    def forward(self, ids) -> torch.Tensor:
        mark = self.clock.begin()
        t0 = time.perf_counter()
        new = [int(x) for x in torch.as_tensor(ids).reshape(-1).tolist()]
        if self.pos == 0:
            self.key, self.prompt_len = prompt_key(new), len(new)
        self.tokens += new
        self.pos += len(new)
        logits = torch.full((len(new), self.vocab_size), -1e4)
        for i in range(len(new)):
            end = self.pos - len(new) + i + 1
            if end < self.prompt_len:
                continue
            try:
                tok = self.chains.next_token(self.key, self.tokens[self.prompt_len:end])
            except ChainsMiss:
                tok, self.misses = 0, self.misses + 1
            logits[i, tok] = 0.0
        # a prefill takes prefill_s; any other forward one step (a few tokens cost one pass of the weights)
        self._pace(t0, self.prefill_s if self.forwards == 0 else self.step_s)
        self.clock.end(mark)
        self.forwards += 1
        return logits


class Emulation(NamedTuple):
    """An emulated draft device, written PROFILE:SHAPE[:bf16|fp8] (e.g. 'corsair:Qwen3-1.7B:fp8'): a device
    profile of params/devices, a model shape, and the bytes per weight."""
    profile: str
    shape: str
    bytes_per_param: float

    @classmethod
    def parse(cls, spec: str) -> "Emulation":
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"draft emulation {spec!r}: use PROFILE:SHAPE[:bf16|fp8], e.g. corsair:Qwen3-1.7B:fp8")
        fmt = parts[2] if len(parts) == 3 else "bf16"
        if fmt not in ("bf16", "fp8"):
            raise ValueError(f"draft emulation {spec!r}: weights {fmt!r}, use bf16 or fp8")
        return cls(parts[0], parts[1], {"bf16": 2.0, "fp8": 1.0}[fmt])


def parse_emulation(spec: str) -> Emulation:
    """'corsair:Qwen3-1.7B:fp8' -> (profile, model shape, bytes per parameter)."""
    return Emulation.parse(spec)


def emulated_draft(model, spec: str, chains_path: str, vocab: int | None = None) -> EmulatedEngine:
    """The emulated draft of `spec` (PROFILE:SHAPE[:bf16|fp8]) replaying the chains recorded in chains_path."""
    from .. import devices
    profile, shape, bpp = parse_emulation(spec)
    p = devices.load(profile)
    w, kv, layers = devices.model_bytes(shape, bpp)
    step = p.step_s(w, kv, layers)
    eng = EmulatedEngine(model, DraftChains.load(chains_path), step, prefill_s=4 * step, vocab=vocab)
    eng.emulation = {"profile": p.name, "shape": shape, "weights": "fp8" if bpp == 1 else "bf16",
                     "memory": p.memory(w, kv), "step_ms": step * 1e3, "kind": "emulated"}
    return eng

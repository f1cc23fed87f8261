"""One cache row over any draft Engine: the decoder interface a BatchDrafter drives (batchmodel.BatchDecoder's),
so that the draft server serves any engine `make_engine` builds (transformers, the fast decoder, synthetic and
trace-driven acceptance, an emulated draft device) as a server of one row.

    dec = EngineRow(engine, capacity)         # rows = 1
    dec.open_row(0, prompt_ids)               # a new sequence takes the row
    dec.forward(ids, positions, slots)        # a prompt chunk [1, W]
    logits = dec.step(ids, positions, slots, top)   # a draft step [1, W] -> the last column's logits [1, V]

The engine holds one context at a time, its tokens at positions 0..engine.pos-1. A forward or step whose first
position p0 is below engine.pos rolls the engine back to p0 first (the drafter feeds from the first token its row
does not hold settled; entries from there on are stale); a step's row may repeat its first token at its own
position (batchmodel's padding), and only its distinct positions are fed. An engine whose answers are keyed by its
request's prompt (`keyed_by_prompt`: synthetic and trace-driven acceptance, an emulated draft) sees the whole prompt
in its first forward, as the one-sequence drafter fed it; its prompt's tokens are not fed again. It cannot fork:
copy_prefix refuses any row but its own, and a verdict cache has no free row to draft branches on.
"""
from __future__ import annotations

import torch

from .engine import ForwardClock


class EngineRow:
    """One row of `capacity` tokens over one Engine (see the module)."""

    rows = 1

    def __init__(self, engine, capacity: int):
        if capacity < 2:
            raise ValueError(f"capacity {capacity}: a row holds at least a prompt token and a draft (use 2 or more)")
        self.engine, self.capacity, self.device = engine, capacity, engine.device
        self.clock = ForwardClock(self.device.type == "cuda")     # forward time, across sequences
        self.steps, self.last_rows, self.graphs = 0, 0, {}
        self.prompt: list[int] = []            # the sequence's prompt (an engine keyed by it sees it whole)
        self.prompt_logits = None              # [1, V] after the prompt's last token (keyed engines)
        self.started = False

    def open_row(self, row: int, prompt_ids: list[int]) -> None:
        """A new sequence takes the row: the engine's cache is started afresh."""
        self._check_rows([row])
        self.prompt, self.prompt_logits = list(prompt_ids), None
        self.engine.start(self.capacity)
        self.started = True

    def copy_prefix(self, src: list[int], dst: list[int], n: int) -> None:
        """A row onto itself only (one row: nothing to copy)."""
        self._check_rows(src + dst)

    def _check_rows(self, rows: list[int]) -> None:
        if any(r != 0 for r in rows):
            raise ValueError(f"rows {rows}: an engine row has row 0 only (this draft cannot fork branches)")

    def warm(self, *a, **kw) -> None:
        """Nothing to capture here (the engine captures its own widths on first use, or in Engine.warm)."""

    def span_for(self, top: int) -> int:
        return self.capacity

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, row0: int = 0,
                span: int | None = None) -> torch.Tensor:
        """A prompt chunk into the row: ids, positions [1, W] (consecutive positions)."""
        self._check_rows([row0 + r for r in range(ids.shape[0])])
        p0 = int(positions[0, 0])
        return self._feed(ids[0], p0)

    def prefill(self, ids: list[int], start: int, row: int) -> None:
        """A prompt chunk into the row at positions start.. (BatchDecoder.prefill's call)."""
        self._check_rows([row])
        self._feed(torch.tensor(ids, dtype=torch.long, device=self.device), start)

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, top: int) -> torch.Tensor:
        """A draft step of the row: ids, positions [1, W] whose last position is top - 1 (a first step may repeat
        its first token at its own position); the last column's logits [1, V]."""
        if ids.shape[0] != 1:
            raise ValueError(f"a step of {ids.shape[0]} rows: an engine row steps one")
        if top > self.capacity:
            raise ValueError(f"position {top - 1} is past this row's {self.capacity} slots")
        W = ids.shape[1]
        p0 = top - 1 if W == 1 else int(positions[0, 0])      # (a draft step's position is top - 1: no read)
        logits = self._feed(ids[0, W - (top - p0):], p0)
        self.steps += 1
        self.last_rows = 1
        return logits

    def _feed(self, ids: torch.Tensor, p0: int) -> torch.Tensor:
        """Tokens ids [m] at positions p0.. into the engine; the last one's next-token logits [1, V]."""
        eng = self.engine
        if not self.started:
            raise ValueError("a forward before open_row: open a sequence on the row first")
        keyed = bool(getattr(eng, "keyed_by_prompt", False)) and self.prompt
        mark = self.clock.begin()
        if keyed and eng.pos == 0:            # the whole prompt in the first forward (its answers are keyed by it)
            self.prompt_logits = eng.forward(self.prompt)[-1:]
        skip = max(len(self.prompt) - p0, 0) if keyed else 0       # a keyed engine holds its prompt already
        p0, ids = p0 + skip, ids[skip:]
        if p0 > eng.pos:
            raise ValueError(f"tokens from position {p0}, but the engine holds {eng.pos}: a gap in the row")
        if p0 < eng.pos:
            eng.rollback(p0)
        out = eng.forward(ids)[-1:] if ids.numel() else self.prompt_logits
        self.clock.end(mark)
        return out

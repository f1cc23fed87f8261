"""The batched drafter's records: a sequence's state in its cache row (Sequence), one row's proposal from a step
(RowDrafted), and the errors a round or a step can meet (Desync, Full, Overflow)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .batchmodel import WIDTHS
from .verify import Sampling

CATCH_UP = WIDTHS[-1]   # pending tokens a draft step feeds in its first forward; more (a prompt) are prefilled first


class Desync(ValueError):
    """A round that does not fit the sequence the draft holds: the client re-opens it."""


class Full(ValueError):
    """No cache row is free."""


class Overflow(ValueError):
    """Sequences whose drafts would pass the cache's slots (n + k > capacity): `seqs` names them; nothing was
    drafted."""

    def __init__(self, seqs: list, capacity: int):
        self.seqs = seqs
        super().__init__(", ".join(f"{s.key[1]!r} at {s.n} tokens + k={k}" for s, k in seqs)
                         + f" would pass this cache's {capacity} slots")


@dataclass(eq=False)
class Sequence:
    key: tuple                     # (client, sequence id)
    gen: int                       # the client's generation of this sequence (a re-open is a new one)
    row: int                       # its cache row
    s: Sampling
    rng: torch.Generator
    q_top: int
    n: int = 0                     # context tokens the client has settled
    fed: int = 0                   # ... of which in the cache row
    pending: list[int] = field(default_factory=list)   # ... and waiting to be fed (n = fed + len(pending))
    prev: list[int] = field(default_factory=list)      # the last proposal
    ahead: int = 0                 # prev's first tokens in the cache, past the context
    stream: bool = False           # pipelined: drafted ahead, a token a step (see open_stream)
    window: int = 0
    base: int = 0                  # stream: the prompt's length (stream positions count from it)
    chain: list[int] = field(default_factory=list)     # stream: tokens at positions 0.. (drafted or committed)
    acked: int = 0                 # stream: positions < acked are final (the client said so)
    epoch: int = 0                 # stream: restarts so far
    read_at: float = 0.0           # stream: when the newest commit was read (wall clock, time.time())
    read_pos: int = -1             # ... its position; -1 once the step after it has drafted (see stream_step)
    opened: float = field(default_factory=time.perf_counter)
    stepped: float = 0.0           # when it last drafted (time.perf_counter; 0: never)
    prefill_s: float = 0.0         # the prompt's forwards
    drafted: int = 0               # proposals made
    seed: int = 0                  # its draws' seed (a branch's own generator is derived from it)
    watch: int = 0                 # stream: the draft's next choices sent with each token (Open.watch)
    send_branches: bool = False    # stream: its verdict-cache branches sent as they are drafted (Open.branches)
    alts: dict = field(default_factory=dict)           # stream: position -> the draft's next choices there

    @property
    def ready(self) -> bool:
        """Whether a draft step can take it (its prompt is fed)."""
        return 1 <= len(self.pending) <= CATCH_UP

    @property
    def room(self) -> bool:
        """A stream that may draft its next token (within its window past what the client settled)."""
        return self.stream and self.ready and len(self.chain) - self.acked < self.window


@dataclass
class RowDrafted:
    """One sequence's proposal from a batched step."""
    tokens: list[int]
    q_idx: list[list[int]] | None = None
    q_val: list[list[float]] | None = None
    alts: list[list[int]] | None = None      # per token: the draft's next choices (BatchDrafter.alts of them)

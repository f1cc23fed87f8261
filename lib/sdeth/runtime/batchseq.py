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
    lineage: int = 0               # stream: bumped by whatever a step launched ahead could not foresee (a commit
                                   # that restarts or extends the chain, a token dropped): see Flight
    flight: "FlightRow | None" = None                  # stream: its row of the newest step launched, not yet read

    @property
    def ready(self) -> bool:
        """Whether a draft step can take it (its prompt is fed)."""
        return 1 <= len(self.pending) <= CATCH_UP

    @property
    def room(self) -> bool:
        """A stream that may draft its next token (within its window past what the client settled)."""
        fr = self.ahead_row()
        if fr is not None:                 # (its next token is the one in flight: position fr.pos + 1)
            return fr.pos + 1 - self.acked < self.window
        return self.stream and self.ready and len(self.chain) - self.acked < self.window

    def ahead_row(self) -> "FlightRow | None":
        """Its row of the step in flight while nothing has happened since that step's launch that it could not
        foresee: the next step may then feed that step's token on the device (see Flight)."""
        fr = self.flight
        return fr if fr is not None and fr.lineage == self.lineage else None

    @property
    def next_n(self) -> int:
        """Its context length once the step in flight (if any) is read: what the next step drafts after."""
        fr = self.ahead_row()
        return fr.n + 1 if fr is not None else self.n


@dataclass
class FlightRow:
    """A stream's row of a step launched ahead of its read (BatchDrafter.launch_streams): the cache row it
    stepped in, the chain position it drafts, the context length before it (its token goes at slot n), and the
    stream's lineage then: the token is kept only if the lineage is unchanged when the step is read."""
    launched: "Launched"
    row: int
    pos: int
    n: int
    lineage: int


@dataclass
class Launched:
    """A draft step on the device: its batch [(sequence, k)], its tokens there ([R] per drafted position; the
    first feeds a step launched after it), the sampled rows' q per position, the copy of its tokens to the host
    and its forwards' timing mark. finish() reads it; a stream step's rows (FlightRow) are kept in `rows`."""
    batch: list
    toks: list
    qs: list
    copy: object
    mark: object
    rows: list = field(default_factory=list)
    t_launch: float = 0.0          # when the launch returned (time.perf_counter)
    t_due: float = 0.0             # when the next step is to be launched behind it (the server's estimate)


@dataclass
class RowDrafted:
    """One sequence's proposal from a batched step."""
    tokens: list[int]
    q_idx: list[list[int]] | None = None
    q_val: list[list[float]] | None = None
    alts: list[list[int]] | None = None      # per token: the draft's next choices (BatchDrafter.alts of them)

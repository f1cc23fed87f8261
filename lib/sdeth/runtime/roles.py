"""The roles a draft plays, as contracts (typing.Protocol): a new draft (another device, another engine,
another transport) is one class against one of these, and both loops take it unchanged.

    DraftSource  the sync loop's draft (loop.generate_sd): loop.Drafter in-process,
                 wire.draft_handles.ServerDraft over the link
    DraftStream  the pipelined loop's draft (pipeline.generate_pipelined): wire.draft_handles.ServerStream over
                 the link; tests/doubles.LocalStream simulates the link in-process
    DraftBackend the device a draft model runs on, under both (engine.Engine on a CPU or GPU,
                 emulated.EmulatedEngine for a device profile): start, forward, rollback, pos, forward_s

Either raises loop.DraftUnavailable when the draft cannot go on; the request then finishes on the
target alone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .verify import Sampling


@runtime_checkable
class DraftSource(Protocol):
    @property
    def compute_s(self) -> float:
        """Draft model seconds spent in propose() since start()."""

    def start(self, prompt_ids: list[int], size: int, s: "Sampling | None" = None, seed: int | None = None) -> None:
        """Prefill the prompt into a cache of `size` tokens; seed: this request's sampling seed."""

    def propose(self, n_prev: int, nxt: int, k: int) -> "tuple[list[int], torch.Tensor | None]":
        """Apply the verdict on the previous proposal (n_prev of its tokens accepted, then the target's
        token nxt), then propose k tokens: (ids [k], q [k, V] on the target's device, or None when the
        draft is greedy)."""


@runtime_checkable
class DraftStream(Protocol):
    view: object                # the target's picture of what the draft streamed: a pipeline.StreamView

    @property
    def compute_s(self) -> float:
        """Draft model seconds since start()."""

    @property
    def streamed(self) -> int:
        """Tokens the draft streamed in this request."""

    def start(self, prompt_ids: list[int], size: int, first: int, s: "Sampling | None" = None,
              seed: int | None = None) -> None:
        """Begin drafting after the prompt and the target's first token `first`, without waiting."""

    def commit(self, pos: int, token: int) -> None:
        """The target's own token at `pos` (pipeline's rules); returns at once."""

    def poll(self) -> None:
        """Take in whatever drafts have arrived (into view), without waiting."""

    def wait(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for at least one more message, then poll; False if none came (the caller
        decides when silence means the draft is gone); DraftUnavailable if the draft reported an error."""

    def end(self) -> None:
        """The request is over: free its state on the draft side."""


@runtime_checkable
class DraftBackend(Protocol):
    """What Drafter and StreamDrafter drive (engine.Engine is one; a vendor's card is another)."""
    pos: int                        # tokens held in the cache

    def start(self, max_len: int) -> None:
        """A cache for one request of up to max_len tokens, empty."""

    def forward(self, ids) -> "torch.Tensor":
        """Append m token ids (host list or device tensor); the next-token logits after each, [m, vocab]."""

    def rollback(self, pos: int) -> None:
        """Forget everything after the first pos tokens."""

    @property
    def forward_s(self) -> float:
        """Seconds spent in forward since start() (settable: the drafters reset it after the prefill)."""

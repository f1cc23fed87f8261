"""A draft server's messages (msgspec structs): a client's Open, Rounds and Commits, and the server's Drafts and
Streamed (wire.protocol has the flows, wire.draft_server the rules)."""
from __future__ import annotations

import msgspec

from .messages import STREAM_WINDOW, DraftSeed, GenNo, ReqId


class Open(msgspec.Struct, tag="open"):
    """Draft server: a sequence (or the same one again, under a new generation after a desync) and its
    context so far. No reply: the first Rounds row for it is answered once its prompt is fed."""
    seq: ReqId
    gen: GenNo
    prompt_ids: list[int]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    draft_sampled: bool = False
    q_top: int = 64
    seed: DraftSeed = 0
    stream: bool = False     # pipelined: the server drafts ahead (up to `window` past what the client settled)
    window: int = STREAM_WINDOW   # and streams each token in Streamed; the client sends Commits, not Rounds
    watch: int = 0           # stream: send the draft's next `watch` choices with each token (StreamRow.alts)
    branches: bool = False   # stream: send the server's verdict-cache branches ahead, as they are drafted
                             # (StreamRow.fork/corr), so that a foreseen rejection's drafts are at the client already


class Row(msgspec.Struct, array_like=True):
    """One sequence's round: the client believes the draft holds `have` tokens of it; of the last proposal it
    accepted `accepted`, then its target chose `tokens`; draft k more."""
    seq: ReqId
    gen: GenNo
    have: int
    accepted: int
    tokens: list[int]
    k: int


class Rounds(msgspec.Struct, tag="rounds"):
    """Draft server: the rounds of one client's sequences (a target's batch), answered by Drafts."""
    rows: list[Row]


class RowDraft(msgspec.Struct, array_like=True):
    seq: ReqId
    gen: GenNo
    tokens: list[int]
    q_idx: list[list[int]] | None = None
    q_val: list[list[float]] | None = None
    error: str = ""          # a row refused: desync (open the sequence again) | limit | bad-message | internal |
                             # reclaimed (idle while another client waited for a row: open it again to resume)
    message: str = ""


class CommitRow(msgspec.Struct, array_like=True):
    """A stream's position settled by the client's target (pos 0: its first token after the prompt); the rules
    are runtime.pipeline's (runtime.streamdraft.StreamDrafter.commit)."""
    seq: ReqId
    gen: GenNo
    pos: int
    token: int


class Commits(msgspec.Struct, tag="commits"):
    """Draft server, pipelined: one client's commits (no reply; drafts stream back in Streamed)."""
    rows: list[CommitRow]


class StreamRow(msgspec.Struct, array_like=True):
    seq: ReqId
    gen: GenNo
    epoch: int
    pos: int
    token: int
    q_idx: list[int] | None = None
    q_val: list[float] | None = None
    since: int = -1          # the first row after the server read a commit: that commit's position (else -1)
    read_at: float = 0.0     # ... and when the server read it (its wall clock, time.time())
    alts: list[int] | None = None   # the draft's next choices at pos (Open.watch)
    fork: int = -1           # a verdict-cache branch's token (Open.branches): valid if the target's token at `fork`
    corr: int = -1           # is `corr` (runtime.pipeline.StreamView's rules); -1: the stream's own draft


class Streamed(msgspec.Struct, tag="streamed"):
    """Draft server -> one client: the tokens its streams drafted in one batched step."""
    rows: list[StreamRow]
    batch: int = 0           # stream rows in the step (all clients')
    draft_ms: float = 0.0
    stepped_at: float = 0.0  # the step's tokens on the server's host (its wall clock, time.time())
    streams: int = 0         # streams the server holds (all clients'), at the step
    branch_rows: int = 0     # verdict cache: branch rows in the step (beside the `batch` stream rows)
    missed: list[str] = []   # verdict cache: streams whose restart (a Commit just read) found no branch; a foreseen
                             # one is answered at once with its branch's drafts (rows, since = the commit's pos)


class Drafts(msgspec.Struct, tag="drafts"):
    """Draft server -> one client: its rows drafted in one batched step (or refused), with the step's costs
    on the server's clock: draft compute (device), queueing (arrival to the step's start), host work."""
    rows: list[RowDraft]
    batch: int = 0           # sequences in the step (all clients')
    draft_ms: float = 0.0
    queued_ms: float = 0.0
    held_ms: float = 0.0     # arrival of the Rounds to this send
    host_ms: float = 0.0     # the step's host work: held - queued - draft

"""What one request may ask of a draft server, by its own fields (wire.server_config's ServerLimits): the
context, a stream's window and watch, a sampled draft's q_top; a round's k, new tokens and context. Each refusal
is (code, field, message), the message naming the value and the fix; None when the request is within bounds.
What depends on the server's state (rows free, fair shares, generations) is the server's own check."""
from __future__ import annotations

from ..runtime.verify import Sampling
from . import protocol
from .server_config import ServerLimits

WATCH_MOST = 8           # a stream's Open.watch: the draft's next choices sent with each token, at most


def open_bounds(msg: protocol.Open, lim: ServerLimits, vocab: int) -> tuple | None:
    """An Open's own fields against the limits."""
    n = len(msg.prompt_ids)
    why = protocol.check_open(msg, vocab)
    if why:
        return "bad-message", why[0], why[1]
    if n + 1 > lim.context - 1:
        return "limit", "context", (f"a context of {n} tokens: this server drafts within {lim.context} tokens a "
                                    f"sequence; open a shorter context")
    if msg.stream and not 0 <= msg.watch <= WATCH_MOST:
        return "bad-message", "watch", f"watch {msg.watch}: send 0 to {WATCH_MOST} next choices a token"
    if msg.stream and n + msg.window + 1 > lim.context - 1:
        return "limit", "window", (f"a stream of {n} tokens drafting {msg.window} ahead would pass this server's "
                                   f"{lim.context} tokens a sequence: open a shorter context or a smaller window")
    s = Sampling(*protocol.sampling_args(msg))
    most = lim.q_top_most(vocab)
    if not s.greedy and s.draft_sampled and (msg.q_top or vocab) > most:
        return "limit", "q_top", (f"q_top {msg.q_top or 'whole vocabulary'} ({msg.q_top or vocab} "
                                  f"pairs a token): a sampled draft's reply of {lim.sequences_per_client} rows x "
                                  f"k {lim.k} must fit {lim.reply_bytes} bytes, so use q_top 1 to {most}")
    return None


def row_bounds(row: protocol.Row, lim: ServerLimits, vocab: int) -> tuple | None:
    """A round's k, new tokens and the context it would reach."""
    if not 1 <= row.k <= lim.k:
        return "limit", "k", f"k={row.k}: draft 1 to {lim.k} tokens a round"
    if not 1 <= len(row.tokens) <= lim.tokens_per_row:
        return "limit", "tokens", (f"{len(row.tokens)} new tokens in a row: send 1 to {lim.tokens_per_row} (a longer "
                                   f"context is a new Open)")
    bad = next((t for t in row.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        return "bad-message", "tokens", f"token id {bad} outside the vocabulary [0, {vocab})"
    if row.have + row.accepted + len(row.tokens) + row.k > lim.context - 1:
        return "limit", "context", (f"sequence {row.seq!r} would reach {row.have + row.accepted + len(row.tokens)} "
                                    f"tokens plus {row.k} drafts, past this server's {lim.context}: end it")
    return None

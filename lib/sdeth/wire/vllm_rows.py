"""vLLM's rows matched to draft-server tracks (no network): what the remote draft proposer (wire.vllm_proposer)
sends each step.

Terms. A *track* is one sequence on the draft server as this proposer knows it: the context the server holds
(`context`) and the server's last proposal for it (`prev`). Rows are matched to tracks by content: a track
continues row i when its context is a prefix of the row's context; the rest of the row's context is the round's
news, of which the leading tokens equal to `prev` are `accepted` and the others are the target's. A row no track
fits (a new request, one resumed after preemption, a context that went back) opens a track with its whole
context; a track no row fits for IDLE_STEPS steps is ended. Two rows of one content may share drafts (they are
the same).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

IDLE_STEPS = 4           # steps a track may go unmatched before it is ended
MAX_ROW_TOKENS = 16      # new tokens one round may carry (the server's default limit); more: a new track
MAX_TRACKS = 64          # sequences held at once (the server's default per client)
MAX_ROWS = 128           # rows of one Rounds (the server's default limit); more go in several


class ProposerError(RuntimeError):
    """The proposer cannot run: what is missing and what to do."""


# ------------------------------------------------------------------ the server's limits

@dataclass(frozen=True)
class Bounds:
    """What this proposer sends, within the server's limits: draft tokens per round (k), the longest context a
    row is drafted for (its drafts included), rows per Rounds, new tokens per row, sequences held at once."""
    k: int
    context: int
    rows_per_message: int = MAX_ROWS
    tokens_per_row: int = MAX_ROW_TOKENS
    sequences: int = MAX_TRACKS

    @classmethod
    def of(cls, k: int, max_len: int, limits: dict | None) -> "Bounds":
        """vLLM's k and max_model_len, within the server's limits (a Welcome's `limits`; a key absent or 0: the
        default above; None: all defaults). ProposerError naming a limit that is not a positive integer."""
        lim = {}
        for key, v in (limits or {}).items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ProposerError(f"the draft server's limit {key}={v!r} is not a whole number >= 0: the server "
                                    f"and this proposer are of different sdeth versions; install one version on both")
            if v:
                lim[key] = v
        seqs = [lim[n] for n in ("sequences", "sequences_per_client") if n in lim]
        return cls(min(k, lim.get("k", k)), min(max_len, lim.get("context", max_len)),
                   lim.get("rows_per_message", MAX_ROWS), lim.get("tokens_per_row", MAX_ROW_TOKENS),
                   min(seqs, default=MAX_TRACKS))


@dataclass(eq=False)
class Track:
    seq: str
    context: np.ndarray                  # [n] the tokens the draft server holds for it (settled)
    prev: list[int] = field(default_factory=list)   # the server's last proposal for it (past the context)
    sent_at: float = 0.0                 # a round awaits its Drafts since then (0: none)
    idle: int = 0                        # steps since a row last fitted it
    held_until: float = 0.0              # refused by the server: no rounds before then, a new track after
    offered: int = 0                     # of prev, the drafts vLLM was offered (0: none, or late)


class Round(NamedTuple):
    row: int                             # vLLM's row index this step
    track: Track
    have: int                            # the context length the server holds for the track
    accepted: int                        # of its last proposal
    tokens: list[int]                    # the target's, after them
    k: int


@dataclass
class Plan:
    """One step's messages: tracks to open (with their context), rounds, tracks to end."""
    opens: list = field(default_factory=list)      # (Track, context [n])
    rounds: list[Round] = field(default_factory=list)
    ends: list[Track] = field(default_factory=list)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RowTracker:
    """vLLM's rows matched to draft-server tracks by content (this module's docstring has the rules)."""

    def __init__(self, idle_steps: int = IDLE_STEPS, prefix: str = "", tokens_per_row: int = MAX_ROW_TOKENS,
                 max_tracks: int = MAX_TRACKS):
        self.idle_steps = idle_steps
        self.tokens_per_row, self.max_tracks = tokens_per_row, max_tracks
        self.prefix = prefix or f"v{os.getpid():x}-"
        self.tracks: dict[str, Track] = {}       # by seq id
        self.by_row: dict[int, Track] = {}       # the track each row fitted last step
        self.count = 0

    def plan(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, k: int, max_len: int,
             now: float) -> Plan:
        """This step's Opens, rounds and Ends. A track with a round awaiting its Drafts, or held after a
        refusal, gets no round; a row with no new tokens, or still in prefill, neither; a row with no room for a
        draft (max_len) gets no track, nor does a new row while max_tracks are held (tracks no row fitted this step
        are then ended at once, making room for the next)."""
        plan, claimed, by_row, crowded = Plan(), set(), {}, False
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if n >= max_len:
                continue
            ctx = token_ids_cpu[i, :n]
            t = self._match(i, ctx, n - len(sampled), claimed)
            if t is not None and t.held_until and now >= t.held_until:     # refused before: start over
                plan.ends.append(self._drop(t))
                t = None
            if t is None and len(self.tracks) >= self.max_tracks:
                crowded = True
                continue
            if t is None:
                t = self._open(plan, ctx if not len(sampled) else ctx[:-1])
            if len(sampled) and not t.sent_at and not t.held_until:
                t = self._round(plan, i, t, ctx, min(k, max_len - n))
            claimed.add(t)
            by_row[i] = t
            t.idle = 0
        self.by_row = by_row
        for t in [t for t in self.tracks.values() if t not in claimed]:
            t.idle += 1
            if t.idle > self.idle_steps or crowded:
                plan.ends.append(self._drop(t))
        return plan

    def _match(self, row: int, ctx: np.ndarray, before: int, claimed: set) -> Track | None:
        """The unclaimed track whose context is the longest prefix of ctx; the row's own track of the last step
        at once when it holds at least the context before this step's tokens (`before`)."""
        hint = self.by_row.get(row)
        if hint is not None and hint.seq in self.tracks and hint not in claimed and \
                len(hint.context) >= before and fits(hint, ctx):
            return hint
        best = None
        for t in self.tracks.values():
            if t not in claimed and (best is None or len(t.context) > len(best.context)) and fits(t, ctx):
                best = t
        return best

    def _open(self, plan: Plan, context: np.ndarray) -> Track:
        self.count += 1
        t = Track(f"{self.prefix}{self.count}", context.copy())
        self.tracks[t.seq] = t
        plan.opens.append((t, t.context))
        return t

    def _round(self, plan: Plan, row: int, t: Track, ctx: np.ndarray, k: int) -> Track:
        """Row `row`'s round on track t: the news past t's context, of which the leading tokens equal to t's last
        proposal are accepted (the last token is always the target's); a new track when the news is too long.
        The track the row continues."""
        news = ctx[len(t.context):]
        if not len(news) or k < 1:
            return t
        accepted = min(common_prefix(news.tolist(), t.prev), len(news) - 1)
        tokens = news[accepted:].tolist()
        if len(tokens) > self.tokens_per_row:
            plan.ends.append(self._drop(t))
            t = self._open(plan, ctx[:-1])
            accepted, tokens = 0, [int(ctx[-1])]
        plan.rounds.append(Round(row, t, len(t.context), accepted, tokens, k))
        t.context, t.prev = ctx.copy(), []
        return t

    def _drop(self, t: Track) -> Track:
        self.tracks.pop(t.seq, None)
        return t

    def reset(self) -> None:
        self.tracks.clear()
        self.by_row.clear()


def fits(t: Track, ctx: np.ndarray) -> bool:
    """Whether t's context is a prefix of ctx (last token first: most tracks differ there)."""
    n = len(t.context)
    return n <= len(ctx) and (n == 0 or (ctx[n - 1] == t.context[-1] and np.array_equal(ctx[:n], t.context)))

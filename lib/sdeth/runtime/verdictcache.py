"""Verdict speculation for the streams of a batched draft (the draft server's verdict cache).

While a stream's drafted positions await the target's verdict, the draft prepares the next speculation for the
likely verdicts: a rejection at position j with the target's token there being one of the draft's next choices
at j (its 2nd, 3rd, ... token). Each (j, token) is a *branch*: a free cache row that takes the stream's context
before j (a slice copy per layer), feeds the token and drafts its continuation a token a step, in the same
batched steps as the live streams (after them: live streams are always stepped first, and a branch takes only a
row no sequence holds; a new sequence evicts branches). A row a live sequence gave back is held for its client's
next Open for HOLD_S (a client ends a stream and opens the next in two messages: a full server that turns its
streams over stays full, and plants no branch between them).

    vc = VerdictCache(drafter, VerdictSpec.parse("4x4x8"))   # drafter.cache = vc; drafter.alts >= fanout
    extra = vc.rows(room)                 # branches to step beside the live streams (stream_step)
    vc.took(drafted)                      # their tokens, after the step
    vc.plan(streams)                      # new branches on free rows, after the step
    b = vc.on_commit(seq, pos, token)     # before BatchDrafter.commit: a hit adopts the branch (no commit then)

Where the branches go (costmodel.fanouts): a branch at offset i past the last settled position on the draft's
rank-r choice there is worth alpha^i * P(a rejection's correction is the draft's rank-r choice), alpha the
acceptance observed for the stream (as Saguaro's geometric rule, Kumar et al. 2026) and the ranks' shares those
the server has seen at its rejections (the corrected token's place among the draft's next choices, over every
stream; a prior halving by rank before any); a stream holds the `budget` branches of most worth, at most `fanout`
at one position. A commit that settles a position as drafted drops the
branches at it and before; a rejection that finds its (j, token) adopts that branch (the stream's row becomes
the branch's, its drafted continuation goes out at once: a *hit*), and drops the others either way.

Lossless: the target verifies the adopted continuation as any other drafts. A branch's tokens are drawn as the
stream's would be (greedy: the argmax; sampled: from q given the branch's context, by a generator of the
branch's own), and its q goes with each token.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from ..costmodel import fanouts
from .batchdraft import BatchDrafter, RowDrafted, Sequence
from .specs import parse_branch_spec

VERDICT_DEFAULT = "4x4x8"
ALPHA_PRIOR, PRIOR_WEIGHT = 0.7, 4.0   # a stream's acceptance before it has verdicts (the prior's pseudo-counts)
RANK_PRIOR = 4.0       # rejections' pseudo-counts behind the correction ranks before any is seen (halving by rank)
HOLD_S = 2.0           # a row a live sequence gave back is held this long for its client's next Open, not branched on


@dataclass(frozen=True)
class VerdictSpec:
    """A verdict cache: `fanout` branches at the first unverified position (0: off), `depth` tokens drafted past
    each fork, at most `budget` branches a stream. Written "off", "on" (VERDICT_DEFAULT) or FANOUT[xDEPTH[xBUDGET]]."""
    fanout: int = 0
    depth: int = 4
    budget: int = 8

    @classmethod
    def parse(cls, spec: str) -> "VerdictSpec":
        parts = parse_branch_spec(spec, "verdict cache", VERDICT_DEFAULT, "BUDGET", lambda f: max(f * 2, 1))
        return cls(*parts) if parts else cls()

    @property
    def on(self) -> bool:
        return self.fanout > 0

    def __str__(self) -> str:
        return f"{self.fanout}x{self.depth}x{self.budget}" if self.on else "off"


@dataclass(eq=False)
class VerdictBranch:
    row: Sequence                  # its cache row and chain (chain[pos] = token)
    pos: int
    token: int
    offset: int                    # pos past its stream's settled positions when it was made
    rank: int = 1                  # the token's rank among the draft's choices at pos (1: its second choice)
    out: list = field(default_factory=list)     # (position, RowDrafted) of its continuation


class VerdictCache:
    """The branches of every stream of one BatchDrafter, and what they foresaw (stats)."""

    def __init__(self, drafter: BatchDrafter, spec: VerdictSpec):
        if not spec.on:
            raise ValueError("a verdict cache needs fanout >= 1 (VerdictSpec.parse('on'))")
        self.drafter, self.spec = drafter, spec
        drafter.cache, drafter.alts = self, max(drafter.alts, spec.fanout)
        self.held: dict[Sequence, dict[tuple[int, int], VerdictBranch]] = {}
        self.seen: dict[Sequence, list[float]] = {}       # stream -> [positions settled as drafted, rejections]
        self.given_back: collections.deque[float] = collections.deque()   # when live sequences gave rows back, not
                                                                          # yet taken by an Open (oldest first)
        self.stats = {"branches": 0, "hits": 0, "misses": 0, "uncovered": 0, "foreseen_tokens": 0,
                      "rows_stepped": 0, "dropped": 0, "evicted": 0, "hits_at": {}, "rejections_at": {},
                      "hits_by_rank": {}}      # hits_at: by offset past the settled positions; by_rank: 1 = 2nd choice
        self.ranked = [0] * (drafter.alts + 1)            # rejections by the correction's rank (0: not among the alts)

    def shares(self) -> list[float]:
        """P(a rejection's correction is the draft's rank-r choice), r = 1..alts (index 0: outside them), from the
        rejections seen and RANK_PRIOR pseudo-counts halving by rank."""
        n = len(self.ranked) - 1
        prior = [0.0] + [0.5 ** r for r in range(1, n + 1)]
        prior[0] = max(1.0 - sum(prior), 0.0)
        total = sum(self.ranked) + RANK_PRIOR
        return [(c + RANK_PRIOR * q) / total for c, q in zip(self.ranked, prior)]

    def alpha(self, seq: Sequence) -> float:
        acc, rej = self.seen.get(seq, (0.0, 0.0))
        return (acc + ALPHA_PRIOR * PRIOR_WEIGHT) / (acc + rej + PRIOR_WEIGHT)

    def branches(self) -> list[VerdictBranch]:
        return [b for held in self.held.values() for b in held.values()]

    def rows(self, room: int) -> list[Sequence]:
        """Up to `room` branches that may draft their next token (fewer than depth drafted), the nearest forks
        first."""
        ready = [b for b in self.branches() if len(b.out) < min(self.spec.depth, b.row.window) and b.row.ready]
        return [b.row for b in sorted(ready, key=lambda b: b.offset)[:max(room, 0)]]

    def spare(self) -> int:
        """Free rows a branch may take: the drafter's free rows less those held for an Open (HOLD_S)."""
        now = time.monotonic()
        while self.given_back and now - self.given_back[0] >= HOLD_S:
            self.given_back.popleft()
        return max(len(self.drafter.free_rows) - len(self.given_back), 0)

    def opened(self) -> None:
        """A new sequence took a row: the oldest row held for an Open is no longer held."""
        if self.given_back:
            self.given_back.popleft()

    def took(self, drafted: dict) -> list[tuple[Sequence, VerdictBranch, int, RowDrafted]]:
        """A step's tokens ({id(row): RowDrafted}) for the branches that were in it; returns (stream, branch,
        position, RowDrafted) for each, the nearest forks first (what a stream's client gets ahead, Open.branches)."""
        out = []
        for seq, held in self.held.items():
            for b in held.values():
                d: RowDrafted | None = drafted.get(id(b.row))
                if d is not None:
                    b.out.append((len(b.row.chain) - 1, d))
                    self.stats["rows_stepped"] += 1
                    out.append((seq, b, len(b.row.chain) - 1, d))
        return sorted(out, key=lambda x: x[1].offset)

    def plan(self, streams: list[Sequence]) -> int:
        """New branches for the streams' unverified positions (costmodel.fanouts on each stream's own alpha and the
        ranks seen), within each one's budget and the spare rows (spare()); returns how many were made."""
        want, ranks, shares = [], {}, self.shares()
        for seq in streams:
            held = self.held.get(seq, {})
            span = [j for j in range(seq.acked, len(seq.chain)) if seq.base + j <= seq.fed and j in seq.alts]
            if not span or len(held) >= self.spec.budget:
                continue
            fs = fanouts(self.alpha(seq), self.spec.fanout, self.spec.budget, len(seq.chain) - seq.acked, shares)
            room = self.spec.budget - len(held)
            new = [(j - seq.acked, r, (seq, j, t)) for j in span for r, t in enumerate(seq.alts[j][:fs[j - seq.acked]])
                   if (j, t) not in held]
            ranks.update({w: r + 1 for _, r, w in new})
            want += new[:room]
        want = [w for *_, w in sorted(want, key=lambda w: w[:2])][:self.spare()]   # nearest first, all streams
        for (seq, j, t), row in zip(want, self.drafter.fork(want)):
            self.held.setdefault(seq, {})[(j, t)] = VerdictBranch(row, j, t, j - seq.acked, ranks.get((seq, j, t), 1))
        self.stats["branches"] += len(want)
        return len(want)

    def on_commit(self, seq: Sequence, pos: int, token: int) -> VerdictBranch | None:
        """The client's token at pos, before BatchDrafter.commit: a rejection whose (pos, token) was foreseen
        adopts that branch and returns it (the caller skips commit, the branch's drafts go out at once); any
        rejection drops the stream's other branches; a position settled as drafted drops the branches at it
        and before. None: commit as usual."""
        held = self.held.get(seq, {})
        seen = self.seen.setdefault(seq, [0.0, 0.0])
        seen[0] += max(min(pos, len(seq.chain)) - seq.acked, 0)
        if not (pos < len(seq.chain) and seq.chain[pos] != token):
            for key in [key for key in held if key[0] <= pos]:
                self._release(held.pop(key))
            return None
        seen[1] += 1
        alts = seq.alts.get(pos, [])
        self.ranked[alts.index(token) + 1 if token in alts[:len(self.ranked) - 1] else 0] += 1
        at = str(pos - seq.acked)
        self.stats["rejections_at"][at] = self.stats["rejections_at"].get(at, 0) + 1
        b = held.pop((pos, token), None)
        covered = any(key[0] == pos for key in held)
        self.drop(seq)
        if b is None:
            self.stats["misses"] += 1
            self.stats["uncovered"] += not covered
            return None
        self.drafter.adopt(seq, b.row)
        self.stats["hits"] += 1
        self.stats["foreseen_tokens"] += len(b.out)
        self.stats["hits_at"][at] = self.stats["hits_at"].get(at, 0) + 1
        self.stats["hits_by_rank"][str(b.rank)] = self.stats["hits_by_rank"].get(str(b.rank), 0) + 1
        return b

    def _release(self, b: VerdictBranch) -> None:
        self.drafter.release(b.row)
        self.stats["dropped"] += 1

    def drop(self, seq: Sequence) -> None:
        """Every branch of seq (its stream restarted, ended or was freed: then its row is held for an Open)."""
        for b in self.held.pop(seq, {}).values():
            self._release(b)
        if not self.drafter.holds(seq):
            self.seen.pop(seq, None)
            self.given_back.append(time.monotonic())

    def discard(self, rows: list[Sequence]) -> int:
        """The branches on these rows (a step of theirs failed) released; their streams keep their rows."""
        ids, n = {id(r) for r in rows}, 0
        for held in self.held.values():
            for key in [key for key, b in held.items() if id(b.row) in ids]:
                self._release(held.pop(key))
                n += 1
        return n

    def evict(self, n: int) -> int:
        """Free n rows for live sequences: the farthest forks first. Returns the rows freed."""
        victims = sorted(((b.offset, id(b), seq, key) for seq, held in self.held.items() for key, b in held.items()),
                         key=lambda v: -v[0])[:n]
        for _, _, seq, key in victims:
            self.drafter.release(self.held[seq].pop(key).row)
            self.stats["evicted"] += 1
        return len(victims)

    def summary(self) -> dict:
        """The stats with the hit rate (hits over rejections), the rows branches hold now and the correction ranks'
        shares the branches are placed by (shares())."""
        s = self.stats
        rej = s["hits"] + s["misses"]
        return {**s, "spec": str(self.spec), "hit_rate": s["hits"] / rej if rej else None,
                "held_rows": len(self.branches()), "rank_shares": [round(x, 4) for x in self.shares()]}

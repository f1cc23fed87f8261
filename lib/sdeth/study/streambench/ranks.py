"""Acceptance that carries ranks, for emulated targets against a draft with random weights: at each position the
target's token is the draft's rank-r choice (0: the draft's own token, accepted; r >= 1: its (r+1)-th choice, a
rejection whose correction a verdict cache may have foreseen; TOP: outside the draft's first TOP choices).
The draft server sends its next choices with each token (Open.watch), so the emulated target names the token.

- "coins": rank 0 with probability alpha, else TOP (no token information: the bench's synthetic coins);
- "trace": the ranks of reports/traces/embedded_greedy.json (runtime.synthetic.AcceptanceTrace, the target token's
  rank in the draft's order at each position of the embedded pair's greedy runs), alpha scaled to the point's;
- "synthetic:H": rank 0 with probability alpha; a rejection's correction is the draft's 2nd choice with
  probability H, else outside its first TOP choices (a labelled model of a stronger pair).
"""
from __future__ import annotations

import random

from ..bench.targets import TRACE

TOP = 8


class Ranks:
    def __init__(self, spec: str, alpha: float, seed: int):
        self.spec, self.alpha, self.rng = spec or "coins", alpha, random.Random(seed)
        self.trace, self.hit = None, 0.0
        if self.spec == "trace" or self.spec.startswith("trace:"):
            from ...paths import REPO
            from ...runtime.synthetic import AcceptanceTrace
            path = self.spec.partition(":")[2] or str(REPO / TRACE)
            self.trace = AcceptanceTrace.load(path, alpha=alpha)
        elif self.spec.startswith("synthetic:"):
            self.hit = float(self.spec.partition(":")[2])
            if not 0 <= self.hit <= 1:
                raise ValueError(f"ranks {spec!r}: synthetic:H with H a probability, e.g. synthetic:0.9")
        elif self.spec != "coins":
            raise ValueError(f"ranks {spec!r}: use coins, trace[:PATH] or synthetic:H")

    @property
    def label(self) -> str:
        if self.trace is not None:
            return (f"trace-driven ranks ({self.trace.source}, alpha scaled to {self.alpha}: the target's token is "
                    f"the draft's rank-r choice)")
        if self.spec == "coins":
            return f"synthetic coins (alpha {self.alpha}; no rank information: a rejection's token is none of the draft's)"
        return (f"synthetic ranks (alpha {self.alpha}; a rejection's correction is the draft's 2nd choice with "
                f"probability {self.hit}, else outside its first {TOP})")

    def shares(self) -> list[float]:
        """P(rank r | a rejection) for r = 0..TOP, TOP: outside the draft's first TOP choices (the first TOP are
        costmodel.verdict_terms' rank_shares)."""
        out = [0.0] * (TOP + 1)
        if self.trace is not None:
            rej = [min(r, TOP) for s in self.trace.seqs for r in s if r]
            for r in rej:
                out[r] += 1 / len(rej)
        else:
            out[1], out[TOP] = self.hit, 1 - self.hit
        return out

    def rank(self, key: int, pos: int) -> int:
        """The rank of the target's token at a stream's position pos (key: the stream's)."""
        if self.trace is not None:
            return min(self.trace.rank(key, pos), TOP)
        if self.rng.random() < self.alpha:
            return 0
        return 1 if self.hit and self.rng.random() < self.hit else TOP


def token_of(rank: int, drafted: int | None, alts: list[int] | None, vocab: int) -> int:
    """The target's token of that rank: the draft's own (rank 0), its rank-th next choice when the draft sent it,
    else a token none of the draft's first choices (the draft's token not known: a token of its own)."""
    if drafted is None:
        return -1
    if rank == 0:
        return drafted
    alts = alts or []
    if rank - 1 < len(alts) and rank < TOP:
        return alts[rank - 1]
    taken = {drafted, *alts}
    t = (drafted + 1) % vocab
    while t in taken:
        t = (t + 1) % vocab
    return t

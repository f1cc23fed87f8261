"""The event model's draft side (simulate_pipelined plays it): its steps one period apart, and what a Commit does
to its run (taken as given, a restart, or a cache's branch)."""
from __future__ import annotations

from typing import NamedTuple

from .cacheterms import CacheTerms


class DraftStep(NamedTuple):
    """One token of the modelled draft's current run."""
    pos: int            # the position it drafts
    end: float          # when its step ends (seconds, on the target's clock)
    match: bool         # it equals the target's choice (probability alpha)


class _ModelDraft:
    """The draft side of simulate_pipelined: it steps every `period` seconds from the start of its current
    run; a Commit reaches it `one_way` seconds after the target sends it."""

    def __init__(self, alpha: float, period: float, one_way: float, cache: CacheTerms, rng,
                 late: tuple[float, float] | None = None) -> None:
        self.alpha, self.period, self.one_way, self.cache, self.rng = alpha, period, one_way, cache, rng
        self.late = late                # (probability, seconds): a restart that late (a server busy elsewhere)
        self.run: list[DraftStep] = []
        self.next_pos, self.last_end = 1, one_way   # the first Commit (position 0) reaches the draft at one_way
        self.acked = 1                  # positions < acked were committed when the last Commit arrived
        self.restarts = self.hits = 0
        self.t_restart = 0.0            # when the target sent the Commit that last restarted the run
        self.t_first = 2 * one_way + period   # when the current run's first token reaches the target

    def produce_until(self, when: float, upto_pos: int = -1) -> None:
        """Every step that ends by `when`, and at least up to position upto_pos."""
        while self.last_end <= when or self.next_pos <= upto_pos:
            self.last_end += self.period
            self.run.append(DraftStep(self.next_pos, self.last_end, self.rng.random() < self.alpha))
            self.next_pos += 1

    def commit(self, p: int, sent: float) -> None:
        """The target committed positions up to p (its own token at p) and sent the Commit at `sent`."""
        d, arrive = self.period, sent + self.one_way
        self.produce_until(arrive - d)                 # every step that ended before the Commit arrives
        mine = next((x for x in self.run if x.pos == p), None)
        if mine is None and self.next_pos <= p:
            self.next_pos = p + 1                       # not drafted yet: take the target's token
            self.last_end = max(self.last_end, arrive)
        elif mine is not None and not mine.match:
            self.restarts += 1
            self.run.clear()                            # mismatch: a new run from p + 1, behind the step in flight
            busy = self.last_end + d if self.last_end > arrive - d else self.last_end
            c = self.cache
            if c.hit and p < self.acked + c.forks and self.rng.random() < c.hit:
                self.hits += 1                          # the branch at p: drafted from its fork's step on
                self.run.extend(DraftStep(p + j, mine.end + j * d, self.rng.random() < self.alpha)
                                for j in range(1, c.depth + 1))
                self.next_pos, self.last_end = p + c.depth + 1, max(mine.end + c.depth * d, busy, arrive)
                self.t_first = mine.end + d + self.one_way
            else:
                self.next_pos, self.last_end = p + 1, max(busy, arrive)
                if self.late and self.rng.random() < self.late[0]:
                    self.last_end += self.late[1]
                self.t_restart, self.t_first = sent, self.last_end + d + self.one_way

    def arrived(self, out: int, t: float) -> tuple[list[DraftStep], int, bool]:
        """The run from position `out` on; how many of its first tokens are at the target by t, in order;
        whether none of the run has arrived yet (a fresh run)."""
        run = [x for x in self.run if x.pos >= out]
        avail = 0
        while avail < len(run) and run[avail].pos == out + avail and run[avail].end + self.one_way <= t:
            avail += 1
        return run, avail, not any(x.end + self.one_way <= t for x in self.run)

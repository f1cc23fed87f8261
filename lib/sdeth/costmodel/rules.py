"""The step policy's wait rules (WaitRule) and their long-run tokens/s: renewal-reward over a restart cycle, every
rule scored (best_rule, or a piece at a time for a caller between its steps: best_rule_steps)."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from .rounds import expected_tokens


CYCLE_ROUNDS = 160     # rounds of one restart cycle the renewal evaluation follows (the rest: survival < 1e-5)
PHASES = (0.25, 0.75)  # where in its step the draft is when a Commit restarts it (restart latency: link + (1+u) steps)
OVERDUE = 3.0          # a restart's drafts this many times later than due: the draft is stalled; step alone
CORNER_MARGIN = 0.01   # a rule between the corners (sync, offered) is played only where the model puts it this much
                       # above the better corner: the model's own error is about that (against the event model)
RULE_EVERY = 32        # the most steps between two choices of the rule (the estimates move; a choice costs ~5 ms
                       # uncached); StepPolicy chooses sooner where alpha or the widths measured have moved


class WaitRule(NamedTuple):
    """A target step's rule: verify min(cap, max(on offer, w)) drafts, waiting for them; w is `empty` when
    nothing is on offer and `some` otherwise. offered is (0, 0, k), sync (k, k, k)."""
    empty: int
    some: int
    cap: int

    def m(self, available: int, m_max: int) -> int:
        return min(self.cap, m_max, max(available, self.some if available else self.empty))


def link_of_restart(restart_s: float, period_s: float) -> float:
    """The link (both ways) a measured restart implies (a Commit sent to the first draft after it at the target):
    that draft comes link + (1 + u) periods after the Commit, u uniform over a period (_cycle), so 1.5 periods on
    average; never below 0. The step policy's targets and the event model fed a point's components read it alike."""
    return max(restart_s - 1.5 * period_s, 0.0)


def _cycle(alpha: float, tv: tuple, d: float, link: float, u: float, rule: WaitRule) -> tuple[float, float]:
    """(E[tokens], E[seconds]) of one restart cycle under `rule` (renewal-reward: every cycle starts alike,
    at the Commit that restarts the draft). The draft's new run arrives one token a period from link + (1+u)
    periods on; a round of m drafts waits for the m-th, verifies (tv[m]: that forward plus the round's overhead),
    and the cycle goes on while every draft is accepted and the target's own token is the draft's next one
    (probability alpha once drafted; a position the draft had not reached is taken as given and the run goes on
    one step behind). Deterministic along the way: the only branch is 'accepted, go on' or 'restart'. (WaitRule.m,
    alpha ** m and expected_tokens are taken out of the loop: a vLLM proposer scores rules between its steps.)"""
    t, o, base, alive, tokens, secs = 0.0, 0, link + (1 + u) * d, 1.0, 0.0, 0.0
    k = len(tv) - 1
    cap, empty, some = min(rule.cap, k), rule.empty, rule.some
    gain = [expected_tokens(alpha, m) for m in range(k + 1)]
    p_all = [alpha ** m for m in range(k + 1)]
    for _ in range(CYCLE_ROUNDS):
        avail = max(int((t - base) // d) + 1 - o, 0) if t >= base else 0
        m = min(cap, max(avail, some if avail else empty))
        end = max(t, base + (o + m - 1) * d) + tv[m] if m > avail else t + tv[m]
        tokens += alive * gain[m]
        secs += alive * (end - t)
        if base + (o + m) * d <= end + link:      # the draft's token at the target's own position: compared
            alive *= p_all[m] * alpha
        else:                                     # not drafted yet: taken as given, the run one step behind
            alive *= p_all[m]
            base = max(base - d, end + link + d - (o + m + 1) * d)
        o, t = o + m + 1, end
        if alive < 1e-5:
            break
    return tokens, secs


def rule_rate(alpha: float, tv: tuple, d: float, link: float, rule: WaitRule) -> float:
    """Long-run tokens/s of a rule: E[tokens per cycle] / E[seconds per cycle], over the restart's phases."""
    return _rate([_cycle(min(alpha, 0.999), tv, d, link, u, rule) for u in PHASES])


def _rate(runs: list[tuple[float, float]]) -> float:
    return sum(r[0] for r in runs) / sum(r[1] for r in runs)


@lru_cache(maxsize=4096)
def best_rule(alpha: float, tv: tuple, d: float, link: float) -> tuple[WaitRule, float]:
    """The rule with the highest long-run tokens/s for these costs (tv[m]: a round of m drafts, m = 0..k), and
    that rate. Every rule with w <= cap <= k is scored (about 5 ms for k = 8, 0.3 to 10 ms for k = 3); one between
    the corners only where it beats the better corner by CORNER_MARGIN. Cached per (rounded) cost tuple."""
    for out in best_rule_steps(alpha, tv, d, link):
        pass
    return out


def best_rule_steps(alpha: float, tv: tuple, d: float, link: float):
    """best_rule a piece at a time, for a caller that cannot spend the whole scoring at once: a generator that
    yields None after each restart cycle it plays (one phase of one rule: 62 pieces for k = 3) and, last,
    best_rule's (rule, rate)."""
    k, a = len(tv) - 1, min(alpha, 0.999)
    rules = [WaitRule(0, 0, k), WaitRule(k, k, k)]
    rules += [WaitRule(e, s, cap) for cap in range(1, k + 1) for e in range(cap + 1) for s in range(cap + 1)]
    rates = []
    for r in rules:
        runs = []
        for u in PHASES:
            runs.append(_cycle(a, tv, d, link, u, r))
            yield None
        rates.append((r, _rate(runs)))
    corner = max(rates[:2], key=lambda x: x[1])
    best = max(rates[2:], key=lambda x: x[1])
    yield best if best[1] > corner[1] * (1 + CORNER_MARGIN) else corner


def _q(x: float, rel: float = 0.02) -> float:
    """x rounded to about rel (so that costs measured a hair apart share a cached table)."""
    if x <= 0:
        return 0.0
    return round(math.exp(round(math.log(x) / rel) * rel), 9)

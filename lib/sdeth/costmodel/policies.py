"""The policies that choose each round's drafts (adaptive k; the pipelined step's named settings, the step policy
among them); the event model that plays them is eventmodel's (simulate_pipelined), the step policy's rules are
rules'."""
from __future__ import annotations

import math

import numpy as np

from .rounds import Costs, best_k, expected_tokens
from .rules import OVERDUE, RULE_EVERY, WaitRule, _q, best_rule


# ---------------------------------------------------------------------------------------------
# Adaptive k: running estimates of alpha and the component costs, and the choice made from them.

class AdaptivePolicy:
    """Running estimates, updated every round, that choose k (sync) or how many streamed draft
    tokens to wait for (pipelined). alpha is the per-token acceptance: accepted / (accepted +
    rejections), which is its maximum-likelihood estimate under the i.i.d. model (a round's tokens
    after the first rejection are never tested), with a weak prior and exponential forgetting.
    Pipelined, it also keeps the draft's wall step (host included) and the link's own round trip."""

    def __init__(self, alpha0: float = 0.5, prior: float = 4.0, decay: float = 0.98):
        self.acc, self.rej, self.decay = alpha0 * prior, (1 - alpha0) * prior, decay
        self.draft_step: float | None = None
        self.rtt: float | None = None
        self.verify_s: dict[int, float] = {}
        self._seen: set[int] = set()
        self.overhead = 0.0
        self.period: float | None = None          # the draft's wall step (host included)
        self.link: float | None = None            # the link's own round trip (two transits)

    @staticmethod
    def _ema(old: float | None, new: float, w: float = 0.2) -> float:
        return new if old is None else (1 - w) * old + w * new

    def observe_round(self, n_accepted: int, n_drafted: int) -> None:
        self.acc = self.acc * self.decay + n_accepted
        self.rej = self.rej * self.decay + (1 if n_accepted < n_drafted else 0)

    def observe_verify(self, width: int, seconds: float) -> None:
        """The first forward of a width is not counted: on a GPU it includes capturing its graph
        (and compiling), 10-100x a step, which would keep the policy away from that width."""
        if width not in self._seen:
            self._seen.add(width)
            return
        self.verify_s[width] = self._ema(self.verify_s.get(width), seconds)

    def observe_draft(self, seconds_per_token: float) -> None:
        self.draft_step = self._ema(self.draft_step, seconds_per_token)

    def observe_rtt(self, seconds: float) -> None:
        self.rtt = self._ema(self.rtt, max(seconds, 0.0))

    def observe_period(self, seconds: float) -> None:
        self.period = self._ema(self.period, seconds)

    def observe_link(self, seconds: float) -> None:
        self.link = self._ema(self.link, max(seconds, 0.0))

    @property
    def alpha(self) -> float:
        return self.acc / (self.acc + self.rej)

    def costs(self) -> Costs | None:
        """None until one verify and one draft step have been seen."""
        if not self.verify_s or self.draft_step is None:
            return None
        ws = sorted(self.verify_s)
        step = self.verify_s.get(1)
        if step is None:  # no single-token forward seen: extrapolate from the two smallest widths
            w0 = ws[0]
            slope = (self.verify_s[ws[1]] - self.verify_s[w0]) / (ws[1] - w0) if len(ws) > 1 else 0.0
            step = max(self.verify_s[w0] - slope * (w0 - 1), 1e-6)
        return Costs(step, self.draft_step, dict(self.verify_s), self.rtt or 0.0, self.overhead,
                     self.period or 0.0, self.link)

    def choose_k(self, k_max: int, k_default: int) -> int:
        """Sync rounds: the k with the best predicted tokens/s. Until two verify widths have been
        timed it tries k_default, then 1 (a second width, to see how verify cost grows)."""
        c = self.costs()
        if c is None or len(self.verify_s) < 2:
            return k_default if (k_default + 1) not in self.verify_s else (1 if k_default != 1 else 2)
        return best_k(self.alpha, c, k_max)[0]

    def choose_m(self, available: int, m_max: int, fresh: bool = False, since_s: float = 0.0) -> int:
        """Pipelined rounds: how many streamed drafts (0..m_max) to verify now, given `available`
        already here. m = 0 is a plain target step. Maximises this round's E[tokens] / (wait +
        verify(m+1)); the draft keeps drafting meanwhile, so waiting costs only target time. The
        wait for drafts not yet here: (m - available) draft steps, or, right after a correction or a
        request's start (fresh: nothing of the new run has arrived, since_s ago), a round trip plus m
        steps. Once that is overdue (a draft still prefilling a long prompt on a slow device, a stall)
        nothing says the tokens are about to arrive: the wait is taken to be as long again from now, so
        a slow draft's start is covered by plain steps rather than waited out."""
        c = self.costs()
        if c is None:
            return min(max(available, 1), m_max)
        a = self.alpha

        def wait(m: int) -> float:
            if m <= available:
                return 0.0
            if fresh:
                due = c.rtt + m * c.draft_step
                return due - since_s if since_s < due else due
            return (m - available) * c.draft_step

        return max(range(0, m_max + 1),
                   key=lambda m: expected_tokens(a, m) / (wait(m) + c.verify(m + 1) + c.overhead))


class FixedPolicy(AdaptivePolicy):
    """The fixed pipelined policy (adaptive off): verify every streamed draft on offer, up to k,
    waiting for at least one; never a plain target step while the draft answers."""

    def choose_m(self, available: int, m_max: int, fresh: bool = False, since_s: float = 0.0) -> int:
        return min(max(available, 1), m_max)


class OfferedPolicy(AdaptivePolicy):
    """Verify what is on offer, up to k, and never wait (0 on offer: a plain target step); the draft server's
    emulated pipelined targets play this rule."""

    def choose_m(self, available: int, m_max: int, fresh: bool = False, since_s: float = 0.0) -> int:
        return min(available, m_max)


class SyncPolicy(AdaptivePolicy):
    """Sync ("always wait for k"): every round verifies k streamed drafts, waiting for them; a named setting kept
    for comparison with the step policy."""

    def choose_m(self, available: int, m_max: int, fresh: bool = False, since_s: float = 0.0) -> int:
        return m_max


# ---------------------------------------------------------------------------------------------
# The step policy: how many drafts to verify and how long to wait for them, for long-run tokens/s.

JUMPS = 256    # the most waits a batch's plan from the restarts' spread tries (each a time a draft could come)


def _thinned(xs: list[float], most: int) -> list[float]:
    """At most `most` of the sorted xs, evenly spaced, the last kept."""
    stride = -(-len(xs) // most) if xs else 1
    return xs[::-1][::stride][::-1]


class StepPolicy(AdaptivePolicy):
    """The step policy ("policy", the default of every remote mode): each target step chooses how many drafts to
    verify and how long to wait for them, maximising long-run tokens/s from what it measures: alpha, t_v(m), the
    draft's period and the restart latency. Among the wait rules (WaitRule: on nothing on offer wait for `empty`,
    on some wait for `some`, never more than `cap`) it plays the one whose renewal-reward rate over a restart
    cycle (best_rule) is highest: a round is worth what it yields plus the state it leaves the next one in,
    not its own ratio. A restart whose drafts are OVERDUE times later than due (a draft still prefilling, a stall)
    is covered by plain steps. The event model (simulate_pipelined) plays this very object."""
    holds = True     # the step's first choice stands while its drafts are on their way (runtime.pipeline.DraftFeed)
    alpha_step = 0.01    # alpha is rounded to this before a rule is chosen (coarser: fewer distinct tables to score)
    _rule: tuple[int, int, WaitRule, float] | None = None   # (steps until chosen again, for k, the rule, its rate)
    _chosen_on: tuple[float, int] = (0.0, 0)   # alpha and the widths measured when the rule was chosen
    alpha_move = 0.1    # alpha this far from the one the rule was chosen on: the rule is chosen again at once (a
    #   request's first rounds move it that far; a steady alpha's estimate, over its ~50 rounds, seldom does)
    batch_wait_s: float | None = None   # the newest batch's chosen wait (choose_batch; None: each stream's own rule)
    batch_spread = False                # ... chosen from the restarts' spread (its caller then gives it no slack)
    restarts: tuple[float, ...] = ()    # measured restarts (a Commit sent to its first draft at the target), sorted,
    #   seconds: a batch's wait for a restarted stream is planned from their spread (empty, or at one stream: from
    #   due_s, from their median, with the overdue rule)

    def rule(self, m_max: int) -> WaitRule | None:
        """The rule for rounds of at most m_max drafts, chosen again every RULE_EVERY steps, and at once where what
        it was chosen on has moved: alpha by alpha_move or more, or a verify width measured for the first time (a
        rule chosen on a request's first rounds, on the prior's alpha and one width, would otherwise hold for the
        next RULE_EVERY steps, a short request's whole length); None until the costs are measured. m_max below the
        run's k (the last tokens of a request) caps the rule."""
        r, (alpha, widths) = self._rule, self._chosen_on
        if (r is not None and r[0] > 0 and r[1] >= m_max and not self.alpha_moved(alpha)
                and len(self.verify_s) == widths):
            self._rule = (r[0] - 1, *r[1:])
            return r[2]
        key = self.rule_key(m_max)
        if key is None:
            return None
        self._rule = (RULE_EVERY - 1, len(key[1]) - 1, *best_rule(*key))
        self._chosen_on = (self.alpha, len(self.verify_s))
        return self._rule[2]

    def alpha_moved(self, since: float) -> bool:
        """Whether alpha has moved by alpha_move or more from `since` (the alpha a rule was chosen on): the rule is
        then chosen again at once (rule here; the vLLM proposer's policy mode alike)."""
        return abs(self.alpha - since) >= self.alpha_move

    def rule_key(self, m_max: int) -> tuple | None:
        """best_rule's arguments for rounds of at most m_max drafts, from the estimates now (alpha rounded to
        alpha_step, the costs to about 2%); None until the costs are measured."""
        c = self.costs()
        if c is None:
            return None
        k = max(m_max, 1)
        tv = tuple(_q(c.verify(m + 1) + c.overhead) for m in range(k + 1))
        d = _q(self.period or c.draft_step)
        link = _q(self.link if self.link is not None else c.rtt)
        return round(round(self.alpha / self.alpha_step) * self.alpha_step, 2), tv, d, link

    def due_s(self, m: int, available: int = 0) -> float:
        """When the m-th draft is due, from a restart (available = 0) or from now (one period per draft); never,
        until the costs are measured."""
        c = self.costs()
        if c is None:
            return math.inf
        d = self.period or c.draft_step
        link = self.link if self.link is not None else c.rtt
        return link + (m + 0.5) * d if not available else (m - available) * d

    def choose_m(self, available: int, m_max: int, fresh: bool = False, since_s: float = 0.0) -> int:
        rule = self.rule(m_max)
        if rule is None:                        # costs not measured yet: wait for one draft (alpha and the verify's
            return min(max(available, 1), m_max)   # widths are measured only by verifying drafts)
        m = rule.m(available, m_max)
        if fresh and m > available and self.overdue(m, since_s):
            return min(available, m_max)       # stalled: go with what is on offer
        return m

    def choose_batch(self, offers: list[int], m_max: int, fresh: list[bool], since_s: list[float]) -> list[int]:
        """Drafts to verify for each of B streams stepped together (one verify, one wait for the batch): each
        stream's own choice (choose_m), then the step's one wait, among none and the times the short streams' drafts
        come: the one whose expected tokens over the batch, less what the batch makes in the long run (B x the
        rule's renewal rate) in the step's verify and wait, is highest (renewal-reward's marginal test: a wait pays
        only where what it brings beats what its time brings elsewhere); each stream verifies what it will hold by
        then. A wait for one stream's drafts holds all B, so at B > 1 the batch waits only where the streams' gain
        outweighs it; at B = 1 it is choose_m. fresh: a stream restarted with nothing received since (its drafts due
        from the restart, since_s ago: due_s; one late but not overdue is given its next draft within half a
        period); since_s: since each stream's restart. With the restarts measured (restarts), a restarted stream
        is planned from their spread instead (one later than every one of them: stalled, it goes with what is on
        offer): each of its drafts weighed by the chance it comes within the wait given that none came so far
        (restart_by, at every wait at once), the waits tried at the times its drafts could come (at most JUMPS,
        evenly over their span), the verify costed at its expected width (for every stream: one verify's width is
        the batch's widest), and no overdue rule (the spread says how late they come). The wait chosen is kept in
        batch_wait_s (None where each stream's own choice stands) and batch_spread says whether the spread chose it: a
        caller waiting for drafts that come late gives up a period after a planned time, at once after a time the
        spread chose."""
        c = self.costs()
        d = (self.period or c.draft_step or 0.0) if c is not None else 0.0
        measured = [len(offers) > 1 and d > 0 and f and not a and bool(self.restarts) for a, f in zip(offers, fresh)]
        spread = [m and t < self.restarts[-1] for m, t in zip(measured, since_s)]
        # (measured but later than every restart measured: a stall, what is on offer)
        wants = [min(a, m_max) if m and not s else self.choose_m(a, m_max, f, 0.0 if s else t)
                 for a, f, t, m, s in zip(offers, fresh, since_s, measured, spread)]
        self.batch_wait_s, self.batch_spread = None, False
        if len(offers) < 2 or c is None or self._rule is None or all(w <= a for w, a in zip(wants, offers)):
            return wants
        alpha, rate, top, B = self.alpha, len(offers) * self._rule[3], max(wants), len(offers)
        et = np.array([expected_tokens(alpha, m) for m in range(top + 1)])
        step = np.array([c.verify(m + 1) + c.overhead for m in range(top + 1)])
        ms = np.arange(1, top + 1)[:, None]

        def arrives(j: int, m: int) -> float:       # seconds from now until stream j holds m drafts (planned)
            if fresh[j]:
                return max(self.due_s(m, 0) - since_s[j], (m - 0.5) * d)
            return (m - offers[j]) * d                # (streaming: one a period)

        def chances(j: int, w: np.ndarray) -> np.ndarray:    # P(stream j holds m drafts w from now): [m - 1, wait]
            a, t = min(offers[j], wants[j]), since_s[j]
            if spread[j]:                             # (its m-th draft m - 1 periods after its first)
                p = self.restart_by(t, t + w[None, :] - (ms - 1) * d + 1e-9)
            else:
                due = np.array([arrives(j, m) for m in range(1, top + 1)])[:, None]
                p = ((ms <= a) | ((w[None, :] > 0) & (due <= w[None, :] + 1e-9))).astype(float)
            return np.where(ms <= wants[j], p, 0.0)
        planned = [arrives(j, m) for j, m in enumerate(wants) if m > offers[j] and not spread[j]]
        jumps = _thinned(sorted({r - t + (m - 1) * d for j, (t, s) in enumerate(zip(since_s, spread)) if s
                                 for r in self.restarts if r > t for m in range(1, wants[j] + 1)}), JUMPS)
        waits = np.array([0.0] + sorted(planned + jumps))
        ps = np.stack([chances(j, waits) for j in range(B)])                  # [stream, m - 1, wait]
        gain = B * et[0] + (ps * np.diff(et)[None, :, None]).sum(axis=(0, 1))
        wide = 1 - np.prod(1 - ps, axis=0)                                    # P(the verify's width >= m)
        i = int(np.argmax(gain - rate * (step[0] + (wide * np.diff(step)[:, None]).sum(axis=0) + waits)))
        w = float(waits[i])
        self.batch_wait_s, self.batch_spread = w, w in jumps and w not in planned
        return [int(n) for n in (ps[:, :, i] > 0).sum(axis=1)]

    def restart_by(self, since_s: float, t):
        """The chance that a restart with no draft in its first since_s has its first draft by t (seconds, or an
        array of them; both from its Commit), from the measured restarts (their distribution given that none came by
        since_s); 0 where none of them is later than since_s."""
        runs = np.asarray(self.restarts)
        lo = np.searchsorted(runs, since_s, "right")
        if lo == len(runs):
            return np.zeros_like(np.asarray(t, dtype=float))
        return np.where(np.asarray(t) > since_s, (np.searchsorted(runs, t, "right") - lo) / (len(runs) - lo), 0.0)

    def overdue(self, m: int, since_s: float, available: int = 0) -> bool:
        """m drafts this late (since_s: since the restart, or since the wait began with `available` on offer): the
        wait is given up (the caller goes with what is on offer)."""
        return since_s > OVERDUE * self.due_s(m, available)


SETTINGS = {"policy": StepPolicy, "sync": SyncPolicy, "offered": OfferedPolicy}   # the step's named settings
POLICIES = {"adaptive": AdaptivePolicy, "fixed": FixedPolicy, **SETTINGS}   # ... and the earlier rules, by name


def step_setting(name: str) -> type[AdaptivePolicy]:
    """The pipelined step's policy named `name`: one of SETTINGS ("policy": the step policy, the remote modes'
    default; "sync": always wait for k; "offered": go with what is on offer), or the earlier rules kept by name
    ("adaptive": one round's best rate; "fixed": what is on offer, waiting for one); a ValueError otherwise."""
    if name not in POLICIES:
        raise ValueError(f"step policy {name!r}: use one of {', '.join(POLICIES)} (e.g. --policy policy)")
    return POLICIES[name]


def setting_of(est: AdaptivePolicy) -> str:
    """The name a policy object plays under (POLICIES); its class name when it is none of them (a test double)."""
    return next((name for name, cls in POLICIES.items() if type(est) is cls), type(est).__name__)


def _policy(alpha: float, c: Costs, k_max: int, adaptive: bool | str, period: float | None) -> "AdaptivePolicy":
    """The runtime's policy fed what it sees: alpha (as if long measured), the draft's step (`period` when
    the cache's rows weigh on it), the round trip as the target lives it (c.rtt), the verify costs."""
    est = POLICIES[adaptive]() if isinstance(adaptive, str) else AdaptivePolicy() if adaptive else FixedPolicy()
    est.acc, est.rej = alpha * 1e9, (1 - alpha) * 1e9
    est.draft_step, est.rtt, est.overhead = c.draft_step, c.rtt, c.overhead
    est.verify_s = {m: c.verify(m) for m in range(1, k_max + 2)}
    if period is not None:
        est.draft_step = period
    est.link = c.link_rtt
    return est

"""The policies that choose each round's drafts (adaptive k; the pipelined step's named settings, the step policy
among them) and the event model that plays them (simulate_pipelined). One room: the event model plays the
policies, and the step policy asks the event model for its rule."""
from __future__ import annotations

import math
from bisect import bisect_right

from .cacheterms import CacheTerms
from .modeldraft import _ModelDraft
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

JUMPS = 24     # the most waits a batch's plan from the restarts' spread tries (each a time a draft could come)


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
    batch_wait_s: float | None = None   # the newest batch's chosen wait (choose_batch; None: each stream's own rule)
    batch_spread = False                # ... chosen from the restarts' spread (its caller then gives it no slack)
    restarts: tuple[float, ...] = ()    # measured restarts (a Commit sent to its first draft at the target), sorted,
    #   seconds: a batch's wait for a restarted stream is planned from their spread (empty, at one stream, or later
    #   than every one measured: from due_s, from their median, with the overdue rule)

    def rule(self, m_max: int) -> WaitRule | None:
        """The rule for rounds of at most m_max drafts, chosen again every RULE_EVERY steps; None until the costs
        are measured. m_max below the run's k (the last tokens of a request) caps the rule."""
        if self._rule is not None and self._rule[0] > 0 and self._rule[1] >= m_max:
            self._rule = (self._rule[0] - 1, *self._rule[1:])
            return self._rule[2]
        key = self.rule_key(m_max)
        if key is None:
            return None
        self._rule = (RULE_EVERY - 1, len(key[1]) - 1, *best_rule(*key))
        return self._rule[2]

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
        if rule is None:
            return min(max(available, 1), m_max)
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
        whose wait is inside their reach is planned from their spread instead: each of its drafts weighed by the
        chance it comes within the wait given that none came so far (restart_by), the waits tried at the times its
        drafts could come (at most JUMPS of them, evenly over their span), the verify costed at its expected width, and no
        overdue rule (the spread says how late they come). The wait chosen is kept in batch_wait_s (None where each
        stream's own choice stands) and batch_spread says whether the spread chose it: a caller waiting for drafts
        that come late gives up a period after a planned time, at once after a time the spread chose."""
        c = self.costs()
        d = (self.period or c.draft_step or 0.0) if c is not None else 0.0
        spread = [len(offers) > 1 and d > 0 and f and not a and bisect_right(self.restarts, t) < len(self.restarts)
                  for a, f, t in zip(offers, fresh, since_s)]     # (beyond every restart measured: due_s's rule)
        wants = [self.choose_m(a, m_max, f, 0.0 if s else t) for a, f, t, s in zip(offers, fresh, since_s, spread)]
        self.batch_wait_s, self.batch_spread = None, False
        if len(offers) < 2 or c is None or self._rule is None or all(w <= a for w, a in zip(wants, offers)):
            return wants
        alpha, rate, top = self.alpha, len(offers) * self._rule[3], max(wants)
        et = [expected_tokens(alpha, m) for m in range(top + 1)]
        step = [c.verify(m + 1) + c.overhead for m in range(top + 1)]

        def arrives(j: int, m: int) -> float:       # seconds from now until stream j holds m drafts (planned)
            if fresh[j]:
                return max(self.due_s(m, 0) - since_s[j], (m - 0.5) * d)
            return (m - offers[j]) * d                # (streaming: one a period)

        def chances(j: int, w: float) -> list[float]:    # P(stream j holds m drafts w from now), m = 1..top
            a, t = min(offers[j], wants[j]), since_s[j]
            if spread[j]:                             # (its m-th draft comes m - 1 periods after its first)
                return [self.restart_by(t, t + w - (m - 1) * d + 1e-9) if m <= wants[j] else 0.0 for m in range(1, top + 1)]
            return [1.0 if m <= a or (m <= wants[j] and w > 0 and arrives(j, m) <= w + 1e-9) else 0.0
                    for m in range(1, top + 1)]

        def worth(w: float) -> float:
            ps = [chances(j, w) for j in range(len(offers))]
            gain = sum(et[0] + sum(p * (et[m] - et[m - 1]) for m, p in enumerate(q, 1)) for q in ps)
            wide = [1 - math.prod(1 - q[m - 1] for q in ps) for m in range(1, top + 1)]   # P(the verify's width >= m)
            return gain - rate * (step[0] + sum(p * (step[m] - step[m - 1]) for m, p in enumerate(wide, 1)) + w)
        planned = [arrives(j, m) for j, m in enumerate(wants) if m > offers[j] and not spread[j]]
        jumps = _thinned(sorted({r - t + (m - 1) * d for j, (t, s) in enumerate(zip(since_s, spread)) if s
                                 for r in self.restarts if r > t for m in range(1, wants[j] + 1)}), JUMPS)
        w = max([0.0] + sorted(planned + list(jumps)), key=worth)
        self.batch_wait_s, self.batch_spread = w, w in jumps and w not in planned
        return [sum(1 for p in chances(j, w) if p > 0) for j in range(len(offers))]

    def restart_by(self, since_s: float, t: float) -> float:
        """The chance that a restart with no draft in its first since_s has its first draft by t (both from its
        Commit), from the measured restarts (their distribution given that none came by since_s); 0 where none of
        them is later than since_s."""
        n, lo = len(self.restarts), bisect_right(self.restarts, since_s)
        return 0.0 if t <= since_s or lo == n else (bisect_right(self.restarts, t) - lo) / (n - lo)

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


def simulate_pipelined(alpha: float, c: Costs, k_max: int, n_tokens: int = 20000, seed: int = 0,
                       adaptive: bool = True, cache: tuple | None = None, policy: str = "", streams: int = 1) -> dict:
    """Event model of the pipelined protocol (runtime.pipeline). Terms: a *step* is one draft token, one per
    draft_period (its device step plus its host's work: read, send, launch) from the start of its current
    run; a *transit* is link_rtt/2 (c.rtt/2 when link_rtt is None), a token's or a Commit's way over the link;
    each draft token equals the target's choice with probability alpha (for greedy decoding: acceptance).

    Per round the target applies the runtime's own policy (AdaptivePolicy.choose_m, fed the draft's device
    step and the round trip as the target lives it, c.rtt), verifies and commits; the Commit reaches the
    draft a transit later, between two of its steps: a mismatch there restarts the draft's run behind the
    step it has in flight, a position not drafted yet is taken as given. adaptive=False plays FixedPolicy;
    policy names one of POLICIES instead ("offered": verify what is on offer, never wait).
    Deterministic for a seed.

    streams: B sequences a target verifies in one batch (c's verify costs are the batch's): each has a draft of its
    own on the server's period; every step waits for the batch's choice (the step policy's choose_batch; another
    policy's choice per stream, the step waiting for the last) and verifies them all at once. At 1, one stream.

    cache: a CacheTerms (or its 4-tuple; cache_terms makes it). A rejection at one of the first `forks`
    positions past the last commit finds its correction on a branch with probability `hit`; the branch
    drafted `depth` tokens from its fork's step on, so a hit costs no restart. Every step costs row_cost
    plain ones unless draft_period, measured with the branches on, already holds them.

    Returns tokens/s (over all streams), per stream and round: mean drafts verified and tokens, the shares of plain
    rounds and of idle target time, the restarts and the hit rate after a rejection (None without restarts)."""
    import random
    terms = CacheTerms(*cache) if cache else CacheTerms(0, 0, 0.0, 1.0)
    period = c.draft_period or c.draft_step * terms.row_cost
    est = _policy(alpha, c, k_max, policy or adaptive, period if cache and not c.draft_period else None)
    est.period = period                              # the draft's wall step, as the runtime measures it
    one_way = (c.rtt if c.link_rtt is None else c.link_rtt) / 2
    drafts = [_ModelDraft(alpha, period, one_way, terms, random.Random(seed + j * 1_000_003)) for j in range(streams)]
    t, outs = 0.0, [1] * streams     # target clock (s); positions < outs[j] of stream j are committed
    idle, rounds, verified, plain = 0.0, 0, 0, 0
    while sum(outs) < n_tokens:
        ms, ready = _step_choice(est, drafts, outs, t, k_max)
        idle += ready - t
        t = ready + c.verify(max(ms) + 1) + c.overhead
        rounds, verified, plain = rounds + streams, verified + sum(ms), plain + ms.count(0)
        for j, (d, m) in enumerate(zip(drafts, ms)):
            run = [x for x in d.run if x.pos >= outs[j]]
            n = next((i for i in range(m) if not run[i].match), m)      # accepted drafts
            outs[j] += n + 1
            d.commit(outs[j] - 1, t)
            d.acked = outs[j]
            d.run[:] = [x for x in d.run if x.pos >= outs[j]]
    restarts, hits = sum(d.restarts for d in drafts), sum(d.hits for d in drafts)
    return {"tokens_per_s": sum(outs) / t, "verified_per_round": verified / rounds,
            "tokens_per_round": sum(outs) / rounds, "plain_step_share": plain / rounds, "target_idle_share": idle / t,
            "restarts": restarts, "cache_hit_rate": hits / restarts if restarts else None}


def _step_choice(est: AdaptivePolicy, drafts: list[_ModelDraft], outs: list[int], t: float,
                 k_max: int) -> tuple[list[int], float]:
    """simulate_pipelined's step at t: each stream's drafts to verify (one stream: choose_m; a batch: the step
    policy's choose_batch, another policy's choose_m per stream) and when the last of them is at the target."""
    seen = []
    for d, out in zip(drafts, outs):
        d.produce_until(t - d.one_way)
        _, avail, fresh = d.arrived(out, t)
        if getattr(est, "holds", False):
            fresh = t < d.t_first                   # the step policy's fresh: nothing of this run has arrived
        seen.append((avail, fresh, t - d.t_restart))
    if len(drafts) > 1 and hasattr(est, "choose_batch"):
        ms = est.choose_batch([a for a, _, _ in seen], k_max, [f for _, f, _ in seen], [s for _, _, s in seen])
    else:
        ms = [est.choose_m(a, k_max, f, s) for a, f, s in seen]
    ready = t
    for d, out, m, (avail, _, _) in zip(drafts, outs, ms, seen):
        if m > avail:                               # wait for the m-th token
            d.produce_until(-1, out + m - 1)
            ready = max(ready, [x for x in d.run if x.pos >= out][m - 1].end + d.one_way)
    return ms, ready


def pipelined_speedup(alpha: float, c: Costs, k_max: int, **kw) -> float:
    return simulate_pipelined(alpha, c, k_max, **kw)["tokens_per_s"] * c.target_step

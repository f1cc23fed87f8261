"""The remote draft proposer's link to its draft server, a mixin of wire.vllm_proposer.RemoteDraftProposer (whose
__init__ sets the state it uses), over the draft server's one client (wire.draft_client.DraftServerClient, built
with wait=False: its sends never block, a Hello's Welcome comes as a message): when to say Hello on a fresh socket
and the Welcome that bounds the proposer, the messages taken while a step waits and what each does (Drafts,
Streamed, Ended, Error), Pings to a silent server, a lost one given up, a full one asked again less and less often
(wire.vllm_proposer's docstring has the rules)."""
from __future__ import annotations

import time

from . import protocol
from .draft_client import DraftServerClient
from .vllm_rows import Bounds, Plan, ProposerError
from .vllm_settings import BACKOFF_MAX_S, DECODE, LOST_S, PING_S, RETRY_S, hello_for


class ProposerLink:
    """RemoteDraftProposer's messages to and from its draft server, on its client `conn` (the module docstring has
    what they do)."""

    def _hello(self) -> None:
        """A fresh socket (what the old one still receives is never taken) and a Hello on it."""
        if self.hello is None:
            self.hello = hello_for(self.config)
        self.peer, self.refusal, self.t_hello = None, "", time.perf_counter()
        self.t_heard, self.t_retry = self.t_hello, self.t_hello + RETRY_S
        self.stats.hellos += 1
        self.tracker.reset()
        if self.streams is not None:
            self.streams.reset()
        if self.conn is None:
            self.conn = DraftServerClient(self.addr, self.hello, keys=self.keys, wait=False, decode=DECODE)
        else:
            self.conn.hello_again()

    def _ready(self, now: float) -> bool:
        """Take what has arrived (late Drafts, a Welcome); Hello again when the server has not answered one
        for RETRY_S (or refused it, and the backoff has passed); with rounds outstanding, Ping a silent server, and
        give it up after LOST_S of silence. Whether rounds can go out."""
        self._drain()
        if self.peer is None and now >= self.t_retry:
            self._hello()
        silent = now - self.t_heard
        if self.peer is not None and (any(t.sent_at for t in self.tracker.tracks.values())
                                      or self.streams is not None and self.streams.streams):
            if silent > LOST_S:
                self._lost(f"rounds outstanding and nothing heard for {silent:.0f} s")
            elif silent > PING_S and now - self.t_ping > PING_S:
                self.conn.send(protocol.Ping(time.time()))
                self.t_ping = now
        return self.peer is not None

    def _lost(self, why: str) -> None:
        self.stats.lost += 1
        self.log.line(f"draft server lost ({why}): drafting nothing until it answers a Hello again", self.addr)
        self.peer = None
        self.t_retry = 0.0
        self.tracker.reset()
        if self.streams is not None:
            self.streams.reset()
        self.waiting = {}

    def _send_plan(self, plan: Plan, now: float) -> None:
        for t in plan.ends:
            self.conn.send(protocol.End(t.seq))
        for t, ctx in plan.opens:
            self.conn.send_open(t.seq, 0, ctx.tolist())
        rows = []
        for r in plan.rounds:
            if r.track.offered:                         # the verdict on what vLLM was offered of its last proposal
                self.stats.verified += r.track.offered
                self.stats.accepted += min(r.accepted, r.track.offered)
                r.track.offered = 0
            rows.append(protocol.Row(r.track.seq, 0, r.have, r.accepted, r.tokens, r.k))
            self.waiting[r.track.seq] = (r.row, r.k)
            r.track.sent_at = now
        self.conn.send_rows(protocol.Rounds, rows, self.bounds.rows_per_message)
        self.stats.opened += len(plan.opens)
        self.stats.ended += len(plan.ends)
        self.stats.rounds += len(rows)

    def _drain(self) -> None:
        while self.conn is not None and (m := self.conn.take(0)) is not None:
            self._take(m)

    def _await(self, deadline: float) -> float:
        """Take messages until every round of this step is answered or the deadline passes; the time waited (0: no
        round was sent)."""
        return self._wait_while(lambda: self.waiting, deadline) if self.waiting else 0.0

    def _wait_while(self, more, deadline: float) -> float:
        """Messages taken (each by _take) while more() and the deadline (perf_counter) has not passed; the seconds
        waited, counted in stats.wait_s."""
        t0 = time.perf_counter()
        while more() and (left := deadline - time.perf_counter()) > 0:
            m = self.conn.take(left)
            if m is None:
                break
            self._take(m)
        waited = time.perf_counter() - t0
        self.stats.wait_s += waited
        return waited

    def _take(self, m) -> None:
        """One message from the server: a Welcome, Drafts (this step's, late or refused rows), an Error, a Pong."""
        if m is not None:
            self.t_heard = time.perf_counter()
        if isinstance(m, protocol.Welcome):
            if self.peer is None:
                try:
                    self._bound(m)
                except ProposerError as e:         # load_model stops vLLM with it; later: drafting nothing
                    self.refusal = str(e)
                    self.log.line(self.refusal, self.addr)
                    return
                self.log.line(f"drafting with {m.model_id} at {self.addr} ({self.mode} mode, k={self.bounds.k}, "
                              f"deadline "
                              f"{self.deadline_s * 1e3:.0f} ms or {self.step_ratio:g} target steps if longer)")
            if self.peer is None and self.t_hello:           # the Hello's round trip: the link, as a restart adds it
                rtt = self.t_heard - self.t_hello            # (the least: a Welcome read only at the next step is late)
                self.link_s = min(self.link_s, rtt) if self.link_s else rtt
            self.peer, self.backoff_s = m, 0.0
        elif isinstance(m, protocol.Streamed):
            self.stats.streamed += (self.streams.take(m.rows, self.t_heard, m.stepped_at, self.link_s)
                                    if self.streams is not None else 0)
            if m.draft_ms > 0:                             # a step's tokens (not a foreseen verdict's branch)
                self.stats.server_draft_s += m.draft_ms / 1e3
                self.stats.server_steps += 1
                self.draft_steps_s.append(m.draft_ms / 1e3)
        elif isinstance(m, protocol.Ended):
            self.stats.confirmed += 1
        elif isinstance(m, protocol.Drafts):
            self.stats.server_draft_s += m.draft_ms / 1e3
            self.stats.server_held_s += m.held_ms / 1e3
            for r in m.rows:
                self._take_row(r, time.perf_counter())
        elif isinstance(m, protocol.Error):
            if self.peer is None and m.code in ("mismatch", "version"):
                self.refusal = f"{m.code}: {m.message}"
                self.log.refused(self.addr, m.code, m.message)
            elif self.peer is None and m.code == "limit":   # the Hello refused (the server full): ask less often
                self._back_off(m)
            elif self.peer is None:                     # e.g. a stale Error of a lost connection: Hello as usual
                self.log.refused(self.addr, m.code, m.message)
            else:
                self._lost(f"{m.code}: {m.message}")

    def _back_off(self, refusal: protocol.Error) -> None:
        """No Hello for one step's deadline after the first refusal, twice as long after each next one, at most
        BACKOFF_MAX_S (a full server is not asked every step, each time on a fresh socket)."""
        self.backoff_s = min(BACKOFF_MAX_S, max(self.deadline(), 2 * self.backoff_s))
        self.t_retry = time.perf_counter() + self.backoff_s
        self.log.refused(self.addr, refusal.code, f"{refusal.message} (Hello again in {self.backoff_s:.2f} s)")

    def _bound(self, welcome: protocol.Welcome) -> None:
        """Keep within the limits the server's Welcome carries (today's defaults when it carries none)."""
        b = self.bounds = Bounds.of(self.k, self.max_len, getattr(welcome, "limits", None))
        self.tracker.tokens_per_row, self.tracker.max_tracks = b.tokens_per_row, b.sequences
        if self.streams is not None:
            self.streams.max_streams = b.sequences
        if b.k < self.k:
            self.log.line(f"the draft server drafts at most {b.k} tokens a round: vLLM's num_speculative_tokens="
                          f"{self.k} gets {b.k} (set num_speculative_tokens={b.k} to verify no empty slots)")

    def _take_row(self, r: protocol.RowDraft, now: float) -> None:
        if r.error and self.streams is not None and self.streams.refused(r.seq, r.gen, r.error, now):
            self.stats.refused += 1
            self.log.refused(self.addr, r.error, r.message)
            return
        t = self.tracker.tracks.get(r.seq)
        if t is None or r.gen != 0:                     # an ended track's, or a stale generation's
            return
        mine = self.waiting.pop(r.seq, None)
        t.sent_at = 0.0
        if r.error:
            self.stats.refused += 1
            self.log.refused(self.addr, r.error, r.message)
            t.held_until = max(t.held_until, now + (RETRY_S if r.error != "desync" else 0.0))
            return
        t.prev = list(r.tokens)                         # what the server holds past the context
        if mine is None:                                # answered after its step's deadline: vLLM never sees it
            self.stats.late += 1
            return
        row, k = mine
        self.out[row] = t.prev[:k]
        t.offered = len(self.out[row])
        self.stats.answered += 1

    def close(self) -> None:
        self.steplog.flush()
        if self.conn is not None:
            self.conn.close()
            self.conn = None

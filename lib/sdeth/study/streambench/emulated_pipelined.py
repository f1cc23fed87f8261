"""The emulated pipelined target (EmulatedPipelined): B streams on the draft server, a target step every t_v(B, m)
that verifies the drafts its step policy chose, one Commits message a step."""
from __future__ import annotations

import random
import time

from ...costmodel import StepPolicy, link_of_restart, step_setting
from ...runtime.pipeline import StreamView
from ...wire import protocol
from .common import CONTEXT, HOLDS, PROMPT, SPIN_S, TIMELINE, first_end, hello, wait_until
from .ranks import Ranks, token_of

FORESEEN_WAIT_S = 0.05     # the most a target waits for its restart's answer (a foreseen verdict's drafts or `missed`)
HOLD_S = 0.2              # the most a commit is held for the draft's own token (see EmulatedPipelined)
HOLD_PERIODS = 2.0        # hold "periods": a commit waits for the draft's token this many server periods (a draft at
                          # the target's frontier steps that position within one), then goes as a token of our own
DRAFT_WAIT_S = 1.0         # the most a step waits for the drafts its policy chose (a stream still prefilling: less)


class EmulatedPipelined:
    """One emulated pipelined target: B streams on the draft server (Open(stream=True)), a target step every
    t_v(B, m) (m: the most drafts any stream has on offer, at most k), coins with alpha for each stream's drafts on
    offer, one Commits message a step, sent when the verify's wait ends (each stream's own token: a correction after
    a rejected draft, or the token after the last one it had), as a real target learns its verdict only then. How
    many drafts each stream verifies, and so how long the step waits for them, is the step's policy (`policy`, a
    costmodel.POLICIES name: "policy", the step policy, fed the measured alpha, t_v(B, m), the server's period and
    the commit-to-first-draft latency; "offered": what is on offer, never waiting; "sync": k each); a stream with
    none to verify gains its own token. The bonus token (after every draft on
    offer was accepted) is the draft's token at its position with probability alpha. When that token has not reached
    the target by the verify's end, the emulation cannot name it: its commit (and the stream's commits after it)
    is held until the token arrives, then sent as the draft's, so that the draft's run goes on as it would behind a
    real target, which would have sent that token at once (held_commits counts them). Sending a token of our own
    at once instead, as this emulation once did, turned each such agreement into a rejection: with many rows, a
    draft running behind the target then never caught up. How long a commit is held (`hold`): "periods" (the
    default), HOLD_PERIODS times the median gap between the server's steps that carried this target's streams, then
    a token of our own: a draft at the target's frontier steps the position within one period, and one further
    behind is caught up by the commit (it extends the draft's chain), as behind a real target, rather than drafting
    each held position itself; "draft": until the draft's token comes (HOLD_S at most), the rule of the calls
    before. A token of our own sent where the draft's was still on its way is a
    rejection a real target would not have made (restarts_found_late counts them): both rules err on the draft's
    side of the real target, "periods" by less.

    ranks (streambench.ranks): which token the target's is in the draft's order, per position ("coins": none of
    the draft's on a rejection); watch: the draft's next choices the server sends with each token. foreseen: the
    server runs a verdict cache, so after a rejection the target waits for the server's answer to its Commits (the
    branch's drafts when the verdict was foreseen, `missed` when not; at most FORESEEN_WAIT_S) before its next
    verify, as a target that knows the server speculates on its verdicts would."""

    def __init__(self, addr: str, index: int, B: int, k: int, tv_ms: dict, alpha: float, seed: int, vocab: int,
                 window: int = protocol.STREAM_WINDOW, prompt: int = PROMPT, context: int = CONTEXT, ranks: str = "coins",
                 watch: int = 0, foreseen: bool = False, policy: str = "policy", ahead: bool = False,
                 hold: str = HOLDS[0], **_):
        from ...wire.draft_client import DraftServerClient
        self.est = step_setting(policy)()      # before the connection: a bad name fails first
        if hold not in HOLDS:
            raise ValueError(f"hold {hold!r}: give one of {', '.join(HOLDS)}")
        self.hold, self.gaps, self.stamp = hold, [], 0.0   # the newest 32 gaps between the server's steps that
                                                           # carried our streams (warm-up's included), the last's stamp
        self.server = DraftServerClient(addr, hello(vocab), timeout_s=60)
        self.index, self.B, self.k, self.alpha, self.vocab = index, B, k, alpha, vocab
        self.tv_s = {int(m): v / 1e3 for m, v in tv_ms.items()}     # drafts verified per stream -> seconds
        self.est.verify_s = {m + 1: v for m, v in self.tv_s.items()}
        self.window, self.prompt, self.context = window, prompt, context
        self.rng, self.count = random.Random(seed), 0
        self.ranks, self.watch, self.foreseen, self.ahead = Ranks(ranks, alpha, seed), watch, foreseen and not ahead, ahead
        self.missed: set = set()               # streams the server said had no branch for their restart
        self.streams = [self.fresh() for _ in range(B)]
        self.rec = {key: [] for key in ("step_ms", "tpot_ms", "offered", "accepted", "draft_ms", "batch",
                                        "tv_over", "held", "period_ms", "branch_rows", "answer_ms", "wait_ms",
                                        "verified", "step_tokens", "open_to_first_ms", "hit_offered",
                                        *TIMELINE)}
        self.last_step = 0.0                   # the newest Streamed's step (server clock)
        self.window_from = 0.0                 # the point's start (wall clock): steps before it are not counted
        self.rec.update(tokens=0, restarts=0, stream_tokens=[0] * B, late=0, dry=[0, 0], hits=0, misses=0, hits_at={},
                        rejections_at={}, rank_hist={}, held_commits=0,
                        restarts_late=0)

    def fresh(self) -> dict:
        """A new stream: Open(stream) and its first token's commit. Its sequence ends when it would pass the
        context; a target's first B end sooner, at staggered lengths (first_end)."""
        self.count += 1
        seq = f"p{self.index}-{self.count}"
        ids = [self.rng.randrange(self.vocab) for _ in range(self.prompt)]
        self.server.client.send(protocol.Open(seq, 0, ids, seed=self.rng.randrange(2 ** 31), q_top=0, stream=True,
                                         window=self.window, watch=self.watch, branches=self.ahead))
        first = self.rng.randrange(self.vocab)
        view = StreamView()
        view.on_commit(0, first)
        room = self.context - self.prompt - self.window - self.k - 2     # the tokens a sequence settles, at most
        s = {"seq": seq, "settled": 1, "view": view, "sent": {}, "first": None, "key": self.index * 100_003 + self.count,
             "fresh": True, "held": [], "end": first_end(self.rng, room) if self.count <= self.B else room}
        self.send_commits([(s, protocol.CommitRow(seq, 0, 0, first))])
        return s

    def send_commits(self, pairs: list, stamped: bool = True) -> None:
        """One Commits message; each stream keeps when its commit went out (the timeline's first stamp; not for a
        commit held for the draft's token, stamped=False: its first draft after is no restart's)."""
        now = time.time()
        for s, row in pairs if stamped else []:
            s["sent"][row.pos] = now
        self.server.client.send(protocol.Commits([row for _, row in pairs]))

    @staticmethod
    def drafted_at(view, pos: int) -> int | None:
        """The draft's token at pos as the view has it (None: not here, or a commit of ours there unresolved)."""
        return view.drafts.get(pos, (None,))[0] if not view.unresolved else None

    def note_first(self, s: dict, r, m, arrived: float) -> None:
        """The first draft the server stepped after reading a commit: the timeline's gaps up to its arrival."""
        sent = s["sent"].pop(r.since, None)
        for p in [p for p in s["sent"] if p < r.since]:
            del s["sent"][p]
        if sent is None or not r.read_at:
            return
        if s.pop("fresh", False):              # a new sequence's first draft: after its prompt's prefill, no restart
            self.rec["open_to_first_ms"].append((arrived - sent) * 1e3)
            return
        for key, a, b in (("sent_to_read", sent, r.read_at), ("read_to_stepped", r.read_at, m.stepped_at),
                          ("stepped_to_arrived", m.stepped_at, arrived), ("sent_to_arrived", sent, arrived)):
            self.rec[key].append((b - a) * 1e3)
        s["first"] = (r.epoch, r.pos, arrived)

    def take(self) -> None:
        """Every Streamed message waiting: each stream's drafts of its current epoch (a newer epoch replaces them).
        An Error (a message of ours the server refused whole, e.g. past its per-connection queue: a Commits or an
        Open lost, so the streams are out of step from here) ends the point, naming it."""
        by = {s["seq"]: s for s in self.streams}
        while (m := self.server.client.recv(0)) is not None:
            if isinstance(m, protocol.Error):
                raise RuntimeError(f"the draft server refused a message ({m.code}): {m.message}")
            if isinstance(m, protocol.Drafts) and any(r.error for r in m.rows):
                bad = next(r for r in m.rows if r.error)
                raise RuntimeError(f"the draft server refused a stream ({bad.error}): {bad.message}")
            if not isinstance(m, protocol.Streamed):
                continue
            arrived = time.time()
            self.missed.update(m.missed)
            if m.batch and m.stepped_at > self.stamp:
                if self.stamp:
                    self.gaps = self.gaps[-31:] + [m.stepped_at - self.stamp]
                self.stamp = m.stepped_at
            if m.batch and m.stepped_at >= self.window_from:   # (a step's in the point's window: an answer to a
                if self.last_step:                              # Commits carries no step; one stepped during the
                                                                # warm-up, read at the window's start, is not counted)
                    self.rec["period_ms"].append((m.stepped_at - self.last_step) * 1e3)
                self.last_step = m.stepped_at
                self.rec["draft_ms"].append(m.draft_ms)
                self.rec["batch"].append(m.batch)
                self.rec["branch_rows"].append(m.branch_rows)
            self.rec["held"].append(m.streams)
            for r in m.rows:
                if r.seq in by:
                    view, restarts = by[r.seq]["view"], by[r.seq]["view"].restarts
                    view.on_drafted(r.epoch, r.pos, r.token, None, r.fork, r.corr, alts=r.alts)
                    self.rec["restarts_late"] += view.restarts - restarts   # (our own token, the draft's came later)
                    if r.since >= 0:
                        self.note_first(by[r.seq], r, m, arrived)
        self.release()

    def offered(self, s: dict) -> int:
        return len(s["view"].chain(s["settled"], self.k))

    def verified(self, s: dict, m: int) -> None:
        """The timeline's last gap: the first draft after a commit taken into a verify (or passed: too late)."""
        if s["first"] is None:
            return
        epoch, pos, arrived = s["first"]
        if epoch != s["view"].epoch or pos < s["settled"]:
            self.rec["late"] += 1
            s["first"] = None
        elif pos < s["settled"] + m:
            self.rec["arrived_to_verified"].append((time.time() - arrived) * 1e3)
            s["first"] = None

    def verdict(self, s: dict, m: int) -> tuple[int, int]:
        """(drafts accepted, the rank of the target's token after them) for m drafts on offer."""
        for i in range(m + 1):
            r = self.ranks.rank(s["key"], s["settled"] + i)
            if r or i == m:
                return i, r
        return m, 0

    def answers(self, restarted: list) -> None:
        """After a rejection with the server's verdict cache on: wait for each restarted stream's answer (its
        foreseen drafts: a hit; `missed`: a miss), at most FORESEEN_WAIT_S; the wait and the hits recorded."""
        if not (self.foreseen and restarted):
            return
        t0 = time.perf_counter()
        while True:
            self.take()
            waiting = [(s, a) for s, a in restarted if s["seq"] not in self.missed and not self.offered(s)]
            if not waiting or time.perf_counter() - t0 > FORESEEN_WAIT_S:
                break
        self.rec["answer_ms"].append((time.perf_counter() - t0) * 1e3)
        for s, a in restarted:
            hit = s["seq"] not in self.missed and self.offered(s) > 0
            self.rec["hits" if hit else "misses"] += 1
            if hit:
                self.rec["hits_at"][str(a)] = self.rec["hits_at"].get(str(a), 0) + 1
        self.missed.clear()

    def measured(self) -> None:
        """What the policy plays from, as measured so far: the server's period and a commit's way to the first
        draft after it (its restart latency: the link and one and a half periods, as the policy models it:
        costmodel.link_of_restart); the step policy also gets the newest 64 restarts, whose spread plans a batch's
        wait (StepPolicy.choose_batch)."""
        r, est = self.rec, self.est
        if r["period_ms"] and r["sent_to_arrived"]:
            period = sorted(r["period_ms"][-64:])[len(r["period_ms"][-64:]) // 2] / 1e3
            restarts = tuple(x / 1e3 for x in sorted(r["sent_to_arrived"][-64:]))
            est.draft_step = est.period = period
            est.rtt = est.link = link_of_restart(restarts[len(restarts) // 2], period)
            if isinstance(est, StepPolicy):        # (a batch's wait planned from their spread)
                est.restarts = restarts

    def chosen(self) -> list[int]:
        """Each stream's drafts to verify this step: the policy's choice from what it has on offer, waited for (the
        server keeps drafting) until every stream has its own, a restart's drafts are overdue, or DRAFT_WAIT_S; a
        batch's one wait (StepPolicy.choose_batch) is given up a server period after the time it chose, whatever
        came late (the drafts a restart sends late hold no batch past its plan). Where the restarts' measured spread
        chose it (batch_spread), the wait ends at that very time and the batch is planned again from what came and
        how long it has been (the event model, costmodel.simulate_pipelined, does the same)."""
        if self.est.draft_step is None or len(self.rec["step_ms"]) % 32 == 0:
            self.measured()
        t0, holding = time.perf_counter(), isinstance(self.est, StepPolicy)
        waited = False              # (a step that waits for nothing records no wait: not the host's own time)
        for _ in range(16):
            t1, (wants, planned, spread) = time.perf_counter(), self.plan(holding)
            slack = 0.0 if spread else self.est.period or self.est.draft_step or 0.0
            limit = DRAFT_WAIT_S if planned is None else min(planned + slack, DRAFT_WAIT_S)
            while time.perf_counter() - t1 < limit:
                short = [(s, m) for s, m in zip(self.streams, wants) if self.offered(s) < m]
                late = holding and not spread and all(self.est.overdue(m, time.perf_counter() - s["view"].t_epoch)
                                                      for s, m in short)
                if not short or late:
                    break
                waited = True
                time.sleep(0.0002)
                self.take()
            if not spread or all(self.offered(s) >= m for s, m in zip(self.streams, wants)):
                break
        self.rec["wait_ms"].append((time.perf_counter() - t0) * 1e3 if waited else 0.0)
        return [min(self.offered(s), m) for s, m in zip(self.streams, wants)]

    def plan(self, holding: bool) -> tuple[list[int], float | None, bool]:
        """The policy's choice from what is on offer now: each stream's drafts, the batch's planned wait (None: each
        stream's own rule) and whether the restarts' spread chose it."""
        now = time.perf_counter()
        offers, views = [self.offered(s) for s in self.streams], [s["view"] for s in self.streams]
        fresh, since = [v.received == 0 for v in views], [now - v.t_epoch for v in views]
        if not holding:
            return [self.est.choose_m(a, self.k, f, t) for a, f, t in zip(offers, fresh, since)], None, False
        wants = self.est.choose_batch(offers, self.k, fresh, since)     # (B streams, one verify: one wait)
        return wants, self.est.batch_wait_s, self.est.batch_spread

    def verify_wait(self, deadline: float) -> None:
        """The verify's wait, the socket read meanwhile (as a real target's receiving thread would: each draft
        stamped when it arrives, not when the verify ends); its last SPIN_S spun."""
        sock = self.server.client.sock
        while (left := deadline - time.perf_counter()) > SPIN_S:
            held = any(s["held"] for s in self.streams)      # (a held commit's time may run out meanwhile)
            ms = max(int((left - SPIN_S) * 1e3), 0)
            if sock.poll(min(ms, 1) if held else ms):
                self.take()
            elif held:
                self.release()
            if not ms:
                break
        wait_until(deadline)

    def tally(self, s: dict) -> None:
        """Branches sent ahead: the stream's restarts since the last tally, each a hit (its view took a branch the
        server sent before the verdict) or a miss; a hit's next step is watched (hit_offered)."""
        if not self.ahead:
            return
        view = s["view"]
        dr, dh = view.restarts - s.get("restarts_seen", 0), view.hits - s.get("hits_seen", 0)
        s["restarts_seen"], s["hits_seen"] = view.restarts, view.hits
        self.rec["hits"] += dh
        self.rec["misses"] += max(dr - dh, 0)
        if dh:
            s["hit_next"] = True

    def commit_view(self, s: dict, pos: int, token: int, a: int, restarted: list) -> None:
        """Our token at pos into the stream's view (the same rules as the server's, runtime.pipeline): a restart
        is counted, with the drafts accepted before it."""
        view, restarts = s["view"], s["view"].restarts
        view.on_commit(pos, token)
        if view.restarts > restarts:
            restarted.append((s, a))
            if self.ahead and view._hit:
                self.rec["hits_at"][str(a)] = self.rec["hits_at"].get(str(a), 0) + 1
            self.rec["rejections_at"][str(a)] = self.rec["rejections_at"].get(str(a), 0) + 1
        self.rec["restarts"] += view.restarts - restarts

    def release(self) -> None:
        """Commits held for the draft's own token (see the class docstring), sent in order as soon as that token
        is here (the draft's, so they agree); one held past hold_s() is sent as a token of our own."""
        pairs, now, hold_s = [], time.perf_counter(), self.hold_s()
        for s in self.streams:
            held, view = s["held"], s["view"]
            while held:
                pos, token, a, t_held = held[0]
                if token < 0:
                    drafted = self.drafted_at(view, pos)
                    if drafted is None and now - t_held < hold_s:
                        break
                    token = drafted if drafted is not None else self.rng.randrange(self.vocab)
                held.pop(0)
                self.commit_view(s, pos, token, a, [])
                pairs.append((s, protocol.CommitRow(s["seq"], 0, pos, token)))
        if pairs:
            self.send_commits(pairs, stamped=False)

    def hold_s(self) -> float:
        """How long a commit waits for the draft's own token (the class docstring: `hold`)."""
        if self.hold == "draft" or not self.gaps:
            return HOLD_S
        return min(HOLD_PERIODS * sorted(self.gaps)[len(self.gaps) // 2], HOLD_S)

    def step(self) -> None:
        t0 = time.perf_counter()
        self.take()
        for s in self.streams:
            self.tally(s)
            if s.pop("hit_next", False):        # a hit's next step: drafts on offer at once, no answer awaited
                self.rec["hit_offered"].append(self.offered(s))
        offers = self.chosen()
        t1 = time.perf_counter()
        for s, m in zip(self.streams, offers):
            self.verified(s, m)
        tv = self.tv_s[max(offers)]
        verdicts = [self.verdict(s, m) for s, m in zip(self.streams, offers)]
        self.verify_wait(t1 + tv)             # the verify of the chosen drafts: its verdict is known only now
        self.take()                           # the draft's token at the bonus position, if it was made meanwhile
        commits, toks, restarted = [], [], []
        for s, m, (a, rank) in zip(self.streams, offers, verdicts):
            pos, view = s["settled"] + a, s["view"]
            drafted = self.drafted_at(view, pos)
            token = token_of(rank, drafted, view.alts.get(pos), self.vocab)
            self.rec["rank_hist"][str(rank)] = self.rec["rank_hist"].get(str(rank), 0) + (a < m or drafted is not None)
            restarts = view.restarts
            if token < 0 and rank:                      # not the draft's token, and it is not here: our own
                token = self.rng.randrange(self.vocab)
            if s["held"] or token < 0:                  # the draft's own token, not here yet (or one held before)
                s["held"].append([pos, token, a, time.perf_counter()])
                self.rec["held_commits"] += token < 0
            else:
                self.commit_view(s, pos, token, a, restarted)
                commits.append((s, protocol.CommitRow(s["seq"], 0, pos, token)))
            if not m:                                   # a stream with nothing to verify: after its own restart,
                self.rec["dry"][int(bool(s.get("restarted")))] += 1     # or not (the server behind it)
            s["restarted"] = view.restarts > restarts
            s["settled"] = pos + 1
            toks.append(a + 1)
            self.rec["offered"].append(m)
            self.rec["accepted"].append(a)
            if m:
                self.est.observe_round(a, m)
        self.send_commits(commits)
        self.answers(restarted)
        for j, s in enumerate(self.streams):
            if s["settled"] > s["end"]:
                self.tally(s)
                self.server.client.send(protocol.End(s["seq"]))
                self.streams[j] = self.fresh()
        t2 = time.perf_counter()
        r, ms = self.rec, (t2 - t0) * 1e3
        r["step_ms"].append(ms)
        r["tpot_ms"] += [ms / t for t in toks]
        r["tokens"] += sum(toks)
        r["step_tokens"].append(sum(toks))
        r["stream_tokens"] = [n + t for n, t in zip(r["stream_tokens"], toks)]
        r["tv_over"].append((t2 - t1) / tv - 1)

    def run(self, conn) -> dict:
        """Warm until every stream has a draft on offer (the prompts prefilled), 'ready', then steps from the
        parent's start time for `seconds`."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60:
            self.take()
            if all(self.offered(s) for s in self.streams):
                break
            time.sleep(0.001)
        for key in self.rec:
            self.rec[key] = type(self.rec[key])()
        self.rec.update(stream_tokens=[0] * self.B, dry=[0, 0], held_commits=0, restarts_late=0, hold=self.hold)
        for s in self.streams:                     # (the window's tallies start here)
            s["restarts_seen"], s["hits_seen"], s["hit_next"] = s["view"].restarts, s["view"].hits, False
        conn.send({"ready": True, "cold_start_ms": round((time.perf_counter() - t0) * 1e3, 2)})
        start_at, seconds = conn.recv()
        self.window_from = start_at
        time.sleep(max(start_at - time.time(), 0))
        while time.time() < start_at + seconds:
            self.step()
        self.rec["t_end"] = time.time()
        for s in self.streams:                     # End, and its Ended taken: a socket closed at once (linger 0)
            self.server.end_seq(s["seq"])          # would drop the End, and the server would keep the stream
        self.server.close()
        return self.rec

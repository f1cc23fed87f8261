"""The draft server's class: DraftServer, a BatchDrafter behind the wire, with a handler per message and a batched
step per idle call (wire.draft_server has its rules and its constructors)."""
from __future__ import annotations

import collections
import os
import time
from dataclasses import asdict

from ..runtime.batchdraft import BatchDrafter, Desync, Full, Overflow
from ..runtime.verdictcache import VerdictCache, VerdictSpec
from ..runtime.verify import Sampling
from . import protocol
from .admission import ClientState
from .bounds import open_bounds, row_bounds
from .clients import ClientTable
from .overlap import Overlap
from .scheduler import Scheduler
from .server_config import DraftServerConfig
from .serving import serve_requests
from .server_streams import StreamSteps
from .stepahead import StepAhead
from .transport import Log, PeerLimits, key_of, reply

DECODE = protocol.Decoder("a draft server", protocol.SERVER_TAKES)


def refusal(seq: str, gen: int, code: str, message: str) -> protocol.RowDraft:
    return protocol.RowDraft(seq, gen, [], error=code, message=message)


class DraftServer(StreamSteps):
    """A BatchDrafter behind the wire: a handler per message, a step per idle call; its clients in a ClientTable,
    what steps next decided by a Scheduler. Built by build_server."""

    def __init__(self, drafter: BatchDrafter, welcome: protocol.Welcome, cfg: DraftServerConfig):
        """cfg: resolved (DraftServerConfig.resolved; build_server does it)."""
        self.drafter, self.welcome, self.cfg, self.limits = drafter, welcome, cfg, cfg.limits
        self.welcome.sequences = cfg.limits.sequences                   # (told in the Welcome)
        self.welcome.limits = {**asdict(cfg.limits), "rows": cfg.rows, "capacity": cfg.capacity,
                          "ttl_ms": round(cfg.ttl_s * 1e3), "idle_ms": round(cfg.idle_s * 1e3), "prefill_chunk": cfg.prefill_chunk,
                          "prefill_budget": cfg.prefill_budget or cfg.prefill_chunk,
                          "messages_per_s": cfg.messages_per_s, "per_pass": cfg.per_pass}
        self.log = Log("draft server")
        self.clients = ClientTable(drafter, cfg.limits, cfg.ttl_s, self.log)
        self.steps = self.served = 0         # draft steps; drafts sent (for cfg.die_after)
        self.parts = drafter.parts          # where the loop's time goes (logged every cfg.report_s seconds)
        self._idle_end = time.perf_counter()
        dev = drafter.device
        self.overlap = Overlap(dev if dev.type == "cuda" else None)   # a step on its own thread while the loop reads
        self.batches: collections.deque = collections.deque(maxlen=4096)    # sequences per step, newest last
        spec = VerdictSpec.parse(cfg.verdict_cache)
        self.verdicts = VerdictCache(drafter, spec) if spec.on else None    # verdict speculation (streams)
        self.welcome.rows = self.verdicts is not None                     # (told: it can send branches ahead)
        self.scheduler = Scheduler(drafter, self.verdicts, cfg, self.log)
        # stream steps launched ahead (wire.stepahead); beside a verdict cache only while it can hold no branch
        # (StreamSteps.ahead_now), its branches stepping inline as before
        self.ahead = StepAhead() if cfg.launch_ahead == "on" else None
        self.handlers = {protocol.Ping: self.handle_ping, protocol.Hello: self.handle_hello,
                         protocol.Open: self.handle_open, protocol.Rounds: self.handle_rounds,
                         protocol.Commits: self.handle_commits, protocol.End: self.handle_end}

    # ------------------------------------------------------------------ messages

    def serve(self, bind: str, max_seconds: float = 0, keys=None) -> None:
        kernels = getattr(self.drafter.dec, "kernels", None)     # (a batched fast decoder's FastOptions.kernels)
        self.log.line(f"{self.welcome.model_id} for up to {self.limits.sequences} sequences on {bind}"
                      + (f", kernels={kernels}" if kernels else ""))
        pump_to = self.overlap.start if self.cfg.read_while_stepping else None
        try:
            for sock, ident, msg, t1, peer in serve_requests(bind, DECODE, self.log, max_seconds, self.idle,
                                                             self.cfg.spin_s, keys, PeerLimits(self.cfg.messages_per_s),
                                                             per_pass=self.cfg.per_pass, closed=self.clients.closed,
                                                             urgent=(protocol.Commits, protocol.End), pump_to=pump_to):
                for m in self.dispatch(ident, msg, t1, peer):
                    self._send(sock, ident, m)
        finally:
            self.overlap.close()

    def _send(self, sock, ident: bytes, m) -> None:
        """Send one reply; under cfg.die_after (fault injection), exit abruptly once that many drafts went out (a
        proposal, a stream's token: a crash, as far as its clients can tell)."""
        reply(sock, ident, m)
        if self.cfg.die_after:
            rows = getattr(m, "rows", None) if isinstance(m, (protocol.Drafts, protocol.Streamed)) else None
            self.served += sum(1 for r in rows or [] if not getattr(r, "error", "") and getattr(r, "fork", -1) < 0)
            if self.served >= self.cfg.die_after:
                os._exit(17)

    def dispatch(self, ident: bytes, msg, t1: float, peer: str) -> list:
        """The immediate replies to one message (Drafts come from steps); an Error is logged with the peer."""
        key, c = key_of(peer), self.clients.get(ident)
        forged = bool(key and c is not None and c.key != key)
        if forged:                          # CURVE: a routing id stays bound to the key that said Hello with it
            out = [protocol.Error("auth", "this routing id is bound to another client key: connect with your own "
                                          "(a fresh DEALER socket)")]   # (another key that forges it reaches none
        elif c is None and isinstance(msg, protocol.Hello):             # of its sequences)
            out = self._hello(ident, msg, t1, peer)
        elif c is None and not isinstance(msg, protocol.Ping):
            out = [protocol.Error("version", "send Hello first (protocol handshake)")]
        else:
            if c is not None:
                c.seen, c.gone = t1, 0.0
                c.active = c.active if isinstance(msg, protocol.Ping) else t1      # (Pings keep no slot)
            try:
                out = self.handlers[type(msg)](c, msg, t1)
            except Exception as e:     # this message failed; the server serves on
                out = [protocol.Error("internal", f"{type(msg).__name__} failed: {type(e).__name__}: {e}")]
        for m in out:
            if isinstance(m, protocol.Error):
                self.log.refused(peer, m.code, f"{type(msg).__name__}: {m.message}")
        if not forged and ident in self.clients and self.clients[ident].refused:   # refused rows go out at once
            out.append(self._drafts(self.clients[ident], []))
        return out

    def _hello(self, ident: bytes, msg: protocol.Hello, t1: float, peer: str) -> list:
        """A new connection's Hello: the handshake's answer, then room for it (a client that said Hello before
        under the same client id, from the same address or key, takes its old connection's place)."""
        why = protocol.check_hello(msg, self.welcome)
        if why is not None:
            return [why]
        full = self.clients.hello(ident, msg.client, t1, peer)
        if full:
            return [protocol.Error("limit", full)]
        return [self.welcome]

    def handle_ping(self, c, msg: protocol.Ping, t1: float) -> list:
        return [protocol.Pong(msg.t0, t1, time.time())]

    def handle_hello(self, c, msg: protocol.Hello, t1: float) -> list:
        return [protocol.check_hello(msg, self.welcome) or self.welcome]

    def _refuse(self, c: ClientState, seq: str, gen: int, code: str, field_: str, message: str) -> None:
        self.log.refused(c.peer, code, f"{field_}: {message}")
        c.refused.append(refusal(seq, gen, code, f"{field_}: {message}"))

    def handle_open(self, c: ClientState, msg: protocol.Open, t1: float) -> list:
        why = self._open_error(c, msg)
        if why and why[1] == "sequences" and self._reclaim(c):
            why = self._open_error(c, msg)
        if why:
            self._refuse(c, msg.seq, msg.gen, *why)
            return []
        self._drop_waiting(c, msg.seq)
        s = Sampling(*protocol.sampling_args(msg))
        try:
            if msg.stream:
                seq = self.drafter.open_stream((c.ident, msg.seq), msg.gen, msg.prompt_ids, s, msg.seed, msg.q_top,
                                         msg.window)
                seq.watch, seq.send_branches = msg.watch, msg.branches
                self.drafter.alts = max(self.drafter.alts, msg.watch)
            else:
                self.drafter.open((c.ident, msg.seq), msg.gen, msg.prompt_ids, s, msg.seed, msg.q_top)
            self.parts.count("opened")
        except Full as e:
            self._refuse(c, msg.seq, msg.gen, "limit", "sequences", str(e))
        return []

    def _reclaim(self, c: ClientState) -> bool:
        """A row for c, refused one for want of free rows: the oldest idle sequence past cfg.idle_s (of another
        owner, while c holds less than its fair share) is freed, and its holder told `reclaimed`."""
        seq = self.clients.idle_row(c, self.cfg.idle_s)
        if seq is None:
            return False
        idle_s = time.perf_counter() - max(seq.stepped, seq.opened)
        self.drafter.free(seq.key)
        holder = self.clients.get(seq.key[0])
        if holder is not None:
            why = ("its connection closed" if holder.gone else
                   f"it drafted nothing for {idle_s:.1f} s (the server's idle_s is {self.cfg.idle_s:g})")
            self._refuse(holder, seq.key[1], seq.gen, "reclaimed", "idle_s", (
                f"sequence {seq.key[1]!r}: {why} while another client waited for a row: open it again to resume"))
        return True

    def _open_error(self, c: ClientState, msg: protocol.Open) -> tuple | None:
        """(code, field, message) for an Open that cannot be served; None when it can."""
        why = open_bounds(msg, self.limits, self.welcome.vocab_size)
        if why:
            return why
        if self.drafter.get((c.ident, msg.seq)) is not None:      # its own sequence again: no new row
            return None
        field_, full = self.clients.open_refusal(c)
        return ("limit", field_, full) if full else None

    def handle_rounds(self, c: ClientState, msg: protocol.Rounds, t1: float) -> list:
        lim = self.limits
        if len(msg.rows) > lim.rows_per_message:
            return [protocol.Error("limit", f"rows_per_message: {len(msg.rows)} rows in one Rounds, the most is "
                                            f"{lim.rows_per_message}: send them in several")]
        for row in msg.rows:
            why = self._row_error(c, row)
            if why:
                self._refuse(c, row.seq, row.gen, *why)
                continue
            seq = self.drafter.get((c.ident, row.seq))
            try:
                self.drafter.apply(seq, row.have, row.accepted, row.tokens)
            except Desync as e:
                self.drafter.free(seq.key)
                self._refuse(c, row.seq, row.gen, "desync", "have", f"{e}: open the sequence again (next generation)")
                continue
            c.waiting.append((seq, row.k, t1))
        return []

    def _row_error(self, c: ClientState, row: protocol.Row) -> tuple | None:
        """(code, field, message) for a row that cannot be drafted; None when it can."""
        seq = self.drafter.get((c.ident, row.seq))
        if seq is None or seq.gen != row.gen:
            held = "no such sequence" if seq is None else f"this draft holds generation {seq.gen}"
            return "desync", "gen", f"sequence {row.seq!r} generation {row.gen}: {held}; open it again"
        if seq.stream:
            return "bad-message", "seq", f"sequence {row.seq!r} is a stream: send Commits, not Rounds"
        if any(s is seq for s, _, _ in c.waiting):
            return "desync", "seq", f"sequence {row.seq!r} already has a round waiting: wait for its Drafts"
        return row_bounds(row, self.limits, self.welcome.vocab_size)

    def handle_commits(self, c: ClientState, msg: protocol.Commits, t1: float) -> list:
        """Pipelined: the client's settled tokens; a mismatch restarts that stream (its drafts past the position
        are dropped, a new epoch begins). Nothing is answered but refusals: drafts stream from the steps."""
        if len(msg.rows) > self.limits.rows_per_message:
            return [protocol.Error("limit", f"rows_per_message: {len(msg.rows)} commits in one message, the most "
                                            f"is {self.limits.rows_per_message}: send them in several")]
        foreseen, missed = [], []
        for row in msg.rows:
            seq = self.drafter.get((c.ident, row.seq))
            if seq is None or seq.gen != row.gen or not seq.stream:
                what = "no such stream" if seq is None or not seq.stream else f"this draft holds generation {seq.gen}"
                self._refuse(c, row.seq, row.gen, "desync", "gen", f"stream {row.seq!r} generation {row.gen}: {what}; "
                             "open it again")
            elif not 0 <= row.token < self.welcome.vocab_size:
                self._refuse(c, row.seq, row.gen, "bad-message", "token", f"token id {row.token} outside the "
                             f"vocabulary [0, {self.welcome.vocab_size})")
            elif seq.base + row.pos + 2 > self.limits.context - 1:      # (a stream drafts one token a step)
                self._refuse(c, row.seq, row.gen, "limit", "context", f"stream {row.seq!r} reaches position "
                             f"{seq.base + row.pos}, past this server's {self.limits.context} tokens: end it")
            else:
                try:
                    hit = self.verdicts.on_commit(seq, row.pos, row.token) if self.verdicts else None
                    if hit is not None:            # a foreseen verdict: the branch's drafts go out at once
                        foreseen = [r for r in foreseen if r.seq != row.seq]
                        foreseen += [self._stream_row(seq, p, d) for p, d in hit.out]
                    elif self.drafter.commit(seq, row.pos, row.token) and self.verdicts:
                        missed.append(row.seq)
                    if seq.read_pos == row.pos:
                        seq.read_at = t1           # (the timeline: read off the socket, perhaps during a step)
                except Desync as e:
                    self.drafter.free(seq.key)
                    self._refuse(c, row.seq, row.gen, "desync", "pos", f"{e}: open the stream again")
        if not (foreseen or missed):
            return []
        return [protocol.Streamed(foreseen, 0, 0.0, time.time(), len(self.drafter.streams()), 0,
                                  missed)]

    def handle_end(self, c: ClientState, msg: protocol.End, t1: float) -> list:
        self._drop_waiting(c, msg.req)
        self.drafter.free((c.ident, msg.req))
        return [protocol.Ended(msg.req)]

    def _drop_waiting(self, c: ClientState, seq: str) -> None:
        c.waiting = [w for w in c.waiting if w[0].key[1] != seq]

    # ------------------------------------------------------------------ the step

    def idle(self, sock) -> bool:
        """Between messages: the TTL sweep, one draft step over the waiting rows (and one over the streams), the
        refusals a step made, one chunk of prefill. True while work remains (refusals the prefill made included).
        With steps launched ahead, nothing until the step in flight is due (the loop serves messages meanwhile), or
        only its read while a prefill holds the next launch (wire.stepahead)."""
        if self.ahead is not None and (what := self.ahead.next()) != "launch":
            for ident, m in self._stream_ahead([], time.perf_counter()) if what == "read" else []:
                self._send(sock, ident, m)
            return True
        P = self.parts                  # (each part closed as the next begins: they add up to the loop's time)
        if not P.steps:                 # (no step since the last report: the wait for work is no step's)
            P.reset(counts=False)
            self._idle_end = P.since
        t = P.add("between", self._idle_end)     # the messages served since the last call, and any wait for them
        self.clients.expire()
        t = P.add("sweep", t)
        out = self.step()
        t = P.add("rounds", t)
        out += self.stream_step()
        t = P.add("streams", t)
        out += [(c.ident, self._drafts(c, [])) for c in self.clients.values() if c.refused]
        for ident, m in out:
            self._send(sock, ident, m)
        t = P.add("send", t)
        if self.ahead is None or self.ahead.flight is None:     # (no branch is planted while a step is in flight)
            self.scheduler.plan()        # (after the step's tokens went out: the live streams wait for nothing)
        t = P.add("plan", t)
        fed, failed, why = self.scheduler.prefill()
        if fed and self.ahead is not None:
            self.ahead.queued_behind(self.drafter.device)
        if why:
            self._fail([failed] if failed else [], "internal", "prefill", why)
        more = bool(fed) or self.scheduler.more(self.clients) or self.ahead is not None and self.ahead.flight is not None
        self._idle_end = P.add("prefill", t)
        if self.cfg.report_s and P.steps and self._idle_end - P.since >= self.cfg.report_s:
            self.log.line(f"the loop's parts: {P.line()}")
            P.reset()
        return more

    def _contained(self, batch: list, draft) -> dict:
        """draft(batch) with its errors contained (_guarded), {id(sequence): RowDrafted}."""
        done, out = self._guarded(batch, draft)
        return {id(s): d for (s, _), d in zip(done, out or [])}

    def _guarded(self, batch: list, run) -> tuple[list, object]:
        """run(batch) (a step: drafted, or launched) with its errors contained: rows past their own room (Overflow)
        are refused `limit` and the rest run again; any other error refuses every row of the step `internal`.
        Refused rows are freed (their clients open them again). (the rows run, the result); ([], None) when no row
        is left."""
        try:
            return batch, run(batch)
        except Overflow as e:
            bad = {id(s) for s, _ in e.seqs}
            self._fail([s for s, _ in e.seqs], "limit", "context", str(e))
            rest = [(s, k) for s, k in batch if id(s) not in bad]
            return self._guarded(rest, run) if rest else ([], None)
        except Exception as e:
            self._fail([s for s, _ in batch], "internal", "step", f"{type(e).__name__}: {e}")
            return [], None

    def _fail(self, seqs: list, code: str, field_: str, why: str) -> None:
        """A step's error: its sequences refused and freed; its verdict-cache branches (they carry their stream's
        key, not its row) are only dropped."""
        branches = [s for s in seqs if not self.drafter.holds(s)]
        if branches and self.verdicts is not None:
            self.verdicts.discard(branches)
        seqs = [s for s in seqs if self.drafter.holds(s)]
        dropped = f" ({len(branches)} verdict-cache branches dropped)" if branches else ""
        self.log.line(f"{len(seqs)} sequences refused and freed{dropped}: {field_}: {why}")
        for seq in seqs:
            self.drafter.free(seq.key)
            c = self.clients.get(seq.key[0])
            if c is not None:
                self._drop_waiting(c, seq.key[1])
                self._refuse(c, seq.key[1], seq.gen, code, field_, f"sequence {seq.key[1]!r}: {why}; open it again")

    def step(self) -> list[tuple[bytes, protocol.Drafts]]:
        """One batched draft step over the scheduler's rows: one Drafts per client."""
        picked = self.scheduler.rounds(self.clients)
        if not picked:
            return []
        t0 = time.time()
        c0 = self.drafter.dec.clock.seconds
        batch = [(seq, k) for _, rows in picked for seq, k, _ in rows]
        done = self._contained(batch, lambda b: self.overlap.run(self.drafter.draft, b))
        draft_s = self.drafter.dec.clock.seconds - c0
        self.steps += 1
        self.parts.steps += 1
        self.batches.append(len(batch))
        sent = []
        for c, rows in picked:
            c.waiting = [w for w in c.waiting if w not in rows]
            drafted = [(seq, done[id(seq)]) for seq, _, _ in rows if id(seq) in done]
            first = min(t for _, _, t in rows)
            c.seen = max(c.seen, time.time())        # the TTL counts from the end of its last piece of work
            sent.append((c.ident, self._drafts(c, drafted, len(batch), draft_s, t0 - first, first)))
        return sent

    def _drafts(self, c: ClientState, drafted: list, batch: int = 0, draft_s: float = 0.0, queued_s: float = 0.0,
                first: float = 0.0) -> protocol.Drafts:
        rows = [protocol.RowDraft(seq.key[1], seq.gen, d.tokens, d.q_idx, d.q_val) for seq, d in drafted]
        rows += c.refused
        c.refused = []
        held = (time.time() - first) * 1e3 if first else 0.0
        return protocol.Drafts(rows, batch, draft_s * 1e3, queued_s * 1e3, held,
                               max(held - queued_s * 1e3 - draft_s * 1e3, 0.0) if first else 0.0)

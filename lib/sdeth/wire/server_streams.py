"""The draft server's stream steps (a mixin of wire.server_core.DraftServer, whose __init__ sets the state it uses):
one batched step over the scheduler's streams and verdict-cache branches, one token each, inline or launched ahead
(wire.stepahead), and the StreamRows its tokens go out in."""
from __future__ import annotations

import time

from . import protocol

AHEAD_ROWS = 64          # rows of one Streamed message past which a step's branch tokens are not sent ahead (a hit's
                         # answer to its Commits carries its branch's drafts whole)


class StreamSteps:
    """DraftServer's stream steps (see the module docstring)."""

    def stream_step(self) -> list[tuple[bytes, protocol.Streamed]]:
        """One batched step over the scheduler's streams and branches: one token each, one Streamed per client."""
        t = time.perf_counter()
        rows, extra = self.scheduler.streams()
        t = self.parts.add("streams.schedule", t)
        if self.ahead is not None and self.ahead_now(extra):
            return self._stream_ahead(rows, t)
        if self.ahead is not None and self.ahead.flight is not None:
            return self._stream_ahead([], t)      # (branches due: the step in flight is read; they step inline)
        if not rows and not extra:
            return []
        c0 = self.drafter.dec.clock.seconds
        positions = {id(seq): len(seq.chain) for seq in rows}
        out = self._contained([(seq, 1) for seq in rows + extra],
                              lambda b: self.overlap.run(self.drafter.stream_step, [s for s, _ in b]))
        draft_ms = (self.drafter.dec.clock.seconds - c0) * 1e3
        t = self.parts.add("streams.run", t)
        self.steps += 1
        self.parts.steps += 1
        self.batches.append(len(rows) + len(extra))
        ahead = self.verdicts.took(out) if self.verdicts is not None else []
        stepped, held = time.time(), len(self.drafter.streams())
        msgs: dict[bytes, list] = {}
        for seq in rows:
            if (d := out.get(id(seq))) is not None:
                msgs.setdefault(seq.key[0], []).append(self._stream_row(seq, positions[id(seq)], d))
        for seq, b, pos, d in ahead:        # (branches of streams that asked for them, nearest fork first, bounded)
            if seq.send_branches and len(msgs.setdefault(seq.key[0], [])) < AHEAD_ROWS:
                msgs[seq.key[0]].append(self._branch_row(seq, b, pos, d))
        self.parts.add("streams.replies", t)
        return [(ident, protocol.Streamed(m, len(rows), draft_ms, stepped, held, len(extra)))
                for ident, m in msgs.items()]

    def ahead_now(self, extra: list) -> bool:
        """Whether this stream step is launched ahead: always without a verdict cache; with one, only while it holds
        no branch and has no spare row to plant one (a full server), so that no branch is planted or adopted while a
        step is in flight (adopting one hands its row to a stream that step may hold)."""
        return self.verdicts is None or not (extra or self.verdicts.branches() or self.verdicts.spare())

    def _stream_ahead(self, rows: list, t: float) -> list[tuple[bytes, protocol.Streamed]]:
        """The next stream step launched behind the one in flight (wire.stepahead), then the one in flight read:
        its kept tokens, one Streamed per client."""
        A, prev = self.ahead, self.ahead.flight
        _, nxt = self._guarded([(s, 1) for s in rows],
                               lambda b: self.drafter.launch_streams([s for s, _ in b], prev)) if rows else ([], None)
        t = self.parts.add("streams.run", t)
        if nxt is not None:
            self.steps += 1
            self.parts.steps += 1
            self.batches.append(len(rows))
        if prev is None:
            A.took(nxt, None, 0.0)
            return []
        try:
            kept = self.drafter.settle_streams(prev)
            prev_ms = self.drafter.dec.clock.elapsed(prev.mark) * 1e3
            self.drafter.dec.clock.settle_through(prev.mark)
        except Exception as e:
            held = [s for s, _ in prev.batch if self.drafter.holds(s)]
            self._fail(held, "internal", "step", f"{type(e).__name__}: {e}")
            kept, prev_ms = [], 0.0
        A.took(nxt, time.perf_counter(), prev_ms)
        t = self.parts.add("streams.wait", t)
        stepped, held, msgs = time.time(), len(self.drafter.streams()), {}
        for seq, pos, d in kept:
            msgs.setdefault(seq.key[0], []).append(self._stream_row(seq, pos, d))
        self.parts.add("streams.replies", t)
        return [(ident, protocol.Streamed(m, len(prev.batch), prev_ms, stepped, held, 0)) for ident, m in msgs.items()]

    @staticmethod
    def _stream_row(seq, pos: int, d) -> protocol.StreamRow:
        """A stream's drafted token at pos as a StreamRow (the first after a commit read carries its stamps)."""
        r = protocol.StreamRow(seq.key[1], seq.gen, seq.epoch, pos, d.tokens[0], d.q_idx[0] if d.q_idx else None,
                               d.q_val[0] if d.q_val else None, seq.read_pos, seq.read_at if seq.read_pos >= 0 else 0.0,
                               d.alts[0][:seq.watch] if seq.watch and d.alts else None)
        seq.read_pos = -1                   # (the timeline: the first draft after each commit read)
        return r

    @staticmethod
    def _branch_row(seq, b, pos: int, d) -> protocol.StreamRow:
        """A branch's drafted token at pos, sent ahead: valid if the target's token at b.pos is b.token."""
        return protocol.StreamRow(seq.key[1], seq.gen, seq.epoch, pos, d.tokens[0], d.q_idx[0] if d.q_idx else None,
                                  d.q_val[0] if d.q_val else None,
                                  alts=d.alts[0][:seq.watch] if seq.watch and d.alts else None, fork=b.pos,
                                  corr=b.token)

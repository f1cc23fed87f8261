"""The batched drafter's streams (a mixin of runtime.batchdraft.BatchDrafter, whose __init__ sets the state it
uses): a pipelined sequence drafts a token a step ahead of its client's commits (runtime.pipeline has the protocol;
runtime.streamdraft.StreamDrafter.commit the same rules for one stream in-process).

A stream step is either drafted and read at once (stream_step) or launched ahead of its read (launch_streams, then
settle_streams): the draft server launches the next step just before the one in flight ends, feeding each stream's
token of that step on the device, so that the device never waits for the host between steps while commits are
still taken until then. A step launched ahead keeps a stream's token only if nothing it could not foresee came
between its launch and its read (Sequence.lineage: a commit that restarts the stream or extends its chain, the
stream freed, an earlier token dropped); a dropped token is never sent, so the output is the same either way.
"""
from __future__ import annotations

import time

from .batchseq import Desync, FlightRow, Launched, RowDrafted, Sequence
from .verify import Sampling


class StreamRows:
    """BatchDrafter's streams (see the module docstring)."""

    def open_stream(self, key: tuple, gen: int, prompt_ids: list[int], s: Sampling, seed: int, q_top: int,
                    window: int) -> Sequence:
        """A pipelined sequence: drafted a token a step (stream_step), up to `window` tokens past the last
        position its client settled; the client's commits follow runtime.pipeline's rules
        (runtime.streamdraft.StreamDrafter.commit)."""
        seq = self.open(key, gen, prompt_ids, s, seed, q_top)
        seq.stream, seq.window, seq.base = True, window, len(prompt_ids)
        return seq

    def commit(self, seq: Sequence, pos: int, token: int) -> bool:
        """The client's token at stream position pos (earlier positions settled as drafted, or as earlier commits
        said): a token that differs from the draft's restarts the stream there (True: a new epoch, drafts past
        pos dropped); pos just past the chain extends it. Desync past that."""
        if pos > len(seq.chain) or pos < 0:
            raise Desync(f"commit at stream position {pos}, but the draft's chain ends at {len(seq.chain) - 1}")
        restart = pos < len(seq.chain) and seq.chain[pos] != token
        if pos == len(seq.chain):
            seq.chain.append(token)
            seq.pending.append(token)
            seq.n += 1
            seq.lineage += 1                # (a step in flight drafted this position: its token is not kept)
        elif restart:
            p = seq.base + pos
            keep = seq.pending[:p - seq.fed] if p > seq.fed else []
            seq.fed = min(seq.fed, p)
            seq.pending, seq.n = keep + [token], p + 1
            seq.chain = seq.chain[:pos] + [token]
            seq.epoch += 1
            seq.lineage += 1
        seq.acked = max(seq.acked, pos + 1)
        seq.alts = {p: a for p, a in seq.alts.items() if p > pos}
        seq.read_at, seq.read_pos = time.time(), pos
        return restart

    def stream_step(self, seqs: list[Sequence]) -> list[RowDrafted]:
        """One batched step over streams with room: each drafts its next token (its position: len(chain) before
        the step), which becomes part of its chain. A stream whose target ran ahead (commits past its chain, up
        to CATCH_UP tokens) is caught up in the same step: its tokens are fed in the step's first forward."""
        out = self.draft([(seq, 1) for seq in seqs])
        for seq, d in zip(seqs, out):
            self._extend(seq, d)
        return out

    @staticmethod
    def _extend(seq: Sequence, d: RowDrafted) -> None:
        """A drafted token becomes the chain's next position (its first choices kept there) and the next step's
        input."""
        if d.alts:
            seq.alts[len(seq.chain)] = d.alts[0]
        seq.chain.append(d.tokens[0])
        seq.pending, seq.n, seq.prev = [d.tokens[0]], seq.n + 1, []

    def launch_streams(self, seqs: list[Sequence], prev: Launched | None = None) -> Launched:
        """stream_step launched ahead of its read: one token for each stream, queued behind `prev` (the step in
        flight, or None), nothing read. A stream whose row of prev is still valid (nothing came since its launch
        that it could not foresee: Sequence.lineage) is fed prev's token on the device, at prev's next position;
        the others feed their pending tokens. settle_streams(L) reads it later. Between the two, commits are taken
        as usual (commit()): a restart, a commit past the chain or a freed stream drops prev's token for it, and
        the token of every step launched on it."""
        feed = {}
        for seq in seqs:
            fr = seq.ahead_row()
            if fr is not None and fr.launched is prev:
                feed[id(seq)] = fr
        L = self.launch([(seq, 1) for seq in seqs], feed)
        for seq in seqs:
            fr = feed.get(id(seq))
            seq.flight = (FlightRow(L, seq.row, fr.pos + 1, fr.n + 1, seq.lineage) if fr is not None
                          else FlightRow(L, seq.row, len(seq.chain), seq.n, seq.lineage))
            L.rows.append(seq.flight)
        return L

    def settle_streams(self, L: Launched) -> list[tuple[Sequence, int, RowDrafted]]:
        """A stream step launched ahead read to the host (waiting for it alone): (stream, position, its token) for
        each stream whose token is kept (its lineage unchanged since the launch, still held, nothing committed at
        the position); the others' tokens are dropped (a step launched on such a token was launched before the
        lineage changed, and drops its token too)."""
        clk = time.perf_counter()
        host = L.copy.value()
        clk = self.parts.add("draft.wait", clk)
        out, now = [], time.perf_counter()
        for (seq, _), fr in zip(L.batch, L.rows):
            if seq.flight is fr:
                seq.flight = None
            if not self.holds(seq) or seq.lineage != fr.lineage:   # (a step launched since began from its host state)
                continue
            if len(seq.chain) != fr.pos or seq.n != fr.n:          # (never, as commit() bumps the lineage: kept safe)
                seq.lineage += 1
                continue
            d = self._drafted(fr.row, 1, host[fr.row], L.qs, seq.q_top)
            seq.fed, seq.ahead, seq.drafted, seq.stepped = fr.n, 0, seq.drafted + 1, now   # (the step fed up to n)
            self._extend(seq, d)
            out.append((seq, fr.pos, d))
        self.parts.add("draft.settle", clk)
        return out

"""Drafting for many independent sequences at once: a table of sequences over one BatchDecoder.

    d = BatchDrafter(decoder, vocab)
    seq = d.open(key, gen, prompt_ids, sampling, seed, q_top)     # a cache row; the prompt waits to be fed
    d.prefill(budget)                                           # feed waiting prompts, a chunk at a time
    d.apply(seq, have, accepted, tokens)                         # the client's verdict on the last proposal
    out = d.draft([(seq, k), ...])                               # one batched proposal per sequence

A sequence's context is what its client has settled: `n` tokens, of which `fed` are in its cache row and
`pending` wait to be fed; past the context the row holds the first `ahead` tokens of the last proposal
(`prev`). A round's verdict (apply) says how many of `prev` the client accepted and which tokens follow;
the client also says how many tokens it believes the draft holds (`have`): any disagreement is a Desync
(the client then opens the sequence again, under the next generation), never a wrong draft.

draft() feeds every row's pending tokens (the target's token, after the last draft token when all were
accepted; or, for a stream whose target ran ahead of it, every token the target committed since, up to
CATCH_UP) in one step of the smallest width that holds them (batchmodel.WIDTHS: a row with fewer tokens
repeats its first at its own position), then drafts k tokens, each step's tokens feeding the next on the device; the tokens of all rows reach the host
in one read at the end. Rows with a smaller k draft along (their extra tokens are dropped; the cache
entries past a row's context are stale and masked by position).
"""
from __future__ import annotations

import time

import torch

from .batchmodel import BatchDecoder, upload, width
from .batchseq import CATCH_UP, Desync, Full, Launched, Overflow, RowDrafted, Sequence
from .batchstreams import StreamRows
from .engine import HostCopy
from .loop import draft_token, q_support
from .parts import Parts
from .verify import Sampling

WARM_S = 1.0            # a sequence that drafted within this many seconds is warm: it keeps a low cache row (see draft)


class BatchDrafter(StreamRows):
    def __init__(self, decoder: BatchDecoder, vocab: int, chunk: int = 256):
        self.dec, self.vocab, self.chunk = decoder, vocab, chunk
        self.free_rows = list(range(decoder.rows))
        self.seqs: dict[tuple, Sequence] = {}
        self.last_batch = 0            # rows in the newest draft step
        self.alts = 0                  # the draft's next choices kept per drafted token (0: none)
        self.cache = None              # a runtime.verdictcache.VerdictCache: its branches hold free rows
        self.warm_s = WARM_S           # see draft(): how recently a sequence drafted to keep a low row
        self.moves = 0                 # sequences moved to a lower row (their cache copied) so far
        self.parts = Parts()           # a step's parts (draft.pack, .inputs, .launch, .wait, .settle), a fork's
                                       # (plan.copy, plan.rows); the draft server adds its loop's to the same

    @property
    def device(self):
        return self.dec.device

    def capacity_for(self, k: int) -> int:
        """The longest context a sequence may reach and still draft k tokens."""
        return self.dec.capacity - k - 1

    def get(self, key: tuple) -> Sequence | None:
        """The sequence under key (None: no such sequence)."""
        return self.seqs.get(key)

    def holds(self, seq: Sequence) -> bool:
        """Whether seq is a sequence of the table (a verdict-cache branch is not)."""
        return self.seqs.get(seq.key) is seq

    def held(self) -> int:
        """Sequences the table holds (each a cache row)."""
        return len(self.seqs)

    def sequences(self) -> list[Sequence]:
        return list(self.seqs.values())

    def streams(self) -> list[Sequence]:
        return [s for s in self.seqs.values() if s.stream]

    def keys_of(self, client) -> list[tuple]:
        """The keys of one client's sequences (key[0] is the client)."""
        return [key for key in self.seqs if key[0] == client]

    def feeding(self) -> list[Sequence]:
        """The sequences whose prompts wait to be prefilled."""
        return [s for s in self.seqs.values() if len(s.pending) > CATCH_UP]

    def rekey(self, old, new) -> int:
        """Client old's sequences become client new's (same sequence ids, rows and state); returns how many."""
        moved = self.keys_of(old)
        for key in moved:
            seq = self.seqs.pop(key)
            seq.key = (new, key[1])
            self.seqs[seq.key] = seq
        return len(moved)

    def open(self, key: tuple, gen: int, prompt_ids: list[int], s: Sampling, seed: int, q_top: int) -> Sequence:
        """A new sequence (an old one under the same key is replaced). Its prompt is fed by prefill()."""
        if key in self.seqs:
            self.free(key)
        if self.cache is not None:
            self.cache.opened()
            if not self.free_rows:
                self.cache.evict(1)        # a live sequence before any branch
        if not self.free_rows:
            raise Full(f"all {self.dec.rows} cache rows hold sequences")
        self.free_rows.sort()
        rng = torch.Generator(device=self.device).manual_seed(seed)
        self.dec.open_row(self.free_rows[0], prompt_ids)
        seq = Sequence(key, gen, self.free_rows.pop(0), s, rng, q_top, n=len(prompt_ids), pending=list(prompt_ids),
                       seed=seed)
        self.seqs[key] = seq
        return seq

    def free(self, key: tuple) -> Sequence | None:
        seq = self.seqs.pop(key, None)
        if seq is not None:
            self.free_rows.append(seq.row)
            if self.cache is not None:
                self.cache.drop(seq)
        return seq

    def fork(self, forks: list[tuple[Sequence, int, int]]) -> list[Sequence]:
        """Branches of streams, one per (stream, position, token): each takes a free row holding its stream's
        context before the position (one slice copy per layer for all), then the token at the position (fed by its
        first step); a branch drafts a token a step like a stream (stream_step) but is no sequence of the table.
        Each position must be in its stream's cache row (base + pos <= fed); Full when rows run out."""
        if len(forks) > len(self.free_rows):
            raise Full(f"{len(forks)} branches, {len(self.free_rows)} free cache rows")
        bad = [(s.key, p) for s, p, _ in forks if not 0 <= s.base + p <= s.fed]
        if bad:
            raise ValueError(f"branches at {bad}: a branch starts inside its stream's fed context")
        self.free_rows.sort()
        rows = self.free_rows[:len(forks)]
        t = time.perf_counter()
        self.dec.copy_prefix([s.row for s, _, _ in forks], rows, max(s.base + p for s, p, _ in forks) if forks else 0)
        t = self.parts.add("plan.copy", t)
        del self.free_rows[:len(forks)]           # (taken once the copy went through)
        out = []
        for (seq, pos, token), row in zip(forks, rows):
            p = seq.base + pos
            seed = hash((seq.seed, seq.epoch, pos, token)) & (2 ** 62 - 1)     # (ints hash the same in every run)
            rng = torch.Generator(device=self.device).manual_seed(seed)
            out.append(Sequence(seq.key, seq.gen, row, seq.s, rng, seq.q_top, n=p + 1, fed=p,
                                pending=[token], stream=True, window=seq.window, base=seq.base,
                                chain=seq.chain[:pos] + [token], acked=pos + 1, epoch=seq.epoch, seed=seq.seed,
                                watch=seq.watch, send_branches=seq.send_branches))
        self.parts.add("plan.rows", t)
        return out

    def adopt(self, seq: Sequence, branch: Sequence) -> None:
        """The stream takes its branch's row and drafts (the client's token at the fork was the branch's): a new
        epoch from the fork on, as commit() would start, with the branch's continuation already drafted."""
        self.free_rows.append(seq.row)
        pos = branch.acked - 1
        seq.row, seq.fed, seq.pending, seq.n = branch.row, branch.fed, branch.pending, branch.n
        seq.chain, seq.prev, seq.acked, seq.epoch = branch.chain, [], branch.acked, seq.epoch + 1
        seq.alts = {p: a for p, a in branch.alts.items() if p > pos}
        seq.read_at, seq.read_pos = time.time(), pos
        seq.stepped = branch.stepped

    def release(self, branch: Sequence) -> None:
        """A branch's row back to the free rows."""
        self.free_rows.append(branch.row)

    def apply(self, seq: Sequence, have: int, accepted: int, tokens: list[int]) -> None:
        """The client's verdict: `accepted` of the last proposal, then `tokens` (the target's); `have`: the
        context length the client believes this draft holds. Desync when it does not."""
        if have != seq.n or not 0 <= accepted <= len(seq.prev):
            raise Desync(f"the client says the draft holds {have} tokens and accepted {accepted} of a "
                         f"{len(seq.prev)}-token proposal; the draft holds {seq.n} tokens of generation {seq.gen}")
        kept = min(accepted, seq.ahead)
        seq.fed += kept
        seq.pending += seq.prev[kept:accepted] + list(tokens)
        seq.n += accepted + len(tokens)
        seq.prev, seq.ahead = [], 0

    def prefill(self, budget: int | None = None) -> int:
        """Feed waiting prompts (all but their last token), shortest first (a new short sequence is not held
        behind a long one), in chunks of at most `chunk` tokens, until `budget` tokens are fed; returns the
        tokens fed (0: nothing waits)."""
        budget = budget or self.chunk
        done = 0
        for seq in sorted((s for s in self.seqs.values() if len(s.pending) > CATCH_UP), key=lambda s: len(s.pending)):
            while len(seq.pending) > CATCH_UP and done < budget:
                take = min(len(seq.pending) - 1, self.chunk, budget - done)
                self.parts.count("prefill.behind" if seq.drafted else "prefill.prompt", take)
                self._feed(seq, seq.pending[:take])
                seq.pending = seq.pending[take:]
                done += take
        return done

    def _feed(self, seq: Sequence, ids: list[int]) -> None:
        t0 = time.perf_counter()
        self.dec.prefill(ids, seq.fed, seq.row)
        seq.fed += len(ids)
        seq.prefill_s += time.perf_counter() - t0

    def waiting(self) -> bool:
        """Whether a prompt waits to be prefilled."""
        return bool(self.feeding())

    def draft(self, batch: list[tuple[Sequence, int]]) -> list[RowDrafted]:
        """One proposal of k tokens for each (sequence, k), all rows in the same steps; each sequence must be
        ready. Returns the proposals in batch order. Each row feeds its drafts only up to its own k (n + k slots;
        past that, to the scratch slot), so a short row beside a long one never writes past its cache row;
        Overflow (nothing drafted) names the rows whose own n + k passes the capacity."""
        if not batch:
            return []
        return self.finish(self.launch(batch))

    def launch(self, batch: list[tuple[Sequence, int]], feed: dict | None = None) -> Launched:
        """draft()'s device work, queued (nothing here waits for the device). feed: {id(sequence): the step in
        flight's row of it} for streams whose next input is that step's token, still on the device (it is taken
        there: launch_streams)."""
        feed = feed or {}
        state = [self._state(s, feed) for s, _ in batch]
        over = [(s, k) for (s, k), (_, _, n) in zip(batch, state) if n + k > self.dec.capacity]
        if over:
            raise Overflow(over, self.dec.capacity)
        clk = time.perf_counter()             # (the step's parts: runtime.parts)
        self._pack(batch, feed)
        clk = self.parts.add("draft.pack", clk)
        R = max(s.row for s, _ in batch) + 1
        K = max(k for _, k in batch)
        W = width(max(len(p) for p, _, _ in state))
        ids, pos, slots, base, stop = self._inputs(batch, state, R, W, feed)
        clk = self.parts.add("draft.inputs", clk)
        top = max(n for _, _, n in state)
        logits = self.dec.step(ids, pos, slots, top)
        mark = self.dec.clock.last()
        active = slots[:, -1] < self.dec.capacity
        toks, qs, alts = [], [], []
        for i in range(K):
            t, q = self._choose(logits, batch, i)
            toks.append(t)
            qs.append(q)
            if self.alts:                       # the draft's first choices (the drawn token is left out below)
                alts.append(logits[:, :self.vocab].topk(self.alts + 1, -1).indices)
            if i < K - 1:
                p = base + i                    # [R]; a row past its own n + k writes the scratch slot
                slot = torch.where(active & (p < stop), p, self.dec.capacity)
                logits = self.dec.step(t[:, None], torch.minimum(p, stop - 1)[:, None], slot[:, None],
                                       max(min(s.n + i, s.n + k - 1) for s, k in batch) + 1)
        tk = torch.stack(toks, 1)
        copy = HostCopy(torch.cat([tk[:, :, None], torch.stack(alts, 1)], 2) if alts else tk)
        self.parts.add("draft.launch", clk)
        self.last_batch = len(batch)
        return Launched(batch, toks, qs, copy, mark, t_launch=time.perf_counter())

    def finish(self, L: Launched) -> list[RowDrafted]:
        """A launched step read to the host (waiting for it alone) and settled: each sequence's proposal."""
        clk = time.perf_counter()
        host = L.copy.value()
        clk = self.parts.add("draft.wait", clk)
        out = [self._settle(seq, k, host[seq.row], L.qs) for seq, k in L.batch]
        self.parts.add("draft.settle", clk)
        return out

    @staticmethod
    def _state(seq: Sequence, feed: dict) -> tuple[list[int], int, int]:
        """(the tokens a step feeds, where they begin, the context after them) of a batch row: a row fed from the
        step in flight feeds its one token (a placeholder here) at that step's n."""
        fr = feed.get(id(seq))
        return ([0], fr.n, fr.n + 1) if fr is not None else (seq.pending, seq.fed, seq.n)

    def _pack(self, batch: list[tuple[Sequence, int]], feed: dict) -> None:
        """Before a step: every row of the batch below the count of warm sequences (those that drafted within
        warm_s, and the batch's own), so that the step, which computes cache rows 0..max(row), computes no more
        rows than are warm: a sequence whose client went quiet costs no one's step, whatever row it holds. A
        batch row above that count trades rows (and caches: one slice copy per layer) with a cold sequence or a
        free row below it; in steady traffic nothing moves."""
        now, stepping = time.perf_counter(), {id(s) for s, _ in batch}
        held = self._occupants()
        warm = {id(s) for s in held.values() if id(s) in stepping or now - max(s.stepped, s.opened) < self.warm_s
                or s.flight is not None}
        top = len(warm)
        # (a verdict-cache branch is never moved: it lives a few steps, and the copy of its context costs more)
        movers = [s for s, _ in batch if s.row >= top and self.seqs.get(s.key) is s]
        if not movers:
            return
        lows = [r for r in range(top) if r not in held or id(held[r]) not in warm]
        for seq, row in zip(movers, lows):
            self._trade(seq, row, held.get(row), feed)

    def _trade(self, seq: Sequence, row: int, other: Sequence | None, feed: dict) -> None:
        """seq takes `row` (and its cache prefix); other, the cold sequence or branch there (None: a free row),
        takes seq's old row."""
        old = seq.row
        fed = max(seq.fed, feed[id(seq)].n if id(seq) in feed else 0)     # (the step in flight feeds up to its n)
        n = min(max(fed + seq.ahead, other.fed + other.ahead if other else 0) + 1, self.dec.capacity)
        if other is None:
            self.dec.copy_prefix([old], [row], n)
            self.free_rows.remove(row)
            self.free_rows.append(old)
        else:
            self.dec.copy_prefix([old, row], [row, old], n)           # (a swap: the source rows are read first)
            other.row = old
        seq.row = row
        self.moves += 1
        self.parts.count("moved")

    def _occupants(self) -> dict[int, Sequence]:
        """Cache row -> the sequence or verdict-cache branch on it."""
        held = {s.row: s for s in self.seqs.values()}
        if self.cache is not None:
            held.update({b.row.row: b.row for b in self.cache.branches()})
        return held

    def _inputs(self, batch, state, R: int, W: int, feed: dict):
        """The first step's ids, positions and slots [R, W] (rows not in the batch write to the scratch
        slot), each row's first drafted position [R] and the end of its own drafts (n + k) [R], on the device
        in one copy; a row fed from the step in flight takes that step's token there (its row: `src`)."""
        cap = self.dec.capacity
        ids, pos, slots = [[0] * W] * R, [[0] * W] * R, [[cap] * W] * R     # (rows are replaced, never mutated)
        base, stop, src = [[0] * W] * R, [[1] * W] * R, [[-1] * W] * R
        for (seq, k), (pending, fed, n) in zip(batch, state):
            pad = W - len(pending)              # a row with fewer tokens repeats its first at its own position
            ids[seq.row] = pending[:1] * pad + pending
            pos[seq.row] = slots[seq.row] = [fed] * pad + list(range(fed, n))
            base[seq.row], stop[seq.row] = [n] * W, [n + k] * W
            if id(seq) in feed:
                src[seq.row] = [feed[id(seq)].row] * W
        rows = [ids, pos, slots, base, stop] + ([src] if feed else [])
        t = upload(rows, self.device)                  # (one tensor from lists: a step's host work grows with its rows)
        ids = t[0]
        if feed:                                       # (the token of the step in flight, read on the device)
            prev = next(iter(feed.values())).launched.toks[0]
            ids = torch.where(t[5] >= 0, prev[t[5].clamp(0, prev.shape[0] - 1)], ids)
        return ids, t[1], t[2], t[3][:, 0], t[4][:, 0]

    def _choose(self, logits, batch, i: int):
        """Step i's token per row: argmax for greedy rows, a draw from q for sampled ones (their q kept)."""
        logits = logits[:, :self.vocab]         # the pair's shared tokenizer (padded rows are never proposed)
        t = logits.argmax(-1)
        qs = {}
        for seq, k in batch:
            if i < k and not seq.s.greedy and seq.s.draft_sampled:
                tok, q = draft_token(logits[seq.row], seq.s, seq.rng, seq.q_top)
                t[seq.row] = tok
                qs[seq.row] = q
        return t, qs

    def _settle(self, seq: Sequence, k: int, row_tokens: list, qs: list[dict]) -> RowDrafted:
        out = self._drafted(seq.row, k, row_tokens, qs, seq.q_top)
        seq.fed, seq.pending = seq.n, []
        seq.prev, seq.ahead = out.tokens, min(k, len(row_tokens) - 1)     # (row_tokens: the step's K tokens)
        seq.drafted += 1
        seq.stepped = time.perf_counter()
        return out

    def _drafted(self, row: int, k: int, row_tokens: list, qs: list[dict], q_top: int) -> RowDrafted:
        """One row's proposal from the host copy of its step's tokens (and its q: qs[i][row] for a sampled row)."""
        choices = None
        if row_tokens and isinstance(row_tokens[0], list):    # [token, first choices...] per step
            choices = [[a for a in r[1:] if a != r[0]][:self.alts] for r in row_tokens[:k]]
            row_tokens = [r[0] for r in row_tokens]
        out = RowDrafted(row_tokens[:k], alts=choices)
        if row in qs[0]:
            top = q_support(torch.stack([qs[i][row] for i in range(k)]), q_top)
            out.q_idx, out.q_val = top.indices.tolist(), top.values.tolist()
        return out

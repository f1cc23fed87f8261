"""The event model of N targets sharing one draft GPU in sync rounds (simulate_shared): each round's requests,
batches, verifies and accepted tokens, event by event."""
from __future__ import annotations

import heapq

import numpy as np

from .steptables import Tables


def _group_rows(batch: int, groups: int) -> int:
    if groups < 1 or batch % groups:
        raise ValueError(f"batch {batch} does not split into {groups} equal groups of streams")
    return batch // groups


class _SharedSim:
    """simulate_shared's state. A client is one group of one target's streams. Events (time, order, seq, client):
    order 0 a client's request reaches the draft server, 1 the draft may start a batch (after every request of
    the same instant), 2 a batch ends."""

    def __init__(self, tables: Tables, alpha: float, k: int, batch: int, n: int, groups: int, rounds: int,
                 seed: int, jitter: float, request_tokens: int):
        self.tables, self.alpha, self.k, self.groups, self.rounds = tables, alpha, k, groups, rounds
        self.jitter, self.request_tokens = jitter, request_tokens
        self.rows = _group_rows(batch, groups)                  # streams per client
        self.rng = np.random.default_rng(seed)
        self.verify_s = tables.t_v(self.rows, k)
        clients = n * groups
        start = k * tables.t_d(self.rows) + tables.rtt_s + self.verify_s + tables.host_s
        self.sent = [c * start / clients for c in range(clients)]   # clients start out of phase
        self.target_free = [0.0] * n                            # when each target GPU ends its last verify
        self.done = [0] * clients                               # rounds finished
        self.warm = max(rounds // 10, 1)                        # rounds left out of the statistics
        self.t_warm, self.t_end, self.tokens = [0.0] * clients, [0.0] * clients, [0] * clients
        self.req_tok = np.zeros((clients, self.rows))           # [clients, rows] the current request's tokens
        self.req_time = np.zeros((clients, self.rows))          # [clients, rows] ... and seconds
        self.tpots, self.waits, self.round_s, self.batch_rows = [], [], [], []
        self.queue, self.in_batch, self.arrived, self.busy_s, self.verify_busy = [], [], {}, 0.0, 0.0
        self.free, self.seq, self.events = True, 0, []
        for c, s in enumerate(self.sent):
            self._push(s + tables.rtt_s / 2, 0, c)

    def _push(self, t: float, order: int, client: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, order, self.seq, client))

    def run(self) -> None:
        while self.events:
            t, order, _, c = heapq.heappop(self.events)
            if order == 0:
                self.queue.append(c)
                self.arrived[c] = t
                if self.free:
                    self._push(t, 1, -1)
            elif order == 1 and self.free and self.queue:
                self._start(t)
            elif order == 2:
                self._finish(t)

    def _start(self, t: float) -> None:
        self.in_batch, self.queue, self.free = self.queue, [], False
        dur = self.k * self.tables.t_d(len(self.in_batch) * self.rows)
        self.busy_s += dur
        self.batch_rows.append(len(self.in_batch) * self.rows)
        self.waits.extend(t - self.arrived[c] for c in self.in_batch)
        self._push(t + dur, 2, -1)

    def _finish(self, t: float) -> None:
        """The batch's drafts go back; each client's target verifies them in turn (one verify at a time per
        target GPU), counts the tokens and sends the client's next request."""
        coins = self.rng.random((len(self.in_batch), self.rows, self.k)) < self.alpha
        made = np.cumprod(coins, axis=2).sum(axis=2) + 1        # [clients, rows] accepted drafts + 1
        tb = self.tables
        for j, c in enumerate(self.in_batch):
            verify = self.verify_s * max(0.0, 1 + self.jitter * self.rng.standard_normal()) if self.jitter \
                else self.verify_s
            gpu = c // self.groups
            begin = max(t + tb.rtt_s / 2, self.target_free[gpu])
            nxt = self.target_free[gpu] = begin + verify + tb.host_s   # the next request leaves the target
            self.verify_busy += verify + tb.host_s
            self._count(c, nxt - self.sent[c], made[j], nxt)
            self.sent[c] = nxt
            if self.done[c] < self.rounds:
                self._push(nxt + tb.rtt_s / 2, 0, c)
        self.free = True
        if self.queue:
            self._push(t, 1, -1)

    def _count(self, c: int, dur: float, made, now: float) -> None:
        self.done[c] += 1
        if self.done[c] <= self.warm:
            self.t_warm[c] = now
            return
        self.t_end[c] = now
        self.tokens[c] += int(made.sum())
        self.round_s.append(dur)
        self.req_tok[c] += made
        self.req_time[c] += dur
        full = self.req_tok[c] >= self.request_tokens
        self.tpots.extend(self.req_time[c][full] / self.req_tok[c][full])
        self.req_tok[c][full], self.req_time[c][full] = 0, 0.0

    def result(self) -> dict:
        n, streams = len(self.target_free), len(self.sent) * self.rows
        rate = sum(tok / (end - w) for tok, end, w in zip(self.tokens, self.t_end, self.t_warm) if end > w)
        tpots, span = self.tpots or [float("nan")], max(self.t_end)
        return {"tpot_ms_p50": float(np.percentile(tpots, 50)) * 1e3,
                "tpot_ms_p99": float(np.percentile(tpots, 99)) * 1e3,
                "tpot_ms_mean": streams / rate * 1e3 if rate else float("nan"),
                "tok_s_per_gpu": rate / (n + 1),
                "draft_busy_frac": self.busy_s / span, "target_busy_frac": self.verify_busy / span / n,
                "queue_ms_mean": float(np.mean(self.waits)) * 1e3,
                "round_ms_mean": float(np.mean(self.round_s)) * 1e3,
                "rows_per_batch_mean": float(np.mean(self.batch_rows))}


def simulate_shared(tables: Tables, alpha: float, k: int, B: int, N: int, rounds: int = 2000, seed: int = 0,
                    groups: int = 1, jitter: float = 0.0, request_tokens: int = 128) -> dict:
    """Event model of N targets x B streams sharing one draft GPU, sync rounds. Each target's streams form
    `groups` clients of B / groups streams. A client's request crosses rtt/2 to the draft server; when the draft
    is free it takes every waiting request as one batch (FIFO) and drafts k tokens for its rows in k t_d(rows);
    the drafts cross rtt/2 back; the client's target verifies them in t_v(B / groups, k) (x (1 + jitter x
    normal)) once it has verified what came before, spends host_s, and sends the client's next request. Each
    stream accepts each draft with probability alpha until the first rejection and makes accepted + 1 tokens a
    round. Clients start out of phase; each runs `rounds` rounds, the first tenth left out of the statistics.
    Returns TPOT percentiles over requests of request_tokens tokens (decode only), tokens/s per GPU over the
    N + 1 GPUs, the draft's and targets' busy fractions, the mean wait at the draft, the mean round and rows
    per draft batch."""
    if N < 1 or B < 1 or k < 1 or rounds < 2:
        raise ValueError(f"N {N}, B {B}, k {k}, rounds {rounds}: need N, B, k >= 1 and rounds >= 2")
    sim = _SharedSim(tables, alpha, k, B, N, groups, rounds, seed, jitter, request_tokens)
    sim.run()
    return sim.result()

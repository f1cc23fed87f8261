"""Tokens/s per GPU against time per output token (TPOT): target-only replicas, colocated SD, remote shared SD
(N target GPUs sharing one draft GPU over the network) and EAGLE-3 (modelled), from step tables.

Terms: B streams decode on each target GPU; a round drafts k tokens per stream; t(B) is a target step at batch
B; t_v(B, k) the target forward that verifies k drafts (width k + 1) for B streams; t_d(R) a draft step over R
rows. A round yields E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) tokens per stream (costmodel.expected_tokens).
    TPOT = round / E        tokens/s per GPU = streams / TPOT / GPUs
Replicas: round = t(B), E = 1. Colocated: round = k t_d(B) + t_v(B, k) + host. Remote shared: N targets and
1 draft GPU (N + 1 GPUs); shared_round_s gives the closed form, simulate_shared the event model. In sync rounds
a target idles while its drafts are made, so with one group of streams remote SD cannot beat colocated SD at the
same B (its round is colocated's plus rtt, at best). With `groups` >= 2 a target verifies one group while the
draft works for another; that pays where G verifies of B/G streams cost about one of B (compute-bound).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from ...costmodel import expected_tokens

KINDS = ("replica", "colocated", "remote", "pipelined", "eagle3")
KS = tuple(range(1, 9))
NS = (1, 2, 4, 8, 16, 32)

# EAGLE-3's acceptance length tau: tokens per round per stream, the target's own token included.
# Chain drafting (what eagle_points models): vLLM with the authors' EAGLE-3 head for LLaMA-3.1-8B-Instruct
# (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), k = 7 chained drafts, MT-bench (80 prompts), temperature 0: 3.53 (4816
# rounds, 12208 drafts accepted), the reference figure vLLM's report of a later regression quotes.
EAGLE3_CHAIN = {"tau": 3.53, "k": 7, "url": "https://github.com/vllm-project/vllm/issues/26191",
                "what": "vLLM, EAGLE3-LLaMA3.1-Instruct-8B, chain k=7, MT-bench, temperature 0"}
# The paper's own figure is for a draft tree, not a chain (arXiv 2503.01840, Table 1, LLaMA-Instruct 3.1 8B,
# MT-bench, temperature 0: tau 6.13; depth 8, 60 tokens verified per round). An upper bound for a chain here.
EAGLE3_PAPER_TREE = {"tau": 6.13, "k": 8, "url": "https://arxiv.org/abs/2503.01840",
                     "what": "EAGLE-3 paper, Table 1, LLaMA-Instruct 3.1 8B, MT-bench, T=0, tree of 60 tokens"}
EAGLE3_TAU, EAGLE3_K = EAGLE3_CHAIN["tau"], EAGLE3_CHAIN["k"]
# EAGLE-3's lm_head in units of one Qwen3-8B decoder layer: a 32,000-token draft vocabulary x 4096 (131M weights)
# over a layer's 193M (attention 4096 x (4096 + 1024 + 1024 + 4096), MLP 3 x 4096 x 12288).
EAGLE3_LM_HEAD_LAYERS = 0.68


def _interp(points: dict, x: float) -> float:
    """Linear in x between measured points; the first value below them; the last two's line above them, never
    below the last value (a step does not get cheaper with more work)."""
    xs = sorted(points)
    if x <= xs[0] or len(xs) == 1:
        return points[xs[0]]
    hi = next((p for p in xs if p >= x), None)
    if hi == x:
        return points[x]
    x0, x1 = (xs[-2], xs[-1]) if hi is None else (xs[xs.index(hi) - 1], hi)
    y = points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)
    return max(y, points[xs[-1]]) if hi is None else y


@dataclass
class Tables:
    """Step costs in seconds, from one device. target_step {B: t(B)}; verify {(B, k): t_v(B, k)};
    draft_step {rows: t_d(rows)}. A missing k is linear in k through the measured ones and t_v(B, 0) = t(B)
    (extrapolated from the last two); a missing B or row count is linear between measured ones. With no verify
    entries at all, t_v(B, k) = t(B (k + 1)) (as many tokens in one forward). source: what produced the tables
    (hardware, models, "measured" or "modelled")."""
    target_step: dict
    verify: dict
    draft_step: dict
    n_layers: int
    rtt_s: float = 0.0
    host_s: float = 0.0
    source: str = "modelled"

    def __post_init__(self):
        if not self.target_step:
            raise ValueError("Tables.target_step is empty: give t(B) for at least one batch size")
        for name in ("target_step", "verify", "draft_step"):
            bad = {key: v for key, v in getattr(self, name).items() if not v > 0}
            if bad:
                raise ValueError(f"Tables.{name} has non-positive seconds {bad}: steps take time")
        if self.n_layers < 1 or self.rtt_s < 0 or self.host_s < 0:
            raise ValueError(f"n_layers {self.n_layers}, rtt_s {self.rtt_s}, host_s {self.host_s}: "
                             "need n_layers >= 1 and times >= 0")

    @property
    def measured(self) -> bool:
        return "measured" in self.source

    def t(self, batch: int) -> float:
        return _interp(self.target_step, batch)

    def t_d(self, rows: int) -> float:
        if not self.draft_step:
            raise ValueError("Tables.draft_step is empty: SD points need the draft's batch step")
        return _interp(self.draft_step, rows)

    def t_v(self, batch: int, k: int) -> float:
        if k == 0:
            return self.t(batch)
        if not self.verify:
            return self.t(batch * (k + 1))
        batches = sorted({b for b, _ in self.verify})
        if batch in batches:
            return self._verify_at(batch, k)
        return _interp({b: self._verify_at(b, k) for b in batches}, batch)

    def _verify_at(self, batch: int, k: int) -> float:
        return _interp({0: self.t(batch), **{kk: v for (b, kk), v in self.verify.items() if b == batch}}, k)

    @classmethod
    def from_json(cls, d: dict) -> Tables:
        """From JSON's string keys: "B" for target_step and draft_step, "B,k" for verify."""
        def pair(key: str) -> tuple[int, int]:
            parts = str(key).split(",")
            if len(parts) != 2:
                raise ValueError(f"verify key {key!r} is not 'B,k' (e.g. '4,3')")
            return int(parts[0]), int(parts[1])
        return cls({int(b): float(v) for b, v in d["target_step"].items()},
                   {pair(key): float(v) for key, v in d.get("verify", {}).items()},
                   {int(r): float(v) for r, v in d.get("draft_step", {}).items()},
                   int(d["n_layers"]), float(d.get("rtt_s", 0.0)), float(d.get("host_s", 0.0)),
                   str(d.get("source", "modelled")))

    def to_json(self) -> dict:
        return {"target_step": {str(b): v for b, v in sorted(self.target_step.items())},
                "verify": {f"{b},{k}": v for (b, k), v in sorted(self.verify.items())},
                "draft_step": {str(r): v for r, v in sorted(self.draft_step.items())},
                "n_layers": self.n_layers, "rtt_s": self.rtt_s, "host_s": self.host_s, "source": self.source}


def _row(kind: str, batch: int, n: int, k: int, round_s: float, tokens: float, gpus: int, label: str,
         groups: int = 1) -> dict:
    """One point: N targets x B streams, each making `tokens` per round of `round_s` seconds, on `gpus` GPUs."""
    tpot_s = round_s / tokens
    return {"kind": kind, "B": batch, "N": n, "k": k, "tpot_ms": tpot_s * 1e3,
            "tok_s_per_gpu": n * batch / tpot_s / gpus, "gpus": gpus, "label": label,
            "round_ms": round_s * 1e3, "tokens_per_round": tokens, "groups": groups}


def _how(tables: Tables) -> str:
    return "modelled from measured steps" if tables.measured else "modelled"


def replica_points(tables: Tables, batches=None) -> list[dict]:
    """Target-only replicas, one GPU each: TPOT = t(B), B / t(B) tokens/s per GPU."""
    label = f"target-only replicas ({'measured' if tables.measured else 'modelled'})"
    return [_row("replica", b, 1, 0, tables.t(b), 1.0, 1, label) for b in sorted(batches or tables.target_step)]


def colocated_round_s(tables: Tables, k: int, batch: int) -> float:
    return k * tables.t_d(batch) + tables.t_v(batch, k) + tables.host_s


def colocated_points(tables: Tables, alpha: float, ks=KS, batches=None) -> list[dict]:
    """The draft on the target's GPU, at the k with the best tokens per second of each batch size."""
    rows = []
    for b in sorted(batches or tables.target_step):
        k = max(ks, key=lambda k: expected_tokens(alpha, k) / colocated_round_s(tables, k, b))
        rows.append(_row("colocated", b, 1, k, colocated_round_s(tables, k, b), expected_tokens(alpha, k), 1,
                         f"colocated SD ({_how(tables)})"))
    return rows


def shared_round_s(tables: Tables, k: int, batch: int, n: int, groups: int = 1, greedy: bool = True) -> float:
    """Closed form of a round when n targets of `batch` streams share one draft GPU. Each target splits its
    streams into `groups` groups of r = batch / groups that take turns (while one group's drafts are made the
    target verifies another); the draft serves n x groups such clients. Away from the draft a client spends
    X = rtt + t_v(r, k) + host. The draft runs g batches a cycle of n batch / g rows, d_g = k t_d(n batch / g):
        round = max(g d_g, d_g + X, groups (t_v(r, k) + host))
    (the draft's work for all batches, one client's own cycle, the target's verifies for all its groups).
    greedy (the draft takes every waiting request as soon as it is free): a client back during a batch waits for
    it to end, so g = min(clients, ceil(X / d_g) + 1), the fixed point reached from g = clients (clients out of
    phase). greedy=False: the best g, what a draft server that holds requests to batch them could reach."""
    clients, rows = n * groups, _group_rows(batch, groups)
    verify = tables.t_v(rows, k) + tables.host_s
    away = tables.rtt_s + verify

    def round_for(g: int) -> float:
        draft = k * tables.t_d(clients * rows / g)
        return max(g * draft, draft + away, groups * verify)
    if not greedy:
        return min(round_for(g) for g in range(1, clients + 1))
    g = clients
    while (nxt := min(clients, math.ceil(away / (k * tables.t_d(clients * rows / g))) + 1)) < g:
        g = nxt
    return round_for(g)


def _group_rows(batch: int, groups: int) -> int:
    if groups < 1 or batch % groups:
        raise ValueError(f"batch {batch} does not split into {groups} equal groups of streams")
    return batch // groups


def remote_points(tables: Tables, alpha: float, ks=KS, ns=NS, batches=None, groups=(1, 2), model: str = "closed",
                  rounds: int = 1000) -> list[dict]:
    """N target GPUs of B streams each and one shared draft GPU (N + 1 GPUs), for each B, N and number of
    stream groups a target alternates (1: plain sync rounds; batch sizes that do not split are left out), at
    the k with the most tokens per second. model "closed": shared_round_s; "event": simulate_shared (slower)."""
    if model not in ("closed", "event"):
        raise ValueError(f"model {model!r}: use 'closed' or 'event'")
    how = _how(tables) + (", event model" if model == "event" else "")
    label = f"remote shared SD, N targets + 1 draft GPU ({how})"
    rows = []
    for b in sorted(batches or tables.target_step):
        for n in ns:
            for grp in (x for x in groups if b % x == 0):
                if model == "closed":
                    k = max(ks, key=lambda k: expected_tokens(alpha, k) / shared_round_s(tables, k, b, n, grp))
                    rows.append(_row("remote", b, n, k, shared_round_s(tables, k, b, n, grp),
                                     expected_tokens(alpha, k), n + 1, label, grp))
                    continue
                sims = {k: simulate_shared(tables, alpha, k, b, n, rounds=rounds, groups=grp) for k in ks}
                k = max(sims, key=lambda k: sims[k]["tok_s_per_gpu"])
                tokens = sims[k]["round_ms_mean"] / sims[k]["tpot_ms_mean"]
                rows.append(_row("remote", b, n, k, sims[k]["round_ms_mean"] / 1e3, tokens, n + 1, label, grp))
    return rows


def implied_alpha(tau: float, k: int) -> float:
    """The per-token acceptance alpha with E(alpha, k) = tau (1 <= tau <= k + 1), by bisection."""
    if not 1 <= tau <= k + 1:
        raise ValueError(f"tau {tau} is outside [1, k + 1 = {k + 1}]: a round yields 1 to k + 1 tokens")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def eagle_points(tables: Tables, tau: float = EAGLE3_TAU, k: int = EAGLE3_K,
                 lm_head_layers: float = EAGLE3_LM_HEAD_LAYERS, ks=None, batches=None) -> list[dict]:
    """EAGLE-3 on the target's GPU, modelled. A draft token costs one target decoder layer at batch B, taken as
    t(B) / n_layers (a stand-in: the measured step spread over its layers), plus the lm_head
    (lm_head_layers layers). round = k draft tokens + t_v(B, k) + host, yielding tau tokens per stream.
    ks given: alpha is implied by (tau, k) and each batch size takes its best k in ks."""
    alpha = implied_alpha(tau, k) if ks else None
    label = f"EAGLE-3 colocated (modelled; tau {tau:g} at k={k})"
    rows = []
    for b in sorted(batches or tables.target_step):
        draft_s = tables.t(b) / tables.n_layers * (1 + lm_head_layers)

        def round_s(kk: int) -> float:
            return kk * draft_s + tables.t_v(b, kk) + tables.host_s
        kb = max(ks, key=lambda kk: expected_tokens(alpha, kk) / round_s(kk)) if ks else k
        rows.append(_row("eagle3", b, 1, kb, round_s(kb), expected_tokens(alpha, kb) if ks else tau, 1, label))
    return rows


def pipelined_round(tables: Tables, alpha: float, k: int, batch: int, n: int) -> tuple[float, int]:
    """(a target step's seconds, drafts on offer per stream) when n targets of `batch` pipelined streams share one
    draft GPU. The draft drafts a token a step for each of the n x batch streams (t_d(rows) a step) while the
    targets verify; after a rejection its new drafts start when the commit arrives (rtt / 2) and must be back
    (rtt / 2) before the next target step, so a step of T seconds finds m = floor((T - rtt) / t_d) drafts per
    stream (at most k; m verified in t_v(batch, m)). Conservative: after a full acceptance the draft has run on
    and more are on offer; the model counts the same m."""
    step = tables.t_d(n * batch)
    for m in range(k, -1, -1):
        T = tables.t_v(batch, m) + tables.host_s
        if m == 0 or (T - tables.rtt_s) / step >= m:
            return T, m
    return tables.t(batch) + tables.host_s, 0


def pipelined_points(tables: Tables, alpha: float, ks=KS, ns=NS, batches=None) -> list[dict]:
    """Remote shared SD with pipelined streams (pipelined_round), N targets + 1 draft GPU, the best k per point."""
    label = f"remote shared SD, pipelined streams, N targets + 1 draft GPU ({_how(tables)})"
    rows = []
    for b in sorted(batches or tables.target_step):
        for n in ns:
            best = max(((k, *pipelined_round(tables, alpha, k, b, n)) for k in ks),
                       key=lambda x: expected_tokens(alpha, x[2]) / x[1])
            k, T, m = best
            rows.append({**_row("pipelined", b, n, k, T, expected_tokens(alpha, m), n + 1, label), "offered": m})
    return rows


def pareto_front(rows: list[dict]) -> list[dict]:
    """The upper-left frontier: rows by TPOT, each with more tokens/s per GPU than every row of lower TPOT
    (the most tokens/s per GPU at TPOT <= x is the last of them at or below x)."""
    front = []
    for r in sorted(rows, key=lambda r: (r["tpot_ms"], -r["tok_s_per_gpu"])):
        if not front or r["tok_s_per_gpu"] > front[-1]["tok_s_per_gpu"]:
            front.append(r)
    return front


def throughput_at(rows: list[dict], tpot_ms: float, kind: str | None = None) -> float | None:
    """The most tokens/s per GPU among rows (of `kind`, if given) with TPOT <= tpot_ms; None if none reach it."""
    ok = [r["tok_s_per_gpu"] for r in rows if r["tpot_ms"] <= tpot_ms and kind in (None, r["kind"])]
    return max(ok) if ok else None


def _crossover(rows_a: list[dict], rows_b: list[dict]) -> float | None:
    """The smallest TPOT from which b's frontier beats a's at every TPOT above; None if a wins at the largest."""
    xs = sorted({r["tpot_ms"] for r in rows_a + rows_b})
    wins = []
    for x in xs:
        a, b = throughput_at(rows_a, x), throughput_at(rows_b, x)
        wins.append(b is not None and (a is None or b > a))
    if not wins or not wins[-1]:
        return None
    i = len(wins) - 1
    while i > 0 and wins[i - 1]:
        i -= 1
    return xs[i]


def _resample(rows: list[dict], rng) -> list[dict]:
    """Each row's TPOT drawn from normal(tpot_ms, (tpot_hi - tpot_lo) / 3.92) (a 95% interval), tokens/s per GPU
    scaled with it (streams / TPOT / GPUs); rows without an interval unchanged."""
    out = []
    for r in rows:
        if "tpot_lo" in r and "tpot_hi" in r:
            t = max(rng.normal(r["tpot_ms"], (r["tpot_hi"] - r["tpot_lo"]) / 3.92), 1e-9)
            r = {**r, "tpot_ms": t, "tok_s_per_gpu": r["tok_s_per_gpu"] * r["tpot_ms"] / t}
        out.append(r)
    return out


def crossover_tpot(rows_a: list[dict], rows_b: list[dict], n_boot: int = 400, seed: int = 0) -> dict:
    """The TPOT (ms) above which b's frontier gives more tokens/s per GPU than a's: {"tpot_ms", "lo", "hi"}.
    lo/hi: the 2.5 and 97.5 percentiles over n_boot draws of the rows' TPOT intervals (tpot_lo/tpot_hi), when
    any row has one (draws with no crossover left out); else None."""
    x = _crossover(rows_a, rows_b)
    if not any("tpot_lo" in r for r in rows_a + rows_b):
        return {"tpot_ms": x, "lo": None, "hi": None}
    rng = np.random.default_rng(seed)
    draws = [_crossover(_resample(rows_a, rng), _resample(rows_b, rng)) for _ in range(n_boot)]
    draws = [d for d in draws if d is not None]
    if not draws:
        return {"tpot_ms": x, "lo": None, "hi": None}
    return {"tpot_ms": x, "lo": float(np.percentile(draws, 2.5)), "hi": float(np.percentile(draws, 97.5))}


def answer(rows: list[dict], t1_ms: float, frac: float = 0.9) -> dict:
    """The study's answer at a TPOT of frac x t(1): each kind's tokens/s per GPU, remote shared SD over
    colocated SD, EAGLE-3 over colocated SD and over remote, and for each SD kind the TPOT above which
    target-only replicas give more tokens/s per GPU (crossover_tpot)."""
    budget = frac * t1_ms
    by_kind = {kind: [r for r in rows if r["kind"] == kind] for kind in KINDS}
    thr = {kind: throughput_at(by_kind[kind], budget) for kind in KINDS}

    def ratio(a: str, b: str) -> float | None:
        return thr[a] / thr[b] if thr[a] is not None and thr[b] else None
    return {"tpot_budget_ms": budget, "tok_s_per_gpu": thr,
            "remote_over_colocated": ratio("remote", "colocated"),
            "pipelined_over_colocated": ratio("pipelined", "colocated"),
            "eagle3_over_colocated": ratio("eagle3", "colocated"),
            "eagle3_over_remote": ratio("eagle3", "remote"),
            "replicas_win_above_ms": {kind: crossover_tpot(by_kind[kind], by_kind["replica"])
                                      for kind in KINDS[1:] if by_kind[kind] and by_kind["replica"]}}


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


def figure(rows: list[dict], title: str, note: str):
    """Tokens/s per GPU against TPOT: each label's points and its frontier (modelled series dashed). `note` says
    what hardware and models the tables came from; it is printed under the plot."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    labels = list(dict.fromkeys(r["label"] for r in sorted(rows, key=lambda r: KINDS.index(r["kind"]))))
    for label in labels:
        pts = [r for r in rows if r["label"] == label]
        front = pareto_front(pts)
        (line,) = ax.plot([r["tpot_ms"] for r in front], [r["tok_s_per_gpu"] for r in front],
                          "--" if "modelled" in label else "-", marker="o", ms=4, label=label)
        ax.scatter([r["tpot_ms"] for r in pts], [r["tok_s_per_gpu"] for r in pts], s=10, alpha=0.3,
                   color=line.get_color())
    ax.set(xlabel="time per output token, TPOT (ms)", ylabel="tokens/s per GPU", title=title)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.0, note, fontsize=7, va="top", wrap=True)
    return fig

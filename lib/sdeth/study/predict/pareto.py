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

Rooms: the step tables (steptables), the shared draft's event model (sharedsim), the frontier and the answer read
from the points (frontier); this module makes each kind's points and re-exports the rest.
"""
from __future__ import annotations

import math

from ...costmodel import expected_tokens
from .frontier import KINDS, answer, crossover_tpot, figure, pareto_front, throughput_at  # noqa: F401
from .sharedsim import _group_rows, simulate_shared
from .steptables import Tables


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

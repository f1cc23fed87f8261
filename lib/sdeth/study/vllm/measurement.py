"""Acceptance of a remote draft inside vLLM, read from vLLM's spec-decode counters and set against sdeth's runtime on
the same prompts and k, with standard errors.

Terms (vLLM's, metrics.vllm_metrics): a *draft* is one row's proposal in one engine step (k tokens at most); the
*acceptance length* of a draft is 1 + its accepted tokens; position i's acceptance is the share of drafts whose
first i + 1 tokens were accepted. Acceptance is prefix-closed (a token is accepted only after every earlier one), so
with p_i the acceptance at position i (0-based) a draft's accepted count L has E[L] = sum p_i and
E[L^2] = sum (2i + 1) p_i; the standard errors below treat drafts as independent.

    after, before = scrape_spec_counters(...), scrape_spec_counters(...)      # or _counters(llm) offline
    ours = Acceptance.of_requests(sdeth_results["requests"])
    theirs = Acceptance.of_counters(counters_delta(after, before), k)
    agree(theirs, ours)      # {"draft_acceptance_rate": True, ...}: within two standard errors

Timing from a streamed /v1/completions (read_stream, request_timing): TTFT = the first token's arrival - the
request's send; TPOT = (t_last - t_first) / (n - 1) over a request's n output tokens (vLLM's definition, the first
token left out); percentiles by nearest rank, their intervals by a percentile bootstrap over requests.
"""
from __future__ import annotations

import json
import math
import random
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...metrics import percentile  # noqa: F401  (nearest rank; the tests read it here too)
from .baseline import SPEC_COUNTERS, scrape_spec_counters


class StudyError(RuntimeError):
    """A server did not start or answer, or an option is wrong: what, and what to do."""


@dataclass(frozen=True)
class Acceptance:
    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]          # [k] drafts accepted at least up to each position

    @classmethod
    def of_counters(cls, counters: dict, k: int) -> "Acceptance":
        """From vLLM's four spec-decode counters (names as vllm_baseline.SPEC_COUNTERS; a change over a run:
        counters_delta). ValueError naming what is missing or inconsistent."""
        missing = [n for n in SPEC_COUNTERS if n not in counters]
        if missing and counters.get(SPEC_COUNTERS[0]):
            raise ValueError(f"vLLM's counters lack {', '.join(missing)}: read all four of SPEC_COUNTERS (offline: "
                             f"LLM(disable_log_stats=False) and LLM.get_metrics(); a server: its /metrics)")
        per = [int(v) for v in counters.get(SPEC_COUNTERS[3], [])][:k]
        return cls(int(counters.get(SPEC_COUNTERS[0], 0)), int(counters.get(SPEC_COUNTERS[1], 0)),
                   int(counters.get(SPEC_COUNTERS[2], 0)), tuple(per + [0] * (k - len(per))))

    @classmethod
    def of_requests(cls, requests: list[dict]) -> "Acceptance":
        """From sdeth's per-request records (a results JSON's `requests`: drafts, draft_tokens, accepted_tokens,
        accepted_per_pos)."""
        if not requests:
            raise ValueError("no requests: pass a results JSON's `requests` of a speculative run")
        k = max(len(r["accepted_per_pos"]) for r in requests)
        per = [sum(r["accepted_per_pos"][i] for r in requests if i < len(r["accepted_per_pos"])) for i in range(k)]
        return cls(sum(r["drafts"] for r in requests), sum(r["draft_tokens"] for r in requests),
                   sum(r["accepted_tokens"] for r in requests), tuple(per))

    def figures(self) -> dict:
        """Acceptance rate, mean acceptance length and per-position acceptance, each with its standard error
        (`..._se`); None where there were no drafts."""
        if not self.drafts:
            return {"draft_acceptance_rate": None, "mean_acceptance_length": None, "per_position_acceptance": [],
                    "draft_acceptance_rate_se": None, "mean_acceptance_length_se": None,
                    "per_position_acceptance_se": []}
        n = self.drafts
        p = [a / n for a in self.per_pos]
        mean_l = self.accepted / n
        var_l = max(sum((2 * i + 1) * q for i, q in enumerate(p)) - sum(p) ** 2, 0.0)   # E[L^2] - E[L]^2
        k_mean = self.draft_tokens / n                  # k per draft (below k near max_model_len)
        return {"drafts": n, "draft_acceptance_rate": self.accepted / self.draft_tokens,
                "draft_acceptance_rate_se": math.sqrt(var_l / n) / k_mean,
                "mean_acceptance_length": 1 + mean_l, "mean_acceptance_length_se": math.sqrt(var_l / n),
                "per_position_acceptance": p,
                "per_position_acceptance_se": [math.sqrt(q * (1 - q) / n) for q in p]}


def counters_delta(after: dict, before: dict) -> dict:
    """The change of vLLM's spec-decode counters between two reads (scrape_spec_counters or _counters)."""
    out = {}
    for name in SPEC_COUNTERS:
        a, b = after.get(name), before.get(name)
        if isinstance(a, list) or isinstance(b, list):
            a, b = list(a or []), list(b or [])
            width = max(len(a), len(b))
            out[name] = [x - y for x, y in zip(a + [0] * (width - len(a)), b + [0] * (width - len(b)))]
        elif a is not None:
            out[name] = a - (b or 0)
    return out


def agree(a: Acceptance, b: Acceptance, z: float = 2.0) -> dict:
    """For each figure (the rate, the mean length, each position): whether a and b differ by at most z standard
    errors of their difference, sqrt(se_a^2 + se_b^2). A figure neither could measure (no drafts) is False."""
    fa, fb = a.figures(), b.figures()
    if fa["draft_acceptance_rate"] is None or fb["draft_acceptance_rate"] is None:
        return {"draft_acceptance_rate": False, "mean_acceptance_length": False, "per_position_acceptance": []}

    def within(x, y, sx, sy):
        return abs(x - y) <= z * math.hypot(sx, sy) + 1e-12

    return {name: within(fa[name], fb[name], fa[name + "_se"], fb[name + "_se"])
            for name in ("draft_acceptance_rate", "mean_acceptance_length")} | {
        "per_position_acceptance": [within(x, y, sx, sy) for x, y, sx, sy in zip(
            fa["per_position_acceptance"], fb["per_position_acceptance"], fa["per_position_acceptance_se"],
            fb["per_position_acceptance_se"])]}


# ------------------------------------------------------------------ timing from a server's stream

def bootstrap(xs, q: float, n_boot: int = 2000, seed: int = 0) -> tuple | None:
    """(point, low, high): the q-th percentile of xs and its 95% percentile-bootstrap interval."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    rng = random.Random(seed)
    boots = sorted(percentile([rng.choice(xs) for _ in xs], q) for _ in range(n_boot))
    return percentile(xs, q), boots[int(0.025 * n_boot)], boots[min(n_boot - 1, int(0.975 * n_boot))]


def t_interval(xs) -> dict:
    """Mean of xs with a 95% Student-t interval (low = high = mean for one value)."""
    from scipy.stats import t
    n, m = len(xs), statistics.mean(xs)
    half = t.ppf(0.975, n - 1) * statistics.stdev(xs) / math.sqrt(n) if n > 1 else 0.0
    return {"mean": m, "low": m - half, "high": m + half, "n": n}


def read_stream(lines, clock=time.perf_counter) -> tuple[list[int], list[tuple[float, int]]]:
    """A streamed /v1/completions response (server-sent events, `return_token_ids`): its token ids and, per
    chunk that carried tokens, (arrival time by `clock`, tokens in it)."""
    ids, chunks = [], []
    for raw in lines:
        line = (raw.decode() if isinstance(raw, bytes) else raw).strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = (json.loads(line[6:]).get("choices") or [{}])[0]
        new = choice.get("token_ids") or []
        if new:
            chunks.append((clock(), len(new)))
            ids += new
    return ids, chunks


def request_timing(t_send: float, chunks: list[tuple[float, int]]) -> dict:
    """TTFT (ms) and TPOT (ms, (t_last - t_first) / (n - 1)) of one request from its stream's chunks; TPOT
    None for fewer than two tokens. A chunk of several tokens (accepted drafts) arrives at one time."""
    n = sum(c for _, c in chunks)
    if not chunks:
        return {"tokens": 0, "ttft_ms": None, "tpot_ms": None}
    t_first, t_last = chunks[0][0], chunks[-1][0]
    return {"tokens": n, "ttft_ms": (t_first - t_send) * 1e3,
            "tpot_ms": (t_last - t_first) * 1e3 / (n - 1) if n > 1 else None}


def point_figures(repeats: list[dict], k: int | None) -> dict:
    """One point's figures over its repeats (each {wall_s, requests: [{tokens, ttft_ms, tpot_ms}], counters}):
    tokens/s (t-interval over repeats), TPOT p50/p99 and TTFT p50 (bootstrap over requests), acceptance from
    the counters summed over repeats (k: the speculative tokens; None for target-only)."""
    reqs = [r for rep in repeats for r in rep["requests"]]
    tps = [sum(r["tokens"] for r in rep["requests"]) / rep["wall_s"] for rep in repeats]
    tpot, ttft = [r["tpot_ms"] for r in reqs], [r["ttft_ms"] for r in reqs]
    out = {"kind": "measured", "repeats": len(repeats), "requests": len(reqs),
           "output_tokens": sum(r["tokens"] for r in reqs), "tokens_per_s": t_interval(tps),
           "tokens_per_s_each": tps}
    for name, xs, q in (("tpot_p50_ms", tpot, 50), ("tpot_p99_ms", tpot, 99), ("ttft_p50_ms", ttft, 50)):
        b = bootstrap(xs, q)
        out[name] = dict(zip(("value", "low", "high"), b)) if b else None
    if k:
        total: dict = {}
        for rep in repeats:
            for name, v in rep["counters"].items():
                total[name] = ([a + b for a, b in zip(total[name], v)] if isinstance(v, list) and name in total
                               else v if name not in total else total[name] + v)
        out["counters"] = total
        out["acceptance"] = Acceptance.of_counters(total, k).figures()
    return out


def identical(outputs: list, reference: list) -> list[int]:
    """[requests whose output equals the reference's, requests]."""
    return [sum(a == b for a, b in zip(outputs, reference)), len(reference)]


# ------------------------------------------------------------------ measuring a running server

@dataclass
class Endpoint:
    base: str                     # http://HOST:PORT of vLLM's OpenAI server
    metrics: str = ""             # its Prometheus page (default base + /metrics)
    model: str = ""               # the served model's name (default: the first of /v1/models)

    def __post_init__(self):
        self.base = self.base.rstrip("/")
        self.metrics = self.metrics or self.base + "/metrics"
        if not self.base.startswith(("http://", "https://")):
            raise StudyError(f"--target-url {self.base!r}: give the server's URL, e.g. http://127.0.0.1:8000")

    def served_model(self) -> str:
        if not self.model:
            with urllib.request.urlopen(f"{self.base}/v1/models", timeout=30) as r:
                self.model = json.loads(r.read())["data"][0]["id"]
        return self.model

    def version(self) -> str:
        """The server's vLLM version (its /version), or '?' where it has none."""
        try:
            with urllib.request.urlopen(f"{self.base}/version", timeout=30) as r:
                return json.loads(r.read()).get("version", "?")
        except (OSError, ValueError):
            return "?"

    def counters(self) -> dict:
        with urllib.request.urlopen(self.metrics, timeout=30) as r:
            return scrape_spec_counters(r.read().decode())


def stream_request(ep: Endpoint, ids: list[int], max_tokens: int, temperature: float, seed: int, eos: int) -> dict:
    body = {"model": ep.served_model(), "prompt": ids, "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "stream": True, "return_token_ids": True, "stop_token_ids": [eos]}
    rq = urllib.request.Request(f"{ep.base}/v1/completions", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    t_send = time.perf_counter()
    with urllib.request.urlopen(rq, timeout=900) as resp:
        out, chunks = read_stream(resp)
    return {**request_timing(t_send, chunks), "output_ids": out}


def run_point(ep: Endpoint, prompts: list[list[int]], concurrency: int, temperature: float, max_tokens: int,
              eos: int, repeat: int = 0) -> dict:
    """All prompts with `concurrency` in flight; wall time, per-request records, the counters' change."""
    before = ep.counters()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        reqs = list(ex.map(lambda i: stream_request(ep, prompts[i], max_tokens, temperature, 1000 * repeat + i, eos),
                           range(len(prompts))))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "requests": reqs, "counters": counters_delta(ep.counters(), before)}


def study_table(doc: dict):
    """The study's points (`python -m sdeth bench vllm`'s JSON) as a table: per configuration, draft-server variant,
    temperature and concurrency, tokens/s (mean over repeats; its interval with 2 or more), TPOT p50/p99 and TTFT p50 (ms), vLLM's
    acceptance rate and mean acceptance length, greedy identity with target-only, and TPOT p99 against the
    proposer's deadline bound."""
    import pandas as pd

    def cell(d, key="value"):
        return round(d[key], 1) if d else None
    rows = []
    for p in doc["points"]:
        acc, same = p.get("acceptance") or {}, p.get("identical_to_target_only")
        tps = p["tokens_per_s"]
        rows.append({"config": p["config"], "draft server": p["variant"], "T": p["temperature"],
                     "concurrency": p["concurrency"], "tok/s": cell(tps, "mean"),
                     "tok/s 95%": f"[{tps['low']:.1f}, {tps['high']:.1f}]" if tps.get("n", 1) > 1 else "",
                     "TPOT p50 ms": cell(p["tpot_p50_ms"]), "TPOT p99 ms": cell(p["tpot_p99_ms"]),
                     "TTFT p50 ms": cell(p["ttft_p50_ms"]),
                     "acceptance": acc.get("draft_acceptance_rate"), "mean length": acc.get("mean_acceptance_length"),
                     "identical": f"{same[0]}/{same[1]}" if same else "",
                     "p99 within bound": {True: "yes", False: "NO"}.get(p.get("within_bound"), "")})
    return pd.DataFrame(rows).set_index(["config", "draft server", "T", "concurrency"])


def study_lines(doc: dict) -> list[str]:
    """What the study's plain points say, computed: per temperature, each speculative configuration's tokens/s over
    target-only's at each concurrency; the slowed and jittered draft servers' TPOT p99 against the plain one's."""
    pts = {(p["config"], p["variant"], p["temperature"], p["concurrency"]): p for p in doc["points"]}
    lines = []
    for t in sorted({k[2] for k in pts}):
        cs = sorted({k[3] for k in pts if k[2] == t and k[1] == "plain"})
        for config in ("draft-model", "remote"):
            ratios = [f"c={c} {pts[(config, 'plain', t, c)]['tokens_per_s']['mean'] / base:.2f}x"
                      for c in cs if (config, "plain", t, c) in pts
                      and (base := (pts.get(("target-only", "plain", t, c)) or {}).get("tokens_per_s", {}).get("mean"))]
            if ratios:
                lines.append(f"T={t:g}, {config} tokens/s over vLLM target-only's: " + ", ".join(ratios))
    for (config, variant, t, c), p in sorted(pts.items()):
        if variant != "plain" and p.get("vs_plain"):
            lines.append(f"T={t:g}, c={c}, draft server {variant}: TPOT p99 {p['tpot_p99_ms']['value']:.0f} ms, "
                         f"x{p['vs_plain'].get('tpot_p99_ms', float('nan')):.2f} of the plain remote's; "
                         f"{'within' if p.get('within_bound') else 'OVER'} the deadline's bound "
                         f"({p.get('tpot_bound_ms', float('nan')):.0f} ms)")
    return lines

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .vllm_baseline import SPEC_COUNTERS


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

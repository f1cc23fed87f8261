"""The points read: the frontier of tokens/s per GPU against TPOT, the most at a TPOT budget, where one kind's
frontier overtakes another's (with a bootstrap interval), the study's answer, and its figure."""
from __future__ import annotations

import numpy as np


KINDS = ("replica", "colocated", "remote", "pipelined", "eagle3")


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

"""Tables and plots of the notebooks' own runs: run summaries (10, 15, 20), the k sweep (10), the CPU RTT sweep
and the link probe (20), the draft's card and variants (00), the design map (40)."""
from __future__ import annotations

import json

from ..results import REPORTS, caption


def alt_text(fig) -> str:
    """A figure's alt text: its titles, then its caption (the line under it that names what and which hardware)."""
    titles = [fig._suptitle.get_text()] if getattr(fig, "_suptitle", None) else []
    titles += [ax.get_title() for ax in fig.axes if ax.get_title()]
    words = [t.replace("\n", " ") for t in titles[:3]] + [t.get_text() for t in fig.texts if t is not fig._suptitle]
    return "; ".join(w for w in words if w.strip()) or "a figure without title or caption"


def show_figures_with_alt_text() -> bool:
    """In a notebook's kernel: matplotlib figures render as PNG with their `alt_text` as the image's alt text
    (papermill keeps it in the output's metadata; the HTML exporter writes it). False outside IPython."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
        from matplotlib.figure import Figure
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    import matplotlib.pyplot as plt
    plt.close(plt.figure())   # the inline backend sets its own formatter when it first draws: this one follows it
    ip.display_formatter.formatters["image/png"].for_type(
        Figure, lambda fig: (print_figure(fig, "png", bbox_inches="tight"), {"alt": alt_text(fig)}))
    return True


def clip_to_measured(fig, rows: list[dict], x: str = "tpot_ms", y: str = "tok_s_per_gpu") -> list[str]:
    """Put a plot's axes on the measured points' scale: a modelled series (its label says "modelled") that runs
    beyond them is clipped, with a note naming how far it goes. `rows`: the plotted points, each with `label`,
    `x` and `y`. Returns the labels clipped."""
    measured = [r for r in rows if "modelled" not in r["label"]]
    if not measured:
        return []
    top, right = 1.15 * max(r[y] for r in measured), 1.15 * max(r[x] for r in measured)
    over = {}
    for r in rows:
        if "modelled" in r["label"] and (r[y] > top or r[x] > right):
            over[r["label"]] = max(over.get(r["label"], 0.0), r[y])
    for ax in fig.axes:
        ax.set_ylim(0, top)
        ax.set_xlim(0, right)
    if over:
        fig.text(0.01, -0.07, "; ".join(f"off the scale: {k}, up to {v:,.0f} tokens/s per GPU" for k, v in over.items()),
                 fontsize=7, va="top", color="#444")
    return list(over)


def view(df, digits: int = 3, na: str = "n/a", na_by_column: dict | None = None):
    """A table as a report shows it: floats to `digits` places, every cell whole (no "..."), and a missing value
    written as what it means (`na`, or per column: {"break-even ms": "never"}) instead of NaN."""
    import pandas as pd
    if isinstance(df, str):                  # a message in place of a table ("no ... in reports/gpu")
        return df
    if not isinstance(df, pd.DataFrame):
        df = pd.DataFrame(df)
    style = df.style.format(precision=digits, na_rep=na)
    for col, text in (na_by_column or {}).items():
        if col in df.columns:
            style = style.format(precision=digits, na_rep=text, subset=[col])
    return style


SUMMARY_COLUMNS = {"tokens_per_s": "tokens/s", "predicted_tokens_per_s": "predicted tokens/s", "tpot_ms": "TPOT ms",
                   "ttft_ms": "TTFT ms", "draft_acceptance_rate": "acceptance rate",
                   "mean_acceptance_length": "mean acceptance length", "alpha": "alpha",
                   "wire_ms_per_round": "wire ms/round", "bytes_per_round": "bytes/round",
                   "tokens_without_draft": "tokens without draft", "plain_steps": "plain target steps (pipelined)"}


def summary_table(runs: dict[str, dict]):
    """One row per run (label -> results dict), the summary fields that compare runs."""
    import pandas as pd
    rows = {label: {v: r["summary"].get(k) for k, v in SUMMARY_COLUMNS.items()} for label, r in runs.items()}
    df = pd.DataFrame(rows).T
    base = next((r for r in runs.values() if r["summary"]["mode"] == "target-only"), None)
    if base:
        df["speedup vs target-only"] = df["tokens/s"] / base["summary"]["tokens_per_s"]
    return df


def plot_breakdown(runs: dict[str, dict], hw: dict, title: str):
    """Milliseconds per output token, split into where the time went."""
    import matplotlib.pyplot as plt
    import pandas as pd
    per_tok = {label: {k: v * 1e3 / r["summary"]["output_tokens"] for k, v in r["summary"]["time_breakdown_s"].items()}
               for label, r in runs.items()}
    df = pd.DataFrame(per_tok).T.fillna(0.0)
    ax = df.plot.barh(stacked=True, figsize=(7, 0.6 * len(df) + 1.5))
    ax.set(xlabel="milliseconds per output token", title=title)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.invert_yaxis()
    ax.figure.text(0.01, -0.04, caption(hw, "measured"), fontsize=8)
    plt.show()
    return df


def plot_k_sweep(ks: dict, hw: dict, what: str):
    """10_colocated: vLLM's rate against k at the measured alpha, and the speedup per k, measured and
    modelled from each run's own alpha and costs (ks: summary.k_sweep's result). Returns the table; its
    `predicted` column's best k is the one the title names."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from ... import metrics
    df = pd.DataFrame(ks["rows"]).set_index("k")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    kk = list(range(1, int(df.index.max()) + 1))
    ax1.plot(kk, [metrics.rate_from_alpha(ks["alpha"], x) for x in kk], label=f"rate(alpha={ks['alpha']:.2f}, k)")
    ax1.scatter(df.index, df["rate"], c="C3", zorder=3, label="measured rate")
    ax1.set(xlabel="k", ylabel="draft acceptance rate", title="vLLM's rate falls with k")
    ax1.legend(fontsize=8)
    ax2.plot(df.index, df["predicted"], marker="x", label="cost model")
    ax2.scatter(df.index, df["speedup"], c="C3", zorder=3, label="measured")
    ax2.axhline(1, c="gray", ls="--")
    top = df["predicted"].idxmax()       # the line's own best: each run's alpha and measured costs
    ax2.set(xlabel="k", ylabel="speedup over target-only",
            title=f"best k by the model: {top} ({df['predicted'][top]:.2f}x)")
    ax2.legend(fontsize=8)
    fig.text(0.01, -0.06, caption(hw, what), fontsize=8)
    plt.show()
    return df


def plot_rtt_sweep(sw: dict, rtts, hw: dict, title: str) -> dict:
    """20_ethernet: speedup against injected round trip per link mode: measured points, and the cost model's
    prediction for each run from that run's own components (alpha, draft step, verify costs, the round trip it
    measured): the same predictions the table and the largest-gap line compare. Returns {"table", "curves" (the
    predictions, one per mode and round trip), "relay_base_rtt_ms" (the relay's own round trip at the smallest
    injected one), "crossover"}."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from ..summary import crossover, find_run
    table = pd.DataFrame(sw["table"])
    base_rtt = find_run(sw["runs"], "sd", "ethernet", min(rtts))["summary"]["wire_ms_per_round"] - min(rtts)
    link = table[(table["placement"] == "ethernet") & (table["mode"] != "target only")].sort_values("rtt_ms", kind="stable")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, (mode, pts) in enumerate(link.groupby("mode", sort=False)):
        ax.plot(pts["rtt_ms"], pts["predicted_speedup"], c=f"C{i}", ls="--", marker="x", label=f"{mode}: model")
        ax.scatter(pts["rtt_ms"], pts["speedup"], c=f"C{i}", marker="o", zorder=3, label=f"{mode}: measured")
    col = table[table["mode"] == "sync SD (colocated)"].iloc[0]
    ax.axhline(col["speedup"], c="C2", ls=":", label="colocated SD: measured")
    ax.axhline(1, c="gray", ls="--", label="target only")
    ax.set(xscale="symlog", xticks=list(rtts), xticklabels=[f"{r:g}" for r in rtts], xlabel="injected round trip (ms)",
           ylabel="speedup over target-only", title=title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.figure.text(0.01, -0.1, caption(hw, "measured points; x: the cost model for each run, from its own components"),
                   fontsize=8)
    plt.show()
    curves = [{"mode": r["mode"], "rtt_ms": r["rtt_ms"], "speedup": r["predicted_speedup"]}
              for r in link.to_dict("records") if r["predicted_speedup"] == r["predicted_speedup"]]
    return {"table": table, "curves": curves, "relay_base_rtt_ms": base_rtt, "crossover": crossover(sw["table"], curves)}


def probe_table(link: list[dict]):
    """The link probe's scenarios: RTT and each direction's one-way delay as read naively, by NTP's
    correction, and with the true clock offset (ms, medians)."""
    import pandas as pd
    rows = [{"scenario": r["scenario"], "RTT p50": r["naive"]["rtt_ms"]["p50"], "RTT p90": r["naive"]["rtt_ms"]["p90"],
             "naive t->d": r["naive"]["up_ms"]["p50"], "naive d->t": r["naive"]["down_ms"]["p50"],
             "NTP t->d": r["ntp"]["up_ms"]["p50"], "NTP d->t": r["ntp"]["down_ms"]["p50"],
             "true t->d": r["true_offset"]["up_ms"]["p50"], "true d->t": r["true_offset"]["down_ms"]["p50"]} for r in link]
    return pd.DataFrame(rows).set_index("scenario")


def draft_card(card: dict):
    """00_provision: the embedded draft's card: held-out agreement after each training round, and the last
    round's training curve."""
    import matplotlib.pyplot as plt
    import pandas as pd
    ev = card["eval"]
    from ...models.distill import card_rounds
    rounds = card_rounds(card)
    df = pd.DataFrame([{"round": i + 1, "start": (r.get("recipe") or {}).get("init") or
                        f"the target's first {card['layers']} layers",
                        "training (s)": r["train_seconds"], "steps": r.get("steps_done"),
                        "held-out agreement before": r.get("before"),
                        "after": r["greedy_agreement"]} for i, r in enumerate(rounds)]
                      ).set_index("round")
    print(f"held-out positions: {ev['positions']} ({ev['prompts']}); trained on {card['train_tokens']:,} target tokens "
          f"on {card['hardware']}; {len(rounds)} round(s), {sum(r['train_seconds'] for r in rounds) / 60:.1f} min in "
          f"all; sampled acceptance at T=1 now {ev['sampled_acceptance_t1']}; last recipe: {card['recipe']}")
    h = pd.DataFrame(card["history"])
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(h["s"], h["train_agreement"], marker=".", label="training batches")
    ax.axhline(ev["before_training"]["greedy_agreement"], ls=":", c="gray", label="held-out, before this round")
    ax.axhline(ev["greedy_agreement"], ls="--", c="gray", label="held-out, after it")
    ax.set(xlabel="training time (s)", ylabel="greedy agreement (fraction)",
           title=f"Draft distillation, round {len(rounds)}: agreement with the target")
    ax.legend(loc="lower right", fontsize=8)
    fig.text(0.01, -0.08, f"{card['layers']}-layer draft of {card['target']}, trained on {card['hardware']}", fontsize=8)
    plt.show()
    return df


def draft_variants():
    """The embedded draft's alpha in other numerics and with a pruned output layer (reports/draft_variants_embedded.json)."""
    import pandas as pd
    p = REPORTS / "draft_variants_embedded.json"
    if not p.exists():
        return "no draft-variant figures (python -m sdeth draft-variants)"
    d = json.loads(p.read_text())
    print(f"{d['acceptance']}; {d['prompts']} x {d['max_new']} tokens; {d['hardware']['label']}")
    return pd.DataFrame(d["rows"]).set_index("variant")[["dtype", "fast", "greedy_agreement", "se", "cost", "positions"]]


def _device_labels(points: list[dict], rel: float = 0.5) -> list[tuple[float, str]]:
    """One label per group of device profiles whose draft steps lie within `rel` of each other (they would
    overlap on a log axis): (step ms, "dev1 fp8 / dev2 bf16")."""
    groups: list[list[dict]] = []
    for p in sorted(points, key=lambda p: p["step_ms"]):
        if groups and p["step_ms"] <= groups[-1][0]["step_ms"] * (1 + rel):
            groups[-1].append(p)
        else:
            groups.append([p])
    return [(sum(p["step_ms"] for p in g) / len(g), " / ".join(f"{p['device']} {p['draft'].split()[-1]}" for p in g))
            for g in groups]


def plot_design_map(maps: dict, draft_steps_ms, rtts_ms, points: list[dict], measured: list[dict]):
    """40_heterogeneous: modelled speedup of pipelined SD over (draft step, round trip), one panel per target and
    alpha (titles "target, alpha a"), with each device profile's draft step (dotted; labelled once, at the right)
    and each measured (star) or emulated (square) run marked; the caption names only the markers drawn."""
    import matplotlib.pyplot as plt
    import numpy as np
    n = len(maps)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n + 2.2, 3.8), sharey=True, squeeze=False)
    drawn = set()
    for ax, (title, grid) in zip(axes[0], maps.items()):
        g = np.array(grid)
        im = ax.contourf(rtts_ms, draft_steps_ms, g, levels=[0, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0], cmap="RdYlGn")
        cs = ax.contour(rtts_ms, draft_steps_ms, g, levels=[1.0, 2.0], colors="k", linewidths=0.8)
        ax.clabel(cs, fmt="%gx", fontsize=7)
        for p in points:
            ax.axhline(p["step_ms"], color="C0", lw=0.5, ls=":")
        for m in measured:
            if m.get("panel") == title:
                ax.plot(m["rtt_ms"], m["draft_step_ms"], "k*" if m["kind"] == "measured" else "bs", ms=7)
                drawn.add(m["kind"])
        target, _, alpha = title.rpartition(", ")
        ax.set(xscale="log", yscale="log", xlabel="round trip (ms)")
        ax.set_title(f"{target}\n{alpha}", fontsize=9)
    lo, hi = min(draft_steps_ms), max(draft_steps_ms)
    labels = _device_labels(points)
    for step, label in labels:
        if lo <= step <= hi:          # a label off the map would sit on the colour bar: the caption names those
            axes[0][-1].text(rtts_ms[-1] * 1.15, step, label, fontsize=7, va="center")
    off = [f"{label} ({step:.1f} ms)" for step, label in labels if not lo <= step <= hi]
    axes[0][0].set_ylabel("draft step (ms)")
    fig.colorbar(im, ax=axes[0].tolist(), label="speedup over target-only (modelled)", pad=0.18)
    marks = {"measured": "star: measured", "emulated": "square: emulated"}
    fig.text(0.01, -0.08, "modelled: sdeth.costmodel's pipelined event model; dotted lines: device profiles' draft steps "
             "(params/devices)" + "".join(f"; {marks[k]}" for k in marks if k in drawn)
             + (f"; off the map: {', '.join(off)}" if off else ""), fontsize=8, wrap=True)
    plt.show()

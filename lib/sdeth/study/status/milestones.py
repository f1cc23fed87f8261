"""The milestones M0-M4, each with its status and key figures, the write-up's milestone table, and ours beside
the published alternatives."""
from __future__ import annotations

from pathlib import Path

from ...paths import REPO
from . import sources as src
from .answer import published
from .figures import Figure, Milestone, fig, load, mode_fig


def _answered(m: Milestone, note: str, *figs: Figure | None, pending: str = "") -> Milestone:
    """A question milestone: its figures that exist; with all of them, done (or answered, while `pending` names
    a confirming run not made), the answer as its note."""
    m.figures += [f for f in figs if f]
    if len(m.figures) == len(figs):
        m.status = "answered" if pending else "done"
        m.note = note + (f"; {pending}" if pending else "")
    return m


def _m0(root: Path) -> Milestone:
    """The testbed and the network question (85 ms one way, 215 ms the other)."""
    skew = {"server_clock_skew_ms": -65.0}
    naive = ("link_probe", "scenarios", skew, "naive")
    return _answered(
        Milestone("M0", "Provision a two-node testbed from manifests; the 85 ms vs 215 ms question"),
        "the question is answered on the CPU testbed: clock skew (one-way times from two clocks)",
        fig(root, src.PROVISION, ("link", "rtt_ms", "p50"), "link round trip (median), CPU testbed", "{:.3f} ms",
            "measured"),
        fig(root, src.ETHERNET, naive + ("raw_up_ms", "p50"), "150 ms each way with a 65 ms clock skew reads, one way",
            "{:.0f} ms", "measured"),
        fig(root, src.ETHERNET, naive + ("raw_down_ms", "p50"), "and the other way", "{:.0f} ms", "measured"),
        pending="the two-node cluster run is pending")


def _m1(root: Path) -> Milestone:
    """The colocated baseline and the acceptance question."""
    return _answered(
        Milestone("M1", "Colocated baseline with vLLM; the low acceptance (23.8% / 40.5% at k=5)"),
        "the question is answered: counting (vLLM's rate divides by all k drafted)",
        fig(root, src.COLOCATED, ("agreement", "rates", 0), "draft acceptance rate, sdeth", "{:.3f}", "measured"),
        fig(root, src.COLOCATED, ("agreement", "rates", 1), "the same in vLLM", "{:.3f}", "measured"),
        fig(root, src.ACCEPTANCE, ("user_numbers", {"draft": "Qwen3-0.6B"}, "alpha behind it"),
            "23.8% at k=5 is a per-token alpha of", "{:.2f}", "modelled"),
        fig(root, src.ACCEPTANCE, ("user_numbers", {"draft": "Qwen3-1.7B"}, "alpha behind it"),
            "40.5% at k=5 is a per-token alpha of", "{:.2f}", "modelled"),
        pending="Qwen3 on the cluster is pending")


def _m2(root: Path) -> Milestone:
    """SD with the draft on its own GPU, against its goal (so far two GPUs of one host over loopback)."""
    goal = src.M2_GOAL
    m = Milestone("M2", f"SD with the draft on its own GPU faster than the target alone (goal: pipelined >= "
                        f"{goal:.2f}x); so far two GPUs of one host over loopback, not over Ethernet")
    for rel, mode, label in ((src.HEADLINE, "pipelined", "pipelined SD over TCP, 8B/1.7B shapes, alpha 0.71"),
                             (src.REPEATS[0], "pipelined", "the same, trace-driven"),
                             (src.SD_06B, "pipelined", "pipelined SD, 8B/0.6B shapes, alpha 0.56"),
                             (src.HEADLINE, "sync", "sync SD over TCP, 8B/1.7B shapes, alpha 0.71")):
        f = mode_fig(root, rel, mode, label)
        if f:
            m.figures.append(f)
    if m.figures:
        best = m.figures[0]
        if best.value >= goal:
            m.status = "done"
        else:
            faster = best.interval and best.interval[0] > 1.0
            m.status = "in progress"
            m.note = (("faster than the target alone on two GPUs of one host (interval above 1); " if faster else "")
                      + f"goal {goal:.2f}x not reached; over Ethernet and with real weights: pending")
    return m


def _m3(root: Path, earlier: list[Milestone]) -> Milestone:
    """The write-up: the reader's guide (30_writeup), drawn from the decisions kept in AGENT_LOG.md."""
    m = Milestone("M3", "Write-up: a reader's guide to the reports (30_writeup)")
    if (root / src.WRITEUP_HTML).exists():
        m.status = "done"
        m.note = ("rendered; it follows the milestones above (" + ", ".join(f"{x.id} {x.status}" for x in earlier)
                  + "); its source for decisions and dead ends is AGENT_LOG.md")
    elif (root / "AGENT_LOG.md").exists():
        m.status, m.note = "in progress", "the reader's guide (30_writeup) is not rendered yet"
    return m


def _m4(root: Path) -> Milestone:
    """Heterogeneous SD: the draft on other hardware, emulated, measured and modelled."""
    m = Milestone("M4", "Heterogeneous SD: the draft on other hardware (a Corsair-class card)")
    figs = [fig(root, src.HETERO, ("summary", "best_emulated_speedup"), "best emulated draft device, CPU testbed "
                "target", "{:.2f}x", "emulated"),
            mode_fig(root, src.CPU_DRAFT, "pipelined", "an H200 target with a 16-core CPU draft (0.6B shape), "
                     "pipelined"),
            fig(root, src.HETERO, ("summary", "draft_step_for_2x_ms"), "draft step for 2x over Qwen3-8B on an H200 "
                "(pipelined, alpha 0.71, RTT 0.2 ms)", "{:.2f} ms", "modelled",
                hardware="event model; the 8B step measured on an H200")]
    m.figures += [f for f in figs + _big_targets(root) if f]
    if m.figures:
        m.status = "in progress"
        m.note = "the Corsair-class card itself is emulated and modelled here, not measured"
    else:
        m.note = "pending: notebooks/40_heterogeneous has no results yet"
    return m


def _big_targets(root: Path) -> list:
    """M4's bigger targets, each call's figure from its own file (one H200, random weights), and the modelled
    70B-class claim as 40_heterogeneous checked it."""
    figs = []
    for rel in src.BIG_TARGETS:
        doc = load(root, rel)
        if doc is None:
            continue
        one = f"1x {(doc.get('hardware') or {}).get('label', '?')}, random weights, call {doc.get('call', '?')}"
        figs.append(fig(root, rel, ("targets", {"model": "Qwen3-32B", "weights": "bf16"}, "step_ms"),
                        "Qwen3-32B-shaped target step (bf16)", "{:.1f} ms", "measured", hardware=one))
        figs.append(fig(root, rel, ("targets", {"model": "Qwen2.5-72B", "weights": "fp8"}, "step_ms"),
                        "Qwen2.5-72B-shaped target step (fp8)", "{:.1f} ms", "measured", hardware=one))
        sd = ("sd", {"target": "Qwen2.5-72B", "target_weights": "fp8", "draft": "Qwen3-1.7B", "acceptance": "synthetic"})
        figs.append(fig(root, rel, sd + ("speedup",), "colocated SD over that 72B with the 1.7B draft shape, k=3, "
                        "alpha 0.71", "{:.2f}x", "synthetic", hardware=one, interval=sd + ("speedup_ci95",)))
    figs.append(fig(root, src.HETERO, ("summary", "pipelined_70b_2xh200_modelled_from_measured"), "pipelined SD over "
                    "a 70B-class target split over two H200s (modelled: its step scaled by the 32B's measured / "
                    "modelled step; assumes an H200-class draft and a 0.2 ms round trip)", "{:.2f}x", "modelled",
                    hardware="event model; steps measured on one H200"))
    return figs


def milestones(root: Path = REPO) -> list[Milestone]:
    """M0-M4 from the committed results under `root`."""
    root = Path(root)
    ms = [_m0(root), _m1(root), _m2(root)]
    ms.append(_m3(root, ms))
    ms.append(_m4(root))
    return ms


def milestone_table(ms: list[Milestone]) -> list[dict]:
    """One row per milestone: status, key figure, note (the write-up's milestone table)."""
    return [{"milestone": m.id, "what": m.title, "status": m.status,
             "key figure": f"{m.figures[0].label}: {m.figures[0].shown} ({m.figures[0].kind})" if m.figures else "-",
             "note": m.note or "-"} for m in ms]


def alternatives(ms: list[Milestone], root: Path = REPO) -> list[dict]:
    """Ours beside the published alternatives and beside a second target replica: speedup, and throughput per
    GPU relative to one GPU running the target alone (batch 1 each). A published figure that bundles several
    changes gets no per-GPU gain: it is not one option's."""
    rows = []
    for p in published(Path(root)):
        if "with SD tok/s" in p:
            sp = p["with SD tok/s"] / p["target-only tok/s"]
            per_gpu = f"{sp / p['GPUs']:.2f}"
        else:
            sp = p["target-only s/request"] / p["with SD s/request"]
            per_gpu = "n/a: three changes at once"
        rows.append({"option": p["what"], "speedup": f"{sp:.2f}x", "GPUs": p["GPUs"], "per-GPU vs one replica": per_gpu,
                     "kind": "published", "source": p["source"]})
    rows.append({"option": "a second target replica (two GPUs, one request each)", "speedup": "1.00x", "GPUs": 2,
                 "per-GPU vs one replica": "1.00", "kind": "arithmetic",
                 "source": "no speedup for one request; twice the requests per second"})
    m2 = next((m for m in ms if m.id == "M2"), None)
    for f in (m2.figures if m2 else [])[:2]:
        rows.append({"option": f"ours: {f.label}, {f.hardware} ({f.date} UTC)", "speedup": f"{f.value:.2f}x", "GPUs": 2,
                     "per-GPU vs one replica": f"{f.value / 2:.2f}", "kind": f.kind, "source": f.source})
    return rows

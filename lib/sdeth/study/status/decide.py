"""The decision table: target size x TPOT goal x the draft's hardware -> the option to run, each cell with its
figures (absolute TPOT and tokens/s beside every ratio), their kinds and sources; and the verdict above it.

Terms. *t(1)*: the target alone's TPOT (time per output token) at batch 1 on one GPU. A TPOT goal is a fraction
of it (`sources.TPOT_GOALS`); an option meets a goal when its speedup over the target alone reaches 1 / fraction
(the low end of its 95% interval where it has one). The rule: among the options that meet the goal, the one with
the most tokens/s per GPU; a published option names the best measured one beside it. A cell no figure here
meets says so."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...paths import REPO
from . import sources as src
from .answer import shared_figs
from .figures import Figure, fig, load, bench_hw, bench_kind, mode_fig

OPTIONS = ("replicas", "colocated SD", "EAGLE-3-style head", "remote sync", "remote pipelined")
SHARED_BY = 4            # targets that share one draft GPU in the bigger targets' remote option
EMULATED_MARGIN = 1.10   # an emulated option is the pick only with this much more tokens/s per GPU than a measured one


@dataclass
class Option:
    name: str                # one of OPTIONS
    tpot: Figure             # ms per output token
    tok_s: Figure            # tokens/s of one stream
    ratio: Figure            # speedup over the target alone
    gpus: float              # devices it occupies for that stream (a shared draft GPU counts 1 / its targets)
    note: str = ""

    @property
    def per_gpu(self) -> float:
        return self.tok_s.value / self.gpus

    def meets(self, need: float) -> bool:
        low = self.ratio.interval[0] if self.ratio.interval else self.ratio.value
        return low >= need - 1e-9

    @property
    def figures(self) -> list[Figure]:
        return [self.tpot, self.tok_s, self.ratio]


@dataclass
class Target:
    name: str                # "8B" | "32B" | "72B-class"
    what: str                # the model shape and where it ran
    t1: Figure               # the target alone's TPOT
    options: list[Option]
    crossover: list[Figure] = field(default_factory=list)   # TPOT above which batched replicas win (8B only)


@dataclass
class Cell:
    target: str
    goal: str                # tight | moderate | relaxed
    hardware: str            # "same GPU type" | "a cheaper card"
    option: str | None       # the recommendation; None: the evidence cannot fill it
    figures: list[Figure]
    note: str


def _bench_option(root: Path, name: str, mode: str, gpus: int, note: str = "") -> Option | None:
    """An option from the two-GPU `bench sd` of the 8B/1.7B shapes."""
    hw, kind = bench_hw(root, src.HEADLINE), bench_kind(root, src.HEADLINE)
    kind = "measured" if mode == "target-only" else kind
    tpot = fig(root, src.HEADLINE, ("runs", mode, "summary", "tpot_ms"), f"{name}: TPOT", "{:.2f} ms", kind, hw)
    tok = fig(root, src.HEADLINE, ("rows", {"mode": mode}, "tokens_per_s"), f"{name}: tokens/s", "{:.0f} tok/s", kind, hw)
    ratio = fig(root, src.HEADLINE, ("rows", {"mode": mode}, "speedup"), f"{name}: over the target alone", "{:.2f}x",
                kind, hw, interval=None if mode == "target-only" else ("rows", {"mode": mode}, "speedup_ci95"))
    return Option(name, tpot, tok, ratio, gpus, note) if tpot and tok and ratio else None


def _eagle(root: Path) -> Option | None:
    """The published EAGLE-3 head for Qwen3-8B (one H200, SGLang)."""
    at = ("figures", {"id": "eagle3-qwen3-8b-sglang-h200"})
    hw = "one H200, SGLang, batch not stated"
    tpot = fig(root, src.PUBLISHED_FILE, at + ("with SD tok/s",), "EAGLE-3-style head: TPOT (1000 / tok/s)", "{:.2f} ms",
               "published", hw, scale=1000.0, reciprocal=True)
    tok = fig(root, src.PUBLISHED_FILE, at + ("with SD tok/s",), "EAGLE-3-style head: tokens/s", "{:.0f} tok/s",
              "published", hw)
    ratio = fig(root, src.PUBLISHED_FILE, at + ("with SD tok/s",), "EAGLE-3-style head: over the target alone", "{:.2f}x",
                "published", hw, per=at + ("target-only tok/s",))
    note = "published, another engine"
    return Option("EAGLE-3-style head", tpot, tok, ratio, 1, note) if tpot and tok and ratio else None


def _target_8b(root: Path) -> Target | None:
    loop = "two GPUs of one host, TCP on loopback"
    opts = [_bench_option(root, "replicas", "target-only", 1), _bench_option(root, "colocated SD", "colocated", 1),
            _eagle(root), _bench_option(root, "remote sync", "sync", 2, loop),
            _bench_option(root, "remote pipelined", "pipelined", 2, loop + "; not through vLLM today")]
    opts = [o for o in opts if o]
    base = next((o for o in opts if o.name == "replicas"), None)
    if not base:
        return None
    cross = shared_figs(root, ("replicas_win_above_ms", "colocated", "tpot_ms"),
                        "batched replicas win above", "{:.2f} ms")
    return Target("8B", "Qwen3-8B shape, bf16, H200s, 1.7B-shaped draft, alpha 0.71", base.tpot, opts, cross)


def _cautious(root: Path, rels: tuple, items) -> tuple[str, dict] | None:
    """Of one benchmark's calls, the (file, document) whose matching item (items(doc): the candidates; the first
    with a speedup counts) has the lowest speedup; None when no call has one."""
    found = []
    for rel in rels:
        doc = load(root, rel) or {}
        item = next((x for x in items(doc) if "speedup" in x), None)
        if item:
            found.append((item["speedup"], rel, doc))
    return min(found)[1:] if found else None


def _big(root: Path, name: str, model: str, weights: str) -> Target | None:
    """A bigger target on one H200 (bench_targets): the call whose colocated SD is slowest (the cautious one)."""
    item = {"target": model, "target_weights": weights, "draft": "Qwen3-1.7B", "acceptance": "synthetic"}
    got = _cautious(root, src.BIG_TARGETS,
                    lambda doc: [s for s in doc.get("sd", []) if all(s.get(k) == v for k, v in item.items())])
    if not got:
        return None
    rel, doc = got
    hw = f"1x {(doc.get('hardware') or {}).get('label', '?')}, random weights, call {doc.get('call', '?')}"
    at = ("sd", item)
    only = at + ("target_only_tokens_per_s",)
    t1 = fig(root, rel, only, f"{name} alone: TPOT (1000 / tok/s, prefill included)", "{:.1f} ms", "measured", hw,
             scale=1000.0, reciprocal=True)
    base = Option("replicas", t1, fig(root, rel, only, f"{name} alone: tokens/s", "{:.1f} tok/s", "measured", hw),
                  fig(root, rel, only, f"{name} alone: over itself", "{:.2f}x", "arithmetic", hw, per=only), 1)
    col = Option("colocated SD", fig(root, rel, at + ("tokens_per_s",), f"colocated SD: TPOT over the {name} "
                                     "(1000 / tok/s)", "{:.1f} ms", "synthetic", hw, scale=1000.0, reciprocal=True),
                 fig(root, rel, at + ("tokens_per_s",), f"colocated SD: tokens/s over the {name}", "{:.1f} tok/s",
                     "synthetic", hw),
                 fig(root, rel, at + ("speedup",), f"colocated SD: over the {name} alone", "{:.2f}x",
                     "synthetic", hw, interval=at + ("speedup_ci95",)), 1, "1.7B-shaped draft, k = 3, alpha 0.71")
    return Target(name, f"{model} shape, {weights}, one H200; batch 1 only (batched runs at this size not measured)",
                  t1, [o for o in (base, col, _shared_big(root, name, model)) if o])


def _shared_big(root: Path, name: str, model: str) -> Option | None:
    """Remote pipelined streams: SHARED_BY emulated targets (one stream each, their measured t_v) share one draft
    server on its own GPU (bench streams); the call with the lower speedup (the cautious one)."""
    at = ("big_targets", model, "pipelined", {"B": 1, "N": SHARED_BY})
    got = _cautious(root, src.SERVER_STREAMS, lambda doc: [
        p for p in (doc.get("big_targets") or {}).get(model, {}).get("pipelined", [])
        if p.get("B") == 1 and p.get("N") == SHARED_BY])
    if not got:
        return None
    rel, doc = got
    hw = (f"1x {(doc.get('hardware') or {}).get('label', '?')}: {SHARED_BY} emulated targets, the real draft server "
          f"(Qwen3-1.7B shape), loopback, call {doc.get('call', '?')}")
    who = f"remote pipelined, {SHARED_BY} targets share a draft GPU"
    tpot = fig(root, rel, at + ("tpot_ms", "mean"), f"{who}: TPOT", "{:.1f} ms", "emulated", hw)
    tok = fig(root, rel, at + ("tokens_per_s",), f"{who}: tokens/s of one stream", "{:.1f} tok/s", "emulated", hw,
              per=at + ("N",))
    ratio = fig(root, rel, at + ("speedup",), f"{who}: over the {name} alone", "{:.2f}x", "emulated", hw)
    note = (f"emulated targets (their host work left out), synthetic alpha 0.71, k = 4; the draft GPU counted as "
            f"1/{SHARED_BY} a stream")
    return Option("remote pipelined", tpot, tok, ratio, 1 + 1 / SHARED_BY, note) if tpot and tok and ratio else None


def targets(root: Path = REPO) -> list[Target]:
    root = Path(root)
    return [t for t in (_target_8b(root), _big(root, "32B", "Qwen3-32B", "bf16"),
                        _big(root, "72B-class", "Qwen2.5-72B", "fp8")) if t]


def _same_gpu(t: Target, goal: str) -> Cell:
    frac = src.TPOT_GOALS[goal]
    need, goal_ms = 1 / frac, frac * t.t1.value
    cross = [f for f in t.crossover if f.value <= goal_ms]
    if goal == "relaxed" and cross and t.options[0].name == "replicas":
        o = t.options[0]
        return Cell(t.name, goal, "same GPU type", "replicas, batched", o.figures + cross,
                    "batched replicas give more tokens/s per GPU than SD above that TPOT (emulated targets)")
    fits = sorted((o for o in t.options if o.meets(need)), key=lambda o: -o.per_gpu)
    if not fits:
        best = max(t.options, key=lambda o: o.ratio.value)
        return Cell(t.name, goal, "same GPU type", None, best.figures,
                    f"no option here reaches {need:.2f}x; the fastest is {best.name}")
    pick, beside = fits[0], [o for o in fits[1:] if o.ratio.kind == "emulated"]
    solid = [o for o in fits if o.ratio.kind not in ("emulated", "published")]
    if pick.ratio.kind == "emulated" and solid and pick.per_gpu < EMULATED_MARGIN * solid[0].per_gpu:
        pick, beside = solid[0], [pick]             # emulated evidence wins only by a clear margin
    figures, note = list(pick.figures), pick.note
    for o in beside:
        figures += o.figures
        note += f"; also meets it: {o.name} ({o.ratio.kind}: {o.per_gpu:.1f} tok/s per GPU; {o.note})"
    measured = [o for o in fits if o.ratio.kind != "published"]
    if pick.ratio.kind == "published":
        if measured:
            figures += measured[0].figures
            note += f"; measured here: {measured[0].name}" + (f" ({measured[0].note})" if measured[0].note else "")
        else:
            note += "; nothing measured here reaches it"
    return Cell(t.name, goal, "same GPU type", pick.name, figures, note.strip("; "))


def _cheaper(root: Path, t: Target, goal: str, same: Cell) -> Cell:
    """A cheaper card for the draft: measured only as a 16-core CPU (8B shape), emulated as a Corsair-class card
    on the CPU testbed, modelled as the draft step 2x would need. The same-GPU pick stands when it needs no draft
    device; the cell says what a remote draft on a cheaper card would have to deliver."""
    if goal == "relaxed" or t.name != "8B":
        why = "no draft device in it" if same.option else "the evidence cannot fill it"
        extra = "" if t.name == "8B" else "; a remote draft on a cheaper card is not measured at this size"
        return Cell(t.name, goal, "a cheaper card", same.option, [], f"as on the same GPU type: {why}{extra}")
    cpu_hw, cpu_kind, who = bench_hw(root, src.CPU_DRAFT), bench_kind(root, src.CPU_DRAFT), "a 16-core CPU draft"
    pipe = ("rows", {"mode": "pipelined"})
    cpu = [fig(root, src.CPU_DRAFT, ("runs", "pipelined", "summary", "tpot_ms"), f"{who}, pipelined: TPOT",
               "{:.1f} ms", cpu_kind, cpu_hw),
           fig(root, src.CPU_DRAFT, pipe + ("tokens_per_s",), f"{who}, pipelined: tokens/s", "{:.1f} tok/s",
               cpu_kind, cpu_hw),
           mode_fig(root, src.CPU_DRAFT, "pipelined", f"{who}, pipelined: over an H200 target alone (0.6B shape)")]
    at = ("testbed", {"run": "sd, draft: corsair:Qwen3-1.7B:fp8 (emulated)"})
    bed = "CPU testbed, the embedded pair, the draft's step emulated as a Corsair-class card's (modelled step)"
    corsair = [fig(root, src.HETERO, at + ("tokens/s",), "a Corsair-class draft, emulated: TPOT (1000 / tok/s)", "{:.0f} ms",
                   "emulated", bed, scale=1000.0, reciprocal=True),
               fig(root, src.HETERO, at + ("tokens/s",), "a Corsair-class draft, emulated: tokens/s", "{:.2f} tok/s", "emulated",
                   bed),
               fig(root, src.HETERO, at + ("speedup",), "a Corsair-class draft, emulated: over the target alone", "{:.2f}x",
                   "emulated", bed)]
    remote = next((o for o in t.options if o.name == "remote pipelined"), None)
    price = remote and fig(root, src.HEADLINE, remote.ratio.path, "the most a draft card may cost, as a share of the "
                           "target GPU: speedup - 1, with an H200-fast draft", "{:.2f}",
                           "arithmetic", remote.ratio.hardware, offset=-1.0)
    step = fig(root, src.HETERO, ("summary", "draft_step_for_2x_ms"), "the draft step 2x needs: pipelined, alpha "
               "0.71, 0.2 ms round trip", "{:.2f} ms", "modelled", "event model; the 8B step measured on an H200")
    figures = [f for f in (*cpu, *corsair, price, step) if f]
    keep = f"keep {same.option}: " if same.option else ""
    return Cell(t.name, goal, "a cheaper card", same.option, figures,
                keep + "no cheaper card was run: a CPU draft loses, an emulated Corsair-class card breaks even at best; "
                "a card pays per token only below the price ratio shown, and only if it drafts as fast as an H200")


def table(root: Path = REPO) -> list[Cell]:
    """Every cell: each target x each TPOT goal x (same GPU type, a cheaper card)."""
    root = Path(root)
    cells = []
    for t in targets(root):
        for goal in src.TPOT_GOALS:
            same = _same_gpu(t, goal)
            cells += [same, _cheaper(root, t, goal, same)]
    return cells

"""The decision table: target size x TPOT goal x the draft's hardware -> the option to run, each cell lean (the pick,
its TPOT, tokens/s per GPU and speedup), the rest in the target's details row; testbed rows apart from the H200 rows.

The rule. A TPOT goal is a fraction of the row's t(1) (`sources.TPOT_GOALS`); an option meets it when its speedup
over t(1) reaches 1 / fraction at the low end of its 95% interval. Among the options of the row's one baseline
(`options.Target.options`: every mode and batch the results hold, sync included; never a named mode) that meet
the goal, the pick is the one with the most tokens/s per GPU (the draft GPU counted). A modelled or published
option is never a pick; an option measured on another baseline (`Target.apart`) is shown, not compared. A cell no
option meets says so. `check_claims` holds a verdict to the table: each named pick is the cell's, each figure is
one of the row's, and a comparison is made only between options of one baseline."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...paths import REPO
from . import sources as src
from .figures import Figure, fig, load, bench_hw, bench_kind, mode_fig
from .options import DEFINITIONS, Option, Target, targets as _targets  # noqa: F401

OPTIONS = ("replicas", "colocated SD", "EAGLE-3-style head", "remote sync", "remote pipelined", "remote adaptive",
           "remote step policy")
NO_DRAFT_DEVICE = ("replicas", "colocated SD", "EAGLE-3-style head")
NEVER_PICKED = ("modelled", "published")


@dataclass
class Cell:
    target: str
    goal: str                # tight | moderate | relaxed | a testbed row's label
    hardware: str            # "same GPU type" | "a cheaper card" | "testbed"
    option: str | None       # the recommendation; None: the evidence cannot fill it
    figures: list[Figure]
    note: str
    mode: str = ""           # the pick's mode and batch


@dataclass
class Claim:
    """What a verdict says of one cell: the pick it names (None: that nothing meets it), the figures it quotes, and
    the option it says the pick beats (lower TPOT), if any."""
    target: str
    goal: str
    option: str | None
    figures: list[Figure] = field(default_factory=list)
    over: str | None = None


def targets(root: Path = REPO) -> list[Target]:
    return _targets(Path(root))


def pick(t: Target, goal: str) -> Option | None:
    """The option the rule picks for a goal on the row's baseline; None when none meets it."""
    need = 1 / src.TPOT_GOALS[goal]
    fits = [o for o in t.options if o.meets(need) and o.ratio.kind not in NEVER_PICKED and o.baseline == t.baseline]
    return max(fits, key=lambda o: o.per_gpu) if fits else None


def _same_gpu(t: Target, goal: str) -> Cell:
    need, best = 1 / src.TPOT_GOALS[goal], pick(t, goal)
    if best is None:
        fastest = max(t.options, key=lambda o: o.ratio.value)
        return Cell(t.name, goal, "same GPU type", None, fastest.figures,
                    f"nothing on this baseline reaches {need:.2f}x at the low end of its interval; the fastest: "
                    f"{fastest.name} ({fastest.mode})", fastest.mode)
    return Cell(t.name, goal, "same GPU type", best.name, best.figures,
                "; ".join(x for x in (best.mode, best.note) if x), best.mode)


def _cheaper(root: Path, t: Target, same: Cell) -> Cell:
    """A cheaper card for the draft: not run at any H200 size. Where the pick holds no draft device it stands;
    else the cell names what a draft card may cost (8B: modelled from the measured step and the pick's speedup)."""
    if same.option is None or same.option in NO_DRAFT_DEVICE:
        why = "no draft device in it" if same.option else "the evidence cannot fill it"
        return Cell(t.name, same.goal, "a cheaper card", same.option, [], f"as on the same GPU type: {why}", same.mode)
    figures = []
    if t.name == "8B":
        o = next(o for o in t.options if o.name == same.option and o.mode == same.mode)
        figures = [fig(root, o.ratio.source, o.ratio.path, "the most a draft card may cost, as a share of the target "
                       "GPU: speedup - 1, with an H200-fast draft", "{:.2f}", "arithmetic", o.ratio.hardware,
                       per=o.ratio.per, offset=-1.0),
                   fig(root, src.HETERO, ("summary", "draft_step_for_2x_ms"), "the draft step 2x needs: pipelined, "
                       "alpha 0.71, 0.2 ms round trip", "{:.2f} ms", "modelled", "event model; the 8B step measured "
                       "on an H200")]
    return Cell(t.name, same.goal, "a cheaper card", same.option, [f for f in figures if f],
                f"keep {same.option} with an H200 draft: no cheaper card was run at this size (the testbed rows "
                "have a CPU draft and an emulated Corsair-class card)", same.mode)


def decision_table(root: Path = REPO) -> list[Cell]:
    """Every H200 cell: each target x each TPOT goal x (same GPU type, a cheaper card)."""
    root = Path(root)
    cells = []
    for t in targets(root):
        for goal in src.TPOT_GOALS:
            same = _same_gpu(t, goal)
            cells += [same, _cheaper(root, t, same)]
    return cells


def testbed(root: Path = REPO) -> list[Cell]:
    """The testbed rows, apart from the H200 rows: a 16-core CPU draft beside an H200 target (0.6B shape), a
    Corsair-class card emulated on the CPU testbed, and the link curve of the CPU testbed."""
    root = Path(root)
    cpu_hw, who = bench_hw(root, src.CPU_DRAFT), "a 16-core CPU draft"
    cpu = [fig(root, src.CPU_DRAFT, ("runs", "pipelined", "summary", "tpot_ms"), f"{who}, pipelined: TPOT",
               "{:.1f} ms", bench_kind(root, src.CPU_DRAFT), cpu_hw),
           fig(root, src.CPU_DRAFT, ("rows", {"mode": "pipelined"}, "tokens_per_s"), f"{who}, pipelined: tokens/s",
               "{:.1f} tok/s", bench_kind(root, src.CPU_DRAFT), cpu_hw),
           mode_fig(root, src.CPU_DRAFT, "pipelined", f"{who}, pipelined: over its H200 target alone (0.6B shape)")]
    at = ("testbed", {"run": "sd, draft: corsair:Qwen3-1.7B:fp8 (emulated)"})
    bed, lab = "CPU testbed, the embedded pair, the draft's step emulated as a Corsair-class card's", "Corsair-class"
    corsair = [fig(root, src.HETERO, at + ("tokens/s",), f"a {lab} draft, emulated: TPOT (1000 / tok/s)", "{:.0f} ms",
                   "emulated", bed, scale=1000.0, reciprocal=True),
               fig(root, src.HETERO, at + ("tokens/s",), f"a {lab} draft, emulated: tokens/s", "{:.2f} tok/s",
                   "emulated", bed),
               fig(root, src.HETERO, at + ("speedup",), f"a {lab} draft, emulated: over the target alone", "{:.2f}x",
                   "emulated", bed)]
    rows = [("a CPU draft, H200 target (0.6B shape)", cpu, "a CPU draft loses to the target alone"),
            ("a Corsair-class card, emulated (embedded pair)", corsair, "an emulated Corsair-class card breaks even "
             "at best")]
    out = [Cell("testbed", label, "testbed", None, [f for f in figs if f], note) for label, figs, note in rows
           if all(figs)]
    return out + link_rows(root)


def link_rows(root: Path) -> list[Cell]:
    """The link curve of the CPU testbed (reports/link_cpu.json): speedup at each injected round trip, measured
    through the real draft server, and the event model's figure at the same round trip."""
    doc = load(root, src.LINK_CPU)
    if not doc:
        return []
    out, col = [], ("colocated",)
    for mode in doc.get("modes", []):
        figs = [fig(root, src.LINK_CPU, ("target_only", "tpot_ms", "mean"), "the target alone: TPOT (per request)",
                    "{:.1f} ms", "measured"),
                fig(root, src.LINK_CPU, col + ("speedup",), "colocated SD, same prompts: over the target alone",
                    "{:.2f}x", "measured", interval=col + ("speedup_ci95",))]
        for p in [p for p in doc["points"] if p["mode"] == mode]:
            at = ("points", {"mode": mode, "injected_rtt_ms": p["injected_rtt_ms"]})
            lab = f"{mode} at {p['injected_rtt_ms']:g} ms injected round trip"
            figs += [fig(root, src.LINK_CPU, at + ("speedup",), f"{lab}: measured", "{:.2f}x", "measured",
                         interval=at + ("speedup_ci95",)),
                     fig(root, src.LINK_CPU, at + ("model_speedup",), f"{lab}: event model", "{:.2f}x", "modelled")]
        out.append(Cell("testbed", f"the link curve, {mode} (embedded pair, CPU)", "testbed", None,
                        [f for f in figs if f], "; ".join(x for x in (doc.get("summary", {}).get(mode, ""),
                                                                      doc.get("host_load_note", "")) if x)))
    return out


def _same(a: Figure, b: Figure) -> bool:
    return (a.source, a.path, a.per, a.stat, round(a.value, 9)) == (b.source, b.path, b.per, b.stat, round(b.value, 9))


def check_claims(claims: list[Claim], cells: list[Cell], ts: list[Target]) -> list[str]:
    """What a verdict claims that the table does not show, in words ([] when it claims nothing more)."""
    by_cell = {(c.target, c.goal): c for c in cells if c.hardware == "same GPU type"}
    by_target, bad = {t.name: t for t in ts}, []
    for cl in claims:
        cell, t = by_cell.get((cl.target, cl.goal)), by_target.get(cl.target)
        if cell is None or t is None:
            bad.append(f"{cl.target} {cl.goal}: no such cell")
            continue
        if cl.option != cell.option:
            bad.append(f"{cl.target} {cl.goal}: the verdict names {cl.option}, the table picks {cell.option}")
        shown = cell.figures + [t.t1]
        bad += [f"{cl.target} {cl.goal}: {f.label} is not in the table" for f in cl.figures
                if not any(_same(f, g) for g in shown)]
        if cl.over:
            rivals = [o for o in t.options if o.name == cl.over]
            mine = next((o for o in t.options if o.name == cell.option and o.mode == cell.mode), None)
            if not rivals or not mine:
                bad.append(f"{cl.target} {cl.goal}: {cl.over} is not on the row's baseline; no comparison")
            elif mine.tpot.value >= min(o.tpot.value for o in rivals):
                bad.append(f"{cl.target} {cl.goal}: {cell.option} does not have a lower TPOT than {cl.over}")
    return bad


def baselines_differ(t: Target) -> list[str]:
    """The options of a row whose baseline is not the row's ([] when all share it)."""
    return [f"{o.name} ({o.mode})" for o in t.options if o.baseline != t.baseline]


def misplaced(cells: list[Cell], ts: list[Target]) -> list[str]:
    """The same-GPU cells whose pick is not the rule's (the most tokens/s per GPU among the options of the row's
    baseline that meet the goal), in words; [] when every cell holds the rule's pick."""
    by_target, bad = {t.name: t for t in ts}, []
    for c in (c for c in cells if c.hardware == "same GPU type"):
        best = pick(by_target[c.target], c.goal)
        want = (best.name, best.mode) if best else (None, None)
        if (c.option, c.mode if c.option else None) != want:
            bad.append(f"{c.target} {c.goal}: the cell holds {c.option} ({c.mode}), the rule picks {want[0]} "
                       f"({want[1]})")
    return bad

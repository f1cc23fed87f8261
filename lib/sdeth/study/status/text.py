"""The verdict, the decision table and the whole status as Markdown (`python -m sdeth status`) or HTML (the index,
30_writeup)."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

from ...paths import REPO
from . import sources as src
from .answer import answer
from .decide import Cell, Claim, Target, decision_table, targets, testbed
from .figures import Figure, Milestone, Part
from .options import DEFINITIONS
from .milestones import milestones

PENDING = "Pending: no two-GPU result yet."
ROW_WORDS = {"8B": "For an 8B-class target", "32B": "For the 32B", "72B-class": "For the 72B-class"}


@dataclass
class Verdict(Part):
    """The verdict: its text, and the claims it makes of the table (decide.check_claims holds it to them)."""
    claims: list[Claim] = field(default_factory=list)


def _pick_pieces(t: Target, cell: Cell) -> tuple[list, Claim]:
    o = next((o for o in t.options if o.name == cell.option and o.mode == cell.mode), None)
    if o is None:
        return [f"{cell.goal}: nothing reaches it"], Claim(t.name, cell.goal, None)
    return ([f"{cell.goal}: {o.name} ({o.mode}) at ", o.tpot, ", ", o.per_gpu_fig, ", ", o.ratio],
            Claim(t.name, cell.goal, o.name, o.figures))


def _row_pieces(t: Target, cells: list[Cell]) -> tuple[list, list[Claim]]:
    """One sentence per target: t(1), then each goal's pick with its figures."""
    pieces, claims = [f"{ROW_WORDS.get(t.name, t.name)} ({t.definition} TPOT; {t.where}), t(1) ", t.t1, ": "], []
    for i, c in enumerate(c for c in cells if c.target == t.name and c.hardware == "same GPU type"):
        got, claim = _pick_pieces(t, c)
        pieces += (["; "] if i else []) + got
        claims.append(claim)
    colocated = [o for o in t.options if o.name == "colocated SD"]
    remote = [c for c in claims if c.option and c.option.startswith("remote")]
    if colocated and remote:        # a comparison only between options of one baseline, and only when it holds
        beats = [c for c in remote if c.figures[0].value < min(o.tpot.value for o in colocated)]
        for c in beats:
            c.over = "colocated SD"
        if beats:
            pieces.append(f"; at the {' and '.join(c.goal for c in beats)} goal the pick has a lower TPOT than "
                          "colocated SD on the same baseline")
    never = [o for o in ("remote sync", "remote pipelined") if t.modelled and not any(
        f.label.startswith(f"modelled: {o} ") for f in t.modelled)]
    if never:
        pieces.append(f"; modelled on this row's components, {' and '.join(never)} never beats colocated SD")
    apart = sorted({o.name for o in t.apart})
    if apart:
        pieces.append(f"; {' and '.join(apart)} measured on another baseline (details row), not compared")
    return pieces + [". "], claims


def verdict(root: Path = REPO) -> Verdict | None:
    """The answer in one paragraph, generated from the decision table (its picks and figures only); None while
    the 8B benchmark is missing."""
    root = Path(root)
    ts, cells = targets(root), decision_table(root)
    if not any(t.name == "8B" for t in ts):
        return None
    pieces, claims = [], []
    for t in ts:
        got, cl = _row_pieces(t, cells)
        pieces, claims = pieces + got, claims + cl
    pieces.append("Each pick is the most tokens/s per GPU (the draft GPU counted) among the options of the row's "
                  "baseline that meet the goal at the low end of their 95% interval; random weights, synthetic "
                  "acceptance, TCP on loopback. vLLM calls its proposer once a step; its stream and policy modes draft "
                  "while vLLM verifies, as a pipelined pick does, measured on CPUs only. A cheaper draft card, a real network and real weights are not measured; "
                  "the bigger targets' remote options ran against emulated targets.")
    return Verdict("Verdict", pieces, claims)


def decision(root: Path = REPO) -> str:
    """The decision in one plain line (a notebook's status line): the same-GPU pick of every cell."""
    cells = [c for c in decision_table(root) if c.hardware == "same GPU type"]
    if not cells:
        return PENDING
    picks = [f"{c.target} {c.goal}: " + (f"{c.option} ({c.mode})" if c.option else "the evidence cannot fill it")
             for c in cells]
    return ("Decision (H200s, random weights, each row on its own baseline; python -m sdeth status has every "
            "figure): " + "; ".join(picks) + ". Real weights over a real link: pending.")


def _groups(figs: list[Figure]) -> list[tuple[str, str, list[Figure]]]:
    """Consecutive figures of one kind and source, together: [(kind, source, figures)]."""
    return [(k, s, list(g)) for (k, s), g in groupby(figs, key=lambda f: (f.kind, f.source))]


def _goal_text(t: Target, goal: str) -> str:
    frac = src.TPOT_GOALS[goal]
    return f"{goal}: <= {frac * t.t1.value:.2f} ms ({frac:g} t(1), {1 / frac:.2f}x)"


def _cell_md(c: Cell) -> str:
    head = f"*{c.option}*" if c.option else "*the evidence cannot fill it*"
    body = "; ".join(", ".join(f"{f.label.split(': ')[-1]} **{f.shown}**" for f in fs) + f" ({k}; {s})"
                     for k, s, fs in _groups(c.figures))
    return " ".join(x for x in (head + ":", body, f"({c.note})" if c.note else "") if x).replace("|", "/")


def _details(t: Target) -> list[Cell]:
    """The target's details row: every option of its baseline, then those measured on another baseline."""
    rows = [Cell(t.name, "details", "details", None, o.figures + o.details,
                 f"{o.name} ({o.mode})" + (f": {o.note}" if o.note else "")) for o in t.options]
    rows += [Cell(t.name, "details", "details", None, o.figures, f"another baseline: {o.name} ({o.mode}), "
                  f"{o.baseline.split(' | ')[0]}; {o.note}") for o in t.apart]
    never = [o for o in ("remote sync", "remote pipelined") if not any(f.label.startswith(f"modelled: {o} ")
                                                                       for f in t.modelled)]
    rows += [Cell(t.name, "details", "details", None, t.link, "what Ethernet costs: a device call's link curve "
                  "(its own call and harness, not compared with this row's options)")] if t.link else []
    rows += [Cell(t.name, "details", "details", None, t.branches, "branches sent ahead: a device call's verdict-cache "
                  "part, B = 1, N = 1 (its own call and harness, not compared with this row's options)")
             ] if t.branches else []
    return rows + ([Cell(t.name, "details", "details", None, t.modelled, "what would change the answer: the models "
                         "fed this row's components" + (f"; {' and '.join(never)} never beat colocated SD below alpha "
                                                        "0.99" if never else ""))] if t.modelled else [])


def _baseline_text(t: Target) -> str:
    return f"one baseline: {DEFINITIONS[t.definition]}"


def decision_markdown(root: Path = REPO) -> str:
    """The decision table as Markdown: a row per target and TPOT goal, a column per draft hardware; then each
    target's details row, then the testbed rows."""
    ts = {t.name: t for t in targets(root)}
    cells = decision_table(root)
    if not cells:
        return PENDING + "\n"
    out = ["| target (t(1)) | TPOT goal | draft on the same GPU type | draft on a cheaper card |", "|---|---|---|---|"]
    for (name, goal), pair in groupby(cells, key=lambda c: (c.target, c.goal)):
        same, cheap = list(pair)
        t = ts[name]
        out.append(f"| {name}: {t.what}, t(1) **{t.t1.shown}** ({t.t1.kind}; {t.t1.source}) | {_goal_text(t, goal)} "
                   f"| {_cell_md(same)} | {_cell_md(cheap)} |")
        if goal == list(src.TPOT_GOALS)[-1]:
            detail = " ".join(_cell_md(c).removeprefix("*the evidence cannot fill it*: ") for c in _details(t))
            out.append(f"| {name}: details | {_baseline_text(t)} | {detail} | |")
    for c in testbed(root):
        out.append(f"| testbed (not an H200 row) | {c.goal} | {_cell_md(c).removeprefix('*the evidence cannot fill it*: ')}"
                   " | |")
    return "\n".join(out) + "\n"


def _subject(f: Figure, option: str | None) -> str:
    """What a group of figures is about (its first label up to the colon), unless it is the cell's option."""
    subject = f.label.split(":")[0].split(" (")[0]
    return "" if subject == option else f"{html.escape(subject)}: "


def _cell_html(c: Cell) -> str:
    head = (f'<span class="opt">{html.escape(c.option)}</span>' if c.option
            else '<span class="gap">the evidence cannot fill it</span>')
    body = "<br>".join(_subject(fs[0], c.option) + ", ".join(f"<b>{html.escape(f.shown)}</b>" for f in fs)
                       + f' <span class="src">({html.escape(k)}; {html.escape(s.removeprefix("reports/"))})</span>'
                       for k, s, fs in _groups(c.figures))
    note = f'<br><span class="note">{html.escape(c.note)}</span>' if c.note else ""
    return head + (f"<br>{body}" if body else "") + note


def _spans(cells: list[str]) -> list[tuple[str, int] | None]:
    """Runs of identical cells merged: (cell, rows it spans) for the first of a run, None for the rest."""
    out: list[tuple[str, int] | None] = []
    for c in cells:
        last = next((i for i in range(len(out) - 1, -1, -1) if out[i] is not None), None)
        if last is not None and out[last][0] == c:
            out[last] = (c, out[last][1] + 1)
            out.append(None)
        else:
            out.append((c, 1))
    return out


def _td(span: tuple[str, int] | None) -> str:
    if span is None:
        return ""
    return f'<td rowspan="{span[1]}">{span[0]}</td>' if span[1] > 1 else f"<td>{span[0]}</td>"


def _plain_html(c: Cell) -> str:
    """A details or testbed cell: its figures and note, no pick."""
    return _cell_html(c).split("<br>", 1)[-1] if c.figures or c.note else ""


def decision_html(root: Path = REPO) -> str:
    """The decision table as an HTML table (the index and 30_writeup); equal neighbouring cells merged; each
    target's details row under its goals, the testbed rows last."""
    ts = {t.name: t for t in targets(root)}
    cells = decision_table(root)
    if not cells:
        return f"<p>{PENDING}</p>"
    rows = []
    for name, group in groupby(cells, key=lambda c: c.target):
        group, t = list(group), ts[name]
        same = _spans([_cell_html(c) for c in group if c.hardware == "same GPU type"])
        cheap = _spans([_cell_html(c) for c in group if c.hardware == "a cheaper card"])
        for i, goal in enumerate(src.TPOT_GOALS):
            lead = (f'<th rowspan="{len(src.TPOT_GOALS) + 1}">{html.escape(name)}<br><span class="note">'
                    f'{html.escape(t.what)}</span><br>t(1) <b>{html.escape(t.t1.shown)}</b> <span class="src">'
                    f'({t.t1.kind}; {html.escape(t.t1.source.removeprefix("reports/"))})</span></th>') if i == 0 else ""
            rows.append(f"<tr>{lead}<td>{html.escape(_goal_text(t, goal))}</td>{_td(same[i])}{_td(cheap[i])}</tr>")
        detail = "<br>".join(_plain_html(c) for c in _details(t))
        rows.append(f'<tr class="details"><td>details: {html.escape(_baseline_text(t))}</td><td colspan="2">'
                    f'<details><summary>every option of this baseline, and those measured elsewhere</summary>{detail}'
                    "</details></td></tr>")
    for c in testbed(root):
        rows.append(f'<tr class="testbed"><th>testbed (not an H200 row)</th><td>{html.escape(c.goal)}</td>'
                    f'<td colspan="2">{_plain_html(c)}</td></tr>')
    return ('<table class="decision"><tr><th>target</th><th>TPOT goal</th><th>draft on the same GPU type</th>'
            '<th>draft on a cheaper card</th></tr>' + "".join(rows) + "</table>")


def markdown(ms: list[Milestone] | None = None, only: str | None = None, root: Path = REPO) -> str:
    """The summary as Markdown: the verdict, the decision table, the answer's parts, then the milestones;
    only: one milestone id."""
    ms = ms if ms is not None else milestones(root)
    if only and only not in {m.id for m in ms}:
        raise ValueError(f"milestone {only!r}: use one of {', '.join(m.id for m in ms)}")
    out = []
    if not only:
        v = verdict(root)
        out += [v.markdown() if v else PENDING, "", "**The decision table.**", "", decision_markdown(root)]
        parts = answer(root)
        out += ["**The answer so far, in parts.**"] + [f"- {p.markdown()}" for p in parts]
        out += ["- Real weights over a real link: pending." if parts else f"- {PENDING}", ""]
    for m in ms:
        if only and m.id != only:
            continue
        out.append(f"### {m.id} · {m.title} — {m.status}")
        out += [f"- {f.text()}" for f in m.figures]
        if m.note:
            out.append(f"- {m.note}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"

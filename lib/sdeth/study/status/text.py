"""The verdict, the decision table and the whole status as Markdown (`python -m sdeth status`) or HTML (the index,
30_writeup)."""
from __future__ import annotations

import html
from itertools import groupby
from pathlib import Path

from ...paths import REPO
from . import sources as src
from .answer import answer
from .decide import SHARED_BY, Cell, Target, table, targets
from .figures import Figure, Milestone, Part, fig, bench_hw
from .milestones import milestones

PENDING = "Pending: no two-GPU result yet."


def _opt(t: Target, name: str):
    return next((o for o in t.options if o.name == name), None)


def verdict(root: Path = REPO) -> Part | None:
    """The answer in one paragraph, every figure read from its results JSON; None while the 8B benchmark is
    missing."""
    root = Path(root)
    ts = {t.name: t for t in targets(root)}
    small = ts.get("8B")
    alone, pipe = (_opt(small, "replicas"), _opt(small, "remote pipelined")) if small else (None, None)
    if not (alone and pipe):
        return None
    per_gpu = fig(root, src.HEADLINE, ("rows", {"mode": "pipelined"}, "tokens_per_s"), "remote pipelined: tokens/s "
                  "per GPU", "{:.0f} tok/s per GPU", "arithmetic", bench_hw(root, src.HEADLINE), scale=0.5)
    pieces = ["For an 8B-class target, a draft on its own GPU buys a little latency and costs throughput: pipelined "
              "SD with the draft on a second GPU of the same host (TCP on loopback, random weights, synthetic "
              "acceptance, one request at a time) cuts TPOT from ", alone.tpot, " to ", pipe.tpot, " (", pipe.ratio,
              ") but gives ", per_gpu, " against ", alone.tok_s, " for a second replica of the target"]
    eagle = _opt(small, "EAGLE-3-style head")
    if eagle:
        pieces += ["; a published EAGLE-3 head on the target's own GPU reports ", eagle.tpot, ", ", eagle.tok_s, " (",
                   eagle.ratio, ")"]
    big = [(n, _opt(ts[n], "colocated SD")) for n in ("32B", "72B-class") if n in ts]
    if big:
        pieces.append(". For bigger targets the draft is relatively cheaper, and colocated SD on the target's own "
                      "H200 pays:")
        for i, (n, o) in enumerate(big):
            pieces += [" and " if i else " ", o.ratio, f" over the {n} (", o.tpot, ", ", o.tok_s, ")"]
    shared = [(n, _opt(ts[n], "remote pipelined")) for n in ("32B", "72B-class") if n in ts]
    shared = [(n, o) for n, o in shared if o]
    if shared:
        pieces.append(f". A draft GPU shared by {SHARED_BY} such targets over TCP (emulated targets, one H200 on "
                      "loopback) gives")
        for i, (n, o) in enumerate(shared):
            col = _opt(ts[n], "colocated SD")
            vs = f", {o.per_gpu / col.per_gpu:.2f}x colocated SD's" if col else ""
            pieces += [" and " if i else " ", o.ratio, f" over the {n} (", o.tpot, f", {o.per_gpu:.1f} tok/s per GPU{vs})"]
        pieces.append(": lower TPOT than colocated SD, not yet shown with real targets")
    pieces.append(". For an 8B target, remote SD earns its second GPU only for a TPOT goal the colocated options "
                  "miss, with a GPU to spare and outside vLLM (vLLM runs a proposer synchronously). A cheaper draft "
                  "card, a real network and real weights are not measured.")
    return Part("Verdict", pieces)


def decision(root: Path = REPO) -> str:
    """The decision in one plain line (a notebook's status line): the same-GPU pick of every cell."""
    cells = [c for c in table(root) if c.hardware == "same GPU type"]
    if not cells:
        return PENDING
    picks = [f"{c.target} {c.goal}: {c.option or 'the evidence cannot fill it'}" for c in cells]
    return ("Decision (H200s, batch 1, random weights; python -m sdeth status has every figure): " + "; ".join(picks)
            + ". Real weights over a real link: pending.")


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


def decision_markdown(root: Path = REPO) -> str:
    """The decision table as Markdown: a row per target and TPOT goal, a column per draft hardware."""
    ts = {t.name: t for t in targets(root)}
    cells = table(root)
    if not cells:
        return PENDING + "\n"
    out = ["| target (t(1)) | TPOT goal | draft on the same GPU type | draft on a cheaper card |", "|---|---|---|---|"]
    for (name, goal), pair in groupby(cells, key=lambda c: (c.target, c.goal)):
        same, cheap = list(pair)
        t = ts[name]
        out.append(f"| {name}: {t.what}, t(1) **{t.t1.shown}** ({t.t1.kind}; {t.t1.source}) | {_goal_text(t, goal)} "
                   f"| {_cell_md(same)} | {_cell_md(cheap)} |")
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


def decision_html(root: Path = REPO) -> str:
    """The decision table as an HTML table (the index and 30_writeup); equal neighbouring cells merged."""
    ts = {t.name: t for t in targets(root)}
    cells = table(root)
    if not cells:
        return f"<p>{PENDING}</p>"
    rows = []
    for name, group in groupby(cells, key=lambda c: c.target):
        group, t = list(group), ts[name]
        same = _spans([_cell_html(c) for c in group if c.hardware == "same GPU type"])
        cheap = _spans([_cell_html(c) for c in group if c.hardware == "a cheaper card"])
        for i, goal in enumerate(src.TPOT_GOALS):
            lead = (f'<th rowspan="{len(src.TPOT_GOALS)}">{html.escape(name)}<br><span class="note">'
                    f'{html.escape(t.what)}</span><br>t(1) <b>{html.escape(t.t1.shown)}</b> <span class="src">'
                    f'({t.t1.kind}; {html.escape(t.t1.source.removeprefix("reports/"))})</span></th>') if i == 0 else ""
            rows.append(f"<tr>{lead}<td>{html.escape(_goal_text(t, goal))}</td>{_td(same[i])}{_td(cheap[i])}</tr>")
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

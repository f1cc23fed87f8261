"""A figure: one number read from a results JSON (its `source`, and the `path` of keys inside it), with its
hardware, date and kind; a part of the answer (text and figures); a milestone. And the readers that build them.

Kinds: *measured*; *synthetic* or *trace-driven* (measured timing on random weights, acceptance set by a coin or
replayed from a real pair's trace); *emulated* (a device or a model stood in for by measured times); *modelled*
(the event model or the cost model); *arithmetic* (measured figures combined by a stated rule, e.g. per GPU);
*published* (a cited page, never measured here)."""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Figure:
    label: str
    value: float
    fmt: str                 # how the value prints, e.g. "{:.2f}x"
    source: str              # results JSON, relative to the repository
    path: tuple              # keys into it; a dict selects the list item whose fields match
    hardware: str
    kind: str                # measured | synthetic | trace-driven | emulated | modelled | arithmetic | published
    date: str                # when the source was written, to the minute (UTC)
    interval: tuple | None = None     # a 95% interval, printed with the value's format
    scale: float = 1.0       # value = the JSON's number x scale (1/2: per GPU of two)
    reciprocal: bool = False          # value = scale / the JSON's number (1000 / tok/s: ms per token)
    per: tuple | None = None          # value = the JSON's number / the number at `per` (a ratio of two), x scale
    offset: float = 0.0               # then + offset (speedup - 1: the price ratio a second device may cost)
    stat: str = ""           # "p50:tpot_ms": the path holds a list of records; the value is that quantile of the field

    @property
    def shown(self) -> str:
        s = self.fmt.format(self.value)
        if self.interval:
            s += " [" + ", ".join(self.fmt.format(x).rstrip("x") for x in self.interval) + "]"
        return s

    def text(self) -> str:
        return f"{self.label}: **{self.shown}** ({self.kind}; {self.hardware}; {self.date}; {self.source})"


def read_back(f: Figure, root: Path) -> float:
    """The figure's number as its results JSON holds it, with the figure's stated rule applied."""
    doc = json.loads((Path(root) / f.source).read_text())
    return apply(reduce(dig(doc, f.path), f.stat), dig(doc, f.per) if f.per else 1.0, f.scale, f.reciprocal, f.offset)


def reduce(raw, stat: str):
    """A quantile of one field over a list of records ("p99:tpot_ms", nearest rank); raw itself when stat is ""."""
    if not stat:
        return raw
    q, key = stat.split(":")
    xs = sorted(r[key] for r in raw if r.get(key) is not None)
    return xs[min(len(xs) - 1, max(0, math.ceil(float(q[1:]) / 100 * len(xs)) - 1))] if xs else None


def apply(raw: float, per: float, scale: float, reciprocal: bool, offset: float) -> float:
    """A figure's value from the JSON's numbers: scale / raw, or raw / per x scale, then + offset."""
    return (scale / raw if reciprocal else raw / per * scale) + offset


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
        srcs = ", ".join(dict.fromkeys(f.source for f in self.figures))
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
    status: str = "pending"          # done | answered (a confirming run not made) | in progress | pending
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


def load(root: Path, rel: str):
    p = Path(root) / rel
    return json.loads(p.read_text()) if p.exists() else None


def when(doc: dict) -> str:
    """The results' `created`, to the minute: '2026-12-01 02:22' (UTC)."""
    return str(doc.get("created", "?"))[:16].replace("T", " ")


def fig(root: Path, rel: str, path: tuple, label: str, fmt: str, kind: str, hardware: str | None = None,
        interval: tuple | None = None, scale: float = 1.0, reciprocal: bool = False, per: tuple | None = None,
        offset: float = 0.0, stat: str = "") -> Figure | None:
    """A figure from a results JSON, or None when the file or the key is not there (pending)."""
    doc = load(root, rel)
    if doc is None:
        return None
    try:
        raw, by = reduce(dig(doc, path), stat), (dig(doc, per) if per else 1.0)
        ci = tuple(x * scale + offset for x in dig(doc, interval)) if interval else None
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(raw, (int, float)) or not isinstance(by, (int, float)) or not by or (reciprocal and not raw):
        return None
    hw = hardware or (doc.get("hardware") or {}).get("label") or "?"
    value = apply(float(raw), float(by), scale, reciprocal, offset)
    return Figure(label, value, fmt, rel, path, hw, kind, when(doc) if "created" in doc else "n/a", ci, scale,
                  reciprocal, per, offset, stat)


def bench_kind(root: Path, rel: str) -> str:
    doc = load(root, rel) or {}
    kind = doc.get("acceptance_kind") or str(doc.get("acceptance", "?")).split(":")[0]
    return f"{kind}, emulated target" if doc.get("target_emulation") else kind


def bench_hw(root: Path, rel: str) -> str | None:
    """Where a `bench sd` result ran, in words: GPUs, one host or not, the link, the pair of shapes."""
    doc = load(root, rel)
    if not doc:
        return None
    target, draft = doc["hardware"].get("label", "?"), (doc.get("draft_hardware") or {}).get("label")
    if emulated := doc.get("target_emulation"):
        return (f"1x {draft or target} for the draft, the target emulated ({emulated.get('model')} times measured on "
                f"{emulated.get('hardware')}), {doc['config']['pair']}")
    if draft is None:
        where = f"1x {target}"
    elif draft == target:
        where = f"2x {target} of one host, TCP on loopback"
    else:
        where = f"{target} target, {draft} draft, one host, TCP on loopback"
    return f"{where}, {doc['config']['pair']}"


def mode_fig(root: Path, rel: str, mode: str, label: str, scale: float = 1.0) -> Figure | None:
    """A `bench sd` result's speedup for one mode, with its 95% interval."""
    return fig(root, rel, ("rows", {"mode": mode}, "speedup"), label, "{:.2f}x",
               "arithmetic" if scale != 1.0 else bench_kind(root, rel), bench_hw(root, rel),
               interval=("rows", {"mode": mode}, "speedup_ci95"), scale=scale)

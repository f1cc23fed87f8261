"""reports/index.html: the answer first (from study.status), then one line per rendered report."""
from __future__ import annotations

import html
import json
import time
from pathlib import Path

from .results import REPORTS, results_path

# what kind of figures each report holds (the index says so beside each)
KINDS = {"00_provision": "measured", "10_colocated": "measured", "15_acceptance": "measured and modelled",
         "20_ethernet": "measured on the CPU testbed; recorded two-GPU runs with synthetic or trace-driven acceptance",
         "25_draft_server": "measured on the CPU testbed; one H200 with emulated targets against the real draft server; "
                            "EAGLE-3 modelled",
         "30_writeup": "reads the results of the others", "40_heterogeneous": "measured, emulated and modelled"}


def write_index(rows: list[tuple[str, bool, str]]) -> Path:
    """reports/index.html: the answer first (the decision and the milestones, from study.status), then one
    line per report with the kind of its figures and its hardware."""
    from . import status as st
    items = []
    for name, ok, status in rows:
        js = f' · <a href="{name}.json">results JSON</a>' if (REPORTS / f"{name}.json").exists() else ""
        res = results_path(name)
        hw = (json.loads(res.read_text()).get("hardware") or {}).get("label", "") if res.exists() else ""
        kind = KINDS.get(name, "")
        about = html.escape("; ".join(x for x in (kind, hw and f"on {hw}") if x))
        mark = "✓" if ok else "✗ failed:"
        items.append(f'<li><a href="{name}.html">{name}</a>{js} <small>({about})</small><br>'
                     f'<small>{mark} {html.escape(status)}</small></li>')
    ms = st.milestones()
    table = "".join(f"<tr><td>{m.id}</td><td>{html.escape(m.title)}</td><td><b>{m.status}</b></td>"
                    f"<td>{'<br>'.join(html.escape(f.label + ': ' + f.shown + ' (' + f.kind + ')') for f in m.figures[:2])}"
                    f"{'<br><small>' + html.escape(m.note) + '</small>' if m.note else ''}</td></tr>" for m in ms)
    parts = st.answer()
    answer = ("<ul>" + "".join(f"<li>{p.html()}</li>" for p in parts)
              + "<li>Real weights over a real link: pending.</li></ul>" if parts else "<p>Pending: no two-GPU result yet.</p>")
    page = f"""<!doctype html><meta charset="utf-8"><title>sd-ethernet reports</title>
<style>body{{font-family:sans-serif;max-width:52em;margin:2em auto}} li{{margin:.8em 0}}</style>
<h1>sd-ethernet: speculative decoding with the draft and the target on different machines</h1>
<p><b>The answer so far</b> (each figure bold, read from the results JSON named after it):</p>
{answer}
<table border="1" cellpadding="4" style="border-collapse:collapse;font-size:90%">
<tr><th></th><th>milestone</th><th>status</th><th>key figures (python -m sdeth status has them all, with sources)</th></tr>
{table}</table>
<p>Rendered by <code>make report</code> on {html.escape(time.strftime('%Y-%m-%d %H:%M %Z'))}. Each report states
the hardware, models and settings behind its numbers; synthetic or emulated figures are labelled so.</p>
<ul>{''.join(items)}</ul>"""
    path = REPORTS / "index.html"
    path.write_text(page)
    return path

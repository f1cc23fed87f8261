"""reports/index.html: the verdict and the decision table first (from study.status), then the answer in parts,
the milestones, one line per rendered report, and the glossary."""
from __future__ import annotations

import html
import json
import time
from pathlib import Path

from ..results import REPORTS, results_path

TITLE = "sd-ethernet: speculative decoding with the draft model on its own device"
# what kind of figures each report holds (the index says so beside each)
KINDS = {"00_provision": "measured on the CPU testbed", "10_colocated": "measured on the CPU testbed",
         "15_acceptance": "measured and modelled",
         "20_ethernet": "measured on the CPU testbed; two GPUs of one host over loopback, with synthetic or "
                        "trace-driven acceptance",
         "25_draft_server": "measured on the CPU testbed; one H200 with emulated targets against the real draft "
                            "server; EAGLE-3 modelled",
         "30_writeup": "reads the results of the others", "40_heterogeneous": "measured, emulated and modelled"}
STYLE = """body{font-family:sans-serif;max-width:78em;margin:.6em auto;font-size:14px;line-height:1.3}
h1{font-size:1.3em;margin:.2em 0} h2{font-size:1.1em} p.sub{margin:.1em 0 .4em;color:#444}
p.verdict{margin:.3em 0 .5em} li{margin:.6em 0}
table{border-collapse:collapse} td,th{border:1px solid #bbb;padding:2px 5px;vertical-align:top}
table.decision{font-size:11.5px;line-height:1.2} table.decision th{background:#f2f2f2;text-align:left}
.opt{font-weight:bold;color:#064} .gap{font-weight:bold;color:#a40} .src,.note{color:#555;font-size:92%}
dl.glossary dt{font-weight:bold;float:left;clear:left;width:11em} dl.glossary dd{margin:0 0 .3em 11.5em}
a.term{color:inherit;text-decoration:underline dotted}"""


def _reports(rows: list[tuple[str, bool, str]]) -> str:
    """A row per report: its page and results, the kind of its figures and its hardware, its status line."""
    items = []
    for name, ok, status in rows:
        js = f' · <a href="{name}.json">results JSON</a>' if (REPORTS / f"{name}.json").exists() else ""
        res = results_path(name)
        hw = (json.loads(res.read_text()).get("hardware") or {}).get("label", "") if res.exists() else ""
        about = html.escape("; ".join(x for x in (KINDS.get(name, ""), hw and f"on {hw}") if x))
        mark = "✓" if ok else "✗ failed:"
        items.append(f'<tr><td><a href="{name}.html">{name}</a>{js}</td><td>{about}</td>'
                     f'<td class="note">{mark} {html.escape(status)}</td></tr>')
    return ('<table class="reports"><tr><th>report</th><th>its figures</th><th>its status line</th></tr>'
            + "".join(items) + "</table>")


def _milestones(ms) -> str:
    rows = "".join(f"<tr><td>{m.id}</td><td>{html.escape(m.title)}</td><td><b>{m.status}</b></td>"
                   f"<td>{'<br>'.join(html.escape(f.label + ': ' + f.shown + ' (' + f.kind + ')') for f in m.figures[:2])}"
                   f"{'<br><small>' + html.escape(m.note) + '</small>' if m.note else ''}</td></tr>" for m in ms)
    return ('<table class="milestones"><tr><th></th><th>milestone</th><th>status</th><th>key figures '
            '(python -m sdeth status has them all, with sources)</th></tr>' + rows + "</table>")


def write_index(rows: list[tuple[str, bool, str]]) -> Path:
    """reports/index.html: the verdict and the decision table, the answer's parts, the milestones, the reports,
    the glossary; every figure read from the results JSON named beside it."""
    from .. import status as st
    from ..status.glossary import glossary_html, link_first_use
    v = st.verdict()
    verdict = f'<p class="verdict">{v.html()}</p>' if v else f"<p>{st.text.PENDING}</p>"
    parts = st.answer()
    answer = ("".join(f"<p>{p.html()}</p>" for p in parts) + "<p>Real weights over a real link: pending.</p>"
              if parts else f"<p>{st.text.PENDING}</p>")
    page = f"""<!doctype html><html lang="en"><meta charset="utf-8"><title>{html.escape(TITLE)}</title>
<style>{STYLE}</style>
<h1>{html.escape(TITLE)}</h1>
<p class="sub">So far on two GPUs of one host over loopback, on one GPU, or on a CPU testbed; over Ethernet between
two machines: pending. Which option to run, by target size, TPOT goal and the draft's hardware:</p>
{verdict}
{st.decision_html()}
<p class="note">The rule: among the options that meet the goal (the low end of a measured interval reaches the
needed speedup), the one with the most tokens/s per GPU. Every figure is read from the results JSON named beside it,
with its kind (glossary below).</p>
<h2 id="parts">The answer in parts</h2>
{answer}
<h2>Milestones</h2>
{_milestones(st.milestones())}
<h2>The reports</h2>
<p>Rendered by <code>make report</code> on {html.escape(time.strftime('%Y-%m-%d %H:%M %Z'))}. Each report states
the hardware, models and settings behind its numbers.</p>
{_reports(rows)}
{glossary_html()}
</html>"""
    path = REPORTS / "index.html"
    path.write_text(link_first_use(page, href=""))
    return path

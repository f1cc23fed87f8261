"""The rendered reports (reports/*.html, as committed) read as the product: no local path, no issue number, no label
that numbers rounds of the work, no progress bar or warning, and no NaN in a table (a missing value says what it
means: "never", "n/a"). Run after `make report`; the checks themselves are tested on small pages below."""
import html
import re
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parents[1] / "reports"
PAGES = sorted(REPORTS.glob("*.html"))

# what a reader must not meet, each with why
NOISE = {
    "a local path": re.compile(r"/work/|/root/|/home/\w|\.venv|site-packages|/tmp/"),
    "an issue number": re.compile(r"(?<![\w&/])#\d{1,4}\b"),
    "a label numbering rounds of the work": re.compile(
        r"\bsessions?\b|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|\d+(?:st|nd|rd|th))"
        r"[- ](?:round|pass|iteration) of (?:the )?work", re.I),
    "a progress bar": re.compile(r"\d+it/s\]|it/s\]|\|\s*\d+/\d+ \["),
    "a warning": re.compile(r"\b\w*Warning: "),
}


def page_text(src: str) -> tuple[str, list[str]]:
    """A rendered notebook's visible text (no styles, scripts, images' data) and the text of its table cells."""
    src = re.sub(r"<(style|script)\b.*?</\1>", " ", src, flags=re.S | re.I)
    src = re.sub(r"<img\b[^>]*>", " ", src, flags=re.I)
    cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
             for c in re.findall(r"<t[dh]\b[^>]*>(.*?)</t[dh]>", src, flags=re.S | re.I)]
    return html.unescape(re.sub(r"<[^>]+>", " ", src)), cells


def problems(src: str) -> list[str]:
    text, cells = page_text(src)
    found = []
    for what, rx in NOISE.items():
        for m in rx.finditer(text):
            found.append(f"{what}: ...{text[max(0, m.start() - 60):m.end() + 60]!r}...")
    found += [f"NaN in a table cell (say 'never' or 'n/a')" for c in cells if c.lower() in ("nan", "<na>", "nat")]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_rendered_report_reads_as_the_product(page):
    found = problems(page.read_text())
    assert not found, f"{page.name}: {len(found)} problems, first ones:\n" + "\n".join(found[:8])


def test_the_checks_catch_what_they_are_for():
    bad = ("<p>/work/main/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found</p>"
           "<p>the outcome cache (#17)</p><p>sixth-session runs</p>"
           "<pre>Loading weights: 100%|##| 272/272 [00:00<00:00, 3494.29it/s]</pre>"
           "<table><tr><td>NaN</td></tr></table>")
    kinds = {p.split(":")[0] for p in problems(bad)}
    assert kinds == {"a local path", "an issue number", "a label numbering rounds of the work", "a progress bar",
                     "a warning", "NaN in a table cell (say 'never' or 'n/a')"}
    good = ('<style>td{color:#123}</style><p>pipelined SD 1.23x [1.20, 1.27] (2026-12-01, 2x NVIDIA H200)</p>'
            '<table><tr><td>never</td><td>n/a</td></tr></table><p>&#x27;quoted&#x27;</p>')
    assert problems(good) == []

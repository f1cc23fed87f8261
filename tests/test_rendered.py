"""The rendered pages (reports/*.html as committed, after `make report`) read as pages: a title from the notebook's
first heading, alt text on every figure, no code cells, no NaN, no literal backticks, no bullet over ~60 words,
each glossary term linked or defined at its first use, the decision table on the index with every figure's kind
and source, and one goal per quantity across the pages and the docs. Each check is also tried on a small page."""
import html
import re
from pathlib import Path

import pytest

from sdeth.study import status
from sdeth.study.status.glossary import TERMS

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "reports").glob("*.html"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORDS = 70          # "about 60": a bullet a reader takes in at once


def visible(src: str) -> str:
    src = re.sub(r"<(style|script|title)\b.*?</\1>", " ", src, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<img\b[^>]*>", " ", src, flags=re.I)))


def first_use_problems(src: str) -> list[str]:
    """Terms whose first use in the visible text is neither a link to their definition nor followed by one in
    parentheses."""
    src = re.sub(r"<(style|script|title)\b.*?</\1>", " ", src, flags=re.S | re.I)
    bad = []
    for term in TERMS:
        rx = re.compile(r"(?<![\w:-])" + re.escape(term) + r"(?![\w-]|:\w)")
        for text in re.finditer(r">([^<]+)<", src):
            m = rx.search(text.group(1))
            if not m:
                continue
            before = src[:text.start(1)]
            linked = before.rfind('<a class="term"') > before.rfind("</a>")
            defined = text.group(1)[m.end():m.end() + 2] == " ("
            if not (linked or defined):
                bad.append(f"{term!r} first used undefined: ...{text.group(1)[max(0, m.start() - 40):m.end() + 40]}...")
            break
    return bad


def problems(src: str) -> list[str]:
    text = visible(src)
    found = []
    title = re.search(r"<title>(.*?)</title>", src, flags=re.S)
    if not title or title.group(1).strip() in ("", "Notebook"):
        found.append(f"page title: {title.group(1) if title else None!r}")
    for img in re.findall(r"<img\b[^>]*>", src, flags=re.I):
        alt = re.search(r'\balt="([^"]*)"', img)
        if not alt or not alt.group(1).strip() or "No description" in alt.group(1):
            found.append(f"an image without alt text: {img[:80]}")
    if re.search(r'class="[^"]*(jp-CodeMirrorEditor|hl-ipython3|input_area)', src):
        found.append("a code cell in the rendered page")
    found += [f"NaN: ...{text[max(0, m.start() - 50):m.end() + 30]!r}..." for m in re.finditer(r"\bNaN\b", text)]
    outside_code = visible(re.sub(r"<(code|pre)\b.*?</\1>", " ", src, flags=re.S | re.I))
    found += [f"a literal backtick: ...{outside_code[max(0, m.start() - 40):m.end() + 40]!r}..."
              for m in re.finditer("`", outside_code)]
    for li in re.findall(r"<li\b[^>]*>(.*?)</li>", src, flags=re.S | re.I):
        words = len(visible(li).split())
        if words > MAX_WORDS:
            found.append(f"a bullet of {words} words: {visible(li)[:80]!r}...")
    return found + first_use_problems(src)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_rendered_page_reads_as_a_page(page):
    found = problems(page.read_text())
    assert not found, f"{page.name}: {len(found)} problems, first ones:\n" + "\n".join(found[:8])


def test_the_checks_catch_what_they_are_for():
    bad = ('<title>Notebook</title><img src="x.png" alt="No description has been provided for this image">'
           '<div class="highlight hl-ipython3"><pre>x = 1</pre></div><p>ratio NaN</p><p>run `make test`</p>'
           "<ul><li>" + "word " * 80 + "</li></ul><p>the TPOT is low</p>")
    kinds = {p.split(":")[0].split(" of ")[0].split(" first")[0] for p in problems(bad)}
    assert kinds == {"page title", "an image without alt text", "a code cell in the rendered page", "NaN",
                     "a literal backtick", "a bullet", "'TPOT'"}
    good = ('<title>20 · Over the link</title><img src="x.png" alt="speedup against the round trip | 2x H200">'
            '<p>the <a class="term" href="index.html#g-tpot">TPOT</a> and <code>make test</code>; TPOT again; '
            "alpha (the chance a draft token is accepted)</p><ul><li>short</li></ul>")
    assert problems(good) == []


def test_the_index_opens_with_the_verdict_and_the_decision_table():
    page = (ROOT / "reports" / "index.html").read_text()
    text = visible(page)
    assert "different machines" not in text.split("The answer in parts")[0]
    assert text.index("For an 8B-class target") < text.index("draft on a cheaper card") < text.index("The answer in parts")
    assert 'id="glossary"' in page
    for c in status.decision_table():
        for f in c.figures:
            assert f.shown in text and f"({f.kind}; {f.source.removeprefix('reports/')})" in text, f.label


GOAL = re.compile(r"\bgoals?\b[^.;\n]{0,40}?(\d+(?:\.\d+)?)x|(\d+(?:\.\d+)?)x[^.;\n]{0,12}\(the goal\)", re.I)


def goals_stated(text: str) -> set[float]:
    return {float(a or b) for a, b in GOAL.findall(text)}


def test_one_goal_per_quantity_across_the_pages_and_the_docs():
    allowed = {v for v, _ in status.GOALS.values()}
    for path in PAGES + DOCS:
        text = visible(path.read_text()) if path.suffix == ".html" else path.read_text()
        assert goals_stated(text) <= allowed, (path.name, goals_stated(text) - allowed)
    assert goals_stated("the goal is 2.0x; goal: pipelined >= 1.40x; 1.5x (the goal)") == {2.0, 1.4, 1.5}


def test_design_map_labels_neither_overlap_nor_leave_the_map():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sdeth.study.pages import run_figures
    points = [{"device": d, "draft": f"Qwen3-1.7B {w}", "step_ms": s} for d, w, s in
              (("corsair", "fp8", 0.088), ("h200", "fp8", 1.56), ("h200", "bf16", 1.97), ("a100", "fp8", 2.33),
               ("a100", "bf16", 3.34), ("cpu", "fp8", 5.64), ("corsair", "bf16", 8.82))]
    steps = [s for s, _ in run_figures._device_labels(points)]
    assert all(b / a >= 1.5 for a, b in zip(steps, steps[1:]))          # apart on a log axis
    grid = [[1.0] * 3 for _ in range(3)]
    shown = plt.show
    plt.show = lambda: None
    try:
        run_figures.plot_design_map({"Qwen3-8B on H200, alpha 0.71": grid}, [0.05, 0.5, 5.0], [0.02, 0.2, 2.0],
                                    points, [])
        fig = plt.gcf()
    finally:
        plt.show = shown
    ax = fig.axes[0]
    ys = [t.get_position()[1] for t in ax.texts if "fp8" in t.get_text() or "bf16" in t.get_text()]
    assert ys and all(0.05 <= y <= 5.0 for y in ys)
    assert any("off the map: cpu fp8 (5.6 ms)" in t.get_text() for t in fig.texts)
    plt.close(fig)


def test_the_vllm_study_table_renders_in_25():
    page = (ROOT / "reports" / "25_draft_server.html").read_text()
    after = page[page.index("Through vLLM"):]
    assert "<table" in after and "TPOT p99 ms" in visible(after) and "p99 within bound" in visible(after)

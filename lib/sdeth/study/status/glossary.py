"""The terms a reader meets, defined once (the index's glossary), and the first use of each on a rendered page
linked to its definition."""
from __future__ import annotations

import html
import re

# term -> (anchor, definition); the order is the glossary's
TERMS = {
    "SD": ("g-sd", "speculative decoding: a small draft model proposes k tokens, the target model checks them in "
                   "one forward pass and keeps the longest prefix it agrees with (lossless)."),
    "TPOT": ("g-tpot", "time per output token, in ms, of one request (vLLM's definition): lower is faster."),
    "t(1)": ("g-t1", "the target alone's TPOT at batch 1 on one GPU; the TPOT goals are fractions of it."),
    "alpha": ("g-alpha", "the chance that the target accepts one draft token (per token, not per round)."),
    "colocated": ("g-colocated", "the draft and the target on the same GPU, one after the other."),
    "remote sync": ("g-sync", "the draft on its own device; each round the target waits for the draft's tokens."),
    "pipelined": ("g-pipelined", "the draft on its own device drafts the next round while the target verifies "
                                 "this one."),
    "replicas": ("g-replicas", "more copies of the target alone, each serving its own requests: the baseline a "
                               "second GPU must beat."),
    "EAGLE-3": ("g-eagle", "a trained draft head that reads the target's hidden states and runs on the target's "
                           "GPU."),
    "drafts on offer": ("g-offer", "fresh draft tokens already waiting when the target is ready to verify."),
    "embedded pair": ("g-embedded", "the small draft/target model pair shipped with the package, for the CPU "
                                    "testbed and the tests."),
    "random:16:512:0": ("g-random", "the prompt set: 16 random prompts of 512 tokens, seed 0."),
    "loopback": ("g-loopback", "TCP between two processes of one host: no network card, no switch."),
}
KINDS = {
    "measured": "timed here, on the hardware named.",
    "synthetic": "measured timing on random weights; each draft token accepted by a coin with the stated alpha.",
    "trace-driven": "measured timing on random weights; acceptance replayed from a real pair's trace.",
    "emulated": "a device or a model stood in for by its measured (or modelled) times.",
    "modelled": "predicted by the event model or the cost model, with what it assumes.",
    "arithmetic": "measured figures combined by a stated rule (per GPU, speedup - 1).",
    "published": "from a cited page; not measured here.",
}


def glossary_html() -> str:
    """The index's glossary: terms, then the kinds of figures."""
    terms = "".join(f'<dt id="{a}">{html.escape(t)}</dt><dd>{html.escape(d)}</dd>' for t, (a, d) in TERMS.items())
    kinds = "".join(f"<dt>{k}</dt><dd>{html.escape(d)}</dd>" for k, d in KINDS.items())
    return (f'<h2 id="glossary">Glossary</h2><dl class="glossary">{terms}</dl>'
            f'<h3>The kinds of figures</h3><dl class="glossary">{kinds}</dl>')


_SKIP = re.compile(r"<(style|script|a|title|dt)\b.*?</\1>", re.S | re.I)


def _pattern(term: str) -> re.Pattern:
    return re.compile(r"(?<![\w:-])" + re.escape(term) + r"(?![\w-]|:\w)")


def link_first_use(page: str, href: str = "index.html") -> str:
    """Each term's first use in the page's visible text, wrapped in a link to its definition (with the
    definition as its title). Text inside tags, styles, scripts, links and the glossary itself is left alone."""
    for term, (anchor, definition) in TERMS.items():
        page = _link_one(page, term, f"{href}#{anchor}", definition)
    return page


def _link_one(page: str, term: str, target: str, definition: str) -> str:
    rx = _pattern(term)
    skip = [m.span() for m in _SKIP.finditer(page)]
    for text in re.finditer(r">([^<]+)<", page):
        if any(a <= text.start(1) < b for a, b in skip):
            continue
        m = rx.search(text.group(1))
        if m:
            at = text.start(1) + m.start()
            link = (f'<a class="term" href="{target}" title="{html.escape(definition)}">'
                    f'{page[at:at + len(m.group(0))]}</a>')
            return page[:at] + link + page[at + len(m.group(0)):]
    return page

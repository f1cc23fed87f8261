"""Where the study stands, read from committed results only (nothing is re-run): the verdict and the decision
table, the answer in labelled parts, the milestones M0-M4. `python -m sdeth status [--milestone M2]` prints it as
Markdown; notebooks/30_writeup and reports/index.html show the same.

    sources     every results path, and the goals (one per quantity)
    figures     Figure (one number read from a results JSON, with its kind, hardware, date), Part, Milestone
    answer      the answer's parts
    options     each target's options on one baseline (one TPOT definition, one t(1), one harness)
    decide      the decision table (target size x TPOT goal x draft hardware -> option), the testbed rows, the
                verdict's claims checked against the table
    milestones  M0-M4, the milestone table, ours beside the published alternatives
    text        the verdict, the one-line decision, and everything above as Markdown or HTML
"""
from .answer import answer, published  # noqa: F401
from .decide import Cell, Claim, Option, Target, check_claims, decision_table, targets, testbed  # noqa: F401
from .figures import Figure, Milestone, Part, dig, read_back  # noqa: F401
from .milestones import alternatives, milestone_table, milestones  # noqa: F401
from .sources import (EMULATED, GOALS, HEADLINE, M2_GOAL, REPEATS, SHARED, SWEEPS, TPOT_GOALS,  # noqa: F401
                      SERVER_STREAMS, SSD_CPU, VLLM_STUDY)
from . import text  # noqa: F401
from .text import decision, decision_html, decision_markdown, markdown, verdict  # noqa: F401

"""The pair's one-off commands, each a record printed or written: `prepare`, `soak`, `draft-variants`, `chains`,
`trace`, `calibrate`."""
from __future__ import annotations

import json
import sys


def _prepare(a) -> int:
    from ..models.presets import load_pair
    pair = load_pair("embedded")
    print(json.dumps({k: v for k, v in pair.describe().items() if k != "draft_card"}, indent=1))
    print("draft greedy agreement (card):", pair.card.get("eval", {}).get("greedy_agreement"))
    return 0


def _soak(a) -> int:
    from ..study.config import save
    from ..study.runs.soak import soak
    if a.clients < 1:
        print(f"sdeth: error: --clients {a.clients}: give 1 or more", file=sys.stderr)
        return 2
    res = soak(a.requests, seed=a.seed, clients=a.clients)
    print(json.dumps(res, indent=1))
    if a.json:
        print("wrote", save(res, a.json))
    return 0 if res["ok"] else 1


def _draft_variants(a) -> int:
    from pathlib import Path
    from ..models.presets import load_pair
    from ..study.runs.acceptance import draft_variants, token_ranking
    from ..study.config import save
    pair = load_pair("embedded")
    if not Path(a.rank).exists():
        Path(a.rank).write_text(json.dumps(token_ranking(pair)) + "\n")
        print("wrote", a.rank)
    print("wrote", save(draft_variants(pair, a.rank, a.prompts), a.out))
    return 0


def _chains(a) -> int:
    from ..models.presets import load_pair
    from ..study.runs.acceptance import record_chains
    from ..study.config import save
    print("wrote", save(record_chains(load_pair(a.pair), a.prompts, a.max_tokens, a.depth), a.out))
    return 0


def _trace(a) -> int:
    from ..models.presets import load_pair
    from ..study.runs.acceptance import record_trace
    from ..study.config import save
    res = record_trace(load_pair(a.pair), a.prompts, a.max_tokens, progress=print)
    print(f"alpha {res['alpha']:.3f} over {res['positions']} positions; wrote {save(res, a.out)}")
    return 0


def _calibrate(a) -> int:
    from ..models.presets import load_pair
    from ..study.runs.experiment import calibrate
    print(json.dumps(calibrate(load_pair(a.pair, device=a.device), a.context), indent=1))
    return 0


COMMANDS = {"prepare": _prepare, "soak": _soak, "draft-variants": _draft_variants, "chains": _chains,
            "trace": _trace, "calibrate": _calibrate}

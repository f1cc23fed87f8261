"""Where prepared artefacts live. One place, so tests and CI can point it elsewhere."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]   # lib/sdeth/paths.py -> repo root (source checkout)
ASSETS = Path(__file__).resolve().parent / "assets"


def cache_dir() -> Path:
    """$SDETH_CACHE, else ~/.cache/sdeth. Holds the dequantized target, the draft, prompt caches."""
    p = Path(os.environ.get("SDETH_CACHE") or Path.home() / ".cache" / "sdeth")
    p.mkdir(parents=True, exist_ok=True)
    return p

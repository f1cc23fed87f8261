"""target: the target shape's t(B) and t_v(B, k) (device ms, graph replayed); the bigger targets' t_v from `bench
targets` (reports/gpu/bench_targets_*.json) for emulated targets of those shapes."""
from __future__ import annotations

import statistics
import time
from functools import lru_cache

import torch

from ...runtime.batchmodel import BatchDecoder, bucket
from ...runtime.fastmodel import FastDecoder
from ..bench.step import timed_replays
from .common import BATCHES, CONTEXT, SLACK, VERIFY_KS, sync_device

def target_points(fast: FastDecoder, batches=BATCHES, ks=VERIFY_KS, context: int = CONTEXT, reps: int = 20,
                  compile_mode: str | None = None):
    """(the target's BatchDecoder, its points): per B, width 1 (k None) and width k + 1 for each k."""
    dec = BatchDecoder(fast, max(batches), context + SLACK, columns="all", compile_mode=compile_mode)
    pts = []
    for b in batches:
        for k in (0, *ks):
            w = k + 1
            pos = torch.arange(context - w, context, device=dec.device)[None].expand(b, w).contiguous()
            ids = torch.zeros_like(pos)
            t0 = time.perf_counter()
            dec.step(ids, pos, pos, context)
            sync_device(dec.device)
            first_s = time.perf_counter() - t0
            walls = []
            for _ in range(5):
                t1 = time.perf_counter()
                dec.step(ids, pos, pos, context).argmax(-1).cpu()
                walls.append((time.perf_counter() - t1) * 1e3)
            key = (min(bucket(b), dec.rows), w, dec.span_for(context))
            pt = {"B": b, "k": k or None, "width": w, "wall_ms": round(statistics.median(walls), 4),
                  "first_call_s": round(first_s, 2)}
            if key in dec.graphs:
                pt["replay_ms"] = round(timed_replays(dec.graphs[key][0], reps), 4)
            pts.append(pt)
    return dec, pts


def tv_table(points: list[dict]) -> dict:
    """(B, k) -> the verify's ms an emulated target waits: the graph's replay (device), or the wall on a CPU."""
    return {(p["B"], p["k"] or 0): p.get("replay_ms", p["wall_ms"]) for p in points}



def big_tv(model: str, batches, k: int) -> dict:
    """(B, m) -> ms for m = 0..k of a bigger target (emulated): its t_v(B, m) from the newest `bench targets` call
    that measured it (graph replays, random weights), linear in m between the measured k and t_v(B, 0) = t(B)
    (pareto.Tables), at each B in batches (linear between the measured B). Read once per state of reports/gpu (the
    pages read it for every point of every call: ~0.1 s a read)."""
    from ..results import gpu_state
    tv = _big_tv(model, tuple(sorted(set(batches))), k, gpu_state())
    if tv is None:
        raise ValueError(f"no bench targets call in reports/gpu measured {model}'s t_v(B, k): run `python -m sdeth "
                         f"bench targets` first")
    return dict(tv)


@lru_cache(maxsize=256)
def _big_tv(model: str, batches: tuple, k: int, state: tuple) -> dict | None:
    from ..predict.pareto import Tables
    from ..results import gpu_results
    runs = sorted((n, g) for n, g in gpu_results().items() if g.get("bench") == "targets")
    for name, run in reversed(runs):
        part = next((t for t in run.get("targets", []) if t["model"] == model and t.get("weights") in ("bf16", "fp8")
                     and any(p.get("path") == "rows" for p in t["points"])), None)
        if part is None:
            continue
        rows = [p for p in part["points"] if p.get("path") == "rows" and p.get("replay_ms")]
        t = Tables({p["B"]: p["replay_ms"] / 1e3 for p in rows if not p["k"]},
                   {(p["B"], p["k"]): p["replay_ms"] / 1e3 for p in rows if p["k"]}, {}, 1,
                   source=f"measured: {name}")
        return {(b, m): round(t.t_v(b, m) * 1e3, 4) for b in batches for m in range(k + 1)}
    return None

"""draft_step: the draft shape's batched step (device ms, graph replayed) and a k-token draft's wall and host ms."""
from __future__ import annotations

import statistics
import time

import torch

from ...runtime.batchdraft import BatchDrafter
from ...runtime.batchmodel import BatchDecoder, bucket
from ...runtime.fastmodel import FastDecoder
from ...runtime.verify import Sampling
from ..bench.step import timed_replays
from .common import BATCHES, CONTEXTS, DRAFT_K, GOALS, SLACK, sync_device

def as_fed(drafter: BatchDrafter, key, n: int):
    """A sequence of n context tokens marked fed without a forward: its cache row holds zeros where a prompt's
    keys would be (timing does not depend on the values; the slots read are the same)."""
    seq = drafter.open(key, 0, [1] * n, Sampling(), 0, 0)
    seq.fed, seq.pending = n - 1, [1]
    return seq


def step_ms(dec: BatchDecoder, rows: int, context: int, n: int = 50) -> tuple[float, float]:
    """(ms of one width-1 step of `rows` rows at `context`: its graph replayed back to back, or an eager step timed
    on a CPU; seconds the first call took: capture, and compilation with a compile mode)."""
    z = torch.zeros((rows, 1), dtype=torch.long, device=dec.device)
    pos = z + context - 1
    t0 = time.perf_counter()
    dec.step(z, pos, pos, context)
    sync_device(dec.device)
    first_s = time.perf_counter() - t0
    key = (min(bucket(rows), dec.rows), 1, dec.span_for(context))
    if key in dec.graphs:
        return timed_replays(dec.graphs[key][0], n), first_s
    t0 = time.perf_counter()
    for _ in range(3):
        dec.step(z, pos, pos, context)
    return (time.perf_counter() - t0) / 3 * 1e3, first_s


def draft_wall(drafter: BatchDrafter, seqs: list, k: int, reps: int) -> dict:
    """BatchDrafter.draft of k tokens for the sequences, reps times after one untimed (each sequence then takes
    one token and no draft, so that the context moves by one): medians of the wall ms, of the steps' device ms
    and of the host ms per step."""
    dec = drafter.dec
    walls, devs, hosts = [], [], []
    for i in range(reps + 1):
        sync_device(dec.device)
        c0 = dec.clock.seconds
        t0 = time.perf_counter()
        out = drafter.draft([(s, k) for s in seqs])
        wall = (time.perf_counter() - t0) * 1e3
        dev = (dec.clock.seconds - c0) * 1e3
        for s, d in zip(seqs, out):
            drafter.apply(s, s.n, 0, [d.tokens[0]])
        if i:
            walls.append(wall), devs.append(dev), hosts.append(max(wall - dev, 0.0) / k)
    return {"draft_wall_ms": round(statistics.median(walls), 4),
            "draft_device_ms_per_step": round(statistics.median(devs) / k, 4),
            "host_ms_per_step": round(statistics.median(hosts), 4)}


def draft_step(fast: FastDecoder, vocab: int, name: str, batches=BATCHES, contexts=CONTEXTS, k: int = DRAFT_K,
               reps: int = 10, compile_mode: str | None = None) -> dict:
    """The draft shape's step (device ms, graph replayed) and a k-token draft's wall and host ms, per B and context."""
    t0 = time.perf_counter()
    dec = BatchDecoder(fast, max(batches), max(contexts) + SLACK, compile_mode=compile_mode)
    drafter = BatchDrafter(dec, vocab)
    out = {"draft": name, "k": k, "reps": reps, "rows": dec.rows,
           "compile": compile_mode or "none (eager kernels, CUDA graphs)", "points": []}
    for ctx in contexts:
        n0 = ctx - k - (reps + 1) * len(batches) - 1        # every draft of this context reads `ctx` slots
        seqs = [as_fed(drafter, ("bench", i), n0) for i in range(max(batches))]
        for b in batches:
            ms, first_s = step_ms(dec, b, ctx)
            out["points"].append({"B": b, "context": ctx, "step_ms": round(ms, 4), "first_call_s": round(first_s, 2),
                                  **draft_wall(drafter, seqs[:b], k, reps)})
        for s in seqs:
            drafter.free(s.key)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    del dec, drafter
    return out


def goal_check(parts: list[dict]) -> list[dict]:
    """Each draft_step part of the goal's draft shape at the goal's rows, against the goals."""
    rows = []
    for p in parts:
        if p.get("draft") != GOALS["draft"]:
            continue
        for pt in p.get("points", []):
            if pt["B"] != GOALS["rows"] or pt["context"] not in GOALS["step_ms"]:
                continue
            goal = GOALS["step_ms"][pt["context"]]
            rows.append({"draft": p["draft"], "compile": p["compile"], "B": pt["B"], "context": pt["context"],
                         "step_ms": pt["step_ms"], "step_goal_ms": goal, "step_met": pt["step_ms"] <= goal,
                         "host_ms_per_step": pt["host_ms_per_step"], "host_goal_ms": GOALS["host_ms_per_step"],
                         "host_met": pt["host_ms_per_step"] <= GOALS["host_ms_per_step"],
                         "first_call_s": pt["first_call_s"]})
    return rows

"""The pipelined draft's loop, timed phase by phase (`python -m sdeth bench draft-loop`): where a streamed
draft step's wall time goes beyond its device time.

A pipelined draft (runtime.streamdraft.StreamDrafter, one step in flight) launches a step, waits for its token,
reads it, sends it, takes the target's commits, and launches the next: the device waits for the host between
two steps. The event model charges the step as the draft lives it (`draft_period`), so this host work is part
of every pipelined figure. Here the loop runs alone on one device, as a pipelined draft runs it, with every
token accepted (the target's commit for each position arrives right after it is sent), and each phase is timed
on the host clock:

- launch_ms: queueing the forward (inputs to the device, the graph's replay, the draft's token and its host
  copy; the synthetic answer where acceptance is synthetic);
- wait_ms: from the launch's return to the token being ready on the host (the device's share past the launch);
- settle_ms, send_ms, commit_ms: reading the token, encoding its messages (as the worker sends them), taking
  the commit;
- period_ms: one launch to the next (Step.period_ms); device_ms: the forward's device time (CUDA events);
  host_gap_ms = period_ms - device_ms.

Variants: the plain loop, the loop watching the draft's next two choices (as a stream that sends them with each
token), and the plain engine without the synthetic answer (what a real draft pays).
"""
from __future__ import annotations

import statistics
import time

import torch

from ... import hardware

VARIANTS = {"off": dict(), "watch": dict(watch=2), "off, real logits": dict(real=True)}


def _loop(engine, context: int, steps: int, skip: int, watch: int = 0) -> dict:
    from ...runtime.streamdraft import StreamDrafter
    from ...runtime.verify import Sampling
    from ...wire import protocol
    d = StreamDrafter(engine, 0, 16, watch)     # (window 16: a deep run, as measured)
    prompt = torch.randint(0, 1000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    d.start(prompt, context + steps + 64, 1, Sampling(), 0)
    rows = []
    for i in range(steps):
        t0 = time.perf_counter()
        d.launch()
        t1 = time.perf_counter()
        while not d.ready():
            pass
        t2 = time.perf_counter()
        st = d.settle()
        t3 = time.perf_counter()
        sent = [protocol.StreamRow("r", 0, m[0], m[1], m[2], alts=m[6] if len(m) > 6 else None, fork=m[4], corr=m[5])
                for m in d.messages(st)]
        protocol.encode(protocol.Streamed(sent, 1, st.ms, time.time()))     # what a server sends a step
        t4 = time.perf_counter()
        d.commit(st.pos, st.token)               # the target took it: the run-ahead stays valid
        t5 = time.perf_counter()
        if i >= skip:
            rows.append(dict(launch=t1 - t0, wait=t2 - t1, settle=t3 - t2, send=t4 - t3, commit=t5 - t4,
                             period=st.period_ms / 1e3, device=st.ms / 1e3))
    out = {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}
    out["host_gap"] = out["period"] - out["device"]
    return {f"{k}_ms": round(v, 4) for k, v in out.items()} | {"steps": len(rows)}


def bench_draft_loop(models=("Qwen3-1.7B", "Qwen3-0.6B"), device: str = "cuda:0", context: int = 512,
                     capacity: int = 1024, compile_mode: str = "default", trace: str | None = None,
                     alpha: float | None = 0.71, steps: int = 400, variants=tuple(VARIANTS), progress=print) -> dict:
    """Each model shape (random bf16 weights) as a draft engine of the fast decoder (CUDA
    graphs, synthetic or trace-driven answer), each variant's loop timed (medians over `steps`, the first 50
    not counted: graph captures)."""
    from ...models.presets import PAIRS, random_model
    from ...runtime import make_engine
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
    vocab = PAIRS["random-qwen3-8b/1.7b"].vocab_size
    res = {"schema": "sdeth.bench/1", "bench": "draft-loop", "hardware": hardware.describe(device),
           "weights": "random bf16 on Qwen3 shapes", "context": context, "capacity": capacity, "compile": compile_mode,
           "acceptance": f"trace-driven ({trace})" if trace else f"synthetic alpha {alpha}",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": []}
    for name in models:
        model = random_model(name, device, torch.bfloat16, seed=0)
        engines = {}
        for v in variants:
            real = VARIANTS[v].get("real", False)
            if real not in engines:
                engines[real] = make_engine(model, name, "draft", impl="fast", compile_mode=compile_mode or None,
                                            capacity=capacity, vocab=min(vocab, model.config.vocab_size),
                                            synthetic_alpha=None if real else alpha,
                                            synthetic_trace=None if real else trace)
            opts = {k: x for k, x in VARIANTS[v].items() if k != "real"}
            try:
                row = {"model": name, "variant": v, **_loop(engines[real], context, steps, 50, **opts)}
            except Exception as e:       # keep what was measured
                row = {"model": name, "variant": v, "error": f"{type(e).__name__}: {e}"}
            res["rows"].append(row)
            progress(row)
        del engines, model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return res


def draftloop_table(res: dict) -> str:
    cols = ["period_ms", "device_ms", "host_gap_ms", "launch_ms", "wait_ms", "settle_ms", "send_ms", "commit_ms"]
    lines = [f"{'model':12s} {'variant':18s} " + " ".join(f"{c[:-3]:>9s}" for c in cols)]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"{r['model']:12s} {r['variant']:18s} {r['error']}")
            continue
        lines.append(f"{r['model']:12s} {r['variant']:18s} " + " ".join(f"{r[c]:9.3f}" for c in cols))
    return "\n".join(lines)

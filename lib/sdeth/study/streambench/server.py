"""The draft server's process for the remote parts: a random-weights draft shape behind wire.draft_server."""
from __future__ import annotations

import time
import traceback

import torch

from ...runtime.batchmodel import PREFILL_WIDTHS, BatchDecoder
from ...runtime.fastmodel import FastDecoder
from ...wire.server_config import DraftServerConfig
from .common import CONTEXT, PREFILL_CHUNK, PROMPT, SERVER_ROWS, SLACK, allow_recompiles, sync_device, welcome

REPORT_S = 4.0           # the bench's draft servers log their loop's parts this often (the call's log keeps them)


def serve_random(name: str, device: str, addr: str, ready, seconds: float, rows: int = SERVER_ROWS,
                 capacity: int = CONTEXT + SLACK, spin_s: float = 0.002, compile_mode: str | None = None,
                 verdict_cache: str = DraftServerConfig.verdict_cache,
                 read_while_stepping: bool = DraftServerConfig.read_while_stepping, report_s: float = REPORT_S,
                 launch_ahead: str = DraftServerConfig.launch_ahead, fast_options: str = "") -> None:
    """A draft server process: the named draft shape (random bf16 weights) on `device`, its graphs captured and
    a prompt's prefill run once before `ready` is told; serves `addr` for `seconds` (verdict_cache: the server's
    DraftServerConfig.verdict_cache; read_while_stepping, launch_ahead: its own; report_s: how often it logs
    where its loop's time went, ms a step per part; fast_options: the draft's FastOptions spec)."""
    from ...runtime.randomweights import fused_random
    from ...wire.draft_server import ServerLimits, build_server
    try:
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(device)
        allow_recompiles()
        t0 = time.perf_counter()
        fast = FastDecoder(fused_random(name, device, "bf16", seed=1), 8, fast_options or None)
        server = build_server(fast, welcome(name, fast.vocab, rows), DraftServerConfig(
            rows, capacity, ttl_s=120, prefill_chunk=PREFILL_CHUNK, compile_mode=compile_mode or "none", warm=False,
            spin_s=spin_s, verdict_cache=verdict_cache, read_while_stepping=read_while_stepping, report_s=report_s,
            launch_ahead=launch_ahead,
            limits=ServerLimits(sequences_per_client=rows, reserve=0, clients=4096, clients_per_peer=4096)))
        dec = server.drafter.dec
        dec.warm(spans=(dec.span_for(CONTEXT),))
        warm_prompts(dec)
        prefill_ms = prompt_prefill_ms(dec)
        ready.put({"vocab": fast.vocab, "build_and_warm_s": round(time.perf_counter() - t0, 1),
                   "prompt_prefill_ms": prefill_ms, "prompt_prefill_eager_ms": prompt_prefill_ms(dec, eager=True),
                   "prefill_tokens_between_steps": PREFILL_CHUNK,
                   "graphs": len(dec.graphs), "gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
                   if dec.device.type == "cuda" else None})
    except Exception as e:                       # noqa: BLE001 (the parent reports it)
        ready.put({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
        return
    server.serve(addr, seconds)


def warm_prompts(dec: BatchDecoder) -> None:
    """The prompt chunks' graphs these sequences use captured now, at the spans they reach: a whole prompt, and every
    narrower width (a stream's catch-up past CATCH_UP tokens takes one; a graph captured on first use holds the
    loop while it is captured)."""
    whole = next(w for w in PREFILL_WIDTHS if w >= min(PREFILL_CHUNK, PROMPT - 1))
    dec.warm_prefill(widths=tuple(w for w in PREFILL_WIDTHS if w <= whole),
                     spans=sorted({dec.span_for(PREFILL_WIDTHS[0]), dec.span_for(PROMPT), dec.span_for(CONTEXT)}))


def prompt_prefill_ms(dec: BatchDecoder, prompt: int = PROMPT, eager: bool = False) -> float:
    """ms of one prompt's prefill (its first prompt - 1 tokens into row 0, whose slots a sequence overwrites), as
    BatchDrafter.prefill feeds them: PREFILL_CHUNK tokens a call (BatchDecoder.prefill: graphs on a GPU); eager:
    one eager forward of them all instead. The best of two after one untimed."""
    pos = torch.arange(prompt - 1, device=dec.device)[None]
    ms = []
    for _ in range(3):
        t0 = time.perf_counter()
        if eager:
            dec.forward(torch.zeros_like(pos), pos, pos, row0=0)
        else:
            for lo in range(0, prompt - 1, PREFILL_CHUNK):
                dec.prefill([0] * min(PREFILL_CHUNK, prompt - 1 - lo), lo, 0)
        sync_device(dec.device)
        ms.append((time.perf_counter() - t0) * 1e3)
    return round(min(ms[1:]), 3)

"""The bench's constants, its typed grid, and the small pieces every part uses (percentiles, coins, waits)."""
from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ...metrics import percentile
from ...runtime.batchmodel import BUCKETS
from ...runtime.fastmodel import FastDecoder
from ...wire import protocol

TARGET = "Qwen3-8B"
BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXTS = (512, 2048)
VERIFY_KS = tuple(range(1, 9))
COLOCATED_KS = (2, 3, 4, 5)
REMOTE_KS = (3, 5)
TARGETS_N = (1, 2, 4, 8, 16)
SERVER_ROWS = BUCKETS[-1]       # the draft server's cache rows: its largest batch bucket
PROMPT, CONTEXT = 384, 512      # a stream's sequences: from PROMPT to CONTEXT tokens (first_end: a target's first)
SLACK = 16                      # cache slots past the longest context
DRAFT_K = 5                     # k of the draft_step part
SPIN_S = 0.0003                 # an emulated verify spins for its last 0.3 ms (sleep is coarser)
PREFILL_CHUNK = 512              # prompt tokens a draft feeds between two steps: a whole prompt, one graph replay (its
                                 # device time is mostly its ~840 small kernels, so three 128-token chunks cost ~3x one)
GOALS = {"draft": "Qwen3-1.7B", "rows": 16, "step_ms": {512: 2.3, 2048: 3.3}, "host_ms_per_step": 0.3}
REMOTE_LABEL = f"emulated target (measured t_v of the {TARGET} shape), real draft server"
COLOCATED_LABEL = f"measured: the {TARGET} shape and the draft shape on one GPU, one process"
HOLDS = ("periods", "draft")   # how long an emulated target holds a commit for the draft's token (EmulatedPipelined);
                               # the first the bench's default
PIPELINED_K, PIPELINED_WINDOW = 4, protocol.STREAM_WINDOW   # (window 8, as every call measured it: not stream_window(4))
REQUEST_LEAST = 16             # a sequence cut by a point's end counts in the per-request TPOT with this many tokens
PIPELINED_LABEL = (f"emulated target (measured t_v of the {TARGET} shape), pipelined streams, real draft server")
TIMELINE = ("sent_to_read", "read_to_stepped", "stepped_to_arrived", "sent_to_arrived", "arrived_to_verified")


@dataclass
class Grid:
    """One call's points: which B, N, k each part runs, and for how long (seconds per point)."""
    models_compile: str | None = None
    draft_fast: str | None = None      # the draft's FastOptions spec (draft_options; None: a draft server's default)
    batches: tuple = BATCHES
    reps: int = 10
    verify_ks: tuple = VERIFY_KS
    colocated_batches: tuple = BATCHES
    colocated_ks: tuple = COLOCATED_KS
    colocated_s: float = 1.2
    remote_batches: tuple = BATCHES
    remote_ns: tuple = TARGETS_N
    remote_ks: tuple = REMOTE_KS
    remote_s: float = 2.0
    compile_modes: tuple = ("default", "max-autotune-no-cudagraphs")
    extra_drafts: tuple = ()
    sync: bool = True
    pipelined: tuple = ()              # (B, N) points of the pipelined streams; () -> pipelined_grid()
    policies: tuple = ("policy",)      # the pipelined targets' step policies (costmodel.POLICIES), each point run
                                       # under each in turn (side by side); the ssd part plays offered
    min_steps: int = 0                 # a pipelined point runs until about this many target steps (its t_v
                                       # foretells them), up to max_s; 0: remote_s
    max_s: float = 20.0
    read_while_stepping: bool = False  # the bench's draft server reads its socket while a step runs
    big_targets: tuple = ()            # emulated bigger targets (t_v from bench targets), pipelined and sync
    big_points: tuple = ((1, 1), (1, 4), (2, 4), (4, 4))   # their (B, N)
    colocated_emulated: tuple = ()     # colocated SD against these emulated targets (t_v in series), B and k as colocated
    colocated_real: tuple = ()         # (the ssd and link parts' calls) colocated SD with these real targets too
    prompt: int = PROMPT
    context: int = CONTEXT
    verdict_caches: tuple = ()         # the ssd part's server settings, e.g. ("off", "on"); () leaves it out
    only_ssd: bool = False             # run the ssd part alone (no draft_step, target, colocated or remote parts)
    ssd_targets: tuple = ("Qwen3-8B", "Qwen3-32B", "Qwen2.5-72B")   # emulated from their t_v (bench targets)
    ssd_points: tuple = ((1, 1), (1, 4), (2, 1), (2, 4), (4, 1), (4, 4), (8, 1), (8, 4))   # (B, N), in this order
    ssd_ranks: tuple = ("trace", "synthetic:0.9")                  # streambench.ranks specs
    ssd_s: float = 1.5                 # seconds of each ssd point
    ssd_rows: int = SERVER_ROWS        # the ssd servers' cache rows (B*N of them: a full server)
    ssd_policies: tuple = ("offered",)  # the ssd targets' step policies (costmodel.POLICIES), each point under each
    ssd_holds: tuple = HOLDS[:1]       # the ssd targets' holds (HOLDS), each point under each; points under any but
                                       # the first go to the part's hold_points (a comparison, out of its tables)
    link_rtts: tuple = ()              # the link part's injected round trips (ms); () leaves it out
    only_link: bool = False            # run the link part alone (with colocated_emulated first, if given)
    only_colocated: bool = False       # run colocated_emulated and colocated_real alone
    link_targets: tuple = ("Qwen3-8B", "Qwen3-32B", "Qwen2.5-72B")  # emulated from their t_v (bench targets)
    link_points: tuple = ((1, 1),)     # their (B, N)

    def quick(self) -> "Grid":
        """A small grid (a smoke run)."""
        return Grid(**{**asdict(self), **QUICK})

    def to_json(self) -> dict:
        return asdict(self)


QUICK = dict(batches=(1, 16), reps=4, verify_ks=(1, 3, 5), colocated_batches=(1, 16), colocated_ks=(3, 5),
             colocated_s=0.6, remote_batches=(1, 16), remote_ns=(1, 2), remote_ks=(3,), remote_s=1.0,
             compile_modes=("default",), extra_drafts=(), pipelined=((1, 1), (4, 4)), big_points=((1, 4),))


def pipelined_grid(batches=(1, 2, 4, 8), ns=(1, 2, 4, 8), rows: int = 32) -> list[tuple]:
    return [(b, n) for b in batches for n in ns if n * b <= rows]


def pct(xs, q: float):
    """The q-th percentile (nearest rank, metrics.percentile) to 4 places; None for no values."""
    v = percentile(xs, q)
    return None if v is None else round(v, 4)


def mean(xs):
    return round(statistics.fmean(xs), 4) if xs else None


def coins(rng: random.Random, k: int, alpha: float) -> int:
    """Drafted tokens accepted: a coin per token (heads with probability alpha), up to the first tails."""
    a = 0
    while a < k and rng.random() < alpha:
        a += 1
    return a


def first_end(rng, room: int) -> int:
    """The tokens a target's first sequence on a stream settles, uniform over 1..room (later ones settle `room`): its
    streams then end, and open anew with a prompt for the draft to prefill, at staggered times as a server's requests
    do, not all at once every `room` tokens (the draft server's prefills in waves, every stream held behind them)."""
    return rng.randint(1, room)


def sync_device(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)



def hello(vocab: int) -> protocol.Hello:
    return protocol.Hello(protocol.PROTOCOL_VERSION, "target", f"emulated:{TARGET}", vocab, "random-weights", "bfloat16")


def welcome(name: str, vocab: int, rows: int) -> protocol.Welcome:
    return protocol.Welcome(protocol.PROTOCOL_VERSION, f"random:{name}", vocab, "random-weights", "bfloat16",
                            sequences=rows)




def allow_recompiles(n: int = 64) -> None:
    """Let torch.compile keep a variant per model shape and per size-1 specialisation (rows, width) of the one
    block function every decoder here compiles (the default limit, 8, would send later variants to eager)."""
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, n)


def wait_until(deadline: float) -> None:
    """Sleep until SPIN_S before `deadline` (perf_counter), then spin."""
    while (left := deadline - time.perf_counter()) > 0:
        if left > SPIN_S:
            time.sleep(left - SPIN_S)




def build_fast(name: str, device: str, seed: int, options: str = "") -> FastDecoder:
    """A random-weights FastDecoder of shape `name` (options: its FastOptions spec, e.g. draft_options')."""
    from ...runtime.randomweights import fused_random
    return FastDecoder(fused_random(name, device, "bf16", seed=seed), 8, options or None)


def draft_options(device: str, spec: str | None) -> str:
    """The draft's FastOptions spec (its model in the draft step, colocated and the draft servers): `spec` as given,
    or None: a draft server's own default for bf16 weights on this device (wire.draft_server.fused_options: the fused
    kernels on a GPU, torch's on a CPU)."""
    from ...wire.draft_server import fused_options
    if spec is not None:
        return spec
    return fused_options(torch.device(device).type, torch.bfloat16) or ""


def free() -> None:
    """Return what the dropped models and caches held to the device."""
    gc.collect()
    torch.cuda.empty_cache()




def compiled(g: Grid) -> str:
    return g.models_compile or "none (eager kernels, CUDA graphs)"

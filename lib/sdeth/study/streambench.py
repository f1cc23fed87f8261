"""Many streams over one draft GPU (`python -m sdeth bench streams`): the batched draft step, the target's
batched verify, colocated SD of B streams on one GPU, and a real draft server serving N emulated targets.

Random bf16 weights of the Qwen3-8B target shape and the Qwen3-1.7B / 0.6B draft shapes (runtime.randomweights):
timing does not depend on the values, and the draft's tokens mean nothing, so acceptance is synthetic. The
target side tosses a coin per drafted token (heads with probability alpha: 0.71 with the 1.7B, 0.56 with the
0.6B, the alphas bench sd used with the 8B), accepts the drafts up to the first tails and adds its own token.

Terms (ms; at context c a row's highest position is c - 1 and attention reads c cache slots):
- draft_step: one BatchDecoder step of width 1 over B rows, its CUDA graph replayed back to back (device);
  draft_wall_ms: BatchDrafter.draft of k tokens for B sequences, the read to the host included;
  host_ms_per_step: (that wall - the same steps' device time) / k, the host work the device waits for.
- target: t(B) (width 1) and t_v(B, k) (width k + 1, logits for every column) of the Qwen3-8B shape, graph
  replayed back to back (device); wall_ms adds the input copy, the argmax and the read to the host.
- colocated (measured): both models on one GPU in one process, B streams in lockstep: a round drafts k tokens
  for every stream, verifies B x (k + 1) on the target, tosses the coins, tells the draft.
- remote (emulated target, real draft server): the draft server (wire.draft_server, one 1.7B shape with 128
  cache rows) in a process of its own on the GPU, over loopback TCP; N targets, each a process of its own with
  B streams in lockstep through one DraftServerClient: one Rounds per round, then a wait of the measured
  t_v(B, k) in place of the verify (sleep, then spin for the last SPIN_S), then the coins.
Streams run sequences of PROMPT up to CONTEXT tokens: a sequence whose next round would pass CONTEXT ends and a
new one opens with a new prompt, which the draft prefills while the others run; the target's prefill is not
charged (TPOT, as vLLM defines it, leaves the first token out).
TPOT per stream: a round's time over the tokens it gave that stream (p50, p99 over streams and rounds), and the
mean (time over tokens). tokens/s per GPU: all streams' tokens per second over the GPUs the setup uses.
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import random
import statistics
import time
import traceback
from pathlib import Path

import torch

from .. import hardware
from ..metrics import percentile
from ..models.presets import shape
from ..runtime.batchdraft import BatchDrafter
from ..runtime.batchmodel import BUCKETS, BatchDecoder, bucket
from ..runtime.fastmodel import FastDecoder
from ..runtime.pipeline import StreamView
from ..runtime.verify import Sampling
from ..wire import protocol
from .bigtargets import DRAFT_ALPHA
from .stepbench import copy_bandwidth, timed_replays

TARGET = "Qwen3-8B"
BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXTS = (512, 2048)
VERIFY_KS = tuple(range(1, 9))
COLOCATED_KS = (2, 3, 4, 5)
REMOTE_KS = (3, 5)
TARGETS_N = (1, 2, 4, 8, 16)
SERVER_ROWS = BUCKETS[-1]       # the draft server's cache rows: its largest batch bucket
PROMPT, CONTEXT = 384, 512      # a stream's sequences: from PROMPT to CONTEXT tokens
SLACK = 16                      # cache slots past the longest context
DRAFT_K = 5                     # k of the draft_step part
SPIN_S = 0.0003                 # an emulated verify spins for its last 0.3 ms (sleep is coarser)
PREFILL_CHUNK = 128              # prompt tokens a draft feeds between two steps (one chunk: a new prompt holds the live streams one chunk at a time)
GOALS = {"draft": "Qwen3-1.7B", "rows": 16, "step_ms": {512: 2.3, 2048: 3.3}, "host_ms_per_step": 0.3}
REMOTE_LABEL = f"emulated target (measured t_v of the {TARGET} shape), real draft server"
COLOCATED_LABEL = f"measured: the {TARGET} shape and the draft shape on one GPU, one process"
QUICK = dict(batches=(1, 16), reps=4, verify_ks=(1, 3, 5), colocated_batches=(1, 16), colocated_ks=(3, 5),
             colocated_s=0.6, remote_batches=(1, 16), remote_ns=(1, 2), remote_ks=(3,), remote_s=1.0,
             compile_modes=("default",), extra_drafts=())


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


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- draft_step: the batched draft step

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
    _sync(dec.device)
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
        _sync(dec.device)
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


# ---------------------------------------------------------------- target: t(B) and t_v(B, k)

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
            _sync(dec.device)
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


# ---------------------------------------------------------------- colocated: B streams on one GPU

class Colocated:
    """B streams in lockstep over a BatchDrafter and the target's BatchDecoder (columns='all') in this process."""

    def __init__(self, drafter: BatchDrafter, target: BatchDecoder, B: int, k: int, alpha: float, seed: int,
                 prompt: int = PROMPT, context: int = CONTEXT):
        self.d, self.t, self.B, self.k, self.alpha = drafter, target, B, k, alpha
        self.prompt, self.context = prompt, context
        self.rng, self.gen, self.new = random.Random(seed), 0, 0
        self.seqs = [self.fresh(i) for i in range(B)]
        while self.d.prefill():
            pass
        self.last = [s.pending[-1] for s in self.seqs]          # the token each row's verify starts with

    def fresh(self, i: int):
        self.gen += 1
        ids = [self.rng.randrange(self.d.vocab) for _ in range(self.prompt)]
        return self.d.open(("colocated", i), self.gen, ids, Sampling(), self.gen, 0)

    def round(self) -> tuple[list[int], float, float]:
        """One round: (tokens per stream, draft ms, verify ms)."""
        t0 = time.perf_counter()
        drafts = self.d.draft([(s, self.k) for s in self.seqs])
        t1 = time.perf_counter()
        dev = self.t.device
        ids = torch.tensor([[self.last[i]] + d.tokens for i, d in enumerate(drafts)], device=dev)
        pos = torch.tensor([list(range(s.n - 1, s.n + self.k)) for s in self.seqs], device=dev)
        chosen = self.t.step(ids, pos, pos, max(s.n for s in self.seqs) + self.k).argmax(-1).cpu().tolist()
        t2 = time.perf_counter()
        toks = []
        for i, s in enumerate(self.seqs):
            a = coins(self.rng, self.k, self.alpha)
            tok = chosen[i][a] % self.d.vocab
            self.d.apply(s, s.n, a, [tok])
            self.last[i] = tok
            toks.append(a + 1)
            if s.n + self.k > self.context:                     # its next round would pass the context: a new one
                self.d.free(s.key)
                self.seqs[i] = self.fresh(i)
                self.new += 1
        while self.d.prefill():
            pass
        for i, s in enumerate(self.seqs):
            if s.drafted == 0:
                self.last[i] = s.pending[-1]
        return toks, (t1 - t0) * 1e3, (t2 - t1) * 1e3

    def close(self) -> None:
        for s in self.seqs:
            self.d.free(s.key)


def colocated_point(drafter, target, B: int, k: int, alpha: float, seconds: float, seed: int = 0,
                    warm_rounds: int = 3, prompt: int = PROMPT, context: int = CONTEXT, min_rounds: int = 1) -> dict:
    """Rounds of B lockstep streams for `seconds` and at least min_rounds (after warm_rounds untimed): TPOT and
    tokens/s on one GPU."""
    run = Colocated(drafter, target, B, k, alpha, seed, prompt, context)
    for _ in range(warm_rounds):
        run.round()
    run.new = 0
    rounds, tpot, drafts, verifies, tokens = [], [], [], [], 0
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds or len(rounds) < min_rounds:
        t0 = time.perf_counter()
        toks, d_ms, v_ms = run.round()
        r_ms = (time.perf_counter() - t0) * 1e3
        rounds.append(r_ms), drafts.append(d_ms), verifies.append(v_ms)
        tpot += [r_ms / t for t in toks]
        tokens += sum(toks)
    wall = time.perf_counter() - t_start
    run.close()
    return {"label": COLOCATED_LABEL, "B": B, "k": k, "alpha": alpha, "gpus": 1, "rounds": len(rounds),
            "seconds": round(wall, 3), "tokens": tokens, "tokens_per_round": round(tokens / len(rounds) / B, 3),
            "tokens_per_s": round(tokens / wall, 1), "tokens_per_s_per_gpu": round(tokens / wall, 1),
            "tpot_ms": {"p50": pct(tpot, 50), "p99": pct(tpot, 99), "mean": round(wall * 1e3 * B / tokens, 4)},
            "round_ms": {"p50": pct(rounds, 50), "p99": pct(rounds, 99)}, "draft_ms_mean": mean(drafts),
            "verify_ms_mean": mean(verifies), "new_sequences": run.new}


def best_k(points: list[dict], by=("B",)) -> list[dict]:
    """Per B (and N): the k with the most tokens per second per GPU."""
    best: dict = {}
    for p in points:
        if "tokens_per_s_per_gpu" not in p:
            continue
        key = tuple(p[x] for x in by)
        if key not in best or p["tokens_per_s_per_gpu"] > best[key]["tokens_per_s_per_gpu"]:
            best[key] = p
    return [{**{x: p[x] for x in by}, "k": p["k"], "tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"],
             "tpot_ms_p50": p["tpot_ms"]["p50"], "tpot_ms_mean": p["tpot_ms"]["mean"]} for p in best.values()]


# ---------------------------------------------------------------- remote: a draft server and N emulated targets

def hello(vocab: int) -> protocol.Hello:
    return protocol.Hello(protocol.PROTOCOL_VERSION, "target", f"emulated:{TARGET}", vocab, "random-weights", "bfloat16")


def welcome(name: str, vocab: int, rows: int) -> protocol.Welcome:
    return protocol.Welcome(protocol.PROTOCOL_VERSION, f"random:{name}", vocab, "random-weights", "bfloat16",
                            sequences=rows)


def serve_random(name: str, device: str, addr: str, ready, seconds: float, rows: int = SERVER_ROWS,
                 capacity: int = CONTEXT + SLACK, spin_s: float = 0.002, compile_mode: str | None = None) -> None:
    """A draft server process: the named draft shape (random bf16 weights) on `device`, its graphs captured and
    a prompt's prefill run once before `ready` is told; serves `addr` for `seconds`."""
    from ..runtime.randomweights import fused_random
    from ..wire.draft_server import DraftServer, ServerLimits
    try:
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(device)
        allow_recompiles()
        t0 = time.perf_counter()
        fast = FastDecoder(fused_random(name, device, "bf16", seed=1), 8)
        dec = BatchDecoder(fast, rows, capacity, compile_mode=compile_mode)
        dec.warm(spans=(dec.span_for(CONTEXT),))
        prefill_ms = prompt_prefill_ms(dec)
        server = DraftServer(BatchDrafter(dec, fast.vocab, chunk=PREFILL_CHUNK), welcome(name, fast.vocab, rows),
                             ServerLimits(sequences_per_client=rows), ttl_s=120)
        ready.put({"vocab": fast.vocab, "build_and_warm_s": round(time.perf_counter() - t0, 1),
                   "prompt_prefill_ms": prefill_ms, "prefill_tokens_between_steps": PREFILL_CHUNK,
                   "graphs": len(dec.graphs), "gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
                   if dec.device.type == "cuda" else None})
    except Exception as e:                       # noqa: BLE001 (the parent reports it)
        ready.put({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
        return
    server.serve(addr, seconds, spin_s)


def prompt_prefill_ms(dec: BatchDecoder, prompt: int = PROMPT) -> float:
    """ms of one prompt's prefill (its first prompt - 1 tokens, as BatchDrafter.prefill feeds them: one eager
    forward into row 0, whose slots a sequence overwrites), after one untimed."""
    pos = torch.arange(prompt - 1, device=dec.device)[None]
    ms = []
    for _ in range(3):
        t0 = time.perf_counter()
        dec.forward(torch.zeros_like(pos), pos, pos, row0=0)
        _sync(dec.device)
        ms.append((time.perf_counter() - t0) * 1e3)
    return round(min(ms[1:]), 3)


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


class Emulated:
    """One emulated target: B streams in lockstep through one DraftServerClient, a verify wait of tv_ms a round."""

    def __init__(self, addr: str, index: int, B: int, k: int, tv_ms: float, alpha: float, seed: int, vocab: int,
                 prompt: int = PROMPT, context: int = CONTEXT, **_):
        from ..wire.draft_client import DraftServerClient
        self.c = DraftServerClient(addr, hello(vocab), timeout_s=60)
        self.index, self.k, self.tv_s, self.alpha, self.vocab = index, k, tv_ms / 1e3, alpha, vocab
        self.prompt, self.context = prompt, context
        self.rng, self.count = random.Random(seed), 0
        self.tracks = [self.fresh() for _ in range(B)]
        self.items = [(t, 0, [self.rng.randrange(vocab)], k) for t in self.tracks]
        self.opened: dict = {}                 # stream -> when its new sequence was opened (perf_counter)
        self.rec = {key: [] for key in ("round_ms", "tpot_ms", "wait_ms", "draft_ms", "queued_ms", "held_ms",
                                        "host_ms", "batch", "tv_over", "open_to_first_draft_ms", "first_wait_ms")}
        self.rec["tokens"], self.rec["stream_tokens"] = 0, [0] * B

    def fresh(self):
        self.count += 1
        ids = [self.rng.randrange(self.vocab) for _ in range(self.prompt)]
        return self.c.open(f"t{self.index}-{self.count}", ids, Sampling(), self.rng.randrange(2 ** 31), 0)

    def verdicts(self, got) -> list[int]:
        """The coins for each stream's proposal; the next round's items (a finished sequence ends and a new one
        opens: the draft prefills it during this verify). Returns the tokens each stream got."""
        items, toks, self.opened = [], [], {}
        for j, (t, r) in enumerate(zip(self.tracks, got)):
            if r.error:
                raise RuntimeError(f"the draft server refused a row ({r.error}): {r.message}")
            a = coins(self.rng, min(self.k, len(r.tokens)), self.alpha)
            tok = self.rng.randrange(self.vocab)
            toks.append(a + 1)
            if t.have + a + 1 + self.k > self.context:
                self.c.client.send(protocol.End(t.seq))         # no wait for Ended (the next Rounds skips it)
                self.tracks[j] = t = self.fresh()
                self.opened[j] = time.perf_counter()
                items.append((t, 0, [self.rng.randrange(self.vocab)], self.k))
            else:
                items.append((t, a, [tok], self.k))
        self.items = items
        return toks

    def round(self) -> None:
        """Rounds -> Drafts, coins and opens within the verify wait, the wait's end; one round recorded."""
        t0 = time.perf_counter()
        opened = self.opened
        got = self.c.rounds(self.items)
        t1 = time.perf_counter()
        cost = self.c.last
        toks = self.verdicts(got)
        wait_until(t1 + self.tv_s)
        t2 = time.perf_counter()
        r, ms = self.rec, (t2 - t0) * 1e3
        r["round_ms"].append(ms)
        r["tpot_ms"] += [ms / t for t in toks]
        r["tokens"] += sum(toks)
        r["stream_tokens"] = [n + t for n, t in zip(r["stream_tokens"], toks)]
        for key, v in (("wait_ms", cost.wait_ms), ("draft_ms", cost.draft_ms), ("queued_ms", cost.queued_ms),
                       ("held_ms", cost.held_ms), ("host_ms", cost.host_ms), ("batch", cost.batch),
                       ("tv_over", (t2 - t1) / self.tv_s - 1)):
            r[key].append(v)
        for j, t_open in opened.items():
            r["open_to_first_draft_ms"].append((t1 - t_open) * 1e3)
            r["first_wait_ms"].append((t1 - t0) * 1e3)

    def run(self, conn) -> dict:
        """The first round untimed (every prompt at once: the cold start), 'ready' to the parent, then rounds from
        the parent's start time for `seconds`."""
        t0 = time.perf_counter()
        self.verdicts(self.c.rounds(self.items))
        self.opened = {}
        conn.send({"ready": True, "cold_start_ms": round((time.perf_counter() - t0) * 1e3, 2)})
        start_at, seconds = conn.recv()
        time.sleep(max(start_at - time.time(), 0))
        while time.time() < start_at + seconds:
            self.round()
        self.rec["t_end"] = time.time()
        for t in self.tracks:
            self.c.end(t)
        self.c.close()
        return self.rec


class EmulatedPipelined:
    """One emulated pipelined target: B streams on the draft server (Open(stream=True)), a target step every
    t_v(B, m) (m: the most drafts any stream has on offer, at most k), coins with alpha for each stream's drafts on
    offer, one Commits message a step (each stream's own token: a correction after a rejected draft, or the
    token after the last one it had). It never waits for drafts: a stream with none on offer gains its own token.
    A bonus token at a position whose draft the target has not received counts as a mismatch (the draft restarts
    there): a little pessimistic, where a real target would match it with probability alpha."""

    def __init__(self, addr: str, index: int, B: int, k: int, tv_ms: dict, alpha: float, seed: int, vocab: int,
                 window: int = 8, prompt: int = PROMPT, context: int = CONTEXT, **_):
        from ..wire.draft_client import DraftServerClient
        self.c = DraftServerClient(addr, hello(vocab), timeout_s=60)
        self.index, self.B, self.k, self.alpha, self.vocab = index, B, k, alpha, vocab
        self.tv_s = {int(m): v / 1e3 for m, v in tv_ms.items()}     # drafts verified per stream -> seconds
        self.window, self.prompt, self.context = window, prompt, context
        self.rng, self.count = random.Random(seed), 0
        self.streams = [self.fresh() for _ in range(B)]
        self.rec = {key: [] for key in ("step_ms", "tpot_ms", "offered", "accepted", "draft_ms", "batch",
                                        "tv_over", "held", *TIMELINE)}
        self.rec.update(tokens=0, restarts=0, stream_tokens=[0] * B, late=0)

    def fresh(self) -> dict:
        """A new stream: Open(stream) and its first token's commit."""
        self.count += 1
        seq = f"p{self.index}-{self.count}"
        ids = [self.rng.randrange(self.vocab) for _ in range(self.prompt)]
        self.c.client.send(protocol.Open(seq, 0, ids, seed=self.rng.randrange(2 ** 31), q_top=0, stream=True,
                                         window=self.window))
        first = self.rng.randrange(self.vocab)
        view = StreamView()
        view.on_commit(0, first)
        s = {"seq": seq, "settled": 1, "view": view, "sent": {}, "first": None}
        self.send_commits([(s, protocol.CommitRow(seq, 0, 0, first))])
        return s

    def send_commits(self, pairs: list) -> None:
        """One Commits message; each stream keeps when its commit went out (the timeline's first stamp)."""
        now = time.time()
        for s, row in pairs:
            s["sent"][row.pos] = now
        self.c.client.send(protocol.Commits([row for _, row in pairs]))

    def note_first(self, s: dict, r, m, arrived: float) -> None:
        """The first draft the server stepped after reading a commit: the timeline's gaps up to its arrival."""
        sent = s["sent"].pop(r.since, None)
        for p in [p for p in s["sent"] if p < r.since]:
            del s["sent"][p]
        if sent is None or not r.read_at:
            return
        for key, a, b in (("sent_to_read", sent, r.read_at), ("read_to_stepped", r.read_at, m.stepped_at),
                          ("stepped_to_arrived", m.stepped_at, arrived), ("sent_to_arrived", sent, arrived)):
            self.rec[key].append((b - a) * 1e3)
        s["first"] = (r.epoch, r.pos, arrived)

    def take(self) -> None:
        """Every Streamed message waiting: each stream's drafts of its current epoch (a newer epoch replaces them)."""
        by = {s["seq"]: s for s in self.streams}
        while (m := self.c.client.recv(0)) is not None:
            if isinstance(m, protocol.Drafts) and any(r.error for r in m.rows):
                bad = next(r for r in m.rows if r.error)
                raise RuntimeError(f"the draft server refused a stream ({bad.error}): {bad.message}")
            if not isinstance(m, protocol.Streamed):
                continue
            arrived = time.time()
            self.rec["draft_ms"].append(m.draft_ms)
            self.rec["batch"].append(m.batch)
            self.rec["held"].append(m.streams)
            for r in m.rows:
                if r.seq in by:
                    by[r.seq]["view"].on_drafted(r.epoch, r.pos, r.token, None)
                    if r.since >= 0:
                        self.note_first(by[r.seq], r, m, arrived)

    def offered(self, s: dict) -> int:
        return len(s["view"].chain(s["settled"], self.k))

    def verified(self, s: dict, m: int) -> None:
        """The timeline's last gap: the first draft after a commit taken into a verify (or passed: too late)."""
        if s["first"] is None:
            return
        epoch, pos, arrived = s["first"]
        if epoch != s["view"].epoch or pos < s["settled"]:
            self.rec["late"] += 1
            s["first"] = None
        elif pos < s["settled"] + m:
            self.rec["arrived_to_verified"].append((time.time() - arrived) * 1e3)
            s["first"] = None

    def step(self) -> None:
        t0 = time.perf_counter()
        self.take()
        offers = [self.offered(s) for s in self.streams]
        for s, m in zip(self.streams, offers):
            self.verified(s, m)
        tv = self.tv_s[max(offers)]
        commits, toks = [], []
        for j, (s, m) in enumerate(zip(self.streams, offers)):
            a = coins(self.rng, m, self.alpha)
            pos, view = s["settled"] + a, s["view"]
            drafted = view.drafts.get(pos, (None,))[0] if not view.unresolved else None
            if a < m:                                   # a rejected draft: the target's token differs
                token = (drafted + 1) % self.vocab
            elif drafted is not None and self.rng.random() < self.alpha:
                token = drafted                         # the draft's next token, already here, matches
            else:
                token = self.rng.randrange(self.vocab)
            restarts = view.restarts
            view.on_commit(pos, token)                  # the same rules as the server's (runtime.pipeline)
            self.rec["restarts"] += view.restarts - restarts
            commits.append((s, protocol.CommitRow(s["seq"], 0, pos, token)))
            s["settled"] = pos + 1
            toks.append(a + 1)
            self.rec["offered"].append(m)
            self.rec["accepted"].append(a)
        self.send_commits(commits)
        for j, s in enumerate(self.streams):
            if self.prompt + s["settled"] + self.window + self.k + 2 > self.context:
                self.c.client.send(protocol.End(s["seq"]))
                self.streams[j] = self.fresh()
        wait_until(t0 + tv)
        t2 = time.perf_counter()
        r, ms = self.rec, (t2 - t0) * 1e3
        r["step_ms"].append(ms)
        r["tpot_ms"] += [ms / t for t in toks]
        r["tokens"] += sum(toks)
        r["stream_tokens"] = [n + t for n, t in zip(r["stream_tokens"], toks)]
        r["tv_over"].append((t2 - t0) / tv - 1)

    def run(self, conn) -> dict:
        """Warm until every stream has a draft on offer (the prompts prefilled), 'ready', then steps from the
        parent's start time for `seconds`."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60:
            self.take()
            if all(self.offered(s) for s in self.streams):
                break
            time.sleep(0.001)
        for key in self.rec:
            self.rec[key] = [] if isinstance(self.rec[key], list) else 0
        self.rec["stream_tokens"] = [0] * self.B
        conn.send({"ready": True, "cold_start_ms": round((time.perf_counter() - t0) * 1e3, 2)})
        start_at, seconds = conn.recv()
        time.sleep(max(start_at - time.time(), 0))
        while time.time() < start_at + seconds:
            self.step()
        self.rec["t_end"] = time.time()
        for s in self.streams:                     # End, and its Ended taken: a socket closed at once (linger 0)
            self.c.end_seq(s["seq"])               # would drop the End, and the server would keep the stream
        self.c.close()
        return self.rec


def _target_main(conn) -> None:
    """An emulated target's process: points until told None (cmd "mode": "pipelined" for pipelined streams)."""
    while (cmd := conn.recv()) is not None:
        try:
            res = (EmulatedPipelined if cmd.get("mode") == "pipelined" else Emulated)(**cmd).run(conn)
        except Exception as e:                   # noqa: BLE001 (the parent records it)
            res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        conn.send(res)


class Targets:
    """n emulated-target processes (spawn), kept across points; a point uses the first N."""

    def __init__(self, n: int):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for i in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_target_main, args=(b,), daemon=True, name=f"emulated-target-{i}")
            p.start()
            self.conns.append(a), self.procs.append(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(2)

    @staticmethod
    def _recv(conn, timeout: float):
        if not conn.poll(timeout):
            raise TimeoutError(f"no answer from an emulated target within {timeout:.0f} s")
        return conn.recv()

    def point(self, N: int, cmd: dict, seconds: float, timeout: float = 120) -> tuple[list[dict], list[dict], float]:
        """(each target's 'ready', each target's record, the common start time): targets 0..N-1 open their
        streams and run one cold round; then all start together for `seconds`."""
        conns = self.conns[:N]
        for i, c in enumerate(conns):
            c.send({**cmd, "index": i, "seed": cmd["seed"] * 1000 + i})
        ready = [self._recv(c, timeout) for c in conns]
        start_at = time.time() + 0.05
        for c, r in zip(conns, ready):
            if "error" not in r:
                c.send((start_at, seconds))
        recs = [r if "error" in r else self._recv(c, seconds + timeout) for c, r in zip(conns, ready)]
        return ready, recs, start_at


def remote_record(B: int, N: int, k: int, alpha: float, tv_ms: float, ready, recs, start_at: float) -> dict:
    """One remote point from its targets' records."""
    errs = [r["error"] for r in list(ready) + list(recs) if "error" in r]
    out = {"label": REMOTE_LABEL, "B": B, "N": N, "k": k, "alpha": alpha, "t_v_ms": tv_ms, "gpus": N + 1}
    if errs:
        return {**out, "error": errs[0][:500], "trace": next(r.get("trace") for r in list(ready) + list(recs)
                                                              if "error" in r)}
    cat = lambda key: [x for r in recs for x in r[key]]  # noqa: E731
    wall = max(r["t_end"] for r in recs) - start_at
    tokens, rounds = sum(r["tokens"] for r in recs), len(cat("round_ms"))
    net = [w - h for w, h in zip(cat("wait_ms"), cat("held_ms"))]
    tv = cat("tv_over")
    return {**out, "rounds": rounds, "seconds": round(wall, 3), "tokens": tokens,
            "tokens_per_round": round(tokens / max(rounds, 1) / B, 3), "tokens_per_s": round(tokens / wall, 1),
            "tokens_per_s_per_gpu": round(tokens / wall / (N + 1), 1),
            "tokens_per_s_per_target": [round(r["tokens"] / wall, 1) for r in recs],
            "stream_tokens_min": min(n for r in recs for n in r["stream_tokens"]),
            "tpot_ms": {"p50": pct(cat("tpot_ms"), 50), "p99": pct(cat("tpot_ms"), 99),
                        "mean": round(wall * 1e3 * N * B / max(tokens, 1), 4)},
            "round_ms": {"p50": pct(cat("round_ms"), 50), "p99": pct(cat("round_ms"), 99)},
            "split_ms_mean": {"client_wait": mean(cat("wait_ms")), "draft_compute": mean(cat("draft_ms")),
                              "queueing": mean(cat("queued_ms")), "server_host": mean(cat("host_ms")),
                              "network": mean(net), "server_held": mean(cat("held_ms"))},
            "split_ms_p50": {"client_wait": pct(cat("wait_ms"), 50), "draft_compute": pct(cat("draft_ms"), 50),
                             "queueing": pct(cat("queued_ms"), 50), "server_host": pct(cat("host_ms"), 50),
                             "network": pct(net, 50)},
            "server_batch": {"mean": mean(cat("batch")), "p50": pct(cat("batch"), 50), "min": min(cat("batch"), default=None),
                             "max": max(cat("batch"), default=None)},
            "new_sequence": {"count": len(cat("open_to_first_draft_ms")),
                             "open_to_first_draft_ms_p50": pct(cat("open_to_first_draft_ms"), 50),
                             "open_to_first_draft_ms_max": pct(cat("open_to_first_draft_ms"), 100),
                             "first_rounds_wait_ms_p50": pct(cat("first_wait_ms"), 50),
                             "first_rounds_wait_ms_max": pct(cat("first_wait_ms"), 100),
                             "cold_start_ms_max": max(r["cold_start_ms"] for r in ready)},
            "emulation": {"t_v_over_intended_mean": mean(tv), "t_v_over_intended_max": pct(tv, 100),
                          "t_v_over_intended_mean_per_target": [mean(r["tv_over"]) for r in recs]}}


def remote_grid(batches=BATCHES, ns=TARGETS_N, ks=REMOTE_KS, rows: int = SERVER_ROWS) -> list[tuple]:
    return [(b, n, k) for b in batches for n in ns if n * b <= rows for k in ks]


def remote_points(addr: str, pool: Targets, grid, tv: dict, alpha: float, seconds: float, vocab: int,
                  deadline: float = float("inf"), prompt: int = PROMPT, context: int = CONTEXT, progress=print,
                  save=lambda: None) -> list[dict]:
    """Each (B, N, k) of the grid against the draft server at addr; points not started by `deadline` are skipped."""
    out = []
    for i, (b, n, k) in enumerate(grid):
        if time.time() + seconds > deadline:
            out.append({"label": REMOTE_LABEL, "B": b, "N": n, "k": k, "skipped": "out of time"})
            continue
        cmd = dict(addr=addr, B=b, k=k, tv_ms=tv[(b, k)], alpha=alpha, seed=i + 1, vocab=vocab, prompt=prompt,
                   context=context)
        try:
            out.append(remote_record(b, n, k, alpha, tv[(b, k)], *pool.point(n, cmd, seconds)))
        except TimeoutError as e:
            out.append({"label": REMOTE_LABEL, "B": b, "N": n, "k": k, "error": str(e)})
        progress(remote_row(out[-1]))
        save()
    return out


# ---------------------------------------------------------------- rows of the printed table

def draft_row(p: dict) -> str:
    cells = " ".join(f"B{q['B']}@{q['context']}: {q['step_ms']:.2f}/{q['host_ms_per_step']:.3f}" for q in p["points"])
    return f"draft_step {p['draft']} [{p['compile']}] step ms/host ms per step: {cells}"


def colocated_row(p: dict) -> str:
    return (f"colocated B={p['B']:2d} k={p['k']} TPOT p50 {p['tpot_ms']['p50']:.2f} p99 {p['tpot_ms']['p99']:.2f} "
            f"mean {p['tpot_ms']['mean']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} tok/s/GPU (draft {p['draft_ms_mean']:.2f}"
            f" + verify {p['verify_ms_mean']:.2f} ms a round)")


def remote_row(p: dict) -> str:
    head = f"remote B={p['B']:2d} N={p['N']:2d} k={p['k']}"
    if "tpot_ms" not in p:
        return f"{head}: {p.get('error') or p.get('skipped')}"
    s = p["split_ms_mean"]
    return (f"{head} TPOT p50 {p['tpot_ms']['p50']:.2f} p99 {p['tpot_ms']['p99']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} "
            f"tok/s/GPU ({p['gpus']} GPUs); wait {s['client_wait']:.2f} = draft {s['draft_compute']:.2f} + queue "
            f"{s['queueing']:.2f} + host {s['server_host']:.2f} + net {s['network']:.2f} ms; batch {p['server_batch']['mean']}"
            f"; t_v {p['t_v_ms']:.2f} ms (+{100 * (p['emulation']['t_v_over_intended_mean'] or 0):.1f}%)")


# ---------------------------------------------------------------- one call on the device

NOTES = [
    "Weights: random bf16 of each named shape, drawn on the GPU (runtime.randomweights); timing does not depend on "
    "their values. The draft's tokens are meaningless with random weights, so acceptance is synthetic: coins on the "
    "target side (heads with probability alpha per drafted token, accepted up to the first tails, then the target's "
    "own token), alpha 0.71 with the Qwen3-1.7B shape and 0.56 with the Qwen3-0.6B shape.",
    f"Streams run sequences from {PROMPT} to {CONTEXT} tokens (a sequence whose next round would pass {CONTEXT} ends "
    "and a new one opens; the draft prefills the new prompt between steps, the target's prefill is not charged).",
    f"remote: every point is an {REMOTE_LABEL}; the draft server has {SERVER_ROWS} cache rows (its largest batch "
    f"bucket), so N*B <= {SERVER_ROWS}: more streams need a second draft GPU or larger buckets. tokens/s per GPU "
    "counts N+1 GPUs (N targets and the draft GPU). The emulated verify waits the graph replay time of t_v(B, k) "
    "(device only): the target's host work (input copy, logits read; target.wall_ms shows it) is not in the wait.",
    "What two GPUs would add (a real target in place of the emulated one): the real verify's host work and launch "
    "jitter on the target's own GPU, a real target prefill for each new sequence, and the target's draft-server "
    "traffic on the same host as its forward; the draft GPU's figures (draft compute, queueing, server host work, "
    "batch sizes) would be the same as measured here, since the draft server already runs on its own GPU process.",
    "network (client wait - server held) is loopback TCP between processes on one host, both sides' encoding, and "
    "the time a Rounds waits in the server's socket while a draft step or a prefill runs (the server stamps a "
    "message when it reads it); a link between two hosts adds its round trip to every round.",
    f"A new sequence's prompt ({PROMPT - 1} tokens fed) is prefilled by the draft between steps, up to "
    f"{PREFILL_CHUNK} tokens (several prompts) between two steps: the streams already running wait for it, which "
    "is most of each point's TPOT p99 and of its t_v overshoot; prompt_prefill_ms (remote.server, "
    "colocated) gives one prompt's prefill.",
    "t_v_over_intended: (the emulated verify's actual wait) / t_v - 1, per round; it includes the coins and the "
    "sends of End and Open for finished sequences, and the processes' scheduling on the host's CPU cores.",
]


def build_fast(name: str, device: str, seed: int) -> FastDecoder:
    from ..runtime.randomweights import fused_random
    return FastDecoder(fused_random(name, device, "bf16", seed=seed), 8)


def free() -> None:
    """Return what the dropped models and caches held to the device."""
    gc.collect()
    torch.cuda.empty_cache()


def run_call(call: int, json_path: str, quick: bool = False, drafts=("Qwen3-1.7B",), device: str = "cuda:0",
             budget_s: float = 500, remote_s: float = 2.0, colocated_s: float = 1.2, compile_modes=None,
             models_compile: str | None = None, progress=print, sync: bool = True) -> dict:
    """The four parts for drafts[0] (draft_step, target, colocated, remote), then extras while time is left: the
    compile modes at the goal's rows (only if the first step misses a goal) and each further draft's draft_step and
    colocated parts. models_compile: every BatchDecoder's compile mode (None: eager kernels in CUDA graphs, as
    the draft server builds it). The JSON is rewritten after each part."""
    g = dict(models_compile=models_compile or None, batches=BATCHES, reps=10, verify_ks=VERIFY_KS, colocated_batches=BATCHES, colocated_ks=COLOCATED_KS,
             colocated_s=colocated_s, remote_batches=BATCHES, remote_ns=TARGETS_N, remote_ks=REMOTE_KS,
             remote_s=remote_s, compile_modes=("default", "max-autotune-no-cudagraphs"),
             extra_drafts=tuple(drafts[1:]), sync=sync)
    if quick:
        g.update(QUICK)
    if compile_modes is not None:
        g["compile_modes"] = tuple(compile_modes)
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
    allow_recompiles()
    t_start = time.time()
    t_end = t_start + budget_s
    res = {"schema": "sdeth.bench/1", "bench": "streams", "call": call,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hardware": hardware.describe(device),
           "copy_bandwidth_Bps": copy_bandwidth(device),
           "settings": {"target": TARGET, "drafts": list(drafts), "alpha": {d: DRAFT_ALPHA[d] for d in drafts},
                        "weights": "random bf16 (runtime.randomweights)", "acceptance": "synthetic (coins, target side)",
                        "prompt": PROMPT, "context": CONTEXT, "contexts": list(CONTEXTS), "draft_k": DRAFT_K,
                        "server_rows": SERVER_ROWS, "compile": _compiled(g), "quick": quick, "budget_s": budget_s, "grid": g,
                        "shapes": {n: shape(n) for n in (TARGET, *drafts)}},
           "goals": GOALS | {"step_ms": {str(c): v for c, v in GOALS["step_ms"].items()}}, "notes": NOTES,
           "draft_step": [], "target": {}, "colocated": [], "remote": {}, "goal_check": [], "skipped": []}
    save = lambda: Path(json_path).write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
    first = drafts[0]
    dfast = build_fast(first, device, 1)
    res["draft_step"].append(draft_step(dfast, dfast.vocab, first, g["batches"], CONTEXTS, reps=g["reps"],
                                        compile_mode=g["models_compile"]))
    progress(draft_row(res["draft_step"][-1]))
    res["goal_check"] = goal_check(res["draft_step"])
    save()
    tfast = build_fast(TARGET, device, 0)
    tdec, pts = target_points(tfast, g["batches"], g["verify_ks"], compile_mode=g["models_compile"])
    res["target"] = {"model": TARGET, "context": CONTEXT, "rows": tdec.rows, "compile": _compiled(g), "points": pts}
    progress("target t_v(B, k) ms (replay): " + " ".join(f"B{p['B']}k{p['k'] or 0}={p.get('replay_ms')}" for p in pts))
    save()
    colocated_part(res, dfast, first, tdec, g, g["colocated_ks"], t_end, progress, save)
    free()
    remote_part(res, first, device, tv_table(pts), g, t_end, progress, save)
    extras(res, dfast, first, tdec, g, device, t_end, progress, save)
    res["wall_s"] = round(time.time() - t_start, 1)
    save()
    for line in summary_lines(res):
        progress(line)
    return res


def summary_lines(res: dict) -> list[str]:
    """The goals, the best k per B colocated, and the remote points at each B's best tokens/s per GPU."""
    out = [f"goal {r['draft']} [{r['compile']}] B={r['B']} context {r['context']}: step {r['step_ms']:.3f} ms "
           f"(goal {r['step_goal_ms']}: {'met' if r['step_met'] else 'missed'}), host {r['host_ms_per_step']:.3f} ms/step "
           f"(goal {r['host_goal_ms']}: {'met' if r['host_met'] else 'missed'})" for r in res.get("goal_check", [])]
    for part in res.get("colocated", []):
        out += [f"colocated {part['draft']} best B={b['B']}: k={b['k']} {b['tokens_per_s_per_gpu']:.0f} tok/s/GPU, "
                f"TPOT mean {b['tpot_ms_mean']:.2f} ms" for b in part["best_k"]]
    out += [f"remote best B={b['B']} N={b['N']}: k={b['k']} {b['tokens_per_s_per_gpu']:.0f} tok/s/GPU, TPOT mean "
            f"{b['tpot_ms_mean']:.2f} ms" for b in res.get("remote", {}).get("best_k", [])]
    return out


def _compiled(g: dict) -> str:
    return g["models_compile"] or "none (eager kernels, CUDA graphs)"


def colocated_part(res, dfast, name, tdec, g, ks, t_end, progress, save) -> None:
    """Colocated SD of each (B, k) with this draft shape; the best k per B."""
    ddec = BatchDecoder(dfast, max(g["colocated_batches"]), CONTEXT + SLACK, compile_mode=g["models_compile"])
    ddec.warm(buckets=g["colocated_batches"], widths=(1, 2), spans=(ddec.span_for(CONTEXT),))
    drafter = BatchDrafter(ddec, dfast.vocab, chunk=PREFILL_CHUNK)
    prefill_ms = prompt_prefill_ms(ddec)
    pts = []
    for b in g["colocated_batches"]:
        for k in ks:
            if time.time() + g["colocated_s"] + 5 > t_end:
                res["skipped"].append(f"colocated {name} B={b} k={k}: out of time")
                continue
            try:
                pts.append({"draft": name, **colocated_point(drafter, tdec, b, k, DRAFT_ALPHA[name], g["colocated_s"],
                                                             seed=b * 10 + k)})
                progress(colocated_row(pts[-1]))
            except Exception as e:               # noqa: BLE001 (record and go on)
                pts.append({"draft": name, "B": b, "k": k, "error": f"{type(e).__name__}: {e}"[:500]})
                progress(f"colocated B={b} k={k}: {pts[-1]['error']}")
    res["colocated"].append({"draft": name, "compile": _compiled(g), "prompt_prefill_ms": prefill_ms, "points": pts,
                             "best_k": best_k(pts)})
    save()
    del ddec, drafter
    free()


def remote_part(res, name, device, tv, g, t_end, progress, save) -> None:
    """The draft server in a process of its own and the emulated targets' processes; every grid point."""
    from ..place.testbed import free_port
    grid = remote_grid(g["remote_batches"], g["remote_ns"], g["remote_ks"]) if g.get("sync", True) else []
    missing = sorted({(b, k) for b, _, k in grid} - tv.keys())
    if missing:
        raise ValueError(f"remote points {missing} (B, k) have no measured t_v: measure those in the target part")
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    server = ctx.Process(target=serve_random, args=(name, device, addr, ready, max(t_end - time.time(), 60)),
                         kwargs={"compile_mode": g["models_compile"]}, daemon=True, name="draft-server")
    server.start()
    out = res["remote"] = {"draft": name, "address": "loopback TCP", "server_rows": SERVER_ROWS,
                           "compile": _compiled(g), "points": []}
    try:
        with Targets(max([n for _, n, _ in grid] + [n for _, n in pipelined_grid()])) as pool:
            info = ready.get(timeout=600)
            out["server"] = info
            if "error" in info:
                progress(f"draft server: {info['error']}")
                return
            time.sleep(0.5)                      # the server binds after it says ready
            pipelined_part(res, name, addr, pool, tv, info["vocab"], g, t_end, progress, save)
            out["points"] = remote_points(addr, pool, grid, tv, DRAFT_ALPHA[name], g["remote_s"], info["vocab"],
                                          t_end - 10, progress=progress, save=save)
            out["best_k"] = best_k([p for p in out["points"] if "tpot_ms" in p], by=("B", "N"))
    finally:
        server.terminate()
        server.join(10)
        save()


def extras(res, dfast, first, tdec, g, device, t_end, progress, save) -> None:
    """While time is left: compile modes at the goal's rows (if the eager step missed a goal), then each further
    draft shape's draft_step and colocated parts."""
    missed = any(not (r["step_met"] and r["host_met"]) for r in res["goal_check"])
    if first == GOALS["draft"] and missed:
        for mode in (m for m in g["compile_modes"] if m != g["models_compile"]):
            if time.time() + (240 if "autotune" in mode else 90) > t_end:     # autotuning takes minutes
                res["skipped"].append(f"draft_step {first} compile {mode}: out of time")
                continue
            try:
                res["draft_step"].append(draft_step(dfast, dfast.vocab, first, (GOALS["rows"],), CONTEXTS,
                                                    reps=g["reps"], compile_mode=mode))
                progress(draft_row(res["draft_step"][-1]))
            except Exception as e:               # noqa: BLE001
                res["draft_step"].append({"draft": first, "compile": mode, "error": f"{type(e).__name__}: {e}"[:800]})
                progress(f"compile {mode}: {res['draft_step'][-1]['error']}")
            res["goal_check"] = goal_check(res["draft_step"])
            save()
            free()
    for name in g["extra_drafts"]:
        if time.time() + 60 > t_end:
            res["skipped"].append(f"{name}: out of time")
            continue
        fast = build_fast(name, device, 2)
        res["draft_step"].append(draft_step(fast, fast.vocab, name, g["batches"], CONTEXTS, reps=g["reps"],
                                            compile_mode=g["models_compile"]))
        progress(draft_row(res["draft_step"][-1]))
        save()
        colocated_part(res, fast, name, tdec, g, g["colocated_ks"], t_end, progress, save)
        del fast
        free()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sdeth bench streams", description=__doc__.split("\n\n")[0])
    ap.add_argument("--call", type=int, default=1, help="which call on the device this is (1, 2, ...)")
    ap.add_argument("--json", required=True, help="results JSON path (rewritten after each part)")
    ap.add_argument("--quick", action="store_true", help="a small grid (a smoke run)")
    ap.add_argument("--drafts", default="Qwen3-1.7B", help=f"comma-separated, of {list(DRAFT_ALPHA)}; the first runs "
                    "every part, the others draft_step and colocated while time is left")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--budget-s", type=float, default=500, help="parts not started by then are recorded as skipped")
    ap.add_argument("--remote-s", type=float, default=2.0, help="seconds of each remote point")
    ap.add_argument("--colocated-s", type=float, default=1.2, help="seconds of each colocated point")
    ap.add_argument("--models-compile", default="", help="every BatchDecoder's torch.compile mode (target, "
                    "draft, draft server), e.g. default; '' (the default): eager kernels in CUDA graphs, as the "
                    "draft server builds it")
    ap.add_argument("--no-sync", action="store_true", help="leave out the remote sync-rounds grid (the pipelined "
                    "streams still run)")
    ap.add_argument("--compile", default=None, help="comma-separated compile modes tried at the goal's rows when the "
                    "eager step misses a goal ('' none; default: default,max-autotune-no-cudagraphs; --quick: default)")
    a = ap.parse_args(argv)
    drafts = tuple(x for x in a.drafts.split(",") if x)
    bad = [d for d in drafts if d not in DRAFT_ALPHA]
    if bad or not drafts:
        raise SystemExit(f"unknown drafts {bad}: use {list(DRAFT_ALPHA)}")
    run_call(a.call, a.json, a.quick, drafts, a.device, a.budget_s, a.remote_s, a.colocated_s,
             None if a.compile is None else tuple(x for x in a.compile.split(",") if x), a.models_compile or None,
             sync=not a.no_sync)


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------- remote, pipelined streams

PIPELINED_K, PIPELINED_WINDOW = 4, 8
TIMELINE = ("sent_to_read", "read_to_stepped", "stepped_to_arrived", "sent_to_arrived", "arrived_to_verified")
PIPELINED_LABEL = (f"emulated target (measured t_v of the {TARGET} shape), pipelined streams, real draft server")


def pipelined_grid(batches=(1, 2, 4, 8), ns=(1, 2, 4, 8), rows: int = 32) -> list[tuple]:
    return [(b, n) for b in batches for n in ns if n * b <= rows]


def pipelined_record(B: int, N: int, k: int, alpha: float, ready, recs, start_at: float) -> dict:
    """One pipelined point from its targets' records."""
    errs = [r["error"] for r in list(ready) + list(recs) if "error" in r]
    out = {"label": PIPELINED_LABEL, "B": B, "N": N, "k": k, "window": PIPELINED_WINDOW, "alpha": alpha,
           "gpus": N + 1}
    if errs:
        return {**out, "error": errs[0][:500]}
    cat = lambda key: [x for r in recs for x in r[key]]  # noqa: E731
    wall = max(r["t_end"] for r in recs) - start_at
    tokens, steps = sum(r["tokens"] for r in recs), len(cat("step_ms"))
    tv = cat("tv_over")
    return {**out, "steps": steps, "seconds": round(wall, 3), "tokens": tokens,
            "tokens_per_step": round(tokens / max(steps, 1) / B, 3), "tokens_per_s": round(tokens / wall, 1),
            "tokens_per_s_per_gpu": round(tokens / wall / (N + 1), 1),
            "tpot_ms": {"p50": pct(cat("tpot_ms"), 50), "p99": pct(cat("tpot_ms"), 99),
                        "mean": round(wall * 1e3 * N * B / max(tokens, 1), 4)},
            "step_ms": {"p50": pct(cat("step_ms"), 50), "p99": pct(cat("step_ms"), 99)},
            "offered_mean": mean(cat("offered")), "accepted_mean": mean(cat("accepted")),
            "restarts_per_step": round(sum(r["restarts"] for r in recs) / max(steps, 1), 3),
            "server_batch": {"mean": mean(cat("batch")), "max": max(cat("batch"), default=None)},
            "draft_ms_mean": mean(cat("draft_ms")),
            "server_streams": {"live": N * B, "held_mean": mean(cat("held")), "held_max": max(cat("held"), default=None)},
            "timeline_ms": {key: {"p50": pct(cat(key), 50), "p99": pct(cat(key), 99), "n": len(cat(key))}
                            for key in TIMELINE},
            "first_drafts_late": sum(r["late"] for r in recs),
            "emulation": {"t_v_over_intended_mean": mean(tv), "t_v_over_intended_max": pct(tv, 100)}}


def pipelined_part(res, name, addr, pool, tv, vocab, g, t_end, progress, save) -> None:
    """Pipelined streams against the same draft server: each (B, N) at k = PIPELINED_K."""
    k = PIPELINED_K
    out = res["remote_pipelined"] = {"draft": name, "address": "loopback TCP", "k": k, "window": PIPELINED_WINDOW,
                                     "points": []}
    grid = [(b, n) for b, n in g.get("pipelined_grid") or pipelined_grid() if all((b, m) in tv for m in range(k + 1))]
    for i, (b, n) in enumerate(grid):
        if time.time() + g["remote_s"] + 10 > t_end:
            out["points"].append({"label": PIPELINED_LABEL, "B": b, "N": n, "k": k, "skipped": "out of time"})
            continue
        cmd = dict(mode="pipelined", addr=addr, B=b, k=k, tv_ms={m: tv[(b, m)] for m in range(k + 1)},
                   alpha=DRAFT_ALPHA[name], seed=100 + i, vocab=vocab, window=PIPELINED_WINDOW,
                   prompt=g.get("prompt", PROMPT), context=g.get("context", CONTEXT))
        try:
            out["points"].append(pipelined_record(b, n, k, DRAFT_ALPHA[name], *pool.point(n, cmd, g["remote_s"])))
        except TimeoutError as e:
            out["points"].append({"label": PIPELINED_LABEL, "B": b, "N": n, "k": k, "error": str(e)})
        p = out["points"][-1]
        progress(f"pipelined B={b} N={n}: " + (f"TPOT {p['tpot_ms']['mean']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} "
                                              f"tok/s/GPU, offered {p['offered_mean']}" if "tpot_ms" in p else
                                              p.get("error", p.get("skipped", ""))))
        save()

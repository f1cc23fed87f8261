"""colocated: B streams in lockstep on one GPU (the draft and the target shape in one process)."""
from __future__ import annotations

import random
import time

import torch

from ...runtime.batchdraft import BatchDrafter
from ...runtime.batchmodel import BatchDecoder
from ...runtime.verify import Sampling
from ..bench.targets import DRAFT_ALPHA
from .common import COLOCATED_LABEL, CONTEXT, PREFILL_CHUNK, PROMPT, SLACK, coins, compiled, free, mean, pct
from .report import colocated_row
from .server import prompt_prefill_ms

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




def colocated_part(res, dfast, name, tdec, g, ks, t_end, progress, save) -> None:
    """Colocated SD of each (B, k) with this draft shape; the best k per B."""
    ddec = BatchDecoder(dfast, max(g.colocated_batches), CONTEXT + SLACK, compile_mode=g.models_compile)
    ddec.warm(buckets=g.colocated_batches, widths=(1, 2), spans=(ddec.span_for(CONTEXT),))
    drafter = BatchDrafter(ddec, dfast.vocab, chunk=PREFILL_CHUNK)
    prefill_ms = prompt_prefill_ms(ddec)
    pts = []
    for b in g.colocated_batches:
        for k in ks:
            if time.time() + g.colocated_s + 5 > t_end:
                res["skipped"].append(f"colocated {name} B={b} k={k}: out of time")
                continue
            try:
                pts.append({"draft": name, **colocated_point(drafter, tdec, b, k, DRAFT_ALPHA[name], g.colocated_s,
                                                             seed=b * 10 + k)})
                progress(colocated_row(pts[-1]))
            except Exception as e:               # noqa: BLE001 (record and go on)
                pts.append({"draft": name, "B": b, "k": k, "error": f"{type(e).__name__}: {e}"[:500]})
                progress(f"colocated B={b} k={k}: {pts[-1]['error']}")
    res["colocated"].append({"draft": name, "compile": compiled(g), "prompt_prefill_ms": prefill_ms, "points": pts,
                             "best_k": best_k(pts)})
    save()
    del ddec, drafter
    free()

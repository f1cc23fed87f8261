"""colocated: B streams in lockstep on one GPU (the draft and the target shape in one process).

Two targets: the real target shape's batched verify (`target`), or an emulated one that waits its t_v(B, k) in
series after the real draft steps (`tv_ms`): the same emulated target, with the same t_v table, as the remote
options (remote.py), so colocated and remote SD are measured in one harness."""
from __future__ import annotations

import random
import time

import torch

from ...runtime.batchdraft import BatchDrafter
from ...runtime.batchmodel import BatchDecoder
from ...runtime.verify import Sampling
from ..bench.targets import DRAFT_ALPHA
from .common import (COLOCATED_LABEL, CONTEXT, PREFILL_CHUNK, PROMPT, REQUEST_LEAST, SLACK, coins, compiled, free,
                     mean, pct, wait_until)
from .printout import colocated_row
from .server import prompt_prefill_ms, warm_prompts

def emulated_label(target: str) -> str:
    return (f"emulated target (measured t_v of the {target} shape, in series after the draft), colocated SD, real "
            "draft steps on the same device")


class Colocated:
    """B streams in lockstep over a BatchDrafter and the target's BatchDecoder (columns='all') in this process, or,
    with tv_ms ((B, k) -> ms), an emulated target that waits t_v(B, k) after the draft steps and takes a random
    token (acceptance is synthetic either way: coins with alpha)."""

    def __init__(self, drafter: BatchDrafter, target: BatchDecoder | None, B: int, k: int, alpha: float, seed: int,
                 prompt: int = PROMPT, context: int = CONTEXT, tv_ms: dict | None = None):
        if target is None and tv_ms is None:
            raise ValueError("colocated SD needs a target: its BatchDecoder, or tv_ms for an emulated one")
        if tv_ms is not None and (B, k) not in tv_ms:
            raise ValueError(f"the emulated target has no t_v for B={B} k={k}: measure it (its table has "
                             f"{sorted(tv_ms)})")
        self.drafter, self.t, self.B, self.k, self.alpha, self.tv_ms = drafter, target, B, k, alpha, tv_ms
        self.prompt, self.context = prompt, context
        self.rng, self.gen, self.new = random.Random(seed), 0, 0
        self.seq_at: list[float | None] = [None] * B   # per-request TPOT: each slot's first round's end ...
        self.seq_n = [0] * B                           # ... and its tokens since the first
        self.request_tpot: list[float] = []            # ms, one per sequence ended (or cut with REQUEST_LEAST)
        self.seqs = [self.fresh(i) for i in range(B)]
        while self.drafter.prefill():
            pass
        self.last = [s.pending[-1] for s in self.seqs]          # the token each row's verify starts with

    def fresh(self, i: int):
        self.gen += 1
        ids = [self.rng.randrange(self.drafter.vocab) for _ in range(self.prompt)]
        return self.drafter.open(("colocated", i), self.gen, ids, Sampling(), self.gen, 0)

    def round(self) -> tuple[list[int], float, float]:
        """One round: (tokens per stream, draft ms, verify ms)."""
        t0 = time.perf_counter()
        drafts = self.drafter.draft([(s, self.k) for s in self.seqs])
        t1 = time.perf_counter()
        chosen = self._verify(drafts)
        t2 = time.perf_counter()
        toks = []
        for i, s in enumerate(self.seqs):
            a = coins(self.rng, self.k, self.alpha)
            tok = (chosen[i][a] if chosen else self.rng.randrange(self.drafter.vocab)) % self.drafter.vocab
            self.drafter.apply(s, s.n, a, [tok])
            self.last[i] = tok
            toks.append(a + 1)
            ends = s.n + self.k > self.context                  # its next round would pass the context: a new one
            self.per_request(i, a + 1, t2, ends)
            if ends:
                self.drafter.free(s.key)
                self.seqs[i] = self.fresh(i)
                self.new += 1
        while self.drafter.prefill():
            pass
        for i, s in enumerate(self.seqs):
            if s.drafted == 0:
                self.last[i] = s.pending[-1]
        return toks, (t1 - t0) * 1e3, (t2 - t1) * 1e3

    def _verify(self, drafts) -> list | None:
        """The target's tokens after each row's drafts (the real target), or None after waiting t_v (emulated)."""
        if self.tv_ms is not None:
            wait_until(time.perf_counter() + self.tv_ms[(self.B, self.k)] / 1e3)
            return None
        dev = self.t.device
        ids = torch.tensor([[self.last[i]] + d.tokens for i, d in enumerate(drafts)], device=dev)
        pos = torch.tensor([list(range(s.n - 1, s.n + self.k)) for s in self.seqs], device=dev)
        return self.t.step(ids, pos, pos, max(s.n for s in self.seqs) + self.k).argmax(-1).cpu().tolist()

    def per_request(self, i: int, tokens: int, t_end: float, ends: bool) -> None:
        """Slot i's sequence as serving benchmarks count TPOT ((last token - first token) / (tokens - 1)): from the
        end of its first round (its first token; that round's other tokens count after it) to its last token,
        recorded when it ends."""
        if self.seq_at[i] is None:
            self.seq_at[i], self.seq_n[i] = t_end, tokens - 1
        else:
            self.seq_n[i] += tokens
        if ends:
            self.cut(i, t_end, 1)

    def cut(self, i: int, t_end: float, least: int) -> None:
        """Slot i's TPOT recorded (with at least `least` tokens after its first), and the slot's count reset."""
        if self.seq_at[i] is not None and self.seq_n[i] >= max(least, 1):
            self.request_tpot.append((t_end - self.seq_at[i]) * 1e3 / self.seq_n[i])
        self.seq_at[i], self.seq_n[i] = None, 0

    def close(self) -> None:
        t_end = time.perf_counter()
        for i, s in enumerate(self.seqs):
            self.cut(i, t_end, REQUEST_LEAST)                   # a sequence cut by the point's end, when long enough
            self.drafter.free(s.key)


def colocated_point(drafter, target, B: int, k: int, alpha: float, seconds: float, seed: int = 0,
                    warm_rounds: int = 3, prompt: int = PROMPT, context: int = CONTEXT, min_rounds: int = 1,
                    tv_ms: dict | None = None, label: str = COLOCATED_LABEL) -> dict:
    """Rounds of B lockstep streams for `seconds` and at least min_rounds (after warm_rounds untimed): TPOT (per
    round, and per request as serving benchmarks count it) and tokens/s on one GPU. tv_ms: an emulated target."""
    run = Colocated(drafter, target, B, k, alpha, seed, prompt, context, tv_ms)
    for _ in range(warm_rounds):
        run.round()
    run.new, run.request_tpot, run.seq_at, run.seq_n = 0, [], [None] * B, [0] * B
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
    req = run.request_tpot
    return {"label": label, "B": B, "k": k, "alpha": alpha, "gpus": 1, "rounds": len(rounds),
            "seconds": round(wall, 3), "tokens": tokens, "tokens_per_round": round(tokens / len(rounds) / B, 3),
            "tokens_per_s": round(tokens / wall, 1), "tokens_per_s_per_gpu": round(tokens / wall, 1),
            "tpot_ms": {"p50": pct(tpot, 50), "p99": pct(tpot, 99), "mean": round(wall * 1e3 * B / tokens, 4)},
            "request_tpot_ms": {"p50": pct(req, 50), "p99": pct(req, 99), "mean": mean(req), "n": len(req),
                                "definition": "(last token - first token) / (tokens - 1) per sequence; the first "
                                              "token at its first round's end"},
            "target": "emulated" if tv_ms is not None else "real",
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
    ddec, drafter = batch_drafter(dfast, g.colocated_batches, g.models_compile)
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


def emulated_tables(targets: tuple, own_tv: dict, batches, k: int) -> dict:
    """target -> its (B, k) -> ms table: the call's own target shape from the target part's t_v (as the remote
    options use it; own_tv None: the call measured none), others from `bench targets` (target.big_tv); a target
    with no measured t_v -> its error."""
    from .common import TARGET
    from .target import big_tv
    out = {}
    for name in targets:
        try:
            out[name] = own_tv if name == TARGET and own_tv is not None else big_tv(name, batches, k)
        except ValueError as e:
            out[name] = str(e)
    return out


def batch_drafter(dfast, batches, compile_mode) -> tuple:
    """The draft shape's batched decoder for colocated rounds at these batches (context up to CONTEXT), warmed,
    and its BatchDrafter: (decoder, drafter)."""
    ddec = BatchDecoder(dfast, max(batches), CONTEXT + SLACK, compile_mode=compile_mode)
    ddec.warm(buckets=tuple(batches), widths=(1, 2), spans=(ddec.span_for(CONTEXT),))
    warm_prompts(ddec)
    return ddec, BatchDrafter(ddec, dfast.vocab, chunk=PREFILL_CHUNK)


def colocated_emulated_part(res, dfast, name, own_tv, g, t_end, progress, save) -> None:
    """Colocated SD against each emulated target of g.colocated_emulated (real draft steps, the target's t_v in
    series): the remote options' harness, so that each row compares like with like."""
    batches, ks = sorted(set(g.colocated_batches)), g.colocated_ks
    ddec, drafter = batch_drafter(dfast, batches, g.models_compile)
    out = res["colocated_emulated"] = {}
    for target, tv in emulated_tables(g.colocated_emulated, own_tv, batches, max(ks)).items():
        if isinstance(tv, str):
            out[target] = {"error": tv}
            progress(f"colocated (emulated {target}): {tv}")
            continue
        pts = out.setdefault(target, {"draft": name, "t_v_ms": {f"{b},{m}": v for (b, m), v in tv.items()},
                                      "points": []})["points"]
        for b in batches:
            for k in ks:
                if time.time() + g.colocated_s + 5 > t_end:
                    res["skipped"].append(f"colocated emulated {target} B={b} k={k}: out of time")
                    continue
                pts.append({"draft": name, "emulated": target, **colocated_point(
                    drafter, None, b, k, DRAFT_ALPHA[name], g.colocated_s, seed=b * 10 + k, tv_ms=tv,
                    label=emulated_label(target))})
                progress(colocated_row(pts[-1]))
        out[target]["best_k"] = best_k(pts)
        save()
    del ddec, drafter
    free()


def colocated_real_part(res, dfast, name, models, device, g, t_end, progress, save) -> None:
    """Colocated SD with a real target of each named shape (random bf16 weights, one process, one GPU) beside the
    same target emulated at the t_v this call measures of it (graph replays), each (B, k) of the grid: real over
    emulated says what the emulation leaves out (the target's host work per round), apart from t_v's drift between
    calls (colocated_emulated reads t_v from `bench targets`)."""
    from .common import build_fast
    from .target import target_points, tv_table
    batches, ks = sorted(set(g.colocated_batches)), g.colocated_ks
    ddec, drafter = batch_drafter(dfast, batches, g.models_compile)
    out = res.setdefault("colocated_real", {})
    for model in models:
        if time.time() + 90 > t_end:
            res["skipped"].append(f"colocated real {model}: out of time")
            continue
        tfast = build_fast(model, device, 0)
        tdec, tpts = target_points(tfast, batches, tuple(range(1, max(ks) + 1)), compile_mode=g.models_compile)
        tv = tv_table(tpts)
        part = out[model] = {"draft": name, "t_v_ms": {f"{b},{m}": v for (b, m), v in tv.items()},
                             "target_points": tpts, "points": [], "real_over_emulated": []}
        for b in batches:
            for k in ks:
                if time.time() + 2 * g.colocated_s + 5 > t_end:
                    res["skipped"].append(f"colocated real {model} B={b} k={k}: out of time")
                    continue
                real = colocated_point(drafter, tdec, b, k, DRAFT_ALPHA[name], g.colocated_s, seed=b * 10 + k,
                                       label=f"measured: the {model} shape and the draft shape on one GPU, one process")
                emu = colocated_point(drafter, None, b, k, DRAFT_ALPHA[name], g.colocated_s, seed=b * 10 + k,
                                      tv_ms=tv, label=emulated_label(model) + ", t_v measured in this call")
                part["points"] += [{"draft": name, "target_model": model, **real},
                                   {"draft": name, "target_model": model, **emu}]
                part["real_over_emulated"].append({
                    "B": b, "k": k, "tpot_mean": round(real["tpot_ms"]["mean"] / emu["tpot_ms"]["mean"], 3),
                    "round_ms_p50": round(real["round_ms"]["p50"] / emu["round_ms"]["p50"], 3),
                    "verify_ms_mean": (real["verify_ms_mean"], emu["verify_ms_mean"]),
                    "draft_ms_mean": (real["draft_ms_mean"], emu["draft_ms_mean"])})
                progress(f"colocated real {model}: " + colocated_row(real) + " | emulated: " + colocated_row(emu))
                save()
        del tdec, tfast
        free()
    del ddec, drafter
    free()


def real_runs() -> dict[str, dict]:
    """The results of reports/gpu with real colocated SD beside its emulation (`--colocated-real`), by file stem."""
    from ..results import gpu_results
    return {n: g for n, g in gpu_results().items() if g.get("colocated_real")}


def real_table(runs: dict):
    """Per call, target shape, B and k: real colocated SD's mean TPOT beside the same target emulated at the call's
    own t_v, their ratio, and the draft's and the verify's share of a round in each."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        for model, part in run["colocated_real"].items():
            pts = {(p["B"], p["k"], p["target"]): p for p in part["points"]}
            for r in part["real_over_emulated"]:
                real, emu = pts[(r["B"], r["k"], "real")], pts[(r["B"], r["k"], "emulated")]
                rows.append({"call": name, "target": model, "B": r["B"], "k": r["k"],
                             "real TPOT ms": real["tpot_ms"]["mean"], "emulated TPOT ms": emu["tpot_ms"]["mean"],
                             "real / emulated": r["tpot_mean"], "within 5%": abs(r["tpot_mean"] - 1) <= 0.05,
                             "draft ms (real, emulated)": r["draft_ms_mean"],
                             "verify ms (real, emulated)": r["verify_ms_mean"]})
    return pd.DataFrame(rows)

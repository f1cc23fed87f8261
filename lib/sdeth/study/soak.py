"""The soak (`make soak`, `python -m sdeth soak`): thousands of short requests over the testbed while faults come
and go (the draft killed and restarted, jitter, stalls, resets, cuts at the relay), checking that nothing leaks:
after warm-up the target worker's resident memory grows by at most 50 MB and its threads and open file
descriptors not at all (on a GPU, its allocated memory neither: read from the worker's own log line). Greedy
output is checked against the same requests decoded alone; the time lost to faults is printed."""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace

import psutil

from ..place.testbed import LinkFaults
from .config import RunConfig, encode_prompts
from .experiment import run, run_requests, testbed_for

FAULTS = ("none", "draft restarted", "jitter", "stalls", "resets", "cut")


def _usage(pid: int, settle_s: float = 0.0) -> dict:
    """A worker's resident memory, threads and open files. settle_s: read three times over that long and keep
    the least of each (a connection the controller just closed is still open on the worker's side for a moment)."""
    p = psutil.Process(pid)
    reads = []
    for i in range(3 if settle_s else 1):
        if i:
            time.sleep(settle_s / 2)
        reads.append({"rss_mb": p.memory_info().rss / 2 ** 20, "threads": p.num_threads(), "fds": p.num_fds()})
    return {k: min(r[k] for r in reads) for k in reads[0]}


def soak(requests: int = 2000, batch: int = 25, warmup: int = 100, seed: int = 0, max_tokens: int = 8,
         pair=None, progress=print) -> dict:
    """Run `requests` short requests in batches; each batch meets one fault (or none), drawn at random."""
    from ..models.presets import load_pair
    rng = random.Random(seed)
    cfg = RunConfig(mode="pipelined", k=3, placement="ethernet", prompts="random:64:32:7", max_tokens=max_tokens).check()
    pair = pair or load_pair(cfg.pair)
    prompts = encode_prompts(cfg, pair.tokenizer)
    alone = {r["prompt_id"]: r["output_ids"] for r in
             run(replace(cfg, mode="target-only", placement="colocated"), pair, progress=False)["requests"]}
    t0, done, lost, mismatches, batches = time.time(), 0, {f: [] for f in FAULTS}, 0, []
    clean_s = []
    with testbed_for(cfg, relay=True, draft_timeout_s=2.0) as tb:
        target_pid = tb.procs["target"].pid
        base = None
        while done < requests:
            fault = "none" if done < warmup else rng.choice(FAULTS)
            mode = rng.choice(("sd", "pipelined"))
            if fault == "draft restarted":
                tb.kill("draft")
            elif fault in ("jitter", "stalls", "resets", "cut"):
                tb.set_faults({"jitter": LinkFaults(jitter_ms=2.0, seed=done),
                               "stalls": LinkFaults(stall_every=1.0, stall_ms=(200, 2000), seed=done),
                               "resets": LinkFaults(reset_every=1.0, seed=done),
                               "cut": LinkFaults(cut_at=0.5, cut_s=3.0, seed=done)}[fault])
            n = min(batch, requests - done)
            chosen = [prompts[rng.randrange(len(prompts))] for _ in range(n)]
            reqs, _ = run_requests(replace(cfg, mode=mode, seed=done), chosen, tb)
            if fault == "draft restarted":
                tb.start_draft()
            elif fault != "none":
                tb.set_faults(LinkFaults())
            mismatches += sum(r["output_ids"] != alone[r["prompt_id"]] for r in reqs)
            secs = [r["e2e_s"] for r in reqs]
            (clean_s if fault == "none" else lost[fault]).extend(secs)
            done += n
            if done >= warmup and base is None:
                base = _usage(target_pid, settle_s=2.0)
            batches.append({"fault": fault, "mode": mode, "requests": n, "seconds": sum(secs),
                            "fault_events": sum(len(r["fault_events"]) for r in reqs)})
            if progress and done % 250 < batch:
                progress(f"soak: {done}/{requests} requests, {time.time() - t0:.0f} s, target {_usage(target_pid)}")
        run_requests(replace(cfg, mode="sd"), prompts[:batch], tb)      # a clean batch, then settle
        end = _usage(target_pid, settle_s=2.0)
    typical = statistics.median(clean_s) if clean_s else 0.0
    res = {"schema": "sdeth.soak/1", "requests": done, "wall_s": time.time() - t0, "mismatches": mismatches,
           "target_after_warmup": base, "target_at_end": end,
           "rss_growth_mb": end["rss_mb"] - base["rss_mb"], "thread_growth": end["threads"] - base["threads"],
           "fd_growth": end["fds"] - base["fds"],
           "seconds_lost_to_faults": {f: sum(s) - typical * len(s) for f, s in lost.items() if s},
           "faults_met": {f: sum(b["requests"] for b in batches if b["fault"] == f) for f in FAULTS},
           "median_clean_request_s": typical}
    res["ok"] = (mismatches == 0 and res["rss_growth_mb"] <= 50 and res["thread_growth"] <= 0 and res["fd_growth"] <= 0)
    return res

"""The soak (`make soak`, `python -m sdeth soak`): thousands of short requests over the testbed while faults come
and go (the draft killed and restarted, jitter, stalls, resets, cuts at the relay), checking that nothing leaks:
after warm-up each target worker's resident memory grows by at most 50 MB and its threads and open file
descriptors not at all (on a GPU, its allocated memory neither: read from the worker's own log line). Greedy
output is checked against the same requests decoded alone; the time lost to faults is printed.

Clients. A target worker decodes one request at a time, so several controllers on one target would only queue.
With `clients` = 1 the testbed is a draft worker and a target worker, requests sync (sd) or pipelined. With
`clients` = N > 1 it is N target workers drafting through one draft server (wire.draft_server), each sent its share
of every batch by its own controller at the same time: N requests in flight, N clients of the one draft. The draft
server's requests here are sync (sd; pipelined streams through a draft server are tested in tests/test_draft_server.py);
its faults are the draft server's (killed and restarted) and the link's between the targets and it.
"""
from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import psutil

from ...place.relay import LinkFaults
from ..config import RunConfig, encode_prompts
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


class _OneTarget:
    """The testbed as the controller of one of its target workers sees it (what experiment.run_requests reads)."""

    def __init__(self, tb, i: int):
        self.tb, self.name, self.target_addr, self.relay = tb, tb.target_names[i], tb.target_addrs[i], tb.relay

    def fault_events(self, t0: float = 0.0, t1: float = float("inf")) -> list[dict]:
        return self.tb.fault_events(t0, t1)

    def describe(self) -> dict:
        return self.tb.describe()

    def exit_status(self, name: str):
        return self.tb.exit_status(self.name if name == "target" else name)

    def log(self, name: str) -> str:
        return self.tb.log(self.name if name == "target" else name)


def send_batch(cfg: RunConfig, prompts: list, tb, clients: int) -> list[dict]:
    """One batch's request records: all to the one target worker, or dealt among the `clients` target workers
    (request i to worker i mod clients), each worker's share sent by its own controller, all at once."""
    if clients == 1:
        return run_requests(cfg, prompts, tb)[0]
    shares = [prompts[i::clients] for i in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(run_requests, replace(cfg, seed=cfg.seed + i * len(prompts)), share, _OneTarget(tb, i))
                   for i, share in enumerate(shares) if share]
        return [rec for f in futures for rec in f.result()[0]]


def _growth(base: list[dict], end: list[dict]) -> dict:
    """The largest growth of each figure over the target workers, from after warm-up to the end."""
    names = {"rss_mb": "rss_growth_mb", "threads": "thread_growth", "fds": "fd_growth"}
    return {out: max(e[k] - b[k] for b, e in zip(base, end)) for k, out in names.items()}


def _start_fault(tb, fault: str, seed: int) -> None:
    if fault == "draft restarted":
        tb.kill("draft")
    elif fault in ("jitter", "stalls", "resets", "cut"):
        tb.set_faults({"jitter": LinkFaults(jitter_ms=2.0, seed=seed),
                       "stalls": LinkFaults(stall_every=1.0, stall_ms=(200, 2000), seed=seed),
                       "resets": LinkFaults(reset_every=1.0, seed=seed),
                       "cut": LinkFaults(cut_at=0.5, cut_s=3.0, seed=seed)}[fault])


def _end_fault(tb, fault: str) -> None:
    if fault == "draft restarted":
        tb.start_draft()
    elif fault != "none":
        tb.set_faults(LinkFaults())


def _result(done: int, t0: float, mismatches: int, clients: int, base, end, draft_end, lost: dict, batches: list,
            clean_s: list, clean_alone: int) -> dict:
    """The soak's figures (without the verdict)."""
    typical = statistics.median(clean_s) if clean_s else 0.0
    wall_clean = [b["wall_s"] for b in batches if b["fault"] == "none"]
    return {"schema": "sdeth.soak/2", "requests": done, "wall_s": time.time() - t0, "mismatches": mismatches,
            "clients": clients, "topology": (f"one draft server, {clients} target workers, one controller each, all "
                                             f"at once (mode sd)" if clients > 1 else
                                             "one draft worker, one target worker (modes sd and pipelined)"),
            "target_after_warmup": base, "target_at_end": end, "draft_at_end": draft_end, **_growth(base, end),
            "seconds_lost_to_faults": {f: sum(s) - typical * len(s) for f, s in lost.items() if s},
            "faults_met": {f: sum(b["requests"] for b in batches if b["fault"] == f) for f in FAULTS},
            "median_clean_request_s": typical,
            "clean_requests_per_s": (sum(b["requests"] for b in batches if b["fault"] == "none") / sum(wall_clean)
                                     if wall_clean else 0.0),
            "clean_requests_without_draft": clean_alone}


def soak(requests: int = 2000, batch: int = 25, warmup: int = 100, seed: int = 0, max_tokens: int = 8,
         pair=None, progress=print, clients: int = 1) -> dict:
    """Run `requests` short requests in batches; each batch meets one fault (or none), drawn at random. clients: the
    target workers and their controllers, all at once (module docstring)."""
    from ...models.presets import load_pair
    if clients < 1:
        raise ValueError(f"clients={clients}: give 1 (a draft worker and a target) or more (a draft server and that "
                         f"many targets)")
    rng = random.Random(seed)
    cfg = RunConfig(mode="pipelined", k=3, placement="ethernet", prompts="random:64:32:7", max_tokens=max_tokens).check()
    pair = pair or load_pair(cfg.pair)
    prompts = encode_prompts(cfg, pair.tokenizer)
    alone = {r["prompt_id"]: r["output_ids"] for r in
             run(replace(cfg, mode="target-only", placement="colocated"), pair, progress=False)["requests"]}
    t0, done, lost, mismatches, batches = time.time(), 0, {f: [] for f in FAULTS}, 0, []
    clean_s, clean_alone = [], 0
    tb_kw = dict(targets=clients, draft_server=True) if clients > 1 else {}
    with testbed_for(cfg, relay=True, draft_timeout_s=2.0, **tb_kw) as tb:
        pids = [tb.procs[name].pid for name in tb.target_names]
        base = None
        while done < requests:
            fault = "none" if done < warmup else rng.choice(FAULTS)
            mode = rng.choice(("sd", "pipelined")) if clients == 1 else "sd"
            _start_fault(tb, fault, done)
            n = min(batch, requests - done)
            chosen = [prompts[rng.randrange(len(prompts))] for _ in range(n)]
            t_batch = time.time()
            reqs = send_batch(replace(cfg, mode=mode, seed=done), chosen, tb, clients)
            t_batch = time.time() - t_batch
            _end_fault(tb, fault)
            mismatches += sum(r["output_ids"] != alone[r["prompt_id"]] for r in reqs)
            secs = [r["e2e_s"] for r in reqs]
            (clean_s if fault == "none" else lost[fault]).extend(secs)
            if fault == "none" and done >= warmup:
                clean_alone += sum(bool(r["tokens_without_draft"]) for r in reqs)
            done += n
            if done >= warmup and base is None:
                base = [_usage(pid, settle_s=2.0) for pid in pids]
            batches.append({"fault": fault, "mode": mode, "requests": n, "seconds": sum(secs), "wall_s": t_batch,
                            "fault_events": sum(len(r["fault_events"]) for r in reqs)})
            if progress and done % 250 < batch:
                progress(f"soak: {done}/{requests} requests, {time.time() - t0:.0f} s, target {_usage(pids[0])}")
        send_batch(replace(cfg, mode="sd"), prompts[:batch], tb, clients)      # a clean batch, then settle
        end = [_usage(pid, settle_s=2.0) for pid in pids]
        draft_end = _usage(tb.procs["draft"].pid)
    res = _result(done, t0, mismatches, clients, base, end, draft_end, lost, batches, clean_s, clean_alone)
    res["ok"] = (mismatches == 0 and res["rss_growth_mb"] <= 50 and res["thread_growth"] <= 0 and res["fd_growth"] <= 0)
    return res

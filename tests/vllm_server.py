"""vLLM's OpenAI server in the gated tests (`make test-vllm-server`): target-only, then with the remote proposer in
one mode over a draft server of the embedded pair, the same phases through each (test_vllm_proposer's sync mode,
test_vllm_stream's stream mode)."""
import json
import os
import time
from pathlib import Path

import pytest

from sdeth.wire import vllm_proposer as VP

SERVER_PROMPTS, SAMPLES, SAMPLE_TOKENS, TEMPERATURE = "sharegpt:8", 600, 3, 0.8
# Two vLLM servers and ~1,500 requests: ~10 min on a 2-core machine, so not in `make test`; `make test-vllm-server`
server_gate = pytest.mark.skipif(not os.environ.get("SDETH_VLLM_SERVER_TESTS"), reason="vLLM's OpenAI server with "
                                 "and without the remote proposer (~10 min on 2 cores): `make test-vllm-server`")
SAMPLE_TEXT = "The capital of France is"       # short: the test's samples are cheap, its distribution concentrated
KV_BYTES = 256 * 2**20                          # the servers' KV cache: fixed, not sized from the run


def _complete(base: str, model: str, ids: list[int], max_tokens: int, temperature: float, seed: int, eos: int):
    import urllib.request
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "return_token_ids": True, "stop_token_ids": [eos]}
    rq = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    with urllib.request.urlopen(rq, timeout=600) as resp:
        return json.loads(resp.read())["choices"][0]["token_ids"]


def _openai_phases(base: str, model: str, prompts: list, sample_ids: list[int], eos: int,
                   sample_tokens: int = SAMPLE_TOKENS, seed0: int = 1000) -> dict:
    """Greedy completions of the prompts at concurrency 1, 4 and 8; the same at T=0.8 (seed per prompt); then
    SAMPLES completions of sample_tokens tokens of one short prompt at T=0.8, seeds seed0 + i (give each engine its
    own seed0: samples drawn with the same seeds are mostly the same draw, which a chi-square cannot test). With
    each phase, the change of vLLM's spec-decode counters over it (from /metrics)."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor
    from sdeth.study.vllm.baseline import scrape_spec_counters
    from sdeth.study.vllm.measurement import counters_delta
    from test_vllm_proposer import MAX_TOKENS
    counters = lambda: scrape_spec_counters(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode())  # noqa: E731
    phases = {f"c{c}": (c, [(ids, MAX_TOKENS, 0.0, 0) for ids in prompts]) for c in (1, 4, 8)}
    phases["t08"] = (8, [(ids, MAX_TOKENS, TEMPERATURE, i) for i, ids in enumerate(prompts)])
    phases["samples"] = (8, [(sample_ids, sample_tokens, TEMPERATURE, seed0 + i) for i in range(SAMPLES)])
    out = {}
    for name, (concurrency, reqs) in phases.items():
        before, t0 = counters(), time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            outs = list(ex.map(lambda r: _complete(base, model, r[0], r[1], r[2], r[3], eos), reqs))
        out[name] = {"outputs": outs, "wall_s": time.perf_counter() - t0, "counters": counters_delta(counters(), before)}
    return out


def openai_setup(pair) -> tuple[dict, list, list[int], int]:
    """What the OpenAI-server runs share: vLLM's engine arguments for the pair's target (no speculative_config; a
    KV cache of KV_BYTES), SERVER_PROMPTS as token ids, SAMPLE_TEXT's ids and the eos id."""
    from sdeth.study.runs import experiment
    from sdeth.study.vllm.baseline import _job, engine_args
    from test_vllm_proposer import K, MAX_TOKENS
    cfg = experiment.RunConfig(engine="vllm", mode="sd", k=K, prompts=SERVER_PROMPTS, max_tokens=MAX_TOKENS,
                               max_len=512)
    engine = {**engine_args(_job(cfg, pair)), "kv_cache_memory_bytes": KV_BYTES}
    engine.pop("speculative_config")
    prompts = [ids for _, ids in experiment.encode_prompts(cfg, pair.tokenizer)]
    return engine, prompts, pair.tokenizer.encode(SAMPLE_TEXT), pair.tokenizer.eos_token_id


def run_both_servers(pair, tmp: Path, mode: str | tuple, sample_tokens: int = SAMPLE_TOKENS, env: dict | None = None,
                pin: bool = False) -> dict:
    """vLLM's OpenAI server target-only, then with the remote proposer in `mode` (sync | stream | policy, k=K; or a
    tuple of them, one server each) over a draft server of the embedded pair: _openai_phases through each, each
    engine its own sample seeds (independent samples); {"target-only": phases, mode: phases, ...}. env: added to
    every server's environment. pin: every vLLM process on VLLM_CORES and the draft server on DRAFT_CORES (as the
    stream study runs them). Each server, and the draft server, is stopped with its children before the next starts."""
    from sdeth.study.vllm.servers import start_vllm, stop
    from sdeth.study.vllm.stream import DRAFT_CORES, VLLM_CORES
    from test_vllm_proposer import K, _start_draft_server
    engine, prompts, sample_ids, eos = openai_setup(pair)
    cores, runs = os.sched_getaffinity(0), {}
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    for i, name in enumerate(("target-only", *modes)):
        draft, server_env, eng = None, {**os.environ, **(env or {})}, dict(engine)
        try:
            if name != "target-only":
                draft, addr = _start_draft_server(tmp / f"draft-server-{name}.log")      # (one log per mode)
                if pin:
                    os.sched_setaffinity(draft.pid, DRAFT_CORES)
                server_env[VP.ADDR_ENV], eng["speculative_config"] = addr, VP.speculative_config(K, name)
            try:
                if pin:
                    os.sched_setaffinity(0, VLLM_CORES)     # vLLM's server and its engine processes inherit it
                proc, endpoint, _ = start_vllm(eng, server_env, tmp / f"vllm-{name}.log")
            finally:
                os.sched_setaffinity(0, cores)
            try:
                runs[name] = _openai_phases(endpoint.base, engine["model"], prompts, sample_ids, eos, sample_tokens,
                                            seed0=1000 + i * SAMPLES)     # (target-only 1000: as before)
            finally:
                stop(proc)
        finally:
            stop(draft)
    return runs


def homogeneity_p(outs_a: list, outs_b: list) -> tuple[float, int, int]:
    """A two-sample chi-square test of homogeneity over whole outputs (each a token list): (p, cells kept, distinct
    outputs). Cells expected below 5 are folded into one."""
    from collections import Counter
    from scipy.stats import chi2_contingency
    a, b = Counter(tuple(o) for o in outs_a), Counter(tuple(o) for o in outs_b)
    total = a + b
    big = [c for c, n in total.items() if n / 2 >= 5]
    table = [[a[c] for c in big] + [sum(a.values()) - sum(a[c] for c in big)],
             [b[c] for c in big] + [sum(b.values()) - sum(b[c] for c in big)]]
    if not table[0][-1] and not table[1][-1]:
        table = [row[:-1] for row in table]
    return chi2_contingency(table).pvalue, len(big), len(total)

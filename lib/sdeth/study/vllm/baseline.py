"""vLLM as the reference engine: target-only and draft-model SD, written in sdeth's results schema.

    python -m sdeth run --engine vllm --mode sd --k 3 --prompts sharegpt:8 --json out.json

vLLM's offline engine starts worker processes and must run under `if __name__ == "__main__"`, so
`run_vllm` starts this module as a subprocess (`python -m sdeth.study.vllm.baseline CONFIG.json OUT.json`).
Prompts are encoded by sdeth (same chat template, same token ids) and given to vLLM as token ids, one
request at a time (batch 1, like sdeth's runner). Acceptance comes from vLLM's own counters
(`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`), read before and after each request; timings from vLLM's
per-request stats (first-token latency, first/last token timestamps) and the wall clock.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

KV_ENV = "SDETH_VLLM_KV_MIB"      # overrides the KV cache size sdeth computes (MiB)
KV_BLOCK = 128                   # tokens; vLLM allocates the cache in blocks of at most this many
KV_HEADROOM = 2                  # x what the longest request needs: block rounding, one group per model


class VLLMStartError(RuntimeError):
    """vLLM did not start or failed; the message names the setting to change."""


def kv_bytes_per_token(model_config: dict, dtype: str) -> int:
    """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x bytes per element."""
    c = model_config.get("text_config", model_config)
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    size = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    return 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", heads) * head_dim * size


def kv_cache_bytes(target_config: dict, draft_config: dict | None, max_model_len: int, dtype: str) -> int:
    """The KV cache vLLM is given, from what one request of this run needs (batch 1, like sdeth's
    runner): both models' bytes per token x max_model_len rounded up to whole blocks, x KV_HEADROOM.
    Never a fraction of the machine's memory: vLLM's CPU backend reads that from NUMA node 0's meminfo,
    which on some machines reports a few GB of 24 and grows as memory is used. $SDETH_VLLM_KV_MIB
    overrides it."""
    if os.environ.get(KV_ENV):
        try:
            return int(float(os.environ[KV_ENV]) * 2**20)
        except ValueError:
            raise VLLMStartError(f"{KV_ENV}={os.environ[KV_ENV]!r}: give the KV cache size in MiB, e.g. 256") from None
    per_token = kv_bytes_per_token(target_config, dtype)
    if draft_config is not None:
        per_token += kv_bytes_per_token(draft_config, dtype)
    tokens = -(-max_model_len // KV_BLOCK) * KV_BLOCK + KV_BLOCK
    return KV_HEADROOM * per_token * tokens


def engine_args(job: dict) -> dict:
    """vLLM's engine arguments for one job (both the offline engine and the server take these)."""
    c = job["config"]
    max_model_len = c["max_len"] + c["k"] + 2
    sd = c["mode"] == "sd"
    kw = dict(model=job["target_dir"], dtype=job["dtype"], disable_log_stats=False, enforce_eager=True,
              max_model_len=max_model_len, seed=c["seed"],
              kv_cache_memory_bytes=kv_cache_bytes(job["target_config"], job["draft_config"] if sd else None,
                                                   max_model_len, job["dtype"]))
    if sd:
        kw["speculative_config"] = {"method": "draft_model", "model": job["draft_dir"], "num_speculative_tokens": c["k"]}
    return kw


def start_error(exit_code, log_tail: str, kv_bytes: int) -> VLLMStartError:
    """What to say when vLLM stops: the KV setting and a value to try when the cache was the problem."""
    hint = ""
    if "KV cache" in log_tail or "kv cache" in log_tail:
        hint = (f"\nvLLM was given a KV cache of {kv_bytes / 2**20:.0f} MiB (sized from this run's longest request). "
                f"Try {KV_ENV}={max(256, 4 * kv_bytes // 2**20)} (MiB) to give it more, or lower --max-len.")
    return VLLMStartError(f"vLLM run failed (exit {exit_code}); its last lines:\n{log_tail}{hint}")


SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def run_vllm(cfg, pair=None, timeout_s: float = 1800) -> dict:
    """Run cfg (an experiment.RunConfig with engine 'vllm') in a vLLM subprocess; the results dict."""
    from ..config import encode_prompts
    from ...models.presets import load_pair
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    job = _job(cfg, pair)
    job["prompts"] = encode_prompts(cfg, pair.tokenizer)
    with tempfile.TemporaryDirectory(prefix="sdeth-vllm-") as tmp:
        cfg_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        cfg_path.write_text(json.dumps(job))
        p = subprocess.run([sys.executable, "-m", "sdeth.study.vllm.baseline", str(cfg_path), str(out_path)],
                           capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        if p.returncode or not out_path.exists():
            tail = "\n".join((p.stdout + p.stderr).splitlines()[-25:])
            raise start_error(p.returncode, tail, engine_args(job)["kv_cache_memory_bytes"])
        res = json.loads(out_path.read_text())
    from ... import hardware
    res["config"]["pair_resolved"] = pair.describe()
    res["hardware"] = hardware.describe(cfg.device)
    return res


def _job(cfg, pair) -> dict:
    """What the vLLM runner needs from sdeth: the config, model directories and their configs."""
    from ...models.presets import model_dir
    tdir, ddir = model_dir(pair.config.target), model_dir(pair.config.draft)
    return {"config": asdict(cfg), "target_dir": tdir, "draft_dir": ddir, "dtype": pair.config.dtype,
            "target_config": json.loads((Path(tdir) / "config.json").read_text()),
            "draft_config": json.loads((Path(ddir) / "config.json").read_text()),
            "eos": pair.tokenizer.eos_token_id}


def _counters(llm) -> dict:
    got = {}
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS:
            got[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return got


def _delta(after: dict, before: dict, k: int) -> tuple[int, int, int, list[int]]:
    get = lambda d, n, default: d.get(n, default)  # noqa: E731
    per_a = get(after, SPEC_COUNTERS[3], [0] * k)
    per_b = get(before, SPEC_COUNTERS[3], [0] * k)
    per = [int(a - b) for a, b in zip(per_a + [0] * (k - len(per_a)), per_b + [0] * (k - len(per_b)))]
    return (int(get(after, SPEC_COUNTERS[0], 0) - get(before, SPEC_COUNTERS[0], 0)),
            int(get(after, SPEC_COUNTERS[1], 0) - get(before, SPEC_COUNTERS[1], 0)),
            int(get(after, SPEC_COUNTERS[2], 0) - get(before, SPEC_COUNTERS[2], 0)), per[:k])


def _summary(reqs: list[dict], mode: str, k: int, engine: str, start_s: float) -> dict:
    """The run summary both vLLM paths write: timing and vLLM's acceptance figures from its counters."""
    from ... import metrics
    sd = mode == "sd"
    return {"mode": mode, "k": k if sd else None, "placement": "colocated", "engine": engine,
            "engine_start_s": start_s, **metrics.timing(reqs),
            **metrics.vllm_metrics(sum(r["drafts"] for r in reqs), sum(r["draft_tokens"] for r in reqs),
                                 sum(r["accepted_tokens"] for r in reqs),
                                 [sum(r["accepted_per_pos"][i] for r in reqs) for i in range(k)] if sd else []),
            "predicted_tokens_per_s": None}   # vLLM's component costs are not measured here


def _main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    job = json.loads(Path(job_path).read_text())
    c = job["config"]
    sd = c["mode"] == "sd"
    kwargs = engine_args(job)
    t0 = time.time()
    llm = LLM(**kwargs)
    start_s = time.time() - t0
    sp = SamplingParams(temperature=c["temperature"], top_p=c["top_p"], top_k=c["top_k"] or 0,
                        max_tokens=c["max_tokens"], seed=c["seed"], stop_token_ids=[job["eos"]])
    reqs = []
    for pid, ids in job["prompts"]:
        before = _counters(llm)
        t = time.perf_counter()
        out = llm.generate(TokensPrompt(prompt_token_ids=ids), sp, use_tqdm=False)[0]
        e2e = time.perf_counter() - t
        drafts, draft_tokens, accepted, per = _delta(_counters(llm), before, c["k"]) if sd else (0, 0, 0, [])
        toks = list(out.outputs[0].token_ids)
        m = out.metrics
        ttft = m.first_token_latency if m and m.first_token_latency else e2e / max(len(toks), 1)
        tpot = ((m.last_token_ts - m.first_token_ts) / (len(toks) - 1) * 1e3
                if m and len(toks) > 1 and m.last_token_ts > m.first_token_ts else None)
        reqs.append({"prompt_id": pid, "prompt_tokens": len(ids), "output_ids": toks, "ttft_ms": ttft * 1e3,
                     "tpot_ms": tpot, "e2e_s": e2e, "drafts": drafts, "draft_tokens": draft_tokens,
                     "accepted_tokens": accepted, "accepted_per_pos": per})
    summary = _summary(reqs, c["mode"], c["k"], "vllm", start_s)
    import vllm
    Path(out_path).write_text(json.dumps({
        "schema": "sdeth.results/1", "config": {**c, "engine": "vllm", "vllm": vllm.__version__, "vllm_args": {
            k: v for k, v in kwargs.items() if k != "model"}},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "requests": reqs, "summary": summary}, default=str))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])


# --------------------------------------------------------------------------- the server path
def scrape_spec_counters(metrics_text: str) -> dict:
    """vLLM's spec-decode counters from a Prometheus /metrics page, summed over engines:
    {name: value, ..._per_pos: [per position]}."""
    out: dict = {}
    per: dict[int, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("vllm:spec_decode_num_"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        name = name.removesuffix("_total")
        if name == SPEC_COUNTERS[3]:
            pos = int(labels.split('position="', 1)[1].split('"', 1)[0])
            per[pos] = per.get(pos, 0.0) + float(value)
        elif name in SPEC_COUNTERS:
            out[name] = out.get(name, 0.0) + float(value)
    if per:
        out[SPEC_COUNTERS[3]] = [per[i] for i in sorted(per)]
    return out


def server_args(engine: dict, port: int) -> list[str]:
    """The command line of vLLM's OpenAI server on 127.0.0.1:port with these engine arguments (engine_args; its
    speculative_config passed when set)."""
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", engine["model"], "--host",
            "127.0.0.1", "--port", str(port), "--dtype", engine["dtype"], "--max-model-len",
            str(engine["max_model_len"]), "--seed", str(engine["seed"]), "--enforce-eager", "--kv-cache-memory-bytes",
            str(engine["kv_cache_memory_bytes"])]
    if engine.get("speculative_config"):
        args += ["--speculative-config", json.dumps(engine["speculative_config"])]
    return args


def run_vllm_server(cfg, pair=None, port: int = 0, start_timeout_s: float = 600) -> dict:
    """cfg through vLLM's OpenAI-compatible server, as on the cluster: `python -m vllm.entrypoints.openai.
    api_server` in a subprocess, one streamed /v1/completions request at a time (token ids in, token ids
    out), the spec-decode counters scraped from its Prometheus /metrics before and after each request."""
    from ... import hardware
    from ..config import encode_prompts
    from ...models.presets import load_pair
    from ...place.testbed import free_port
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    kw = engine_args(_job(cfg, pair))
    args = server_args(kw if cfg.mode == "sd" else {**kw, "speculative_config": None}, port)
    log = tempfile.NamedTemporaryFile("w+", prefix="sdeth-vllm-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        start_s = _wait_healthy(proc, log, base, start_timeout_s, kw["kv_cache_memory_bytes"])
        reqs = [_server_request(base, kw["model"], cfg, pair.tokenizer.eos_token_id, pid, ids)
                for pid, ids in encode_prompts(cfg, pair.tokenizer)]
    finally:
        os.killpg(proc.pid, 9) if proc.poll() is None else None
        proc.wait(timeout=30)
    import vllm
    summary = {**_summary(reqs, cfg.mode, cfg.k, "vllm-server", start_s),
               "note": "timings include HTTP and streaming; counters from the server's Prometheus /metrics"}
    return {"schema": "sdeth.results/1", "config": {**asdict(cfg), "vllm": vllm.__version__, "vllm_server_args": args[3:],
                                                    "pair_resolved": pair.describe()},
            "hardware": hardware.describe(cfg.device), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "requests": reqs, "summary": summary}


def _wait_healthy(proc, log, base: str, timeout_s: float, kv_bytes: int) -> float:
    """Until the server's /health answers 200; the seconds that took. start_error (with the log's tail) if the
    server exits first or takes longer than timeout_s."""
    import urllib.request
    t0 = time.time()
    while True:
        try:
            if urllib.request.urlopen(f"{base}/health", timeout=2).status == 200:
                return time.time() - t0
        except OSError:
            pass
        if proc.poll() is not None or time.time() - t0 > timeout_s:
            log.seek(0)
            tail = "\n".join(log.read().splitlines()[-25:])
            raise start_error(proc.poll(), tail, kv_bytes)
        time.sleep(1)


def _server_request(base: str, model: str, cfg, eos: int, pid: str, ids: list[int]) -> dict:
    """One streamed /v1/completions request of token ids; its record (the `requests` entries), with the
    spec-decode counters' change over it (sd)."""
    import urllib.request
    counters = lambda: scrape_spec_counters(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode())  # noqa: E731
    before = counters()
    body = {"model": model, "prompt": ids, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "top_k": cfg.top_k or -1, "seed": cfg.seed, "stream": True,
            "return_token_ids": True, "stop_token_ids": [eos]}
    rq = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    toks, t_first = [], None
    t = time.perf_counter()
    with urllib.request.urlopen(rq, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            new = (json.loads(line[6:])["choices"] or [{}])[0].get("token_ids") or []
            if new and t_first is None:
                t_first = time.perf_counter()
            toks += new
    t_end = time.perf_counter()
    drafts, draft_tokens, accepted, per = _delta(counters(), before, cfg.k) if cfg.mode == "sd" else (0, 0, 0, [])
    t_first = t_first or t_end
    return {"prompt_id": pid, "prompt_tokens": len(ids), "output_ids": toks,
            "ttft_ms": (t_first - t) * 1e3, "e2e_s": t_end - t,
            "tpot_ms": (t_end - t_first) * 1e3 / (len(toks) - 1) if len(toks) > 1 else None,
            "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted, "accepted_per_pos": per}

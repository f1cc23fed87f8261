"""vLLM as the reference engine: target-only and draft-model SD, written in sdeth's results schema.

    python -m sdeth run --engine vllm --mode sd --k 3 --prompts sharegpt:8 --json out.json

vLLM's offline engine starts worker processes and must run under `if __name__ == "__main__"`, so
`run_vllm` starts this module as a subprocess (`python -m sdeth.vllm_baseline CONFIG.json OUT.json`).
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

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def run_vllm(cfg, pair=None, timeout_s: float = 1800) -> dict:
    """Run cfg (an experiment.RunConfig with engine 'vllm') in a vLLM subprocess; the results dict."""
    from .experiment import ConfigError, encode_prompts
    from .models import load_pair, model_dir
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    job = {"config": asdict(cfg), "target_dir": model_dir(pair.config.target),
           "draft_dir": model_dir(pair.config.draft), "dtype": pair.config.dtype,
           "eos": pair.tokenizer.eos_token_id, "prompts": encode_prompts(cfg, pair.tokenizer)}
    with tempfile.TemporaryDirectory(prefix="sdeth-vllm-") as tmp:
        cfg_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        cfg_path.write_text(json.dumps(job))
        p = subprocess.run([sys.executable, "-m", "sdeth.vllm_baseline", str(cfg_path), str(out_path)],
                           capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        if p.returncode or not out_path.exists():
            tail = "\n".join((p.stdout + p.stderr).splitlines()[-25:])
            raise ConfigError(f"vLLM run failed (exit {p.returncode}); its last lines:\n{tail}")
        res = json.loads(out_path.read_text())
    from . import hardware
    res["config"]["pair_resolved"] = pair.describe()
    res["hardware"] = hardware.describe(cfg.device)
    return res


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


def _main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    job = json.loads(Path(job_path).read_text())
    c = job["config"]
    sd = c["mode"] == "sd"
    kwargs = dict(model=job["target_dir"], dtype=job["dtype"], disable_log_stats=False, enforce_eager=True,
                  max_model_len=c["max_len"] + c["k"] + 2, seed=c["seed"],
                  gpu_memory_utilization=float(os.environ.get("SDETH_VLLM_MEMORY", "0.25")))  # CPU: share of RAM
    if sd:
        kwargs["speculative_config"] = {"method": "draft_model", "model": job["draft_dir"],
                                        "num_speculative_tokens": c["k"]}
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
    from . import metrics
    summary = {"mode": c["mode"], "k": c["k"] if sd else None, "placement": "colocated", "engine": "vllm",
               "engine_start_s": start_s, **metrics.timing(reqs),
               **metrics.acceptance(sum(r["drafts"] for r in reqs), sum(r["draft_tokens"] for r in reqs),
                                    sum(r["accepted_tokens"] for r in reqs),
                                    [sum(r["accepted_per_pos"][i] for r in reqs) for i in range(c["k"])] if sd else []),
               "predicted_tokens_per_s": None}  # vLLM's component costs are not measured here
    import vllm
    Path(out_path).write_text(json.dumps({
        "schema": "sdeth.results/1", "config": {**c, "engine": "vllm", "vllm": vllm.__version__, "vllm_args": {
            k: v for k, v in kwargs.items() if k != "model"}},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "requests": reqs, "summary": summary}, default=str))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])

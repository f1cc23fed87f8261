"""One experiment = a config -> a results dict (config, hardware, requests, summary) -> JSON.

    res = run(RunConfig(mode="sd", k=3, prompts="sharegpt:8"))
    save(res, "out.json")
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import costmodel, hardware, metrics
from . import prompts as P
from .engine import Engine, decode_one_token, prefill
from .loop import Drafter, generate_sd, generate_target_only
from .verify import Sampling

MODES = ("target-only", "sd", "pipelined")
ENGINES = ("sdeth", "vllm", "vllm-server")
PLACEMENTS = ("colocated", "ethernet")
SCHEMA = "sdeth.results/1"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class RunConfig:
    pair: str = "embedded"
    target: str | None = None       # override the preset's target id
    draft: str | None = None        # override the preset's draft id
    mode: str = "sd"                # target-only | sd (synchronous rounds) | pipelined (draft streams ahead)
    k: int = 3                      # speculative tokens per round (the most, when adaptive or pipelined)
    adaptive: bool | None = None    # choose k per round from measured alpha and costs (None: on for pipelined only)
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    draft_sampled: bool = False     # draft samples from q (else greedy draft, q one-hot)
    prompts: str = "sharegpt:8"
    max_tokens: int = 64
    chat: bool = True               # apply the chat template (False: raw prompt text)
    thinking: bool | None = None    # Qwen3's enable_thinking; None = template default
    seed: int = 0
    device: str = "cpu"
    placement: str = "colocated"    # colocated: one process | ethernet: draft and target workers on two nodes
    rtt_ms: float = 0.0             # ethernet: injected round trip, split evenly between the directions
    netns: bool | None = None       # ethernet: namespaces + veth (None: when root), else loopback
    max_len: int = 2048             # longest prompt + max_tokens accepted
    engine: str = "sdeth"           # sdeth (this runtime) | vllm (the reference engine, colocated only)

    def check(self) -> "RunConfig":
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r}: use one of {MODES}")
        if self.k < 1:
            raise ConfigError(f"k={self.k}: speculative tokens per round must be >= 1")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens}: must be >= 1")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement {self.placement!r}: use one of {PLACEMENTS}")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r}: use one of {ENGINES}")
        if self.mode == "pipelined" and self.placement != "ethernet":
            raise ConfigError("mode 'pipelined' drafts ahead on its own worker while the target verifies: use "
                              "placement 'ethernet' (two workers; on one machine they share it)")
        if self.engine != "sdeth" and self.mode == "pipelined":
            raise ConfigError("engine 'vllm' has no pipelined mode: use mode 'sd' or 'target-only'")
        if self.engine != "sdeth" and self.placement != "colocated":
            raise ConfigError(f"engine {self.engine!r} runs its draft in the same process: use placement 'colocated'")
        if self.rtt_ms < 0:
            raise ConfigError(f"rtt_ms={self.rtt_ms}: must be >= 0")
        self.sampling()                 # raises on bad temperature / top-p / top-k
        P.parse_spec(self.prompts)      # raises on a bad prompt spec
        return self

    @property
    def adapts(self) -> bool:
        return self.adaptive if self.adaptive is not None else self.mode == "pipelined"

    def sampling(self) -> Sampling:
        try:
            return Sampling(self.temperature, self.top_p, self.top_k, self.draft_sampled)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def encode_prompts(cfg: RunConfig, tokenizer) -> list[tuple[str, list[int]]]:
    out = []
    for p in P.load(cfg.prompts):
        ids = P.encode(p, tokenizer, chat=cfg.chat, thinking=cfg.thinking)
        if len(ids) + cfg.max_tokens > cfg.max_len:
            raise ConfigError(
                f"prompt {p.id} has {len(ids)} tokens; with max_tokens={cfg.max_tokens} it exceeds the cache of "
                f"max_len={cfg.max_len}: raise max_len (--max-len) or lower max_tokens")
        out.append((p.id, ids))
    return out


def run(cfg: RunConfig, pair=None, progress: bool = True, on_testbed=None) -> dict:
    """Run every prompt of cfg.prompts through cfg.mode; returns the results dict. on_testbed: a
    running Testbed to use for placement 'ethernet' (its delay must be cfg.rtt_ms; see sweep())."""
    from tqdm.auto import tqdm
    from .models import load_pair
    cfg = cfg.check()
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    if cfg.engine == "vllm":
        from .vllm_baseline import run_vllm
        return run_vllm(cfg, pair)
    if cfg.engine == "vllm-server":
        from .vllm_baseline import run_vllm_server
        return run_vllm_server(cfg, pair)
    s = cfg.sampling()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
    encoded = encode_prompts(cfg, pair.tokenizer)
    bar = tqdm(encoded, desc=f"{cfg.mode} k={cfg.k} {cfg.placement}", disable=not progress)
    testbed = None
    if cfg.placement == "ethernet":
        reqs, testbed = _run_ethernet(cfg, bar, on_testbed)
    else:
        target = Engine(pair.target, "target", vocab=pair.vocab_size)
        drafter = Drafter(Engine(pair.draft, "draft", vocab=pair.vocab_size), s, seed=cfg.seed + 1)
        eos = pair.tokenizer.eos_token_id
        est = costmodel.Estimator()       # adaptive k: learns over the whole run
        reqs = []
        for pid, ids in bar:
            if cfg.mode == "target-only":
                r = generate_target_only(target, ids, cfg.max_tokens, s, eos, gen, pid)
            else:
                r = generate_sd(target, drafter, ids, cfg.max_tokens, cfg.k, s, eos, gen, pid,
                                est if cfg.adapts else None)
            reqs.append(asdict(r))
    return {"schema": SCHEMA, "config": {**asdict(cfg), "pair_resolved": pair.describe()},
            "hardware": hardware.describe(cfg.device), "testbed": testbed,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "requests": reqs, "summary": summarize(reqs, cfg)}


def _run_ethernet(cfg: RunConfig, prompts, testbed=None, **testbed_kw) -> tuple[list[dict], dict]:
    """Send each request to the target worker of a two-node testbed (started here and torn down
    after, unless one is passed in)."""
    from contextlib import nullcontext
    from . import protocol as W
    from .testbed import Testbed
    from .worker import Client
    reqs = []
    with nullcontext(testbed) if testbed is not None else Testbed(
            cfg.pair, up_ms=cfg.rtt_ms / 2, down_ms=cfg.rtt_ms / 2, netns=cfg.netns, device=cfg.device,
            target=cfg.target, draft=cfg.draft, **testbed_kw) as tb:
        # a request's whole decode; SDETH_CLIENT_TIMEOUT (seconds) overrides it, e.g. to see a stall sooner
        client = Client(tb.target_addr, timeout_s=float(os.environ.get("SDETH_CLIENT_TIMEOUT", 60 + 5 * cfg.max_tokens)))
        try:
            for i, (pid, ids) in enumerate(prompts):
                reply = client.call(W.Generate(pid, ids, cfg.max_tokens, cfg.mode, cfg.k, cfg.adapts, cfg.temperature,
                                               cfg.top_p, cfg.top_k, cfg.draft_sampled, cfg.seed + i))
                if isinstance(reply, W.Error):
                    raise ConfigError(f"target worker failed on {pid}: {reply.message}\n{tb.log('target')[-1500:]}")
                reqs.append(reply.record)
        finally:
            client.close()
        return reqs, tb.describe()


def _widths(reqs: list[dict]) -> dict[int, float]:
    """Mean seconds of a target forward of m tokens during rounds, per m, over a run."""
    tot: dict[int, list] = {}
    for r in reqs:
        for m, (n, sec) in r.get("verify_widths", {}).items():
            t = tot.setdefault(int(m), [0, 0.0])
            t[0] += n
            t[1] += sec
    return {m: sec / n for m, (n, sec) in sorted(tot.items()) if n}


def summarize(reqs: list[dict], cfg: RunConfig) -> dict:
    """Run summary: timing, acceptance (vLLM's definitions), where the time went, and the cost
    model's prediction from this run's own alpha and component costs."""
    sd = cfg.mode != "target-only"
    out = {"mode": cfg.mode, "k": cfg.k if sd else None, "adaptive": cfg.adapts if sd else None,
           "placement": cfg.placement, "rtt_ms": cfg.rtt_ms, **metrics.timing(reqs),
           "tokens_without_draft": sum(r.get("tokens_without_draft", 0) for r in reqs)}
    drafts = sum(r["drafts"] for r in reqs)
    per_pos = [sum(r["accepted_per_pos"][i] for r in reqs) for i in range(cfg.k)] if sd else []
    varying = cfg.mode == "pipelined" or cfg.adapts
    out.update(metrics.acceptance(drafts, sum(r["draft_tokens"] for r in reqs),
                                  sum(r["accepted_tokens"] for r in reqs), per_pos,
                                  sum(r.get("rejections", 0) for r in reqs) if varying else None))
    decode_s = sum(r["e2e_s"] - r["ttft_ms"] / 1e3 for r in reqs)
    draft_s = sum(r["draft_s"] + r["draft_prefill_s"] for r in reqs)
    verify_s = sum(r["verify_s"] for r in reqs)
    wire_s = sum(r["wire_s"] for r in reqs)
    if cfg.mode == "pipelined":   # the draft runs beside the target: only the waiting is on the clock
        out["time_breakdown_s"] = {"prefill": sum(r["ttft_ms"] for r in reqs) / 1e3, "wait for drafts": wire_s,
                                   "verify": verify_s, "other": decode_s - verify_s - wire_s}
        out["draft_compute_overlapped_s"] = draft_s
    else:
        out["time_breakdown_s"] = {"prefill": sum(r["ttft_ms"] for r in reqs) / 1e3, "draft": draft_s, "wire": wire_s,
                                   "verify" if sd else "decode": verify_s,
                                   "other": decode_s - draft_s - verify_s - wire_s}
    n_tokens = [len(r["output_ids"]) for r in reqs]
    ttft = out["ttft_ms"] / 1e3
    if not sd:
        steps = sum(max(n - 1, 0) for n in n_tokens)
        step = decode_s / steps if steps else 0.0
        out["costs"] = costmodel.Costs(target_step=step, draft_step=0.0).to_dict()
        total = sum(ttft + max(n - 1, 0) * step for n in n_tokens)
        out["predicted_tokens_per_s"] = sum(n_tokens) / total if total else None
        return out
    rounds = sum(len(r.get("k_trace") or []) or r["rounds"] for r in reqs)
    out["k_trace"] = [m for r in reqs for m in r.get("k_trace", [])]
    if not drafts or out["alpha"] is None:
        out["predicted_tokens_per_s"] = None
        return out
    widths = _widths(reqs)
    alpha = out["alpha"]
    if cfg.mode == "pipelined":
        streamed = sum(r.get("drafted", 0) for r in reqs)
        rtts = [r["rtt_est_ms"] for r in reqs if r.get("rtt_est_ms") is not None]
        c = costmodel.Costs(
            target_step=widths.get(1, 0.0), draft_step=sum(r["draft_s"] for r in reqs) / max(streamed, 1),
            verify_s=widths, rtt=(statistics.mean(rtts) / 1e3 if rtts else cfg.rtt_ms / 1e3),
            overhead=(decode_s - verify_s - wire_s) / rounds)
        if 1 not in widths:      # no plain step in the run: extrapolate a step from the two narrowest widths
            c.target_step = c.verify(1) if len(widths) > 1 else min(widths.values())
        sim = costmodel.simulate_pipelined(alpha, c, cfg.k, n_tokens=4000, seed=cfg.seed, adaptive=cfg.adapts)
        rate = sim["tokens_per_s"]
        out["plain_steps"] = sum(r.get("plain_steps", 0) for r in reqs)
        out["drafted_tokens"] = streamed
        out["model_pipeline"] = sim
    else:
        draft_prefill = statistics.mean(r["draft_prefill_s"] for r in reqs)
        c = costmodel.Costs(
            target_step=0.0,         # not measured in an SD run (stored as null); pair it with a target-only run
            draft_step=sum(r["draft_s"] for r in reqs) / sum(r["draft_tokens"] for r in reqs),
            verify_s=widths, rtt=wire_s / rounds,
            overhead=(decode_s - draft_s - verify_s - wire_s) / rounds + draft_prefill * len(reqs) / rounds)
        ks = out["k_trace"] or [cfg.k]
        rate = (sum(costmodel.expected_tokens(alpha, k) for k in ks)
                / sum(costmodel.round_time(c, k) for k in ks))
        out["wire_ms_per_round"] = wire_s / rounds * 1e3
    if cfg.placement == "ethernet":
        out["bytes_per_round"] = sum(r["bytes_sent"] + r["bytes_received"] for r in reqs) / rounds
    out["costs"] = {**c.to_dict(), "target_step": c.target_step or None}
    total = sum(ttft + max(n - 1, 0) / rate for n in n_tokens)
    out["predicted_tokens_per_s"] = sum(n_tokens) / total
    out["predicted_over_measured"] = out["predicted_tokens_per_s"] / out["tokens_per_s"]
    return out


@torch.inference_mode()
def calibrate(pair, context: int = 256, widths=(1, 2, 3, 4, 5, 6, 8), reps: int = 9) -> dict:
    """Median cost (s) of a target step, a draft step, and a target forward of m tokens, at a
    given context length: the inputs of the cost model, measured on the hardware at hand."""
    ids = list(range(100, 100 + context))
    out = {"context": context, "verify_s": {}}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        eng = Engine(model, role)
        eng.start(context + max(widths) + 2)
        prefill(eng, ids)
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            decode_one_token(eng, 7)
            times.append(time.perf_counter() - t0)
            eng.rollback(context)
        out[f"{role}_step"] = statistics.median(times[1:])
        if role == "target":
            for m in widths:
                ts = []
                for _ in range(reps + 1):
                    t0 = time.perf_counter()
                    eng.forward(ids[:m])
                    ts.append(time.perf_counter() - t0)
                    eng.rollback(context)
                out["verify_s"][m] = statistics.median(ts[1:])
    return out


SWEEP_RTTS = (0.0, 0.2, 1.0, 5.0, 20.0)


def sweep(cfg: RunConfig, rtts=SWEEP_RTTS, pair=None, progress: bool = True) -> dict:
    """The RTT sweep: target-only and colocated SD once, then sync SD and pipelined SD over the link
    at each injected round trip, on one testbed whose relay is re-set between RTTs. Returns
    {"runs": [results dicts], "table": rows with measured and predicted speedups}."""
    from dataclasses import replace
    from .models import load_pair
    from .testbed import Testbed
    cfg = cfg.check()
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    runs = [run(replace(cfg, mode="target-only", placement="colocated", rtt_ms=0.0), pair, progress),
            run(replace(cfg, mode="sd", placement="colocated", rtt_ms=0.0), pair, progress)]
    with Testbed(cfg.pair, netns=cfg.netns, device=cfg.device, target=cfg.target, draft=cfg.draft, relay=True) as tb:
        for rtt in rtts:
            tb.set_delay(rtt / 2, rtt / 2)
            for mode in ("sd", "pipelined"):
                runs.append(run(replace(cfg, mode=mode, placement="ethernet", rtt_ms=rtt), pair, progress, tb))
    return {"schema": "sdeth.sweep/1", "runs": runs, "table": sweep_table(runs)}


def sweep_table(runs: list[dict]) -> list[dict]:
    """One row per run: measured tokens/s and speedup over the target-only run, and the model's."""
    base = next(r for r in runs if r["config"]["mode"] == "target-only")["summary"]
    rows = []
    for r in runs:
        s, c = r["summary"], r["config"]
        label = {"target-only": "target only", "sd": "sync SD", "pipelined": "pipelined SD"}[c["mode"]]
        rows.append({"mode": label + (" (colocated)" if c["placement"] == "colocated" and c["mode"] == "sd" else ""),
                     "placement": c["placement"], "rtt_ms": c["rtt_ms"], "k": c["k"], "alpha": s.get("alpha"),
                     "tokens_per_s": s["tokens_per_s"], "speedup": s["tokens_per_s"] / base["tokens_per_s"],
                     "predicted_tokens_per_s": s.get("predicted_tokens_per_s"),
                     "predicted_speedup": (s["predicted_tokens_per_s"] / base["predicted_tokens_per_s"]
                                           if s.get("predicted_tokens_per_s") else None),
                     "identical_to_target_only": [q["output_ids"] for q in r["requests"]]
                     == [q["output_ids"] for q in runs[0]["requests"]]})
    return rows


def model_curves(runs: list[dict], rtts) -> list[dict]:
    """The cost model's speedup against RTT for sync and pipelined SD, from the components measured
    in a sweep: the target step of the target-only run; draft step, verify costs and overhead of the
    sync and pipelined runs over the link at the smallest RTT (the colocated run if there is none).
    `rtts` are the full round trips to model (add the relay's own when comparing to injected RTTs)."""
    base = next(r for r in runs if r["config"]["mode"] == "target-only")["summary"]
    step = base["costs"]["target_step"]

    def first(mode, placement):
        cand = [r for r in runs if r["config"]["mode"] == mode and r["config"]["placement"] == placement]
        return min(cand, key=lambda r: r["config"]["rtt_ms"])["summary"] if cand else None

    sync = first("sd", "ethernet") or first("sd", "colocated")
    pipe = first("pipelined", "ethernet")
    k = next(r["config"]["k"] for r in runs if r["config"]["mode"] != "target-only")
    rows = []
    for rtt in rtts:
        for label, s in (("sync SD", sync), ("pipelined SD", pipe)):
            if s is None or s.get("alpha") is None:
                continue
            c = costmodel.Costs(step, s["costs"]["draft_step"], {int(m): v for m, v in s["costs"]["verify_s"].items()},
                                rtt / 1e3, s["costs"]["overhead"])
            sp = (costmodel.pipelined_speedup(s["alpha"], c, k, n_tokens=3000, adaptive=s.get("adaptive", True) is not False)
                  if label == "pipelined SD"
                  else costmodel.speedup(s["alpha"], k, c))
            rows.append({"rtt_ms": rtt, "mode": label, "speedup": sp})
    return rows


def save(res: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=str) + "\n")
    return path


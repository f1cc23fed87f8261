"""What Ethernet costs, on the CPU testbed: speedup against the link's round trip, measured through the real draft
server with an injected delay, and modelled between the points.

Measured (`measure`): the embedded pair on the CPU, greedy, the same prompts for every option: the target alone
(t(1)), colocated SD (the draft in the target's process: real draft steps, the target's verify in series), then at
each injected round trip `injected_rtt_ms` (half each way, a user-space TCP relay between the target's client and
the draft server: place.relay.DelayProxy) sync SD (one Rounds a round) and pipelined SD (a stream of drafts).
Every option on one definition: TPOT per request as serving benchmarks count it, (end - first token) / (tokens - 1),
its mean, p50 and p99; the speedup is t(1)'s mean over the option's, with a 95% paired bootstrap interval over the
prompts. Each point records the delay it added and the round trip a Ping through the relay took (the relay's own
cost included).

Modelled (`model`): sync, the cost model's round (k draft steps + verify + overhead, measured at the lowest round
trip) with the probed round trip in place of that point's: TPOT(rtt) = TPOT_0 + (rtt - rtt_0) x rounds per token;
pipelined, the event model (costmodel.simulate_pipelined) fed the measured target step, verify times, the draft's
period and the probed round trip, scaled to the lowest point (its ratio there is recorded). CPU wall times: two
cores run the target, the draft server and the relay, so the figures say how the curve bends, not what a GPU gives.

    python -m sdeth bench link --json reports/link_cpu.json          # ~6 min on 2 CPU cores
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass

from ... import costmodel, hardware
from ...metrics import ratio_ci
from ...place.relay import DelayProxy
from ...place.testbed import free_port
from ...runtime import make_engine
from ...runtime.loop import Drafter, generate_sd, generate_target_only
from ...runtime.pipeline import generate_pipelined
from ...runtime.verify import Sampling
from ...wire import protocol
from ...wire.draft_client import DraftServerClient, ping_ms
from ...wire.draft_handles import ServerDraft, ServerStream
from ...wire.draft_server import DraftServerConfig, pair_server
from ..config import RunConfig, encode_prompts

LABEL = ("measured on the CPU: the embedded pair (SmolLM2-135M target, its 6-layer draft), greedy, real acceptance; "
         "the real draft server over loopback TCP through a delay relay")


@dataclass
class LinkConfig:
    """One link curve: the prompts, tokens per prompt, k (sync) and k_max (pipelined), the pipelined window, and
    the round trips injected (ms, half each way)."""
    prompts: str = "sharegpt:6"
    max_tokens: int = 40
    k: int = 4
    window: int = protocol.STREAM_WINDOW
    rows: int = 8
    rtts_ms: tuple = (0.02, 0.5, 2.0, 5.0)


def tpot_stats(recs: list) -> dict:
    """Per-request TPOT (ms): mean, p50, p99 (nearest rank) and n."""
    xs = sorted(r.tpot_ms for r in recs if r.tpot_ms is not None)
    q = lambda p: xs[min(len(xs) - 1, max(0, -(-p * len(xs) // 100) - 1))]   # noqa: E731
    return {"mean": round(statistics.mean(xs), 3), "p50": round(q(50), 3), "p99": round(q(99), 3), "n": len(xs)}


def summary(recs: list, base: list, ref: dict) -> dict:
    """An option's figures on the one definition, its speedup over the target alone paired by prompt."""
    point, low, high = ratio_ci([b.tpot_ms for b in base], [r.tpot_ms for r in recs])
    rounds = sum(r.rounds for r in recs)
    decoded = sum(max(len(r.output_ids) - 1, 0) for r in recs)
    acc, rej = sum(r.accepted_tokens for r in recs), sum(r.rejections for r in recs)
    return {"tpot_ms": tpot_stats(recs), "speedup": round(point, 4), "speedup_ci95": [round(low, 4), round(high, 4)],
            "rounds_per_token": round(rounds / decoded, 4) if decoded else None,
            "alpha": round(acc / (acc + rej), 3) if acc + rej else None,
            "greedy_identical": all(r.output_ids == ref[r.prompt_id] for r in recs)}


def _relay(upstream_port: int, rtt_ms: float) -> str:
    """A delay relay to the draft server on its own port and thread: rtt_ms / 2 each way."""
    port = free_port()
    proxy = DelayProxy(("127.0.0.1", port), ("127.0.0.1", upstream_port), rtt_ms / 2, rtt_ms / 2)
    threading.Thread(target=lambda: asyncio.run(proxy.serve()), daemon=True, name=f"relay-{rtt_ms}").start()
    time.sleep(0.3)
    return f"tcp://127.0.0.1:{port}"



def _remote(mode: str, addr: str, hello, eng, pair, prompts: list, cfg: LinkConfig) -> list:
    """Every prompt through the draft server in one mode, one connection."""
    c, eos, out = DraftServerClient(addr, hello, timeout_s=60), pair.tokenizer.eos_token_id, []
    for i, (pid, ids) in enumerate(prompts):
        if mode == "sync":
            out.append(generate_sd(eng, ServerDraft(c), ids, cfg.max_tokens, cfg.k, Sampling(), eos, prompt_id=pid,
                                   draft_seed=i))
        else:
            st = ServerStream(c, window=cfg.window)
            out.append(generate_pipelined(eng, st, ids, cfg.max_tokens, cfg.k, Sampling(), eos, prompt_id=pid,
                                          draft_seed=i))
            c.end_seq(st.seq)
    c.close()
    return out


def _costs(base: list, recs: list, rtt_ms: float) -> costmodel.Costs:
    """The event model's inputs from the records: the target's step (the target alone's decode), the verify time
    by width, the draft's period (pipelined records), the probed round trip."""
    step = sum(r.verify_s for r in base) / max(sum(len(r.output_ids) - 1 for r in base), 1)
    widths: dict[int, list] = {}
    for r in recs:
        for m, (n, s) in r.verify_widths.items():
            w = widths.setdefault(int(m), [0, 0.0])
            w[0], w[1] = w[0] + n, w[1] + s
    periods = [(r.draft_period_ms, r.draft_periods) for r in recs if r.draft_period_ms and r.draft_periods]
    period = sum(p * n for p, n in periods) / sum(n for _, n in periods) / 1e3 if periods else step
    return costmodel.Costs(step, period, {m: s / n for m, (n, s) in widths.items() if n}, rtt_ms / 1e3,
                           draft_period=period, link_rtt=rtt_ms / 1e3)


def model(points: list[dict], base: list, recs: dict) -> None:
    """Each point's modelled speedup (`model_speedup`) beside its measured one, in place (see the module's doc)."""
    for mode in ("sync", "pipelined"):
        pts = sorted((p for p in points if p["mode"] == mode), key=lambda p: p["probe_rtt_ms"])
        if not pts:
            continue
        p0 = pts[0]
        t1 = p0["tpot_ms"]["mean"] * p0["speedup"]           # t(1)'s mean TPOT, the speedup's numerator
        if mode == "sync":
            for p in pts:
                tpot = p0["tpot_ms"]["mean"] + (p["probe_rtt_ms"] - p0["probe_rtt_ms"]) * p0["rounds_per_token"]
                p["model_speedup"] = round(t1 / tpot, 4)
            continue
        raw = {id(p): costmodel.pipelined_speedup(p0["alpha"] or 0.5, _costs(base, recs[mode], p["probe_rtt_ms"]),
                                                  4) for p in pts}
        scale = p0["speedup"] / raw[id(p0)]
        for p in pts:
            p["model_speedup"], p["model_raw_speedup"] = round(raw[id(p)] * scale, 4), round(raw[id(p)], 4)
            p["model_scaled_by"] = round(scale, 4)


def measure(pair, cfg: LinkConfig, progress=print) -> dict:
    """The target alone and colocated SD once, then sync and pipelined SD at each injected round trip."""
    prompts = encode_prompts(RunConfig(mode="target-only", prompts=cfg.prompts, max_tokens=cfg.max_tokens),
                             pair.tokenizer)
    eng, eos = make_engine(pair.target, "target", "target", vocab=pair.vocab_size), pair.tokenizer.eos_token_id
    draft = make_engine(pair.draft, "draft", "draft", vocab=pair.vocab_size)
    base = [generate_target_only(eng, ids, cfg.max_tokens, Sampling(), eos, prompt_id=pid) for pid, ids in prompts]
    ref = {r.prompt_id: r.output_ids for r in base}
    colocated = [generate_sd(eng, Drafter(draft), ids, cfg.max_tokens, cfg.k, Sampling(), eos, prompt_id=pid)
                 for pid, ids in prompts]
    out = {"label": LABEL, "config": asdict(cfg), "target_only": {"tpot_ms": tpot_stats(base)},
           "colocated": summary(colocated, base, ref), "points": []}
    server = pair_server(pair, DraftServerConfig(cfg.rows, 1024))
    port = free_port()
    threading.Thread(target=server.serve, args=(f"tcp://127.0.0.1:{port}",), kwargs={"max_seconds": 3600},
                     daemon=True, name="draft-server").start()
    time.sleep(0.3)
    hello = protocol.Hello(protocol.PROTOCOL_VERSION, "target", pair.config.target, pair.vocab_size,
                           server.welcome.tokenizer_sha, server.welcome.dtype)
    recs: dict = {}
    for rtt in cfg.rtts_ms:
        addr = _relay(port, rtt)
        probe = ping_ms(addr, hello, n=20, timeout_s=5.0)
        for mode in ("sync", "pipelined"):
            got = _remote(mode, addr, hello, eng, pair, prompts, cfg)
            recs.setdefault(mode, []).extend(got)
            p = {"mode": mode, "injected_rtt_ms": rtt, "probe_rtt_ms": round(probe, 3), **summary(got, base, ref)}
            out["points"].append(p)
            progress(f"{mode} at {rtt} ms injected ({probe:.2f} ms probed): TPOT {p['tpot_ms']['mean']:.1f} ms, "
                     f"{p['speedup']:.2f}x {p['speedup_ci95']}, identical {p['greedy_identical']}")
    model(out["points"], base, recs)
    return out


def agreement(points: list[dict], mode: str) -> str:
    """How the measured curve and the model agree, in words: at how many round trips the model lies within the
    measured 95% interval, and within 10% of the measured speedup."""
    pts = [p for p in points if p["mode"] == mode and p.get("model_speedup") is not None]
    inside = sum(p["speedup_ci95"][0] <= p["model_speedup"] <= p["speedup_ci95"][1] for p in pts)
    near = sum(abs(p["model_speedup"] / p["speedup"] - 1) <= 0.10 for p in pts)
    rtts = ", ".join(f"{p['injected_rtt_ms']:g}" for p in pts)
    return (f"{mode}: measured at {len(pts)} injected round trips ({rtts} ms); the model lies within the measured 95% "
            f"interval at {inside} of them and within 10% of the measured speedup at {near} (it passes through the lowest "
            "point by construction)")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m sdeth bench link", description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=LinkConfig.prompts, help="prompt set (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=LinkConfig.max_tokens, help="tokens per prompt")
    ap.add_argument("--rtts", default=",".join(str(x) for x in LinkConfig.rtts_ms),
                    help="injected round trips, ms, comma-separated (default %(default)s)")
    ap.add_argument("--json", default="reports/link_cpu.json", help="where to write the results")
    a = ap.parse_args(argv)
    from ...models import load_pair
    from ...paths import REPO
    cfg = LinkConfig(a.prompts, a.max_tokens, rtts_ms=tuple(float(x) for x in a.rtts.split(",")))
    t0 = time.time()
    pair = load_pair("embedded")
    res = {"schema": 1, "bench": "link", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "hardware": hardware.describe("cpu"), "models": {"target": pair.config.target, "draft": pair.config.draft},
           "definition": "TPOT per request: (end - first token) / (tokens - 1); speedup: the target alone's mean "
                         "TPOT over the option's, 95% paired bootstrap interval over the prompts",
           "load_avg_1min_at_start": round(os.getloadavg()[0], 2), "modes": ["sync", "pipelined"],
           **measure(pair, cfg)}
    res["load_avg_1min_at_end"] = round(os.getloadavg()[0], 2)
    res["summary"] = {m: agreement(res["points"], m) for m in res["modes"]}
    res["wall_s"] = round(time.time() - t0, 1)
    path = REPO / a.json
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {path} ({res['wall_s']} s)")
    return res


if __name__ == "__main__":
    main()

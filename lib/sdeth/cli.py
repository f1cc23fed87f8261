"""Command line: `python -m sdeth run|worker|prepare|calibrate|render|down` (also installed as `sdeth`):
the top layer, which wires the others together."""
from __future__ import annotations

import argparse
import json
import sys


def _bool_switch(v: str) -> bool:
    if v.lower() in ("on", "true", "1", "yes"):
        return True
    if v.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{v!r}: use on or off")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sdeth", description="Speculative decoding over Ethernet: runtime and study")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode a prompt set, target-only or speculative, and write a results JSON")
    r.add_argument("--pair", default="embedded", help="model pair preset (sdeth.models.presets.PAIRS)")
    r.add_argument("--target", help="override the preset's target (hub id or local dir)")
    r.add_argument("--draft", help="override the preset's draft (hub id or local dir)")
    r.add_argument("--mode", default="sd", choices=["target-only", "sd", "pipelined"],
                   help="sd: synchronous rounds; pipelined: the draft streams ahead while the target verifies "
                        "(placement ethernet)")
    r.add_argument("--k", type=int, default=3, help="speculative tokens per round (the most, if adaptive/pipelined)")
    r.add_argument("--adaptive", type=_bool_switch, metavar="on|off",
                   help="choose k per round from measured alpha and costs (default: on for pipelined, off for sd)")
    r.add_argument("--policy", default="", help="pipelined: the step's policy, policy (long-run tokens/s; the "
                   "default when adaptive), sync (always wait for k), offered (go with what is on offer), adaptive "
                   "(one round's rate) or fixed (the default when not adaptive)")
    r.add_argument("--rtt-sweep", metavar="MS,MS,...",
                   help="the RTT sweep (e.g. 0,0.2,1,5,20): target-only, colocated SD, then sync and pipelined SD "
                        "over the link at each round trip; prints measured and predicted speedups")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--top-k", type=int, default=0)
    r.add_argument("--draft-sampled", action="store_true", help="draft samples from q (default: greedy draft)")
    r.add_argument("--prompts", default="sharegpt:8", help="sharegpt:N[:seed] or humaneval:N[:seed]")
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--raw-prompts", action="store_true", help="skip the chat template")
    r.add_argument("--thinking", type=_bool_switch, help="Qwen3 thinking mode on|off (default: template's)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--device", default="cpu")
    r.add_argument("--placement", default="colocated", choices=["colocated", "ethernet"],
                   help="colocated: one process; ethernet: draft and target workers on two (namespace) nodes")
    r.add_argument("--rtt-ms", type=float, default=0.0, help="ethernet: injected round trip (ms), half each way")
    r.add_argument("--impl", default="hf", choices=["hf", "fast"], help="model code: transformers or sdeth's fast decoder")
    r.add_argument("--cache", default="auto", help="pipelined: the outcome cache, off | on | auto | FANOUT[xDEPTH[xRANKS]] "
                   "(on needs --impl fast; auto: the target's event model turns it on per request where it "
                   "predicts a gain, each record says why)")
    r.add_argument("--max-len", type=int, default=2048, help="longest prompt + max_tokens accepted")
    r.add_argument("--json", help="write the results JSON here")
    r.add_argument("--engine", default="sdeth", choices=["sdeth", "vllm", "vllm-server"],
                   help="sdeth (this runtime); vllm (the reference engine, offline, colocated); vllm-server (its "
                        "OpenAI-compatible server, counters scraped from /metrics)")
    sub.add_parser("worker", help="a draft or target worker process (see `python -m sdeth worker -h`)",
                   add_help=False)
    d = sub.add_parser("down", help="scale this project's Deployments in a namespace to zero (GPU nodes idle)")
    d.add_argument("--namespace", default="sdeth")
    d.add_argument("--context", help="kubeconfig context (default: the current one)")
    rd = sub.add_parser("render", help="print a placement's manifests with parameters (| kubectl apply -f -)")
    rd.add_argument("placement", help="colocated | ethernet | ethernet-curve | vllm-target-only | vllm-sd | "
                    "vllm-remote-draft | probe")
    rd.add_argument("--keys", help="ethernet-curve, vllm-remote-draft: the key directory whose keys become the Secret "
                    "sdeth-keys")
    rd.add_argument("--target-node", required=True, help="the node for the target (and, colocated, the draft)")
    rd.add_argument("--draft-node", default="", help="the draft's node (ethernet, probe)")
    rd.add_argument("--pair", help="model pair preset for the workers")
    rd.add_argument("--target-model", default="Qwen/Qwen3-8B"), rd.add_argument("--draft-model", default="Qwen/Qwen3-1.7B")
    rd.add_argument("--k", type=int, default=5, help="vLLM's num_speculative_tokens")
    rd.add_argument("--image", help="the sdeth worker image (registry/name:tag)")
    rd.add_argument("--namespace", default="sdeth")
    b = sub.add_parser("bench", help="compare decoding modes on the same requests, with 95%% intervals (JSON)")
    b.add_argument("what", choices=["sd", "step", "rtt", "draft-loop", "targets", "wire", "streams", "vllm"], help="sd: target-only, "
                   "colocated, sync, adaptive, pipelined SD; step: the decode step, lever by lever (sdeth.study."
                   "bench.step); rtt: the link modes at each added round trip (--rtts); draft-loop: the pipelined "
                   "draft's loop, phase by phase (sdeth.study.bench.draftloop); targets: bigger targets' steps and "
                   "colocated SD on one GPU (`bench targets -h`); wire: round trips plain against CURVE (`bench wire -h`); "
                   "streams: many streams, colocated and over a draft server (`bench streams -h`); vllm: vLLM target-only, its "
                   "own draft and a remote draft server through its OpenAI server (`bench vllm -h`)")
    b.add_argument("--rtts", default="0,0.2,0.5,1,2,5", help="rtt: added round trips (ms)")
    b.add_argument("--pair", default="random-qwen3-8b/1.7b")
    b.add_argument("--synthetic-alpha", type=float, default=None,
                   help="accept each draft token with this probability; -1 for real acceptance (default: 0.71 "
                   "for a random-weight pair, whose own acceptance means nothing; real acceptance otherwise)")
    b.add_argument("--trace", default=None, help="trace-driven acceptance: the draft replays this trace JSON "
                   "(e.g. reports/traces/embedded_greedy.json), scaled to --synthetic-alpha (-1: the trace's own)")
    b.add_argument("--device", default="cuda:0"), b.add_argument("--draft-device", default="cuda:1")
    b.add_argument("--impl", default="fast", choices=["hf", "fast"])
    b.add_argument("--compile", default="default", help="torch.compile mode for the fast decoder ('' = off)")
    b.add_argument("--capacity", type=int, default=1024, help="CUDA-graph cache length (tokens)")
    b.add_argument("--requests", type=int, default=16, help="requests, each its own prompt and seed")
    b.add_argument("--context", type=int, default=512, help="prompt length (random token ids)")
    b.add_argument("--max-tokens", type=int, default=128, help="generated tokens per request")
    b.add_argument("--k", type=int, default=3, help="k of the fixed-k modes (colocated, sync)")
    b.add_argument("--k-max", type=int, default=8, help="the most k of adaptive and pipelined")
    b.add_argument("--modes", default="target-only,colocated,sync,adaptive,pipelined,cached",
                   help="cached: pipelined with the outcome cache (--cache); auto: pipelined, the target's model "
                   "turning the cache on per request where it predicts a gain; pipelined-sync, pipelined-offered, "
                   "pipelined-adaptive: pipelined under that step policy (pipelined: the step policy)")
    b.add_argument("--cache", default="auto", help="the outcome cache of mode 'cached': FANOUT[xDEPTH[xRANKS]] "
                   "(auto: runtime.streamdraft.CACHE_DEFAULT)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", required=True)
    b.add_argument("--draft-fast", default="", help="sd: the draft decoder's levers (FastOptions spec)")
    b.add_argument("--target-fast", default="", help="sd: the target decoder's levers (scope; its numerics stay)")
    b.add_argument("--emulate-target", default="", metavar="PATH[:MODEL]", help="sd: an emulated target (no model, "
                   "synthetic answers, host-side) that takes the forward times measured in PATH's target.points, "
                   "e.g. reports/gpu/bench_streams_2.json:Qwen3-8B (needs synthetic or trace-driven acceptance)")
    b.add_argument("--models", default="Qwen3-1.7B,Qwen3-0.6B,Qwen3-8B", help="step: model shapes (random weights)")
    b.add_argument("--budget-s", type=float, default=480, help="step: start no new lever after this long")
    b.add_argument("--levers", default=None, help="step: comma list of lever names (default: all of study.bench.step's LEVERS)")
    b.add_argument("--kernels", default="", help="step: measure the fused-kernel levers instead (FastOptions kernels=, "
                   "comma list of torch,attn,gemv,all): batch 1 at --context and --rows rows at --row-contexts")
    b.add_argument("--rows", type=int, default=16, help="step --kernels: independent rows of the batched step")
    b.add_argument("--row-contexts", default="512,2048", help="step --kernels: contexts of the batched rows")
    ky = sub.add_parser("keys", help="make a CURVE key directory for the link (copy it to both nodes, or make it the "
                        "Secret of the ethernet-curve placement)")
    ky.add_argument("dir", help="the directory to create (it must not hold keys already)")
    ky.add_argument("--clients", default="client", help="one key pair per named client (comma list, e.g. "
                    "target-0,target-1): each authorized, each in DIR/clients/NAME for its node alone; a draft server "
                    "keeps each client's sequences under its key (default: one pair, `client`, shared by the nodes)")
    sub.add_parser("prepare", help="prepare the embedded pair (dequantize the target, assemble the draft)")
    sk = sub.add_parser("soak", help="many short requests over the testbed with random faults; checks for leaks")
    sk.add_argument("--requests", type=int, default=2000), sk.add_argument("--seed", type=int, default=0)
    sk.add_argument("--json", default="", help="also write the figures here")
    sk.add_argument("--clients", type=int, default=1, help="1: a draft worker and a target worker; N > 1: N target "
                    "workers drafting through one draft server, each with its own controller, all at once (mode sd)")
    st = sub.add_parser("status", help="the milestones M0-M4 from the committed results, as Markdown (a milestone comment)")
    st.add_argument("--milestone", help="one milestone (M0 ... M4)")
    st.add_argument("--cluster", action="store_true", help="instead: what of ours is up on the cluster, and since when")
    st.add_argument("--namespace", default="sdeth"), st.add_argument("--context", default=None)
    rp = sub.add_parser("reap", help="scale the GPU workers to zero if the controller's Lease is stale (the CronJob's command)")
    rp.add_argument("--namespace", default="sdeth"), rp.add_argument("--context", default=None)
    rp.add_argument("--stale-minutes", type=float, default=15.0)
    t = sub.add_parser("trace", help="record a pair's acceptance trace (greedy, teacher forcing) for trace-driven timing")
    t.add_argument("--pair", default="embedded")
    t.add_argument("--prompts", default="sharegpt:64", help="held-out prompts (sharegpt:N[:seed], humaneval:N)")
    t.add_argument("--max-tokens", type=int, default=128, help="target tokens generated per prompt")
    t.add_argument("--out", default="reports/traces/embedded_greedy.json")
    dv = sub.add_parser("draft-variants", help="the embedded draft's alpha in other numerics and with a pruned "
                        "output layer (its token ranking is made first if missing)")
    dv.add_argument("--rank", default="lib/sdeth/assets/embedded-draft/token_rank.json")
    dv.add_argument("--prompts", default="sharegpt:256:1000", help="held-out prompts (the draft card's)")
    dv.add_argument("--out", default="reports/draft_variants_embedded.json")
    ch = sub.add_parser("chains", help="record a draft's greedy continuations from every prefix of the target's "
                        "output (what an emulated draft device replays)")
    ch.add_argument("--pair", default="embedded")
    ch.add_argument("--prompts", default="sharegpt:4")
    ch.add_argument("--max-tokens", type=int, default=32, help="the target's tokens per prompt (>= the runs' max_tokens)")
    ch.add_argument("--depth", type=int, default=17, help="draft tokens per prefix (> the pipelined window)")
    ch.add_argument("--out", required=True)
    c = sub.add_parser("calibrate", help="time a target step, a draft step and target forwards of m tokens")
    c.add_argument("--pair", default="embedded")
    c.add_argument("--context", type=int, default=256)
    c.add_argument("--device", default="cpu")
    return ap


def bench_alpha(pair: str, alpha: float | None, trace: str | None) -> float | None:
    """--synthetic-alpha as the benchmark uses it: None means real acceptance (or a trace's own alpha).
    Left out, a random-weight pair gets 0.71 (its drafts would almost never be accepted) and a real pair
    its real acceptance."""
    if alpha is None:
        return 0.71 if pair.startswith("random") and not trace else None
    return None if alpha < 0 else alpha


# ---------------------------------------------------------------------------------- the run configuration
def build_config(a):
    """The one place the command line becomes a study.config.RunConfig (`run` and `bench`), checked."""
    from .study.config import RunConfig
    if a.cmd == "bench":
        return RunConfig(pair=a.pair, device=a.device, draft_device=a.draft_device or None, impl=a.impl,
                         compile=a.compile, capacity=a.capacity, prompts=f"random:{a.requests}:{a.context}:{a.seed}",
                         max_tokens=a.max_tokens, k=a.k, seed=a.seed, max_len=a.capacity,
                         synthetic_alpha=bench_alpha(a.pair, a.synthetic_alpha, a.trace), netns=False,
                         synthetic_trace=a.trace, draft_fast=a.draft_fast, target_fast=a.target_fast,
                         cache=a.cache, target_emulate=a.emulate_target).check()
    return RunConfig(pair=a.pair, target=a.target, draft=a.draft, mode=a.mode, k=a.k, temperature=a.temperature,
                     top_p=a.top_p, top_k=a.top_k, draft_sampled=a.draft_sampled, prompts=a.prompts,
                     max_tokens=a.max_tokens, chat=not a.raw_prompts, thinking=a.thinking, seed=a.seed,
                     device=a.device, placement=a.placement, rtt_ms=a.rtt_ms, max_len=a.max_len,
                     engine=a.engine, adaptive=a.adaptive, impl=a.impl, cache=a.cache, policy=a.policy).check()


# ---------------------------------------------------------------------------------- commands
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    if argv[:2] == ["bench", "link"]:        # what Ethernet costs on the CPU testbed: the link curve (own parser)
        from .study.bench import link
        link.main(argv[2:])
        return 0
    if argv[:2] == ["bench", "ssd-cpu"]:     # the verdict cache on the CPU, modelled for the H200 (own parser)
        from .study.bench import ssd_cpu
        ssd_cpu.main(argv[2:])
        return 0
    if argv[:2] in (["bench", "targets"], ["bench", "wire"], ["bench", "streams"], ["bench", "vllm"]):   # own parsers
        from .study.bench import targets as bigtargets, wire as wirebench
        from .study import streambench
        from .study.vllm import study as vllm_study
        return ({"targets": bigtargets, "wire": wirebench, "streams": streambench,
                 "vllm": vllm_study}[argv[1]].main(argv[2:]) or 0)
    a = build_parser().parse_args(argv)
    from .models.embedded import ModelError
    from .models.prompts import PromptError
    from .study.config import ConfigError
    try:
        return _command(a)(a)
    except (ConfigError, ModelError, PromptError) as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2


def _command(a):
    """The handler of a parsed command line (each takes the argparse namespace, returns the exit status)."""
    if a.cmd in ("down", "render", "reap") or (a.cmd == "status" and a.cluster):
        return _cluster
    return {"bench": _bench, "status": _status, "prepare": _prepare, "soak": _soak, "draft-variants": _draft_variants,
            "chains": _chains, "trace": _trace, "calibrate": _calibrate, "run": _run, "keys": _keys}[a.cmd]


def _keys(a) -> int:
    from pathlib import Path
    from .wire.auth import DEFAULT_CLIENTS, KeysError, check_clients, make_keys
    if (Path(a.dir) / "server.key_secret").exists():
        print(f"sdeth: error: {a.dir} already holds keys: choose a new directory (or delete it to replace them, "
              f"then copy the new one to every node)", file=sys.stderr)
        return 2
    try:
        names = check_clients(a.clients)
    except KeysError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2
    d = make_keys(a.dir, names)
    if names == DEFAULT_CLIENTS:
        print(f"keys in {d}: server.key(_secret), client.key(_secret), authorized/client.key; copy the directory to "
              f"both nodes and pass --keys {d} (or set SDETH_KEYS)")
    else:
        print(f"keys in {d}: server.key(_secret) and authorized/ ({', '.join(n + '.key' for n in names)}) for the "
              f"draft server's node (--keys {d}); {d}/clients/NAME for client NAME's node alone (--keys "
              f"{d}/clients/NAME): it holds no other client's secret")
    return 0


def _status(a) -> int:
    from .study import status
    try:
        print(status.markdown(only=a.milestone), end="")
    except ValueError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2
    return 0


def _prepare(a) -> int:
    from .models.presets import load_pair
    pair = load_pair("embedded")
    print(json.dumps({k: v for k, v in pair.describe().items() if k != "draft_card"}, indent=1))
    print("draft greedy agreement (card):", pair.card.get("eval", {}).get("greedy_agreement"))
    return 0


def _soak(a) -> int:
    from .study.config import save
    from .study.runs.soak import soak
    if a.clients < 1:
        print(f"sdeth: error: --clients {a.clients}: give 1 or more", file=sys.stderr)
        return 2
    res = soak(a.requests, seed=a.seed, clients=a.clients)
    print(json.dumps(res, indent=1))
    if a.json:
        print("wrote", save(res, a.json))
    return 0 if res["ok"] else 1


def _draft_variants(a) -> int:
    from pathlib import Path
    from .models.presets import load_pair
    from .study.runs.acceptance import draft_variants, token_ranking
    from .study.config import save
    pair = load_pair("embedded")
    if not Path(a.rank).exists():
        Path(a.rank).write_text(json.dumps(token_ranking(pair)) + "\n")
        print("wrote", a.rank)
    print("wrote", save(draft_variants(pair, a.rank, a.prompts), a.out))
    return 0


def _chains(a) -> int:
    from .models.presets import load_pair
    from .study.runs.acceptance import record_chains
    from .study.config import save
    print("wrote", save(record_chains(load_pair(a.pair), a.prompts, a.max_tokens, a.depth), a.out))
    return 0


def _trace(a) -> int:
    from .models.presets import load_pair
    from .study.runs.acceptance import record_trace
    from .study.config import save
    res = record_trace(load_pair(a.pair), a.prompts, a.max_tokens, progress=print)
    print(f"alpha {res['alpha']:.3f} over {res['positions']} positions; wrote {save(res, a.out)}")
    return 0


def _calibrate(a) -> int:
    from .models.presets import load_pair
    from .study.runs.experiment import calibrate
    print(json.dumps(calibrate(load_pair(a.pair, device=a.device), a.context), indent=1))
    return 0


def _cluster(a) -> int:
    from .place import cluster
    try:
        if a.cmd == "down":
            names = cluster.down(a.namespace, a.context)
            print(f"scaled to 0 in {a.namespace}: {', '.join(names) or 'nothing was running'}")
            return 0
        if a.cmd == "reap":
            age, names = cluster.reap(a.namespace, a.stale_minutes, a.context)
            seen = "no controller lease" if age is None else f"controller lease renewed {age / 60:.1f} min ago"
            print(f"{seen}; scaled to 0 in {a.namespace}: {', '.join(names) or 'nothing'}")
            return 0
        if a.cmd == "status":
            c = cluster.Cluster(a.namespace, a.context, hold_lease=False)
            try:
                age, up = c.lease_age_s(), c.up()
            finally:
                c.close()
            print(f"namespace {a.namespace}: " + ("no controller lease" if age is None
                                                  else f"controller lease renewed {age / 60:.1f} min ago"))
            for d in up:
                since = f", up {d['age_s'] / 60:.0f} min" if d["age_s"] is not None else ""
                print(f"- {d['deployment']}: {d['ready']}/{d['replicas']} ready{' (GPU)' if d['gpu'] else ''}{since}")
            return 0
        import yaml
        objs = cluster.render(a.placement, a.target_node, a.draft_node, a.pair, a.target_model, a.draft_model, a.k,
                              a.image, a.namespace, keys_dir=a.keys)
        cluster.validate(objs)
        print(yaml.safe_dump_all(objs, sort_keys=False), end="")
        return 0
    except cluster.ClusterError as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2


def _bench(a) -> int:
    from .study.bench import modes as bench
    from .study.config import ConfigError, parse_rtts, save
    if a.what == "draft-loop":
        from .study.bench import draftloop
        res = draftloop.bench_draft_loop(tuple(m for m in a.models.split(",") if m != "Qwen3-8B"), a.device, a.context,
                                         a.capacity, a.compile, a.trace, bench_alpha(a.pair, a.synthetic_alpha, a.trace))
        print(draftloop.table(res))
        print("wrote", save(res, a.json))
        return 0
    if a.what == "step" and a.kernels:
        from .study.bench import step as stepbench
        levers = tuple(a.kernels.split(","))
        bad = [x for x in levers if x not in stepbench.KERNEL_LEVERS]
        if bad:
            raise SystemExit(f"--kernels {a.kernels!r}: {bad} unknown; use a comma list of {stepbench.KERNEL_LEVERS}")
        res = stepbench.bench_kernels(tuple(a.models.split(",")), a.device, a.context,
                                      tuple(int(c) for c in a.row_contexts.split(",") if c), a.rows, levers, a.compile,
                                      a.budget_s, save=lambda r: save(r, a.json))
        print(stepbench.kernel_table(res))
        print("wrote", save(res, a.json))
        return 0
    if a.what == "step":
        from .study.bench import step as stepbench
        res = stepbench.bench_step(tuple(a.models.split(",")), a.device, a.context, a.capacity, a.compile,
                                   a.budget_s, save=lambda r: save(r, a.json),
                                   levers=a.levers.split(",") if a.levers else None)
        print(stepbench.table(res))
        print("wrote", save(res, a.json))
        return 0
    try:
        base = build_config(a)
        if a.what == "rtt":
            modes = tuple(m for m in a.modes.split(",") if m and m not in ("target-only", "colocated"))
            res = bench.bench_rtt(base, tuple(parse_rtts(a.rtts, "--rtts")), modes, a.k_max)
            print(bench.rtt_table(res))
            print(f"wrote {save(res, a.json)}")
            return 0
        res = bench.bench_sd(base, tuple(m for m in a.modes.split(",") if m), a.k_max)
    except (ConfigError, ValueError) as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2
    print(bench.table(res))
    print(f"wrote {save(res, a.json)}")
    return 0


def _run(a) -> int:
    from .study.runs.experiment import run, save
    cfg = build_config(a)
    if a.rtt_sweep:
        return _sweep(cfg, a)
    res = run(cfg)
    s = res["summary"]
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    keys = ["tokens_per_s", "predicted_tokens_per_s", "ttft_ms", "tpot_ms", "e2e_s", "draft_acceptance_rate",
            "mean_acceptance_length", "alpha", "wire_ms_per_round", "bytes_per_round", "tokens_without_draft"]
    print(f"{cfg.engine}: {cfg.mode} on {res['hardware']['label']}, pair {cfg.pair}, {cfg.prompts}, max_tokens {cfg.max_tokens}"
          + (f", k {cfg.k}" if cfg.mode != "target-only" else "") + (" (adaptive)" if cfg.adapts else ""))
    for k in keys:
        print(f"  {k:24s} {fmt(s.get(k))}")
    if "time_breakdown_s" in s:
        print("  time (s)                 " + ", ".join(f"{k} {v:.2f}" for k, v in s["time_breakdown_s"].items()))
    if a.json:
        print(f"  wrote {save(res, a.json)}")
    return 0


def _sweep(cfg, a) -> int:
    from .study.config import parse_rtts
    from .study.runs.experiment import save, sweep
    rtts = parse_rtts(a.rtt_sweep, "--rtt-sweep")
    res = sweep(cfg, rtts)
    print(f"{'mode':24s} {'rtt ms':>7s} {'tok/s':>7s} {'speedup':>8s} {'predicted':>9s} {'alpha':>6s} identical")
    for r in res["table"]:
        pred = f"{r['predicted_speedup']:.2f}" if r["predicted_speedup"] else "-"
        alpha = f"{r['alpha']:.2f}" if r["alpha"] is not None else "-"
        print(f"{r['mode']:24s} {r['rtt_ms']:7.1f} {r['tokens_per_s']:7.2f} {r['speedup']:8.2f} {pred:>9s} {alpha:>6s} "
              f"{r['identical_to_target_only']}")
    if a.json:
        print(f"wrote {save(res, a.json)}")
    return 0


def worker_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sdeth worker", description="a draft or target worker process: "
                                 "the run configuration comes whole in --config (what a testbed passes); --pair, "
                                 "--target, --draft and --device alone make one for a worker started by hand")
    ap.add_argument("--role", required=True, choices=["draft", "draft-server", "target"],
                    help="draft: one sequence at a time, sync or pipelined; draft-server: many sequences of many "
                         "targets at once, batched (sync rounds); target: decodes, with its draft at --draft-addr")
    ap.add_argument("--bind", required=True, help="tcp://ADDR:PORT to listen on (only that address)")
    ap.add_argument("--config", default="{}", help="the run configuration as JSON (study.config.RunConfig."
                    "worker_config(): pair, devices, engine options); the draft role runs on draft_device if set")
    ap.add_argument("--pair", help="model pair preset (overrides --config's)")
    ap.add_argument("--target"), ap.add_argument("--draft")
    ap.add_argument("--device", help="this worker's device (overrides --config's device and draft_device)")
    ap.add_argument("--draft-addr", help="target role: tcp://ADDR:PORT of the draft worker")
    ap.add_argument("--draft-server", action="store_true", help="target role: the draft at --draft-addr is a "
                    "draft server (started with --role draft-server)")
    draft_server_arguments(ap)
    ap.add_argument("--draft-timeout", type=float, default=5.0, help="seconds before the target stops waiting for a proposal")
    ap.add_argument("--die-after", type=int, default=0, help="fault injection: exit after N proposals")
    ap.add_argument("--max-seconds", type=float, default=0, help="exit after this long (0: run until killed)")
    ap.add_argument("--spin-ms", type=float, default=None,
                    help="busy-poll the link this long after each message (default: 20 on a GPU, where the cores "
                         "are free; 0 on a CPU, where they decode)")
    ap.add_argument("--keys", default=None, help="CURVE key directory (`python -m sdeth keys DIR`; default "
                    "$SDETH_KEYS): serve, and reach the draft, only with these keys; without: plain TCP")
    return ap


def draft_server_arguments(ap) -> None:
    """The draft-server role's flags: every field of wire.server_config.DraftServerConfig (its limits as --limit-*)."""
    from .wire.server_config import ServerLimits, limit_fields
    g = ap.add_argument_group("draft-server role (wire.server_config.DraftServerConfig; docs/reliability.md)")
    g.add_argument("--rows", type=int, default=32, help="sequences drafted at once (cache rows; at most 128)")
    g.add_argument("--capacity", type=int, default=None, help="tokens per cache row (default: --config's capacity)")
    g.add_argument("--ttl", type=float, default=30.0, help="seconds of silence (no message, no work of its own in "
                   "flight) after which a client's sequences are freed")
    g.add_argument("--idle", type=float, default=30.0, help="seconds a sequence may go without a draft step and keep "
                   "its row while another client waits for one (then its row is reclaimed; its client is told "
                   "'reclaimed' and opens it again)")
    g.add_argument("--prefill-chunk", type=int, default=0, help="prompt tokens per forward (0: 2048 on a GPU, 256 on a CPU)")
    g.add_argument("--prefill-budget", type=int, default=0, help="prompt tokens fed between two draft steps (0: a chunk)")
    g.add_argument("--compile", default="auto", help="torch.compile mode of the batched block: auto (default on a "
                   "GPU, eager on a CPU), none, default, reduce-overhead, max-autotune")
    g.add_argument("--fast", default=None, help="the fast decoder's options (default: --config's draft_fast)")
    g.add_argument("--no-warm", action="store_true", help="do not capture the step graphs before serving")
    g.add_argument("--messages-per-s", type=int, default=4000, help="messages one client (connection or CURVE key) "
                   "may send a second")
    g.add_argument("--per-pass", type=int, default=4, help="messages of one client handled between two draft steps")
    g.add_argument("--read-while-stepping", action="store_true", help="run each draft step on a thread of its own "
                   "and read the socket meanwhile (off by default: on a CPU it cost 0.3-0.4 ms a step and let a flood "
                   "of Open/End raise a neighbour's p99 2-3.6x; meant for a GPU, where the device steps alone)")
    g.add_argument("--verdict-cache", default="off", help="streams: draft the likely verdicts' continuations on free "
                   "rows: off, on (4x4x8) or FANOUT[xDEPTH[xBUDGET]] (runtime.verdictcache)")
    for name in limit_fields():
        g.add_argument(f"--limit-{name.replace('_', '-')}", type=int, default=getattr(ServerLimits(), name),
                       help=f"ServerLimits.{name}")


def draft_server_config(a, cfg, spin_s: float):
    """The draft server's DraftServerConfig from its flags (and the run configuration's capacity and fast options)."""
    from .wire.server_config import DraftServerConfig, ServerLimits, limit_fields
    limits = ServerLimits(**{n: getattr(a, f"limit_{n}") for n in limit_fields()})
    return DraftServerConfig(
        rows=a.rows, capacity=a.capacity or cfg.capacity, ttl_s=a.ttl, idle_s=a.idle, prefill_chunk=a.prefill_chunk,
        prefill_budget=a.prefill_budget, compile_mode=a.compile, fast=cfg.draft_fast if a.fast is None else a.fast,
        warm=not a.no_warm, spin_s=spin_s, messages_per_s=a.messages_per_s, per_pass=a.per_pass,
        read_while_stepping=a.read_while_stepping,
        verdict_cache=a.verdict_cache, limits=limits).check()


def worker_config(a):
    """A worker's run configuration: --config, with --pair/--target/--draft/--device over it; checked."""
    from .study.config import ConfigError, RunConfig
    try:
        d = json.loads(a.config)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config {a.config[:80]!r}: not JSON ({e}); pass RunConfig.worker_config() as JSON")
    given = {"pair": a.pair, "target": a.target, "draft": a.draft}
    d.update({k: v for k, v in given.items() if v is not None})
    if a.device is not None:
        d.update(device=a.device, draft_device=None)
    return RunConfig.from_dict(d).check()


def worker_main(argv=None) -> int:
    """`python -m sdeth worker --role draft|target ...`: one worker process, until killed."""
    from dataclasses import asdict
    from .study.config import ConfigError
    from .models.prompts import PromptError
    a = worker_parser().parse_args(argv)
    try:
        cfg = worker_config(a)
    except (ConfigError, PromptError) as e:
        print(f"sdeth worker: error: {e}", file=sys.stderr)
        return 2
    device = (cfg.draft_device or cfg.device) if a.role != "target" else cfg.device
    if a.bind.startswith("tcp://*") or a.bind.startswith("tcp://0.0.0.0"):
        print("sdeth worker: binding every interface; pass the node's own address unless you mean it", file=sys.stderr)
    try:
        import setproctitle
        setproctitle.setproctitle(f"sdeth-worker --role {a.role} --bind {a.bind}")
    except ImportError:
        pass
    import os
    import torch
    from .models.presets import load_pair
    from .wire.auth import Keys, KeysError
    from .wire.draft_worker import serve_draft
    from .wire.target_worker import serve_target
    try:
        keys = Keys.from_env(a.keys)
    except KeysError as e:
        print(f"sdeth worker: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, int(os.environ.get("SDETH_THREADS", torch.get_num_threads()))))
    if device.startswith("cuda"):
        torch.cuda.set_device(device)      # streams, graphs and syncs on this worker's GPU
    own = ("target",) if not cfg.target_emulate else ()     # an emulated target runs no model
    pair = load_pair(cfg.pair, cfg.target, cfg.draft, device=device, roles=own if a.role == "target" else ("draft",))
    opts = asdict(cfg.engine_config())
    spin_s = (a.spin_ms if a.spin_ms is not None else (20.0 if device.startswith("cuda") else 0.0)) / 1e3
    if a.role == "draft":
        serve_draft(a.bind, pair, a.die_after, a.max_seconds, opts, spin_s, keys=keys)
    elif a.role == "draft-server":
        from .wire.draft_server import serve_draft_server
        serve_draft_server(a.bind, pair, draft_server_config(a, cfg, spin_s), a.max_seconds, keys)
    else:
        serve_target(a.bind, pair, a.draft_addr, a.draft_timeout, a.max_seconds, opts, spin_s, keys=keys,
                     draft_server=a.draft_server)
    return 0


if __name__ == "__main__":
    sys.exit(main())

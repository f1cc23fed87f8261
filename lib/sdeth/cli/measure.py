"""The measuring commands, `run` (a prompt set decoded, or the RTT sweep) and `bench sd|step|rtt|draft-loop`, and
the one place their command line becomes a study.config.RunConfig."""
from __future__ import annotations

import sys


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
    from ..study.config import RunConfig
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


# ---------------------------------------------------------------------------------- the commands
def _bench(a) -> int:
    from ..study.bench import modes as bench
    from ..study.config import ConfigError, parse_rtts, save
    if a.what == "draft-loop":
        from ..study.bench import draftloop
        res = draftloop.bench_draft_loop(tuple(m for m in a.models.split(",") if m != "Qwen3-8B"), a.device, a.context,
                                         a.capacity, a.compile, a.trace, bench_alpha(a.pair, a.synthetic_alpha, a.trace))
        print(draftloop.draftloop_table(res))
        print("wrote", save(res, a.json))
        return 0
    if a.what == "step" and a.kernels:
        from ..study.bench import kernelstep
        levers = tuple(a.kernels.split(","))
        bad = [x for x in levers if x not in kernelstep.KERNEL_LEVERS]
        if bad:
            raise SystemExit(f"--kernels {a.kernels!r}: {bad} unknown; use a comma list of {kernelstep.KERNEL_LEVERS}")
        res = kernelstep.bench_kernels(tuple(a.models.split(",")), a.device, a.context,
                                      tuple(int(c) for c in a.row_contexts.split(",") if c), a.kv_rows, levers, a.compile,
                                      a.budget_s, save=lambda r: save(r, a.json))
        print(kernelstep.kernel_table(res))
        print("wrote", save(res, a.json))
        return 0
    if a.what == "step":
        from ..study.bench import step as stepbench
        res = stepbench.bench_step(tuple(a.models.split(",")), a.device, a.context, a.capacity, a.compile,
                                   a.budget_s, save=lambda r: save(r, a.json),
                                   levers=a.levers.split(",") if a.levers else None)
        print(stepbench.lever_table(res))
        print("wrote", save(res, a.json))
        return 0
    try:
        base = build_config(a)
        a.modes = bench_modes(a.modes, base)
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
    print(bench.modes_table(res))
    print(f"wrote {save(res, a.json)}")
    return 0


def _run(a) -> int:
    from ..study.runs.experiment import run, save
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
    from ..study.config import parse_rtts
    from ..study.runs.experiment import save, sweep
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


COMMANDS = {"run": _run, "bench": _bench}


def bench_modes(modes: str, base) -> str:
    """--modes as given; the default without 'cached' where the draft cannot draft branches (said on stderr)."""
    from ..study.runs.experiment import can_branch
    from .parser import BENCH_MODES
    if modes != BENCH_MODES or can_branch(base):
        return modes
    print("sdeth: mode 'cached' left out: branches sent ahead need the batched draft server, which drafts a "
          "fast-decoder draft with real acceptance only", file=sys.stderr)
    return ",".join(m for m in modes.split(",") if m != "cached")

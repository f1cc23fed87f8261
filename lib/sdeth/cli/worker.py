"""`python -m sdeth worker --role draft|draft-server|target`: a worker process, its own parser (the draft server's
flags read from wire.server_config.DraftServerConfig) and the configurations it is started with."""
from __future__ import annotations

import argparse
import json
import sys

ONE_ROW_IDLE_S = 0.5     # --role draft: a sequence silent this long gives its one row to another target's new one


def worker_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sdeth worker", description="a draft or target worker process: "
                                 "the run configuration comes whole in --config (what a testbed passes); --pair, "
                                 "--target, --draft and --device alone make one for a worker started by hand")
    ap.add_argument("--role", required=True, choices=["draft", "draft-server", "target"],
                    help="draft-server: the draft server, many sequences of many targets at once, batched over the "
                         "fast decoder (sync rounds and streams); draft: the draft server of one row over --config's "
                         "engine (any: transformers, fast, synthetic, trace-driven, emulated); target: decodes, with "
                         "its draft server at --draft-addr")
    ap.add_argument("--bind", required=True, help="tcp://ADDR:PORT to listen on (only that address)")
    ap.add_argument("--config", default="{}", help="the run configuration as JSON (study.config.RunConfig."
                    "worker_config(): pair, devices, engine options); the draft role runs on draft_device if set")
    ap.add_argument("--pair", help="model pair preset (overrides --config's)")
    ap.add_argument("--target"), ap.add_argument("--draft")
    ap.add_argument("--device", help="this worker's device (overrides --config's device and draft_device)")
    ap.add_argument("--draft-addr", help="target role: tcp://ADDR:PORT of the draft server (--role draft or "
                    "draft-server)")
    ap.add_argument("--draft-server", action="store_true", help="target role: accepted for older command lines "
                    "(the draft at --draft-addr is always a draft server)")
    draft_server_arguments(ap)
    ap.add_argument("--draft-timeout", type=float, default=5.0, help="seconds before the target stops waiting for a proposal")
    ap.add_argument("--die-after", type=int, default=0, help="fault injection (draft roles): exit after N drafts "
                    "sent (proposals and streamed tokens)")
    ap.add_argument("--max-seconds", type=float, default=0, help="exit after this long (0: run until killed)")
    ap.add_argument("--spin-ms", type=float, default=None,
                    help="busy-poll the link this long after each message (default: 20 on a GPU, where the cores "
                         "are free; 0 on a CPU, where they decode)")
    ap.add_argument("--keys", default=None, help="CURVE key directory (`python -m sdeth keys DIR`; default "
                    "$SDETH_KEYS): serve, and reach the draft, only with these keys; without: plain TCP")
    return ap


def draft_server_arguments(ap) -> None:
    """The draft-server role's flags: every field of wire.server_config.DraftServerConfig (its limits as --limit-*)."""
    from ..wire.server_config import DraftServerConfig, limit_fields
    from .parser import add_renamed
    d = DraftServerConfig()          # every default is the config's
    g = ap.add_argument_group("draft-server role (wire.server_config.DraftServerConfig; docs/reliability.md)")
    g.add_argument("--kv-rows", type=int, default=d.rows, help="sequences drafted at once (cache rows; at most 128)")
    add_renamed(g, "--rows", "--kv-rows", type=int)
    g.add_argument("--capacity", type=int, default=None, help="tokens per cache row (default: --config's capacity)")
    g.add_argument("--ttl", type=float, default=d.ttl_s, help="seconds of silence (no message, no work of its own in "
                   "flight) after which a client's sequences are freed")
    g.add_argument("--idle", type=float, default=None, help="seconds a sequence may go without a draft step and keep "
                   "its row while another client waits for one (then its row is reclaimed; its client is told "
                   f"'reclaimed' and opens it again; default {d.idle_s:g}, and {ONE_ROW_IDLE_S:g} for --role draft, "
                   "where the newest request takes the one row from one gone quiet)")
    g.add_argument("--prefill-chunk", type=int, default=d.prefill_chunk,
                   help="prompt tokens per forward (0: 2048 on a GPU, 256 on a CPU)")
    g.add_argument("--prefill-budget", type=int, default=d.prefill_budget,
                   help="prompt tokens fed between two draft steps (0: a chunk)")
    g.add_argument("--compile", default=d.compile_mode, help="torch.compile mode of the batched block: auto (default on a "
                   "GPU, eager on a CPU), none, default, reduce-overhead, max-autotune")
    g.add_argument("--fast", default=None, help="the fast decoder's options (default: --config's draft_fast)")
    g.add_argument("--no-warm", action="store_true", help="do not capture the step graphs before serving")
    g.add_argument("--messages-per-s", type=int, default=d.messages_per_s, help="messages one client (connection or CURVE key) "
                   "may send a second")
    g.add_argument("--per-pass", type=int, default=d.per_pass, help="messages of one client handled between two draft steps")
    g.add_argument("--read-while-stepping", action="store_true", help="run each draft step on a thread of its own "
                   "and read the socket meanwhile (off by default: on a CPU it cost 0.3-0.4 ms a step and let a flood "
                   "of Open/End raise a neighbour's p99 2-3.6x; meant for a GPU, where the device steps alone)")
    g.add_argument("--launch-ahead", default=d.launch_ahead, choices=("auto", "on", "off"), help="streams: launch "
                   "each draft step just before the one in flight ends, fed its tokens on the device (auto: on a GPU)")
    g.add_argument("--verdict-cache", default=d.verdict_cache, help="streams: draft the likely verdicts' continuations on free "
                   "rows: off, on (4x4x8) or FANOUT[xDEPTH[xBUDGET]] (runtime.verdictcache)")
    g.add_argument("--report-every", type=float, default=d.report_s, help="log where the serving loop's time goes "
                   "(ms a step per part: the step and its parts, the replies, branch planning, prefill, messages) every "
                   "this many seconds (0: never)")
    for name in limit_fields():
        g.add_argument(f"--limit-{name.replace('_', '-')}", type=int, default=getattr(d.limits, name),
                       help=f"ServerLimits.{name}")


def draft_server_config(a, cfg, spin_s: float):
    """The draft server's DraftServerConfig from its flags (and the run configuration's capacity and fast options)."""
    from ..wire.server_config import DraftServerConfig, ServerLimits, limit_fields
    limits = ServerLimits(**{n: getattr(a, f"limit_{n}") for n in limit_fields()})
    return DraftServerConfig(
        rows=a.kv_rows, capacity=a.capacity or cfg.capacity, ttl_s=a.ttl, prefill_chunk=a.prefill_chunk,
        idle_s=a.idle if a.idle is not None else ONE_ROW_IDLE_S if a.role == "draft" else DraftServerConfig.idle_s,
        prefill_budget=a.prefill_budget, compile_mode=a.compile, fast=cfg.draft_fast if a.fast is None else a.fast,
        warm=not a.no_warm, spin_s=spin_s, messages_per_s=a.messages_per_s, per_pass=a.per_pass,
        read_while_stepping=a.read_while_stepping, launch_ahead=a.launch_ahead,
        verdict_cache=a.verdict_cache, die_after=a.die_after, report_s=a.report_every, limits=limits).check()


def worker_config(a):
    """A worker's run configuration: --config, with --pair/--target/--draft/--device over it; checked."""
    from ..study.config import ConfigError, RunConfig
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
    """`python -m sdeth worker --role draft|draft-server|target ...`: one worker process, until killed."""
    from dataclasses import asdict
    from ..study.config import ConfigError
    from ..models.prompts import PromptError
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
    from ..models.presets import load_pair
    from ..wire.auth import Keys, KeysError
    from ..wire.draft_server import serve_draft_server
    from ..wire.target_worker import serve_target
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
    if a.role != "target":      # draft: one row over the run configuration's engine; draft-server: batched
        serve_draft_server(a.bind, pair, draft_server_config(a, cfg, spin_s), a.max_seconds, keys,
                           opts if a.role == "draft" else None)
    else:
        serve_target(a.bind, pair, a.draft_addr, a.draft_timeout, a.max_seconds, opts, spin_s, keys=keys)
    return 0

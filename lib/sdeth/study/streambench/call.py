"""One call on the device: every part in turn, the JSON rewritten after each; the command line."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ... import hardware
from ...costmodel import POLICIES
from ...models.presets import shape
from ...runtime.settings import FastOptions, FastOptionsError
from ..bench.targets import DRAFT_ALPHA
from ..bench.step import copy_bandwidth
from .colocated import colocated_emulated_part, colocated_part, colocated_real_part
from .common import (CONTEXT, CONTEXTS, DRAFT_K, GOALS, HOLDS, SERVER_ROWS, TARGET, Grid, allow_recompiles,
                     build_fast, compiled, draft_options, free)
from .draftstep import draft_step, goal_check
from .link import link_part
from .remote import remote_part
from .ssd import SSD_ALPHA, ssd_part
from .printout import NOTES, draft_row, summary_lines
from .target import target_points, tv_table

def run_call(call: int, json_path: str, grid: Grid, drafts=("Qwen3-1.7B",), device: str = "cuda:0",
             budget_s: float = 500, quick: bool = False, progress=print) -> dict:
    """The four parts for drafts[0] (draft_step, target, colocated, remote: sync rounds, pipelined streams and the
    bigger targets), then extras while time is left: the compile modes at the goal's rows (only if the first step
    misses a goal) and each further draft's draft_step and colocated parts. The JSON is rewritten after each part."""
    g = grid
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
    allow_recompiles()
    t_start = time.time()
    t_end = t_start + budget_s
    res = {"schema": "sdeth.bench/1", "call": call,
           "bench": "streams-policies" if len(g.policies) > 1 else "streams",  # (its own tables: policies side by side)
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hardware": hardware.describe(device),
           "copy_bandwidth_Bps": copy_bandwidth(device),
           "settings": {"target": TARGET, "drafts": list(drafts), "alpha": {d: DRAFT_ALPHA.get(d, SSD_ALPHA) for d in drafts},
                        "weights": "random bf16 (runtime.randomweights)", "acceptance": "synthetic (coins, target side)",
                        "prompt": g.prompt, "context": g.context, "contexts": list(CONTEXTS), "draft_k": DRAFT_K,
                        "server_rows": SERVER_ROWS, "compile": compiled(g),
                        "draft_fast": FastOptions.parse(draft_options(device, g.draft_fast)).spec(),
                        "quick": quick, "budget_s": budget_s,
                        "grid": g.to_json(), "shapes": {n: shape(n) for n in (TARGET, *drafts, *g.big_targets)}},
           "goals": GOALS | {"step_ms": {str(c): v for c, v in GOALS["step_ms"].items()}}, "notes": NOTES,
           "draft_step": [], "target": {}, "colocated": [], "remote": {}, "goal_check": [], "skipped": []}
    save = lambda: Path(json_path).write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
    first = drafts[0]
    if g.only_ssd or g.only_link or g.only_colocated:
        only_parts(res, first, device, g, t_end, progress, save)
        res["wall_s"] = round(time.time() - t_start, 1)
        save()
        return res
    dfast = build_fast(first, device, 1, draft_options(device, g.draft_fast))
    res["draft_step"].append(draft_step(dfast, dfast.vocab, first, g.batches, CONTEXTS, reps=g.reps,
                                        compile_mode=g.models_compile))
    progress(draft_row(res["draft_step"][-1]))
    res["goal_check"] = goal_check(res["draft_step"])
    save()
    tfast = build_fast(TARGET, device, 0)
    tdec, pts = target_points(tfast, g.batches, g.verify_ks, compile_mode=g.models_compile)
    res["target"] = {"model": TARGET, "context": CONTEXT, "rows": tdec.rows, "compile": compiled(g), "points": pts}
    progress("target t_v(B, k) ms (replay): " + " ".join(f"B{p['B']}k{p['k'] or 0}={p.get('replay_ms')}" for p in pts))
    save()
    colocated_part(res, dfast, first, tdec, g, g.colocated_ks, t_end, progress, save)
    if g.colocated_emulated:
        colocated_emulated_part(res, dfast, first, tv_table(pts), g, t_end, progress, save)
    free()
    remote_part(res, first, device, tv_table(pts), g, t_end, progress, save)
    extras(res, dfast, first, tdec, g, device, t_end, progress, save)
    if g.verdict_caches:
        ssd_part(res, first, device, g, t_end, progress, save)
    if g.link_rtts:
        link_part(res, first, device, g, t_end, progress, save)
    res["wall_s"] = round(time.time() - t_start, 1)
    save()
    for line in summary_lines(res):
        progress(line)
    return res


def only_parts(res, first, device, g, t_end, progress, save) -> None:
    """A call of the parts named alone (--only-ssd, --only-link, --only-colocated): colocated SD in the remote
    options' harness first (emulated, and real beside its emulation), then the ssd part, then the link part."""
    res["bench"] = ("streams-ssd" if g.only_ssd else "streams-link" if g.only_link   # (their own bench name: the
                    else "streams-colocated")                                         # streams tables read complete
    if g.only_ssd:                                                                    # calls only)
        res["settings"]["acceptance"] = "ranks (streambench.ranks: trace-driven or synthetic), target side"
    if g.colocated_emulated or g.colocated_real:   # the line the remote figures are held against: colocated SD in
        # the same harness; real targets beside their emulation
        dfast = build_fast(first, device, 1, draft_options(device, g.draft_fast))
        if g.colocated_emulated:  # (own t_v None: the call measured no target; colocated reads bench targets')
            colocated_emulated_part(res, dfast, first, None, g, t_end, progress, save)
        if g.colocated_real:
            colocated_real_part(res, dfast, first, g.colocated_real, device, g, t_end, progress, save)
        del dfast
        free()
    if g.only_ssd:
        ssd_part(res, first, device, g, t_end, progress, save)
    if g.link_rtts:
        link_part(res, first, device, g, t_end, progress, save)


def extras(res, dfast, first, tdec, g, device, t_end, progress, save) -> None:
    """While time is left: compile modes at the goal's rows (if the eager step missed a goal), then each further
    draft shape's draft_step and colocated parts."""
    missed = any(not (r["step_met"] and r["host_met"]) for r in res["goal_check"])
    if first == GOALS["draft"] and missed:
        for mode in (m for m in g.compile_modes if m != g.models_compile):
            if time.time() + (240 if "autotune" in mode else 90) > t_end:     # autotuning takes minutes
                res["skipped"].append(f"draft_step {first} compile {mode}: out of time")
                continue
            try:
                res["draft_step"].append(draft_step(dfast, dfast.vocab, first, (GOALS["rows"],), CONTEXTS,
                                                    reps=g.reps, compile_mode=mode))
                progress(draft_row(res["draft_step"][-1]))
            except Exception as e:               # noqa: BLE001
                res["draft_step"].append({"draft": first, "compile": mode, "error": f"{type(e).__name__}: {e}"[:800]})
                progress(f"compile {mode}: {res['draft_step'][-1]['error']}")
            res["goal_check"] = goal_check(res["draft_step"])
            save()
            free()
    for name in g.extra_drafts:
        if time.time() + 60 > t_end:
            res["skipped"].append(f"{name}: out of time")
            continue
        fast = build_fast(name, device, 2, draft_options(device, g.draft_fast))
        res["draft_step"].append(draft_step(fast, fast.vocab, name, g.batches, CONTEXTS, reps=g.reps,
                                            compile_mode=g.models_compile))
        progress(draft_row(res["draft_step"][-1]))
        save()
        colocated_part(res, fast, name, tdec, g, g.colocated_ks, t_end, progress, save)
        del fast
        free()


def ints(text: str) -> tuple:
    return tuple(int(x) for x in text.split(",") if x)


def floats(text: str) -> tuple:
    try:
        out = tuple(float(x) for x in text.split(",") if x)
    except ValueError:
        raise SystemExit(f"{text!r}: give numbers, comma-separated, e.g. 0.02,0.5,1,2") from None
    if any(x < 0 for x in out):
        raise SystemExit(f"{text!r}: a round trip is 0 ms or more")
    return out


def names(text: str) -> tuple:
    return tuple(x for x in text.split(",") if x)


def pairs(text: str) -> tuple:
    """'B:N,B:N' -> ((B, N), ...)."""
    try:
        return tuple(tuple(int(v) for v in x.split(":")) for x in text.split(",") if x)
    except ValueError:
        raise SystemExit(f"{text!r}: write (B, N) points as B:N,B:N, e.g. 1:4,4:4") from None


def checked_fast(spec: str | None) -> str | None:
    """--draft-fast as a FastOptions spec the bench's random-weights draft takes (bf16, its whole head), or exit."""
    if spec is None:
        return None
    try:
        o = FastOptions.parse(spec)
    except FastOptionsError as e:
        raise SystemExit(f"--draft-fast {spec!r}: {e}") from None
    if o.weights != "bf16" or o.head:
        raise SystemExit(f"--draft-fast {spec!r}: the bench's draft has random bf16 weights and its whole output "
                         "layer; give kernels=... or scope=... only, e.g. kernels=auto")
    return o.spec()


def grid_of(a) -> Grid:
    """The command line's grid (--quick: the small one, then any point lists given)."""
    g = Grid(models_compile=a.models_compile or None, colocated_s=a.colocated_s, remote_s=a.remote_s, sync=not a.no_sync,
             extra_drafts=tuple(x for x in a.drafts.split(",") if x)[1:],
             big_targets=tuple(x for x in a.big_targets.split(",") if x),
             colocated_emulated=tuple(x for x in a.colocated_emulated.split(",") if x))
    g = g.quick() if a.quick else g
    g.only_ssd, g.ssd_s, g.ssd_rows = a.only_ssd, a.ssd_s, a.ssd_rows or g.ssd_rows
    g.policies = tuple(x for x in a.policy.split(",") if x)
    bad = [x for x in g.policies if x not in POLICIES]
    if bad or not g.policies:
        raise SystemExit(f"--policy {a.policy!r}: each of {bad or 'none given'} is no step policy; give a "
                         f"comma-separated list of {', '.join(POLICIES)}, e.g. policy,sync,offered")
    bad = [x for x in (a.ssd_policy or "").split(",") if x and x not in POLICIES]
    if bad:
        raise SystemExit(f"--ssd-policy {a.ssd_policy!r}: {bad} is no step policy; give some of {', '.join(POLICIES)}")
    holds = [x for x in (a.ssd_hold or "").split(",") if x]
    bad = [x for x in holds if x not in HOLDS] or [x for x in holds if holds.count(x) > 1]
    if bad or a.ssd_hold is not None and not holds:
        raise SystemExit(f"--ssd-hold {a.ssd_hold!r}: {bad or 'none given'}: give some of {', '.join(HOLDS)}, the "
                         "first the one the tables show")
    g.min_steps, g.max_s, g.read_while_stepping = a.min_steps, a.max_s, a.read_while_stepping
    g.draft_fast = checked_fast(a.draft_fast)
    if g.only_ssd and not a.verdict_cache:
        raise SystemExit("--only-ssd runs the verdict cache's part: give --verdict-cache, e.g. off,on")
    g.only_link, g.only_colocated = a.only_link, a.only_colocated
    if a.colocated_real and not (g.only_ssd or g.only_link or g.only_colocated):
        raise SystemExit("--colocated-real runs with --only-colocated, --only-ssd or --only-link (a full call measures "
                         "its own target beside colocated SD already): add one of them")
    if g.only_colocated and not (a.colocated_emulated or a.colocated_real):
        raise SystemExit("--only-colocated runs colocated SD in the remote options' harness: give --colocated-emulated "
                         "and/or --colocated-real, e.g. --colocated-emulated Qwen3-32B --colocated-real Qwen3-32B")
    if g.only_link and not a.link_rtts:
        raise SystemExit("--only-link runs the link part: give --link-rtts, e.g. 0.02,0.5,1,2 (ms)")
    for name, text, parse in (("compile_modes", a.compile, lambda t: tuple(x for x in t.split(",") if x)),
                              ("batches", a.batches, ints), ("colocated_batches", a.batches, ints),
                              ("verify_ks", a.verify_ks, ints), ("pipelined", a.pipelined, pairs), ("big_points", a.big_points, pairs),
                              ("remote_batches", a.remote_batches, ints), ("remote_ns", a.remote_ns, ints),
                              ("remote_ks", a.remote_ks, ints), ("colocated_ks", a.colocated_ks, ints),
                              ("verdict_caches", a.verdict_cache, names), ("ssd_targets", a.ssd_targets, names),
                              ("ssd_points", a.ssd_points, pairs), ("ssd_ranks", a.ssd_ranks, names),
                              ("ssd_policies", a.ssd_policy, names), ("ssd_holds", a.ssd_hold, names),
                              ("link_rtts", a.link_rtts, floats), ("link_targets", a.link_targets, names),
                              ("link_points", a.link_points, pairs), ("colocated_real", a.colocated_real, names)):
        if text is not None:
            setattr(g, name, parse(text))
    return g


def part_flags(ap: argparse.ArgumentParser) -> None:
    """The flags of the parts that run alone or after the main ones: ssd, link, colocated in the same harness."""
    ap.add_argument("--verdict-cache", default=None, help="the ssd part: the servers' verdict caches, comma-separated "
                    "(e.g. off,on or off,4x4x8; a setting's +ahead: the branches sent ahead; its +inline: the server steps inline, "
                    "not launched ahead, e.g. off+inline; default: the part is left out)")
    ap.add_argument("--only-ssd", action="store_true", help="run the ssd part alone (with --colocated-emulated "
                    "first, if given; with --only-link, the link part after it)")
    ap.add_argument("--ssd-targets", default=None, help="ssd: emulated targets (default Qwen3-8B,Qwen3-32B,Qwen2.5-72B)")
    ap.add_argument("--ssd-policy", default=None, help="ssd: the targets' step policies, comma-separated, each point "
                    "under each (default offered; e.g. offered,policy)")
    ap.add_argument("--ssd-hold", default=None, help="ssd: how long the emulated targets hold a commit for the "
                    "draft's own token, comma-separated, each point under each: periods (two server periods, the "
                    "default), draft (until it comes; the rule before); points under any but the first are a "
                    "comparison, kept out of the tables")
    ap.add_argument("--ssd-points", default=None, help="ssd: (B, N) as B:N,... (default 1:1,1:4,2:1,2:4,4:1,4:4,8:1,8:4)")
    ap.add_argument("--ssd-ranks", default=None, help="ssd: acceptance ranks, comma-separated (default "
                    "trace,synthetic:0.9; coins: no ranks)")
    ap.add_argument("--ssd-s", type=float, default=Grid.ssd_s, help="ssd: seconds of each point")
    ap.add_argument("--ssd-rows", type=int, default=0, help="ssd: the servers' cache rows (default 128; B*N of "
                    "them: a full server, whose cache drafts no branch)")
    ap.add_argument("--colocated-real", default=None, help="with --only-ssd, --only-link or --only-colocated: "
                    "colocated SD with a real target of these shapes (random bf16 weights), beside it emulated at "
                    "the t_v this call measures, comma-separated, e.g. Qwen3-32B")
    ap.add_argument("--only-colocated", action="store_true", help="run colocated SD in the remote options' harness "
                    "alone (--colocated-emulated, --colocated-real)")
    ap.add_argument("--link-rtts", default=None, help="the link part: round trips (ms) injected by a delay relay in "
                    "front of the draft server, comma-separated, e.g. 0.02,0.5,1,2 (default: the part is left out)")
    ap.add_argument("--only-link", action="store_true", help="run the link part alone (with --colocated-emulated and "
                    "--colocated-real first, if given: colocated SD in the same harness; with --only-ssd, after it)")
    ap.add_argument("--link-targets", default=None, help="link: emulated targets (default "
                    "Qwen3-8B,Qwen3-32B,Qwen2.5-72B)")
    ap.add_argument("--link-points", default=None, help="link: (B, N) as B:N,... (default 1:1)")


def parser() -> argparse.ArgumentParser:
    from . import __doc__ as doc
    ap = argparse.ArgumentParser(prog="python -m sdeth bench streams", description=doc.split("\n\n")[0])
    ap.add_argument("--call", type=int, default=1, help="which call on the device this is (1, 2, ...)")
    ap.add_argument("--json", required=True, help="results JSON path (rewritten after each part)")
    ap.add_argument("--quick", action="store_true", help="a small grid (a smoke run)")
    ap.add_argument("--drafts", default="Qwen3-1.7B", help=f"comma-separated, of {list(DRAFT_ALPHA)}; the first runs "
                    "every part, the others draft_step and colocated while time is left")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--budget-s", type=float, default=500, help="parts not started by then are recorded as skipped")
    ap.add_argument("--remote-s", type=float, default=Grid.remote_s, help="seconds of each remote point")
    ap.add_argument("--colocated-s", type=float, default=Grid.colocated_s, help="seconds of each colocated point")
    ap.add_argument("--models-compile", default="", help="every BatchDecoder's torch.compile mode (target, "
                    "draft, draft server), e.g. default; '' (the default): eager kernels in CUDA graphs")
    ap.add_argument("--draft-fast", default=None, help="the draft's FastOptions (draft step, colocated, draft "
                    "servers), e.g. kernels=torch; default: kernels=auto on a GPU, torch's kernels on a CPU")
    ap.add_argument("--no-sync", action="store_true", help="leave out the remote sync-rounds points (the pipelined "
                    "streams still run)")
    ap.add_argument("--compile", default=None, help="comma-separated compile modes tried at the goal's rows when the "
                    "first step misses a goal ('' none; default: default,max-autotune-no-cudagraphs; --quick: default)")
    ap.add_argument("--pipelined", default=None, help="pipelined (B, N) points as B:N,... (default: B and N in 1, 2, "
                    "4, 8 with B*N <= 32)")
    ap.add_argument("--big-targets", default="Qwen3-32B,Qwen2.5-72B", help="bigger targets emulated from their t_v "
                    "in reports/gpu/bench_targets_*.json, comma-separated ('' none)")
    ap.add_argument("--colocated-emulated", default=",".join(Grid.colocated_emulated),
                    help="colocated SD against emulated targets too (real draft "
                    "steps, the target's t_v in series: the remote options' harness), comma-separated, e.g. "
                    "Qwen3-8B,Qwen3-32B,Qwen2.5-72B ('' none)")
    ap.add_argument("--big-points", default=None, help="their (B, N) points as B:N,... (default 1:1,1:4,2:4,4:4)")
    ap.add_argument("--batches", default=None, help="the draft step's, the target's and colocated SD's batches, "
                    "comma-separated (default 1,2,4,8,16,32)")
    ap.add_argument("--verify-ks", default=None, help="the target's verify widths k measured, comma-separated "
                    "(default 1..8; the pipelined points need 1..4)")
    ap.add_argument("--remote-batches", default=None, help="sync rounds: B values, comma-separated (default 1..32)")
    ap.add_argument("--remote-ns", default=None, help="sync rounds: N values (default 1, 2, 4, 8, 16)")
    ap.add_argument("--remote-ks", default=None, help="sync rounds: k values (default 3, 5)")
    ap.add_argument("--colocated-ks", default=None, help="colocated: k values (default 2, 3, 4, 5)")
    ap.add_argument("--policy", default=",".join(Grid.policies),
                    help="the pipelined targets' step policies, comma-separated, each "
                    "point run under each in turn: policy (long-run tokens/s), sync (always wait for k), offered (go "
                    "with what is on offer; the earlier rule), adaptive, fixed")
    ap.add_argument("--min-steps", type=int, default=Grid.min_steps,
                    help="a pipelined point runs for about this many target "
                    "steps (foretold from t_v; at least --remote-s, at most --max-s); 0: --remote-s")
    ap.add_argument("--max-s", type=float, default=Grid.max_s,
                    help="the longest a pipelined point runs with --min-steps")
    ap.add_argument("--read-while-stepping", action="store_true", help="the draft server reads its socket while a "
                    "step runs (DraftServerConfig.read_while_stepping)")
    part_flags(ap)
    return ap


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    drafts = tuple(x for x in a.drafts.split(",") if x)
    bad = [d for d in drafts if d not in DRAFT_ALPHA]
    if bad or not drafts:
        raise SystemExit(f"unknown drafts {bad}: use {list(DRAFT_ALPHA)}")
    run_call(a.call, a.json, grid_of(a), drafts, a.device, a.budget_s, a.quick)

"""ssd: verdict speculation on the draft server (speculative speculative decoding), cache off against on.

Two draft servers of the same draft shape run side by side on the device, one with the verdict cache off and one
with it on (wire.server_config.DraftServerConfig.verdict_cache); N emulated pipelined targets of B streams each
(emulated.EmulatedPipelined, t_v(B, m) of the 8B / 32B / 72B fp8 shapes from `bench targets`) run each point
against one, then the other, so that off and on are measured back to back. Acceptance carries ranks
(streambench.ranks): trace-driven (the embedded pair's trace, alpha scaled to the draft's) or a labelled synthetic
rank model; both servers send the draft's next choices with each token (Open.watch), so both pay the same top-k.
With the cache on, the target waits for its restart's answer (hit or `missed`) before its next verify.
Each point: hits and the hit rate by position (the client's count: a restart answered with drafts at once),
rows spent (branch rows per step), tokens per target step, TPOT, tokens/s per GPU, and the event model
(costmodel.simulate_pipelined with costmodel.verdict_terms) beside it.

Two calls on one H200 (each within a ~380 s device call; points not started by --budget-s are recorded skipped,
the B=1 points first):

    python -m sdeth bench streams --call 1 --only-ssd --verdict-cache off,on --ssd-s 1.5 --budget-s 340 \
        --json reports/gpu/bench_streams_ssd_1.json            # 8 (B, N) x 3 targets x 2 ranks x 2 servers
    python -m sdeth bench streams --call 2 --only-ssd --verdict-cache off,on,8x4x16 --ssd-rows 32 \
        --ssd-points 1:1,1:4,8:4 --ssd-targets Qwen3-8B,Qwen3-32B --ssd-s 4 --budget-s 340 \
        --json reports/gpu/bench_streams_ssd_2.json            # the goals' points longer, a wider fan-out, and
                                                               # 8:4 on 32 rows: a full server
"""
from __future__ import annotations

import multiprocessing as mp
import time

from ...costmodel import Costs, simulate_pipelined, verdict_terms
from ...runtime.verdictcache import VerdictSpec
from ...wire.server_config import DraftServerConfig
from ..bench.targets import DRAFT_ALPHA
from .common import HOLDS, PIPELINED_K, PIPELINED_WINDOW, draft_options, mean
from .ranks import TOP, Ranks
from .remote import fed_period_ms, model_costs, model_one_way_ms, model_tokens, pipelined_record
from .server import serve_random
from .target import big_tv



SSD_ALPHA = 0.71          # the acceptance of a draft shape bench sd did not measure (a tiny one in the tests)


SSD_NOTES = [
    "Emulated targets (t_v of each shape from `bench targets`, graph replays on the same GPU model), the real draft "
    "server with random bf16 weights of the draft shape; the draft's tokens mean nothing, so acceptance is "
    "trace-driven or synthetic (each point's label says which): the target's token is the draft's rank-r choice.",
    "Two servers run side by side on one GPU, cache off and on; each point runs against each in turn with the same "
    "seed (the same rank stream). Both send the draft's next 8 choices with each token (the same top-k work).",
    "Cache on: after a rejection the target waits for the server's answer to its Commits (the foreseen branch's "
    "drafts, or `missed`) before its next verify; answer_wait_ms is that wait. Cache off: it never waits. A setting "
    "with '+ahead': the targets ask for the branches ahead (Open.branches) and hold them; a foreseen rejection's "
    "drafts are then on offer at the next step with no wait (hit_next_offered: drafts on offer in the step after a "
    "hit), and no answer is awaited.",
    "hit rate: restarts answered with drafts at once over all restarts (the target's count); by position: the "
    "rejection's offset past the last settled position. branch_rows_per_step: branch rows beside the live rows.",
    "model_cached: costmodel.simulate_pipelined (the point's step policy, its B streams verified in one batch) fed the "
    "point's measured server step and commit transit (where longer: the transit its measured restart implies), with "
    "costmodel.verdict_terms from the cache's spec and the ranks' shares (a prediction, not a fit).",
]


AHEAD = "+ahead"          # a cache setting's suffix: the targets ask for the branches ahead (Open.branches) and wait for
                          # no answer; its server runs the spec before it


# how the call's servers place their branches (a call without it ran the geometric rule: costmodel.fanouts)
BRANCH_PLAN = ("worth: a branch at offset i on the draft's rank-r choice is worth alpha^i x the share of rejections "
               "whose correction had rank r, as the server has seen them (costmodel.fanouts)")
INLINE = "+inline"        # a setting's suffix: its server steps inline (DraftServerConfig.launch_ahead off), for the
                          # same call's comparison with its steps launched ahead (the default on a GPU)


def server_spec(cache: str) -> str:
    """The server's verdict-cache spec of a setting ('4x4x8+ahead' -> '4x4x8', 'off+inline' -> 'off')."""
    return cache.removesuffix(INLINE).removesuffix(AHEAD)


def launch_ahead_of(cache: str) -> str:
    """The server's DraftServerConfig.launch_ahead for a setting (off with INLINE, else its default)."""
    return "off" if cache.endswith(INLINE) else DraftServerConfig.launch_ahead


def ssd_label(model: str, ranks: Ranks, cache: str) -> str:
    return (f"emulated target (measured t_v of the {model} shape), pipelined streams, real draft server, verdict "
            f"cache {cache}; {ranks.label}")


def ssd_record(p: dict, recs: list, cache: str, ranks: Ranks, tv: dict, k: int) -> dict:
    """The verdict cache's figures of one point (the client's counts) and the event model with its terms."""
    if "tpot_ms" not in p:
        return p
    hits, misses = sum(r["hits"] for r in recs), sum(r["misses"] for r in recs)
    rej = {}
    for r in recs:
        for key, n in r["rejections_at"].items():
            rej[key] = rej.get(key, 0) + n
    hit_at = {key: sum(r["hits_at"].get(key, 0) for r in recs) for key in sorted(rej, key=int)}
    rows = [x for r in recs for x in r["branch_rows"]]
    p["verdict_cache"] = {"spec": cache, "ranks": ranks.spec, "restarts": sum(rej.values()), "hits": hits,
                          "misses": misses, "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
                          "hit_rate_by_position": {key: round(hit_at[key] / n, 3) for key, n in
                                                   ((key, rej[key]) for key in hit_at) if n},
                          "rejections_by_position": rej, "branch_rows_per_step": mean(rows),
                          "answer_wait_ms": mean([x for r in recs for x in r["answer_ms"]]),
                          "ahead": AHEAD in cache,             # branches sent ahead: a hit waits for no answer;
                          "hit_next_offered": mean([x for r in recs for x in r["hit_offered"]])}   # its next step
    p["model_cached"] = model_cached(p, cache, ranks, tv, k)
    return p


def fed_costs(p: dict, tv: dict, k: int) -> Costs:
    """The costs the event model is fed for a point: t_v(B, m) of its target, the server's measured device step and
    period (fed_period_ms), a transit each way (model_one_way_ms)."""
    return model_costs(tv, p["B"], k, p["draft_ms_mean"], fed_period_ms(p), model_one_way_ms(p))


def model_cached(p: dict, cache: str, ranks: Ranks, tv: dict, k: int, placed: bool = True) -> dict | None:
    """simulate_pipelined fed the point's measured server step, its transit (model_one_way_ms) and verdict_terms for
    its cache (the hit probability predicted from the ranks' shares, not the measured hit rate; placed: the server
    placed its branches by their worth, see BRANCH_PLAN), its B streams verified in one batch."""
    if not p.get("draft_ms_mean"):
        return None
    spec, B, alpha = VerdictSpec.parse(server_spec(cache)), p["B"], p["alpha"]
    c = fed_costs(p, tv, k)
    shares = ranks.shares()[:TOP]          # (TOP: outside the draft's first TOP choices, never foreseen)
    terms = (verdict_terms(alpha, spec.fanout, spec.depth, spec.budget, shares, 1.0, PIPELINED_WINDOW, placed)
             if spec.on else None)
    sim = simulate_pipelined(alpha, c, k, n_tokens=model_tokens(B), policy=p.get("step_policy", "offered"),
                             cache=terms, streams=B)
    out = {"tokens_per_round": round(sim["tokens_per_round"], 3),
           "verified_per_round": round(sim["verified_per_round"], 3),
           "speedup": round(sim["tokens_per_s"] * c.target_step / B, 3),
           "cache_hit_rate": sim["cache_hit_rate"] and round(sim["cache_hit_rate"], 3),
           "terms": terms._asdict() if terms else None}
    if p.get("tokens_per_step"):
        out["tokens_measured_over_model"] = round(p["tokens_per_step"] / out["tokens_per_round"], 3)
    return out


def start_servers(name: str, device: str, caches, g, t_end: float) -> dict:
    """One draft server process per cache setting: {cache: (process, addr, ready info)}."""
    from ...place.testbed import free_port
    ctx = mp.get_context("spawn")
    out = {}
    for cache in caches:
        addr, ready = f"tcp://127.0.0.1:{free_port()}", ctx.Queue()
        proc = ctx.Process(target=serve_random, args=(name, device, addr, ready, max(t_end - time.time(), 60)),
                           kwargs={"compile_mode": g.models_compile, "rows": g.ssd_rows,
                                   "verdict_cache": server_spec(cache), "launch_ahead": launch_ahead_of(cache),
                                   "fast_options": draft_options(device, g.draft_fast)},
                           daemon=True, name=f"draft-server-{cache}")
        proc.start()
        out[cache] = (proc, addr, ready)
    return {cache: (proc, addr, ready.get(timeout=600)) for cache, (proc, addr, ready) in out.items()}


def ssd_points(res: dict, name: str, servers: dict, pool, g, t_end: float, progress, save) -> None:
    """Every (B, N), target and ranks of the grid against each server in turn (the B=1 points first)."""
    pts, k, alpha = res["ssd"]["points"], PIPELINED_K, DRAFT_ALPHA.get(name, SSD_ALPHA)
    tvs = {}
    for model in g.ssd_targets:
        try:
            tvs[model] = big_tv(model, sorted({b for b, _ in g.ssd_points}), k)
        except ValueError as e:
            res["ssd"].setdefault("errors", []).append(f"{model}: {e}")
    seed = 500
    for b, n in g.ssd_points:
        for model, tv in tvs.items():
            for ranks_spec in g.ssd_ranks:
                seed += 1
                for cache, policy, hold in ((c, q, h) for h in g.ssd_holds for q in g.ssd_policies for c in servers):
                    into = pts if hold == g.ssd_holds[0] else res["ssd"].setdefault("hold_points", [])
                    ssd_point(into, servers[cache][1:], cache, (policy, hold), (b, n), (model, tv),
                              (ranks_spec, seed, alpha), g, pool, t_end)
                    progress(ssd_row(into[-1]))
                    save()


def ssd_point(pts: list, server: tuple, cache: str, play: tuple, bn: tuple, target: tuple, draws: tuple, g, pool,
              t_end: float) -> None:
    """One point into pts: N emulated targets of B streams each against one server (addr, ready info) under one
    step policy and hold (play: the two names); draws: (ranks spec, seed, alpha)."""
    (addr, info), (b, n), (model, tv), (ranks_spec, seed, alpha), (policy, hold) = server, bn, target, draws, play
    k = PIPELINED_K
    ranks = Ranks(ranks_spec, alpha, seed)
    label = (ssd_label(model, ranks, cache) + ("" if policy == "offered" else f"; step policy {policy}")
             + ("" if hold == HOLDS[0] else f"; commits held for the draft's token ({hold})"))
    if time.time() + g.ssd_s + 10 > t_end:
        pts.append({"label": label, "target": model, "B": b, "N": n, "skipped": "out of time"})
        return
    cmd = dict(mode="pipelined", addr=addr, B=b, k=k, tv_ms={m: tv[(b, m)] for m in range(k + 1)},
               alpha=alpha, seed=seed, vocab=info["vocab"], window=PIPELINED_WINDOW, prompt=g.prompt,
               context=g.context, ranks=ranks_spec, watch=TOP, foreseen=server_spec(cache) != "off",
               ahead=AHEAD in cache, policy=policy, hold=hold)  # (the cache's model, ssd_model, plays offered)
    try:
        ready, recs, start = pool.point(n, cmd, g.ssd_s)
        p = pipelined_record(b, n, k, alpha, ready, recs, start, tv=tv, label=label, policy=policy)
        p = ssd_record({**p, "target": model}, recs, cache, ranks, tv, k)
    except TimeoutError as e:
        p = {"label": label, "target": model, "B": b, "N": n, "error": str(e)}
    pts.append(p)


def ssd_row(p: dict) -> str:
    hold = p.get("emulation", {}).get("hold", HOLDS[0])
    head = (f"ssd {p.get('target')} B={p['B']} N={p['N']} {p.get('verdict_cache', {}).get('spec', '')} "
            f"{p.get('step_policy', '')}{'' if hold == HOLDS[0] else ' hold ' + hold}").rstrip()
    if "tpot_ms" not in p:
        return f"{head}: {p.get('error') or p.get('skipped')}"
    v, m = p["verdict_cache"], p.get("model_cached") or {}
    return (f"{head} [{v['ranks']}]: TPOT {p['tpot_ms']['mean']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} tok/s/GPU, "
            f"tokens/step {p['tokens_per_step']} (model {m.get('tokens_per_round')}), hit rate {v['hit_rate']} "
            f"(model {m.get('cache_hit_rate')}), branch rows/step {v['branch_rows_per_step']}, speedup {p.get('speedup')}")


def ssd_part(res: dict, name: str, device: str, g, t_end: float, progress, save) -> None:
    """The servers (one per cache setting), the emulated targets' processes, every point; the servers stopped."""
    from .emulated import Targets
    res["ssd"] = {"draft": name, "address": "loopback TCP", "server_rows": g.ssd_rows, "k": PIPELINED_K,
                  "window": PIPELINED_WINDOW, "caches": list(g.verdict_caches), "ranks": list(g.ssd_ranks),
                  "targets": list(g.ssd_targets), "seconds_per_point": g.ssd_s, "notes": SSD_NOTES,
                  "branch_plan": BRANCH_PLAN, "points": []}
    servers = {}
    try:
        with Targets(max(n for _, n in g.ssd_points)) as pool:
            servers = start_servers(name, device, g.verdict_caches, g, t_end)
            res["ssd"]["servers"] = {c: info for c, (_, _, info) in servers.items()}
            bad = [f"{c}: {info['error']}" for c, (_, _, info) in servers.items() if "error" in info]
            if bad:
                progress(f"draft server: {bad}")
                return
            time.sleep(0.5)
            ssd_points(res, name, servers, pool, g, t_end, progress, save)
            for line in hold_lines({"this call": res}):
                progress(line)
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.join(10)
        save()


def ssd_runs() -> dict[str, dict]:
    """The results of reports/gpu that carry an ssd part (`bench streams --verdict-cache ...`), by file stem."""
    from ..results import gpu_results
    return {n: g for n, g in gpu_results().items() if g.get("ssd", {}).get("points")}


def ssd_table(runs: dict):
    """Each ssd point, cache off beside on at the same (target, ranks, B, N): TPOT, tokens/s per GPU, tokens per
    target step against the event model's, the hit rate (measured and modelled), branch rows per step, and on's
    speedup over off."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        pts = [p for p in run["ssd"]["points"] if "tpot_ms" in p]
        key = lambda p: (p["target"], p["verdict_cache"]["ranks"], p["B"], p["N"], p.get("step_policy"))  # noqa: E731
        off = {key(p): p for p in pts if p["verdict_cache"]["spec"] == "off"}
        for p in pts:
            v, m = p["verdict_cache"], p.get("model_cached") or {}
            base = off.get(key(p))
            rows.append({"call": name, "target": p["target"], "ranks": v["ranks"], "B": p["B"], "N": p["N"],
                         "cache": v["spec"], "step policy": p.get("step_policy", "offered"),
                         "TPOT mean ms": p["tpot_ms"]["mean"], "tok/s/GPU": p["tokens_per_s_per_gpu"],
                         "tokens/step": p["tokens_per_step"], "model tokens/step": m.get("tokens_per_round"),
                         "measured / model": m.get("tokens_measured_over_model"),
                         "hit rate": v["hit_rate"], "model hit rate": m.get("cache_hit_rate"),
                         "branch rows/step": v["branch_rows_per_step"], "answer wait ms": v["answer_wait_ms"],
                         "speedup vs target-only": p.get("speedup"),
                         "on / off": round(base["tpot_ms"]["mean"] / p["tpot_ms"]["mean"], 3) if base else None})
    return pd.DataFrame(rows)


GOALS = (   # (ranks, target, B, N, what, least): the verdict cache's goals at one H200, emulated targets
    ("trace", "Qwen3-8B", 1, 1, "on / off", 1.25), ("trace", "Qwen3-8B", 1, 1, "speedup vs target-only", 1.4),
    ("trace", "Qwen3-32B", 1, 1, "on / off", 1.3), ("synthetic:0.9", "Qwen3-32B", 1, 1, "on / off", 1.6),
)


def goal_lines(runs: dict) -> list[str]:
    """Each goal's figure in each call that measured it (the cache on's best spec at the point), and each full
    server's point (rows = B * N): on's TPOT against off's, within 5% the goal."""
    t = ssd_table(runs)
    if not len(t):
        return ["no verdict-cache points"]
    on = t[t["cache"] != "off"]
    out = []
    for ranks, target, b, n, what, least in GOALS:
        sel = on[(on["ranks"] == ranks) & (on["target"] == target) & (on["B"] == b) & (on["N"] == n)]
        for call, rows in sel[sel[what].notna()].groupby("call"):
            best = rows.loc[rows[what].astype(float).idxmax()]
            fig = best[what]
            out.append(f"{call}: {target} B={b} N={n} {ranks}, {what} {fig} with {best['cache']} (goal >= {least}: "
                       f"{'met' if fig is not None and fig >= least else 'missed'}; hit rate {best['hit rate']}, "
                       f"branch rows/step {best['branch rows/step']})")
    if out:
        out.insert(0, "The verdict cache's first goals (a hit's drafts sent in the reply to the Commits; branches "
                      "sent ahead have their own goals below):")
    for name, run in runs.items():
        rows_ = run["ssd"].get("server_rows")
        full = on[(on["call"] == name) & (on["B"] * on["N"] == rows_)]
        for _, r in full.iterrows():
            out.append(f"{name}: full server ({rows_} rows) {r['target']} B={r['B']} N={r['N']} {r['ranks']}: on / off "
                       f"{r['on / off']} with {r['cache']} (goal within 5%: "
                       f"{'met' if r['on / off'] is not None and abs(r['on / off'] - 1) <= 0.05 else 'missed'})")
    return out


def hold_lines(runs: dict) -> list[str]:
    """The calls that ran points under a second hold (`--ssd-hold periods,draft`): each such point beside the same
    point under the call's first hold (the same server, moments apart): speedup, drafts on offer, commits held, and
    restarts our own tokens made where the draft's was on its way."""
    out = []
    key = lambda p: (p["target"], p["verdict_cache"]["spec"], p["verdict_cache"]["ranks"], p["B"], p["N"],  # noqa: E731
                     p.get("step_policy"))
    for name, run in runs.items():
        main = {key(p): p for p in run["ssd"]["points"] if "speedup" in p}
        for q in (q for q in run["ssd"].get("hold_points", []) if "speedup" in q and key(q) in main):
            p = main[key(q)]
            both = [(x["emulation"]["hold"], x) for x in (p, q)]
            out.append(f"{name}: {p['target']} B={p['B']} N={p['N']} {p['verdict_cache']['spec']} "
                       f"[{p.get('step_policy')}]: " + "; ".join(
                           f"hold {h}: speedup {x['speedup']}, offered {x['offered_mean']}, held commits "
                           f"{x['emulation']['held_commits']}, restarts found late {x['emulation']['restarts_found_late']}"
                           for h, x in both))
    return out


__all__ = ["fed_costs", "goal_lines", "hold_lines", "ssd_part", "ssd_runs", "ssd_table", "ssd_points", "ssd_record",
           "ssd_row", "start_servers"]

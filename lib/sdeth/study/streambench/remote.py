"""remote: a draft server in a process of its own and N emulated targets, sync rounds and pipelined streams."""
from __future__ import annotations

import multiprocessing as mp
import time

from ...costmodel import Costs, link_of_restart, simulate_pipelined
from ...metrics import ratio_ci
from ..bench.targets import DRAFT_ALPHA
from .colocated import best_k
from .common import (BATCHES, CONTEXT, PIPELINED_K, PIPELINED_LABEL, PIPELINED_WINDOW, PROMPT, REMOTE_KS,
                     REQUEST_LEAST, REMOTE_LABEL, SERVER_ROWS, TARGETS_N, TIMELINE, compiled, draft_options, mean, pct,
                     pipelined_grid)
from .emulated import Targets
from .printout import pipelined_row, remote_row
from .server import serve_random
from .target import big_tv


REQUEST_TPOT = ("each sequence's own time per output token, (last token - first token) / (tokens - 1), its first "
                "round (which waits for its prompt) giving the first token; sequences cut by the point's end counted "
                f"with {REQUEST_LEAST} tokens or more; with fewer than 100 sequences p99 is their maximum")


def remote_record(B: int, N: int, k: int, alpha: float, tv_ms: float, ready, recs, start_at: float,
                  label: str = REMOTE_LABEL) -> dict:
    """One remote point from its targets' records."""
    errs = [r["error"] for r in list(ready) + list(recs) if "error" in r]
    out = {"label": label, "B": B, "N": N, "k": k, "alpha": alpha, "t_v_ms": tv_ms, "gpus": N + 1}
    if errs:
        return {**out, "error": errs[0][:500], "trace": next(r.get("trace") for r in list(ready) + list(recs)
                                                              if "error" in r)}
    cat = lambda key: [x for r in recs for x in r[key]]  # noqa: E731
    wall = max(r["t_end"] for r in recs) - start_at
    tokens, rounds = sum(r["tokens"] for r in recs), len(cat("round_ms"))
    net = [w - h for w, h in zip(cat("wait_ms"), cat("held_ms"))]
    tv = cat("tv_over")
    return {**out, "rounds": rounds, "seconds": round(wall, 3), "tokens": tokens,
            "tokens_per_round": round(tokens / max(rounds, 1) / B, 3), "tokens_per_s": round(tokens / wall, 1),
            "tokens_per_s_per_gpu": round(tokens / wall / (N + 1), 1),
            "tokens_per_s_per_target": [round(r["tokens"] / wall, 1) for r in recs],
            "stream_tokens_min": min(n for r in recs for n in r["stream_tokens"]),
            "tpot_ms": {"p50": pct(cat("tpot_ms"), 50), "p99": pct(cat("tpot_ms"), 99),
                        "mean": round(wall * 1e3 * N * B / max(tokens, 1), 4)},
            "round_ms": {"p50": pct(cat("round_ms"), 50), "p99": pct(cat("round_ms"), 99)},
            "request_tpot_ms": {"p50": pct(cat("request_tpot_ms"), 50), "p99": pct(cat("request_tpot_ms"), 99),
                                "n": len(cat("request_tpot_ms")), "definition": REQUEST_TPOT},
            "split_ms_mean": {"client_wait": mean(cat("wait_ms")), "draft_compute": mean(cat("draft_ms")),
                              "queueing": mean(cat("queued_ms")), "server_host": mean(cat("host_ms")),
                              "network": mean(net), "server_held": mean(cat("held_ms"))},
            "split_ms_p50": {"client_wait": pct(cat("wait_ms"), 50), "draft_compute": pct(cat("draft_ms"), 50),
                             "queueing": pct(cat("queued_ms"), 50), "server_host": pct(cat("host_ms"), 50),
                             "network": pct(net, 50)},
            "server_batch": {"mean": mean(cat("batch")), "p50": pct(cat("batch"), 50), "min": min(cat("batch"), default=None),
                             "max": max(cat("batch"), default=None)},
            "new_sequence": {"count": len(cat("open_to_first_draft_ms")),
                             "open_to_first_draft_ms_p50": pct(cat("open_to_first_draft_ms"), 50),
                             "open_to_first_draft_ms_max": pct(cat("open_to_first_draft_ms"), 100),
                             "first_rounds_wait_ms_p50": pct(cat("first_wait_ms"), 50),
                             "first_rounds_wait_ms_max": pct(cat("first_wait_ms"), 100),
                             "cold_start_ms_max": max(r["cold_start_ms"] for r in ready)},
            "emulation": {"t_v_over_intended_mean": mean(tv), "t_v_over_intended_max": pct(tv, 100),
                          "t_v_over_intended_mean_per_target": [mean(r["tv_over"]) for r in recs]}}


def remote_grid(batches=BATCHES, ns=TARGETS_N, ks=REMOTE_KS, rows: int = SERVER_ROWS) -> list[tuple]:
    return [(b, n, k) for b in batches for n in ns if n * b <= rows for k in ks]


def remote_points(addr: str, pool: Targets, grid, tv: dict, alpha: float, seconds: float, vocab: int,
                  deadline: float = float("inf"), prompt: int = PROMPT, context: int = CONTEXT, progress=print,
                  save=lambda: None, label: str = REMOTE_LABEL) -> list[dict]:
    """Each (B, N, k) of the grid against the draft server at addr; points not started by `deadline` are skipped.
    With t(B) in tv ((B, 0)), each point's speedup over target-only at the same B."""
    out = []
    for i, (b, n, k) in enumerate(grid):
        if time.time() + seconds > deadline:
            out.append({"label": label, "B": b, "N": n, "k": k, "skipped": "out of time"})
            continue
        cmd = dict(addr=addr, B=b, k=k, tv_ms=tv[(b, k)], alpha=alpha, seed=i + 1, vocab=vocab, prompt=prompt,
                   context=context)
        try:
            out.append(remote_record(b, n, k, alpha, tv[(b, k)], *pool.point(n, cmd, seconds), label=label))
            if (b, 0) in tv and "tokens_per_s" in out[-1]:
                out[-1]["speedup"] = round(out[-1]["tokens_per_s"] / n / target_only(tv, b), 3)
        except TimeoutError as e:
            out.append({"label": label, "B": b, "N": n, "k": k, "error": str(e)})
        progress(remote_row(out[-1]))
        save()
    return out




MODEL_TOKENS = 6000             # the event model's tokens a point, over its streams: this many per stream up to
MODEL_STREAMS = 4               # ... this many streams, the same total beyond (a batch of 32 plays 750 a stream)


def model_tokens(B: int) -> int:
    return MODEL_TOKENS * min(B, MODEL_STREAMS)


def fed_period_ms(p: dict) -> float:
    """The draft period the event model is fed for a point: the server's period p25 (a step's own, without the
    pauses of a full window), never below its device step (mean)."""
    return max(p.get("server_period_ms_p25") or p["draft_ms_mean"], p["draft_ms_mean"])


def model_one_way_ms(p: dict) -> float:
    """The transit the event model is fed for a point: the Commit's measured way to the server, or where longer half
    the link its measured restart implies at the period the model is fed (costmodel.link_of_restart, as the targets'
    step policy reads it), so that the model's restarts take as long as the point's."""
    t, one_way = p["timeline_ms"], p["timeline_ms"]["sent_to_read"]["p50"] or 0.0
    if not t["sent_to_arrived"]["p50"] or not p.get("draft_ms_mean"):
        return one_way
    return max(one_way, link_of_restart(t["sent_to_arrived"]["p50"], fed_period_ms(p)) / 2)


def target_only(tv: dict, B: int) -> float:
    """Tokens/s of one target decoding B streams alone: B / t(B)."""
    return B / (tv[(B, 0)] / 1e3)


def model_costs(tv: dict, B: int, k: int, step_ms: float, period_ms: float, one_way_ms: float) -> Costs:
    """The costs the event model is fed: t_v(B, m) as measured, the draft's device step and period (never below the
    step), a transit each way."""
    return Costs(tv[(B, 0)] / 1e3, step_ms / 1e3, {m + 1: tv[(B, m)] / 1e3 for m in range(1, k + 1)},
                 rtt=2 * one_way_ms / 1e3, draft_period=max(period_ms, step_ms) / 1e3)


def model_of(tv: dict, B: int, k: int, alpha: float, step_ms: float, period_ms: float, one_way_ms: float,
             policy: str = "offered") -> dict:
    """costmodel.simulate_pipelined for this point: the target plays the step's policy the point ran (`policy`;
    'adaptive': one round's best rate, beside it), t_v(B, m) as measured, the server's measured step and period,
    a transit each way (model_one_way_ms); its B streams verified in one batch."""
    c = model_costs(tv, B, k, step_ms, period_ms, one_way_ms)
    sim = simulate_pipelined(alpha, c, k, n_tokens=model_tokens(B), policy=policy, streams=B)
    waits = simulate_pipelined(alpha, c, k, n_tokens=model_tokens(B), policy="adaptive", streams=B)
    return {"step_policy": policy, "verified_per_round": round(sim["verified_per_round"], 3),
            "tokens_per_round": round(sim["tokens_per_round"], 3),
            "speedup": round(sim["tokens_per_s"] * c.target_step / B, 3),
            "adaptive": {"verified_per_round": round(waits["verified_per_round"], 3),
                         "speedup": round(waits["tokens_per_s"] * c.target_step / B, 3)},
            "fed": {"step_ms": step_ms, "period_ms": period_ms, "one_way_ms": one_way_ms}}


BLOCKS = 20                     # a pipelined point's steps in this many runs of consecutive steps (its interval)


def rate_interval(recs: list[dict], blocks: int = BLOCKS) -> dict | None:
    """Tokens/s of a pipelined point with its 95% interval: each target's steps cut into `blocks` runs of
    consecutive steps (batch means: a step's tokens depend on the last), block j of every target taken together
    (their tokens over their mean time: the targets run side by side), a percentile bootstrap over the blocks."""
    n = min(len(r.get("step_ms", [])) for r in recs)
    blocks = min(blocks, n // 5)
    if blocks < 4:
        return None
    tok, sec = [0.0] * blocks, [0.0] * blocks
    for r in recs:
        m = len(r["step_ms"])
        for j in range(blocks):
            lo, hi = j * m // blocks, (j + 1) * m // blocks
            tok[j] += sum(r["step_tokens"][lo:hi])
            sec[j] += sum(r["step_ms"][lo:hi]) / 1e3 / len(recs)
    point, low, high = ratio_ci(tok, sec)
    return {"point": round(point, 1), "low": round(low, 1), "high": round(high, 1), "blocks": blocks,
            "method": "95% percentile bootstrap over runs of consecutive steps (batch means)"}


def restart_periods(out: dict) -> dict | None:
    """The restart (a Commits sent to the first draft stepped after it, at the target; a new sequence's first commit
    is not a restart: open_to_first_draft_ms holds those) in server periods: its p50 and p99 over the server's
    period p50 (the floor issue's goal: p50 <= one transit + 1.5 periods, p99 <= 3)."""
    t, period = out["timeline_ms"], out.get("server_period_ms_p50")
    if not period or not t["sent_to_arrived"]["p50"]:
        return None
    transit = t["sent_to_read"]["p50"] or 0.0
    return {"p50": round(t["sent_to_arrived"]["p50"] / period, 2), "p99": round(t["sent_to_arrived"]["p99"] / period, 2),
            "p50_less_transit": round((t["sent_to_arrived"]["p50"] - transit) / period, 2),
            "period_ms": period, "transit_ms_p50": transit}


def pipelined_record(B: int, N: int, k: int, alpha: float, ready, recs, start_at: float, tv: dict | None = None,
                     label: str = PIPELINED_LABEL, policy: str = "offered") -> dict:
    """One pipelined point from its targets' records; with tv (B, m) -> ms: the speedup over target-only and the
    event model fed this point's measured server step. policy: the step's policy the targets played (its drafts
    verified a step are `offered_mean`; the wait for them `wait_ms_mean`)."""
    errs = [r["error"] for r in list(ready) + list(recs) if "error" in r]
    out = {"label": label, "B": B, "N": N, "k": k, "window": PIPELINED_WINDOW, "alpha": alpha, "gpus": N + 1,
           "step_policy": policy}
    if errs:
        return {**out, "error": errs[0][:500]}
    cat = lambda key: [x for r in recs for x in r[key]]  # noqa: E731
    wall = max(r["t_end"] for r in recs) - start_at
    tokens, steps = sum(r["tokens"] for r in recs), len(cat("step_ms"))
    tv_over = cat("tv_over")
    out.update({"steps": steps, "seconds": round(wall, 3), "tokens": tokens,
                "tokens_per_step": round(tokens / max(steps, 1) / B, 3), "tokens_per_s": round(tokens / wall, 1),
                "tokens_per_s_per_gpu": round(tokens / wall / (N + 1), 1),
                "tpot_ms": {"p50": pct(cat("tpot_ms"), 50), "p99": pct(cat("tpot_ms"), 99),
                            "mean": round(wall * 1e3 * N * B / max(tokens, 1), 4)},
                "step_ms": {"p50": pct(cat("step_ms"), 50), "p99": pct(cat("step_ms"), 99)},
                "offered_mean": mean(cat("offered")), "accepted_mean": mean(cat("accepted")),
                "wait_ms_mean": mean([x for r in recs for x in r.get("wait_ms", [])]),
                "restarts_per_step": round(sum(r["restarts"] for r in recs) / max(steps, 1), 3),
                "server_batch": {"mean": mean(cat("batch")), "max": max(cat("batch"), default=None)},
                "draft_ms_mean": mean(cat("draft_ms")), "server_period_ms_p25": pct(cat("period_ms"), 25),
                "server_period_ms_p50": pct(cat("period_ms"), 50), "draft_ms_p50": pct(cat("draft_ms"), 50),
                "server_streams": {"live": N * B, "held_mean": mean(cat("held")),
                                   "held_max": max(cat("held"), default=None)},
                "timeline_ms": {key: {"p50": pct(cat(key), 50), "p99": pct(cat(key), 99), "n": len(cat(key))}
                                for key in TIMELINE},
                "first_drafts_late": sum(r["late"] for r in recs),
                "open_to_first_draft_ms": {"p50": pct(cat("open_to_first_ms"), 50),
                                           "max": pct(cat("open_to_first_ms"), 100), "n": len(cat("open_to_first_ms"))},
                "offered_hist": {str(m): cat("offered").count(m) for m in range(k + 1)},
                "dry_steps": {"after_own_restart": sum(r.get("dry", [0, 0])[1] for r in recs),
                              "not_after_restart": sum(r.get("dry", [0, 0])[0] for r in recs)},
                "emulation": {"t_v_over_intended_mean": mean(tv_over), "t_v_over_intended_max": pct(tv_over, 100),
                              "held_commits": sum(r.get("held_commits", 0) for r in recs),
                              "restarts_found_late": sum(r.get("restarts_late", 0) for r in recs),
                              "hold": ",".join(sorted({r.get("hold", "?") for r in recs}))}})
    out["restart_periods"] = restart_periods(out)
    out["tokens_per_s_interval"] = rate_interval(recs) if all("step_tokens" in r for r in recs) else None
    if tv is not None:
        out["speedup"] = round(tokens / wall / N / target_only(tv, B), 3)
        if out["tokens_per_s_interval"]:
            ci, base = out["tokens_per_s_interval"], N * target_only(tv, B)
            out["speedup_interval"] = [round(ci["low"] / base, 3), round(ci["high"] / base, 3)]
        if out["draft_ms_mean"]:
            m = model_of(tv, B, k, alpha, out["draft_ms_mean"], fed_period_ms(out), model_one_way_ms(out), policy)
            m["offered_measured_over_model"] = round(out["offered_mean"] / max(m["verified_per_round"], 1e-9), 3)
            m["tokens_measured_over_model"] = round(out["tokens_per_step"] / m["tokens_per_round"], 3)
            out["model"] = m
    return out


def point_seconds(g, tv: dict, b: int, n: int) -> float:
    """A pipelined point's seconds: remote_s, or long enough for about g.min_steps target steps (a step foretold
    at t_v(B, 2), the N targets' steps counted together), at most g.max_s."""
    if not g.min_steps or (b, 2) not in tv:
        return g.remote_s
    return round(min(max(g.remote_s, 1.15 * g.min_steps * tv[(b, 2)] / 1e3 / n), max(g.max_s, g.remote_s)), 1)


def pipelined_part(res, name, addr, pool, tv, vocab, g, t_end, progress, save, points=None,
                   key: str = "remote_pipelined", label: str = PIPELINED_LABEL) -> list:
    """Pipelined streams against the same draft server: each (B, N) at k = PIPELINED_K under each of the grid's
    step policies in turn (side by side: the same server, moments apart); points: those, else the grid's. The
    points go to res[key]['points'] unless key is None. Returns the points."""
    k = PIPELINED_K
    pts = []
    if key:
        res[key] = {"draft": name, "address": "loopback TCP", "k": k, "window": PIPELINED_WINDOW,
                    "step_policies": list(g.policies), "read_while_stepping": g.read_while_stepping, "points": pts}
    grid = [(b, n) for b, n in points or g.pipelined or pipelined_grid() if all((b, m) in tv for m in range(k + 1))]
    for i, (b, n) in enumerate(grid):
        seconds = point_seconds(g, tv, b, n)
        for policy in g.policies:            # (one seed a point: each policy meets the same coins)
            if time.time() + seconds + 10 > t_end:
                pts.append({"label": label, "B": b, "N": n, "k": k, "step_policy": policy, "skipped": "out of time"})
                continue
            tvb = {m: tv[(b, m)] for m in range(k + 1)}
            cmd = dict(mode="pipelined", addr=addr, B=b, k=k, tv_ms=tvb, alpha=DRAFT_ALPHA[name], seed=100 + i,
                       vocab=vocab, window=PIPELINED_WINDOW, prompt=g.prompt, context=g.context, policy=policy)
            try:
                pts.append(pipelined_record(b, n, k, DRAFT_ALPHA[name], *pool.point(n, cmd, seconds), tv=tv,
                                            label=label, policy=policy))
            except TimeoutError as e:
                pts.append({"label": label, "B": b, "N": n, "k": k, "step_policy": policy, "error": str(e)})
            progress(pipelined_row(pts[-1]))
            save()
    return pts


def big_part(res, name, addr, pool, vocab, g, t_end, progress, save) -> None:
    """The bigger targets, emulated from their measured t_v (bench targets), pipelined and sync at g.big_points."""
    out = res["big_targets"] = {}
    for model in g.big_targets:
        try:
            tv = big_tv(model, sorted({b for b, _ in g.big_points}), PIPELINED_K)
        except ValueError as e:
            out[model] = {"error": str(e)}
            progress(f"{model}: {e}")
            continue
        part = out[model] = {"t_v_ms": {f"{b},{m}": v for (b, m), v in tv.items()}, "pipelined": [], "sync": []}
        label = f"emulated target (measured t_v of the {model} shape), pipelined streams, real draft server"
        part["pipelined"] = pipelined_part(res, name, addr, pool, tv, vocab, g, t_end, progress, save,
                                           points=g.big_points, key=None, label=label)
        grid = [(b, n, 3) for b, n in g.big_points] if g.sync else []
        part["sync"] = remote_points(addr, pool, grid, tv, DRAFT_ALPHA[name], g.remote_s, vocab, t_end - 10,
                                     g.prompt, g.context, progress, save,
                                     label=f"emulated target (measured t_v of the {model} shape), real draft server")
        save()


def start_server(name: str, device: str, g, t_end: float):
    """The draft server (serve_random: the draft shape, random weights) in a process of its own, started, on a free
    loopback port, serving until t_end (at least 60 s): (process, address, the queue its ready info comes on)."""
    from ...place.testbed import free_port
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    server = ctx.Process(target=serve_random, args=(name, device, addr, ready, max(t_end - time.time(), 60)),
                         kwargs={"compile_mode": g.models_compile, "read_while_stepping": g.read_while_stepping,
                                 "fast_options": draft_options(device, g.draft_fast)},
                         daemon=True, name="draft-server")
    server.start()
    return server, addr, ready


def remote_part(res, name, device, tv, g, t_end, progress, save) -> None:
    """The draft server in a process of its own and the emulated targets' processes; every grid point."""
    grid = remote_grid(g.remote_batches, g.remote_ns, g.remote_ks) if g.sync else []
    missing = sorted({(b, k) for b, _, k in grid} - tv.keys())
    if missing:
        raise ValueError(f"remote points {missing} (B, k) have no measured t_v: measure those in the target part")
    server, addr, ready = start_server(name, device, g, t_end)
    out = res["remote"] = {"draft": name, "address": "loopback TCP", "server_rows": SERVER_ROWS,
                           "compile": compiled(g), "points": []}
    try:
        with Targets(max([n for _, n, _ in grid] + [n for _, n in g.pipelined or pipelined_grid()]
                         + [n for _, n in g.big_points])) as pool:
            info = ready.get(timeout=600)
            out["server"] = info
            if "error" in info:
                progress(f"draft server: {info['error']}")
                return
            time.sleep(0.5)                      # the server binds after it says ready
            pipelined_part(res, name, addr, pool, tv, info["vocab"], g, t_end, progress, save)
            out["points"] = remote_points(addr, pool, grid, tv, DRAFT_ALPHA[name], g.remote_s, info["vocab"],
                                          t_end - 10, g.prompt, g.context, progress=progress, save=save)
            out["best_k"] = best_k([p for p in out["points"] if "tpot_ms" in p], by=("B", "N"))
            big_part(res, name, addr, pool, info["vocab"], g, t_end, progress, save)
    finally:
        server.terminate()
        server.join(10)
        save()

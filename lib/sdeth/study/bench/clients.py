"""The draft server studied (notebooks/25_draft_server): many target clients through one draft, on the CPU
testbed with real weights, and the H200 figures of `python -m sdeth bench streams` set on the TPOT Pareto axes.

CPU (measured): `interleaved_clients` starts a draft server over the pair's draft and `clients` target
clients, each its own connection and target engine in its own thread, decoding its share of the prompts
through the shared draft; each output is checked against target-only on the same engine, and the server's
steps say how many sequences shared each one.
"""
from __future__ import annotations

import statistics
import threading
import time

from ... import hardware
from ...place.testbed import free_port
from ...runtime import make_engine
from ...runtime.loop import generate_sd, generate_target_only
from ...runtime.verify import Sampling
from ...wire import protocol
from ...wire.draft_client import DraftServerClient, ServerDraft
from ...wire.draft_server import DraftServer, DraftServerConfig, pair_server
from ...wire.transport import Log
from ..config import RunConfig, encode_prompts


class KeptLog(Log):
    """A server log kept in a list (a server in a notebook's own process would print into its cells)."""

    def __init__(self, who: str):
        super().__init__(who)
        self.lines: list[str] = []

    def line(self, text: str, peer: str = "") -> None:
        self.lines.append(f"{peer + ': ' if peer else ''}{text}")


def start_server(pair, rows: int = 8, capacity: int = 1024, seconds: float = 3600) -> tuple[DraftServer, str]:
    """A draft server over the pair's draft in a thread of this process, on a free loopback port (its log kept
    in server.log.lines)."""
    server = pair_server(pair, DraftServerConfig(rows=rows, capacity=capacity))
    server.log = KeptLog("draft server")
    addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": seconds}, daemon=True,
                     name="draft-server").start()
    time.sleep(0.3)
    return server, addr


def _client(addr: str, pair, me: protocol.Welcome, shares: list, k: int, max_tokens: int, s: Sampling) -> list:
    """One target client: its own connection and target engine; SD through the server, then target-only."""
    hello = protocol.Hello(protocol.PROTOCOL_VERSION, "target", pair.config.target, pair.vocab_size,
                           me.tokenizer_sha, me.dtype)
    c = DraftServerClient(addr, hello, timeout_s=60)
    eng = make_engine(pair.target, "target", "target", vocab=pair.vocab_size)
    sd, out, eos = ServerDraft(c, s), [], pair.tokenizer.eos_token_id
    for pid, ids in shares:
        r = generate_sd(eng, sd, ids, max_tokens, k, s, eos, prompt_id=pid)
        waits = (c.last.wait_ms, c.last.held_ms)
        sd.end()
        ref = generate_target_only(eng, ids, max_tokens, s, eos, prompt_id=pid)
        out.append({"prompt": pid, "identical": r.output_ids == ref.output_ids, "tokens": len(r.output_ids),
                    "rounds": r.rounds, "accepted": r.accepted_tokens, "drafted": r.draft_tokens,
                    "tpot_ms": r.tpot_ms, "target_only_tpot_ms": ref.tpot_ms,
                    "last_wait_ms": waits[0], "last_held_ms": waits[1]})
    c.close()
    return out


def interleaved_clients(pair, clients: int = 4, prompts: str = "sharegpt:8", max_tokens: int = 32, k: int = 3,
                        rows: int = 8) -> dict:
    """`clients` targets decode their shares of `prompts` at once through one draft server (greedy): each
    output against target-only, and how many sequences shared the server's steps. Measured, this machine."""
    if not 1 <= clients <= rows:
        raise ValueError(f"clients={clients}: use 1 to rows={rows} (one sequence per client at a time)")
    server, addr = start_server(pair, rows)
    encoded = encode_prompts(RunConfig(prompts=prompts, max_tokens=max_tokens), pair.tokenizer)
    results, errors = {}, []

    def run(i: int) -> None:
        try:
            results[i] = _client(addr, pair, server.welcome, encoded[i::clients], k, max_tokens, Sampling())
        except Exception as e:        # reported below, with the client
            errors.append(f"client {i}: {type(e).__name__}: {e}")
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    reqs = [dict(r, client=i) for i in range(clients) for r in results[i]]
    batches = list(server.batches)
    return {"hardware": hardware.describe("cpu"), "kind": "measured",
            "settings": {"pair": pair.config.name, "target": pair.config.target, "draft": pair.config.draft,
                         "clients": clients, "prompts": prompts, "max_tokens": max_tokens, "k": k, "rows": rows,
                         "temperature": 0.0},
            "identical": all(r["identical"] for r in reqs), "requests": reqs, "wall_s": time.perf_counter() - t0,
            "server": {"steps": server.steps, "sequences_per_step_mean": statistics.fmean(batches) if batches else 0,
                       "sequences_per_step_max": max(batches, default=0),
                       "steps_by_sequences": {n: batches.count(n) for n in sorted(set(batches))},
                       "sequences_left": server.drafter.held()},
            "server_log": server.log.lines[-50:]}


def client_table(run: dict):
    """interleaved_clients' requests as a table (one row per request)."""
    import pandas as pd
    cols = ["client", "prompt", "identical", "tokens", "rounds", "accepted", "drafted", "tpot_ms", "target_only_tpot_ms"]
    return pd.DataFrame(run["requests"])[cols]


# ------------------------------------------------------------------ the H200 figures on the Pareto axes

def bench_runs() -> dict[str, dict]:
    """The `bench streams` results of reports/gpu (bench_streams_*.json), by file stem; a call that stopped part
    way (a name with 'partial') and one a later call superseded (its JSON says why) are left out."""
    from ..results import gpu_results
    return {n: g for n, g in gpu_results().items()
            if g.get("bench") == "streams" and "partial" not in n and "superseded" not in g}


def tables_of(run: dict):
    """pareto.Tables from one `bench streams` call: t(B) and t_v(B, k) of the target (graph replays), the
    draft's batch step at the run's context; rtt: the loopback network share the remote points measured."""
    from ..predict import pareto
    pts = run["target"]["points"]
    draft = run["settings"]["drafts"][0]
    part = next(p for p in run["draft_step"] if p.get("draft") == draft and "points" in p)
    ctx = run["settings"]["context"]
    net = [p["split_ms_p50"]["network"] for p in run.get("remote", {}).get("points", []) if "split_ms_p50" in p]
    shape = run["settings"]["shapes"][run["settings"]["target"]]
    return pareto.Tables(
        {p["B"]: p["replay_ms"] / 1e3 for p in pts if not p["k"] and "replay_ms" in p},
        {(p["B"], p["k"]): p["replay_ms"] / 1e3 for p in pts if p["k"] and "replay_ms" in p},
        {p["B"]: p["step_ms"] / 1e3 for p in part["points"] if p["context"] == ctx},
        shape["num_hidden_layers"], rtt_s=max(statistics.median(net), 0.0) / 1e3 if net else 0.0,
        source=f"measured: {run['hardware'].get('label', 'one GPU')}, random weights")


def _measured(kind: str, label: str, p: dict, n: int, gpus: int) -> dict:
    return {"kind": kind, "B": p["B"], "N": n, "k": p["k"], "tpot_ms": p["tpot_ms"]["mean"],
            "tpot_p99_ms": p["tpot_ms"]["p99"], "tok_s_per_gpu": p["tokens_per_s_per_gpu"], "gpus": gpus,
            "label": label}


def pareto_rows(run: dict, alpha: float) -> list[dict]:
    """Every point of one call on the Pareto axes: replicas (measured t(B)), colocated SD, remote shared SD with
    sync rounds and with pipelined streams (emulated targets against the real draft server), all measured; and
    EAGLE-3 (modelled from the measured t(B): pareto.eagle_points)."""
    from ..predict import pareto
    t = tables_of(run)
    hw = run["hardware"].get("label", "one GPU")
    rows = [dict(r, label=f"target-only replicas (measured t(B), {hw})") for r in pareto.replica_points(t)]
    for part in run.get("colocated", [])[:1]:
        rows += [_measured("colocated", f"colocated SD, {part['draft']} shape (measured, one GPU)", p, 1, 1)
                 for p in part["points"] if "tpot_ms" in p]
    for key, kind, what in (("remote", "remote", "sync rounds"), ("remote_pipelined", "pipelined", "pipelined streams")):
        pts = [p for p in run.get(key, {}).get("points", []) if "tpot_ms" in p]
        rows += [_measured(kind, f"remote shared SD, {what} (emulated targets, real draft server)", p, p["N"],
                           p["N"] + 1) for p in pts]
    rows += pareto.eagle_points(t)
    return rows


def cpu_line(run: dict) -> str:
    """interleaved_clients in a sentence."""
    s, srv = run["settings"], run["server"]
    same = sum(r["identical"] for r in run["requests"])
    return (f"{s['clients']} clients, {len(run['requests'])} requests ({s['prompts']}, {s['max_tokens']} tokens, k={s['k']}, "
            f"greedy) through one draft server on {run['hardware'].get('label', 'this machine')}: {same} of "
            f"{len(run['requests'])} outputs identical to target-only; {srv['steps']} draft steps, "
            f"{srv['sequences_per_step_mean']:.2f} sequences a step on average (at most {srv['sequences_per_step_max']}); "
            f"{srv['sequences_left']} sequences left on the server after the clients ended")


def goal_table(runs: dict):
    """Each call's draft batch step and host time at the goal's rows, against the goals."""
    import pandas as pd
    rows = [{"call": name, **{k: v for k, v in g.items() if k != "draft"}} for name, run in runs.items()
            for g in run.get("goal_check", [])]
    return pd.DataFrame(rows)


def step_table(runs: dict, draft: str | None = None):
    """The draft's batch step (device ms) by rows and context, one column per call."""
    import pandas as pd
    out = {}
    for name, run in runs.items():
        d = draft or run["settings"]["drafts"][0]
        for part in run.get("draft_step", []):
            if part.get("draft") != d or "points" not in part:
                continue
            for p in part["points"]:
                out.setdefault((part["compile"], p["context"], p["B"]), {})[f"{name} step ms"] = p["step_ms"]
                out[(part["compile"], p["context"], p["B"])][f"{name} host ms/step"] = p.get("host_ms_per_step")
    df = pd.DataFrame(out).T
    df.index.names = ["compile", "context", "rows"]
    return df


def target_table(runs: dict):
    """The target's t(B) and t_v(B, k) (device ms, graph replays), one column per call."""
    import pandas as pd
    out = {}
    for name, run in runs.items():
        for p in run["target"]["points"]:
            out.setdefault((p["B"], p["k"] or 0), {})[name] = p.get("replay_ms")
    df = pd.DataFrame(out).T
    df.index.names = ["B", "k (0: a plain step)"]
    return df


def model_check(run: dict, alpha: float, rounds: int = 600) -> "object":
    """Each measured remote point beside the event model's prediction from the same call's measured steps (sync
    rounds: pareto.simulate_shared; pipelined streams: pareto.pipelined_round), and whether it is within 15%."""
    import pandas as pd
    from ..predict import pareto
    t = tables_of(run)
    rows = []
    for p in (p for p in run.get("remote", {}).get("points", []) if "tpot_ms" in p):
        sim = pareto.simulate_shared(t, alpha, p["k"], p["B"], p["N"], rounds=rounds)
        rows.append({"mode": "sync rounds", "B": p["B"], "N": p["N"], "k": p["k"],
                     "measured TPOT ms": p["tpot_ms"]["mean"], "model TPOT ms": sim["tpot_ms_mean"],
                     "measured tok/s/GPU": p["tokens_per_s_per_gpu"], "model tok/s/GPU": sim["tok_s_per_gpu"]})
    for p in (p for p in run.get("remote_pipelined", {}).get("points", []) if "tpot_ms" in p):
        T, m = pareto.pipelined_round(t, alpha, p["k"], p["B"], p["N"])
        tpot = T / pareto.expected_tokens(alpha, m) * 1e3
        rows.append({"mode": "pipelined streams", "B": p["B"], "N": p["N"], "k": p["k"],
                     "measured TPOT ms": p["tpot_ms"]["mean"], "model TPOT ms": tpot,
                     "measured tok/s/GPU": p["tokens_per_s_per_gpu"],
                     "model tok/s/GPU": p["N"] * p["B"] / (tpot / 1e3) / (p["N"] + 1)})
    df = pd.DataFrame(rows)
    if len(df):
        df["model / measured (TPOT)"] = df["model TPOT ms"] / df["measured TPOT ms"]
        df["within 15%"] = (df["model / measured (TPOT)"] - 1).abs() <= 0.15
    return df


def answer(runs: dict, alpha: float) -> dict:
    """pareto.answer for each call (its own measured t(1) as the reference), with the call's compile setting and
    the pipelined streams' drafts on offer per target step (mean over its points)."""
    from ..predict import pareto
    out = {}
    for name, run in runs.items():
        rows = pareto_rows(run, alpha)
        t1 = tables_of(run).t(1) * 1e3
        offered = [p["offered_mean"] for p in run.get("remote_pipelined", {}).get("points", []) if "offered_mean" in p]
        out[name] = {"t1_ms": t1, "hardware": run["hardware"].get("label"), "compile": run["settings"]["compile"],
                     "pipelined_offered_per_step": statistics.fmean(offered) if offered else None,
                     "at_t1": {k: pareto.throughput_at([r for r in rows if r["kind"] == k], t1) for k in pareto.KINDS},
                     **pareto.answer(rows, t1)}
    return out


def compiled_calls(ans: dict) -> list[str]:
    """The calls whose models ran compiled (as the draft server is meant to run on a GPU), oldest first."""
    return sorted(n for n, a in ans.items() if not str(a.get("compile", "")).startswith("none"))


def answer_lines(ans: dict) -> str:
    """The answer in words, each call on its own line."""
    def x(v):
        return f"{v:.2f}x" if v is not None else "n/a"

    def tps(v):
        return f"{v:.0f}" if v is not None else "unreachable"
    lines = []
    for name, a in ans.items():
        thr = a["tok_s_per_gpu"]
        cross = {k: v["tpot_ms"] for k, v in a["replicas_win_above_ms"].items()}
        lines.append(
            f"{name} ({a['hardware']}, compile {a['compile']}, t(1) {a['t1_ms']:.2f} ms): at TPOT <= {a['tpot_budget_ms']:.2f} ms (0.9 t(1)), "
            f"tokens/s per GPU: replicas {tps(thr['replica'])}, colocated SD {tps(thr['colocated'])}, remote sync "
            f"{tps(thr['remote'])}, remote pipelined {tps(thr['pipelined'])}, EAGLE-3 (modelled) {tps(thr['eagle3'])}; "
            f"remote pipelined / colocated {x(a['pipelined_over_colocated'])}, remote sync / colocated "
            f"{x(a['remote_over_colocated'])}; replicas give more tokens/s per GPU above TPOT "
            + ", ".join(f"{k} {v:.2f} ms" if v is not None else f"{k}: never" for k, v in cross.items())
            + (f"; pipelined streams found {a['pipelined_offered_per_step']:.2f} drafts on offer per target step"
               if a.get("pipelined_offered_per_step") is not None else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------ the fixed server's calls (timeline, big targets)

def server_runs(latest: int = 2) -> dict[str, dict]:
    """The newest `latest` complete `bench streams` calls of the server with the stream timeline (reports/gpu/
    bench_streams_server_*.json, partial and superseded calls left out), by file stem, oldest first (0: all)."""
    runs = sorted(((g.get("call", 0), n, g) for n, g in bench_runs().items() if n.startswith("bench_streams_server_")),
                  key=lambda x: (x[0], x[1]))
    return {n: g for _, n, g in runs[-latest if latest else 0:]}


def pipelined_table(runs: dict):
    """Each call's pipelined points (emulated Qwen3-8B targets): drafts on offer per target step against the event
    model fed the point's measured server step (never waiting, as the emulated target; 'adaptive': the runtime's
    policy), the speedup over target-only, the server's streams held against the live ones, and the timeline's
    p50 gaps (ms)."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        for p in (p for p in run.get("remote_pipelined", {}).get("points", []) if "tpot_ms" in p):
            t, m = p["timeline_ms"], p.get("model", {})
            rows.append({"call": name, "B": p["B"], "N": p["N"], "offered": p["offered_mean"],
                         "model offered": m.get("verified_per_round"), "tokens/step": p["tokens_per_step"],
                         "speedup": p.get("speedup"), "model speedup": m.get("speedup"),
                         "model speedup (adaptive)": m.get("adaptive", {}).get("speedup"),
                         "held max / live": f"{p['server_streams']['held_max']} / {p['server_streams']['live']}",
                         "sent->read": t["sent_to_read"]["p50"], "read->stepped": t["read_to_stepped"]["p50"],
                         "stepped->arrived": t["stepped_to_arrived"]["p50"], "sent->arrived": t["sent_to_arrived"]["p50"],
                         "sent->arrived p99": t["sent_to_arrived"]["p99"], "server step ms": p["draft_ms_mean"],
                         "target step ms": p["step_ms"]["p50"]})
    return pd.DataFrame(rows)


def big_table(runs: dict):
    """The bigger targets (emulated from `bench targets`' t_v) through the same server: pipelined streams and sync
    rounds at each (B, N), speedup over target-only at the same B."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        for model, part in run.get("big_targets", {}).items():
            for mode in ("pipelined", "sync"):
                for p in (p for p in part.get(mode, []) if "tpot_ms" in p):
                    rows.append({"call": name, "target": model, "mode": mode, "B": p["B"], "N": p["N"], "k": p["k"],
                                 "speedup": p.get("speedup"), "TPOT mean ms": p["tpot_ms"]["mean"],
                                 "TPOT p99 ms": p["tpot_ms"]["p99"], "tok/s/GPU": p["tokens_per_s_per_gpu"],
                                 "offered": p.get("offered_mean")})
    return pd.DataFrame(rows)


def _point(pts: list, B: int, N: int) -> dict:
    return next((p for p in pts if p["B"] == B and p["N"] == N and "tpot_ms" in p), {})


def goal_lines(runs: dict, worker: dict | None = None) -> list[str]:
    """Each goal of the server-streams work with each call's figure; worker: {call stem: the draft worker's
    pipelined speedup measured in the same call}."""
    out = []
    for name, run in runs.items():
        pipe = run.get("remote_pipelined", {}).get("points", [])
        big = run.get("big_targets", {})
        sync = _point(run.get("remote", {}).get("points", []), 1, 1)
        host = [g["host_ms_per_step"] for g in run.get("goal_check", [])]
        b11 = _point(pipe, 1, 1).get("speedup")
        held = all(p["server_streams"]["held_max"] <= p["server_streams"]["live"] for p in pipe if "tpot_ms" in p)
        out.append(
            f"{name}: B=1 N=1 pipelined {b11}x (draft worker, same call: {(worker or {}).get(name, 'n/a')}x); "
            f"8B B=4 N=4 {_point(pipe, 4, 4).get('speedup')}x (goal 1.25x); Qwen3-32B B=1 N=4 "
            f"{_point(big.get('Qwen3-32B', {}).get('pipelined', []), 1, 4).get('speedup')}x (goal 1.8x); Qwen2.5-72B "
            f"B=1 N=4 {_point(big.get('Qwen2.5-72B', {}).get('pipelined', []), 1, 4).get('speedup')}x (goal 2.0x); "
            f"server host ms/step at 16 rows {host} (goal 0.3); sync B=1 N=1 {_sync_tpot(sync)} (goal p99 <= 2 p50); "
            f"streams held never above live: {held}")
    return out


def _sync_tpot(p: dict) -> str:
    """A sync point's TPOT: per request where the call recorded it (each sequence's own, as serving benchmarks
    count it), with the per-round figure beside it (a round's tokens over its time: spreads by the 1-4 tokens a
    round gives, so its p99 is a one-token round)."""
    t, r = p.get("tpot_ms", {}), p.get("request_tpot_ms")
    per_round = f"per round p50 {t.get('p50')} / p99 {t.get('p99')} ms"
    if not r or not r.get("n"):
        return "TPOT " + per_round
    tail = "p99" if r["n"] >= 100 else f"max (p99 needs 100 sequences, not {r['n']})"
    return f"TPOT per request p50 {r['p50']} / {tail} {r['p99']} ms over {r['n']} sequences ({per_round})"


def sync_lines() -> list[str]:
    """The long sync-rounds calls (reports/gpu/bench_streams_sync_*.json, bench "streams-sync": B=1 N=1 for about
    a minute, about 100 sequences): the per-request TPOT's p50 and tail. The largest of n values bounds their p99
    from above, so a largest within 2x of the p50 shows the p99 goal."""
    from ..results import gpu_results
    out = []
    for name, run in sorted(gpu_results().items()):
        p = _point(run.get("remote", {}).get("points", []), 1, 1) if run.get("bench") == "streams-sync" else {}
        r = p.get("request_tpot_ms") or {}
        if r.get("n"):
            out.append(f"{name} ({run['hardware'].get('label', '?')}, {run['settings']['grid']['remote_s']:g} s): sync "
                       f"B=1 N=1 {_sync_tpot(p)}; largest / p50 {r['p99'] / r['p50']:.2f} (goal p99 <= 2 p50)")
    return out


def worker_speedups() -> dict[str, float]:
    """The draft worker's pipelined speedup (`bench sd --emulate-target`) measured in each server call, by that
    call's stem (reports/gpu/bench_sd_emulated_worker_<call>.json)."""
    from ..results import gpu_results
    out = {}
    for n, g in gpu_results().items():
        if n.startswith("bench_sd_emulated_worker_"):
            row = next((r for r in g.get("rows", []) if r["mode"] == "pipelined"), None)
            if row:
                out[f"bench_streams_server_{n.rsplit('_', 1)[-1]}"] = round(row["speedup"], 3)
    return out


def per_cost(rows: list[dict], draft_price: float = 1.0) -> list[dict]:
    """Pareto rows per unit of GPU price: a target GPU costs 1, the draft server's GPU `draft_price` (1: the same
    GPU). Remote rows (N targets + 1 draft GPU) count N + draft_price; the others their own GPUs. Adds
    tok_s_per_cost; tok_s_per_gpu is kept."""
    out = []
    for r in rows:
        cost = r["N"] + draft_price if r["kind"] in ("remote", "pipelined") else r["gpus"]
        out.append({**r, "cost": cost, "tok_s_per_cost": r["tok_s_per_gpu"] * r["gpus"] / cost})
    return out


def cost_table(run: dict, alpha: float, budgets_ms=(5.0, 6.0, 8.0, 12.0), prices=(1.0, 0.5)):
    """The most tokens/s per unit of GPU price at TPOT <= each budget, per kind, for each draft-GPU price ratio."""
    import pandas as pd
    from ..predict import pareto
    rows = pareto_rows(run, alpha)
    out = []
    for price in prices:
        priced = [dict(r, tok_s_per_gpu=r["tok_s_per_cost"]) for r in per_cost(rows, price)]
        for b in budgets_ms:
            out.append({"draft GPU price": price, "TPOT <= ms": b,
                        **{k: pareto.throughput_at(priced, b, k) for k in pareto.KINDS}})
    return pd.DataFrame(out)

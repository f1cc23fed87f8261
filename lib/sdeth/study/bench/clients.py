"""The draft server studied (notebooks/25_draft_server): many target clients through one draft, on the CPU
testbed with real weights (here); the H200 figures of `python -m sdeth bench streams` on the TPOT Pareto axes
(streams_pareto) and the fixed server's calls (streams_server), re-exported.

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
from ...wire.draft_client import DraftServerClient
from ...wire.draft_handles import ServerDraft
from ...wire.draft_server import DraftServer, DraftServerConfig, pair_server
from ...wire.transport import Log
from ..config import RunConfig, encode_prompts
from .streams_pareto import (answer, answer_lines, bench_runs, compiled_calls, cost_table,  # noqa: F401
                             goal_table, model_check, pareto_rows, per_cost, step_table, tables_of, target_table)
from .streams_server import (big_table, goal_lines, pipelined_table, server_runs, sync_lines,  # noqa: F401
                             worker_speedups)


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


def cpu_line(run: dict) -> str:
    """interleaved_clients in a sentence."""
    s, srv = run["settings"], run["server"]
    same = sum(r["identical"] for r in run["requests"])
    return (f"{s['clients']} clients, {len(run['requests'])} requests ({s['prompts']}, {s['max_tokens']} tokens, k={s['k']}, "
            f"greedy) through one draft server on {run['hardware'].get('label', 'this machine')}: {same} of "
            f"{len(run['requests'])} outputs identical to target-only; {srv['steps']} draft steps, "
            f"{srv['sequences_per_step_mean']:.2f} sequences a step on average (at most {srv['sequences_per_step_max']}); "
            f"{srv['sequences_left']} sequences left on the server after the clients ended")

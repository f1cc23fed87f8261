"""What would change the answer: per target size, the acceptance alpha above which remote SD beats colocated SD
(a lower TPOT), from the cost and event models fed the components the H200 calls measured.

One harness for all three options (the bigger targets' stream rows: no prefill, no target host work): the target's
decode step t_v(1, 0) and verify times t_v(1, k) (`bench streams`, graph replays); colocated SD, k draft steps of
the draft shape measured beside that target (`bench targets`) then the verify, in series, with its measured per-round
overhead (costmodel.speedup); remote sync, the same round plus the round trip and the server's host work the stream
points measured; remote pipelined, the event model (costmodel.simulate_pipelined) fed the server's step, period and
one-way transit the same points measured. The 8B row takes every component from its own `bench sd` call.

    python -m sdeth.study.predict.crossover          # writes reports/crossover.json (seconds, no device)
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ... import costmodel
from ...paths import REPO
from ..results import SERVER_STREAMS

ALPHAS = [round(0.30 + 0.01 * i, 2) for i in range(70)]     # 0.30 .. 0.99
SD_8B = "reports/gpu/bench_sd_1.7b.json"
BIG_TARGETS = tuple(f"reports/gpu/bench_targets_{n}.json" for n in (1, 2, 3))
BIG = {"32B": ("Qwen3-32B", "bf16"), "72B-class": ("Qwen2.5-72B", "fp8")}


def _load(rel: str) -> dict | None:
    p = REPO / rel
    return json.loads(p.read_text()) if p.exists() else None


def _costs(d: dict, **kw) -> costmodel.Costs:
    fields = {k: d[k] for k in ("target_step", "draft_step", "rtt", "overhead") if d.get(k) is not None}
    return costmodel.Costs(**{"rtt": 0.0, "overhead": 0.0, **fields, **kw,
                              "verify_s": {int(m): v for m, v in (kw.get("verify_s") or d["verify_s"]).items()}})


def curves(col: costmodel.Costs, sync: costmodel.Costs, pipe: costmodel.Costs, k: int, k_max: int) -> dict:
    """Speedup over the target alone at each alpha of ALPHAS, per option."""
    return {"colocated SD": [round(costmodel.speedup(a, k, col), 4) for a in ALPHAS],
            "remote sync": [round(costmodel.speedup(a, k, sync), 4) for a in ALPHAS],
            "remote pipelined": [round(costmodel.pipelined_speedup(a, pipe, k_max, n_tokens=4000), 4) for a in ALPHAS]}


def above(curve: list[float], col: list[float]) -> float | None:
    """The smallest alpha from which the curve stays above colocated's to 0.99; None: not within the grid."""
    for i in range(len(ALPHAS)):
        if all(c > o for c, o in zip(curve[i:], col[i:])):
            return ALPHAS[i]
    return None


def _row(name: str, col, sync, pipe, k: int, k_max: int, sources: list[str], at: float) -> dict:
    cs = curves(col, sync, pipe, k, k_max)
    i = ALPHAS.index(at)
    return {"target": name, "sources": sources, "k": k, "k_max": k_max, "alphas": ALPHAS, "speedup": cs,
            "at_measured_alpha": {"alpha": at, **{o: c[i] for o, c in cs.items()}},
            "remote_beats_colocated_above": {o: above(cs[o], cs["colocated SD"]) for o in ("remote sync",
                                                                                            "remote pipelined")},
            "components": {"colocated": col.to_dict(), "remote sync": sync.to_dict(), "remote pipelined": pipe.to_dict()}}


def row_8b() -> dict | None:
    doc = _load(SD_8B)
    if not doc:
        return None
    c = {m: doc["runs"][m]["summary"]["costs"] for m in ("colocated", "sync", "pipelined")}
    step = c["pipelined"]["target_step"]
    return _row("8B", _costs(c["colocated"], target_step=step), _costs(c["sync"], target_step=step),
                _costs(c["pipelined"]), doc["config"]["k"], doc["k_max"], [SD_8B], 0.71)


def row_big(name: str) -> dict | None:
    model, weights = BIG[name]
    calls = [(r, d) for r in SERVER_STREAMS if (d := _load(r)) and model in (d.get("big_targets") or {})]
    item = {"target": model, "target_weights": weights, "draft": "Qwen3-1.7B", "acceptance": "synthetic"}
    cols = [(r, s) for r in BIG_TARGETS for s in (_load(r) or {}).get("sd", [])
            if all(s.get(x) == v for x, v in item.items())]
    if not calls or not cols:
        return None
    (srel, sdoc), (crel, col_item) = calls[-1], cols[-1]
    big = sdoc["big_targets"][model]
    tv = {int(x.split(",")[1]) + 1: v / 1e3 for x, v in big["t_v_ms"].items() if x.startswith("1,")}  # width -> s
    sync_pt = next(p for p in big["sync"] if p["B"] == 1 and p["N"] == 1)
    pipe_pt = next(p for p in big["pipelined"] if p["B"] == 1 and p["N"] == 1)
    k = sync_pt["k"]
    own = col_item["costs"]
    col = costmodel.Costs(tv[1], own["draft_step"], tv, 0.0, own["overhead"])
    wire = (sync_pt["split_ms_mean"]["network"] + sync_pt["split_ms_mean"]["server_host"]
            + sync_pt["split_ms_mean"]["queueing"]) / 1e3
    sync = costmodel.Costs(tv[1], sync_pt["split_ms_mean"]["draft_compute"] / 1e3 / k, tv, wire, own["overhead"])
    fed = pipe_pt["model"]["fed"]
    pipe = costmodel.Costs(tv[1], fed["step_ms"] / 1e3, tv, 2 * fed["one_way_ms"] / 1e3, 0.0,
                           draft_period=fed["period_ms"] / 1e3, link_rtt=2 * fed["one_way_ms"] / 1e3)
    return _row(name, col, sync, pipe, k, pipe_pt["k"], [srel, crel], 0.71)


def main() -> dict:
    rows = [r for r in (row_8b(), *(row_big(n) for n in BIG)) if r]
    doc = {"schema": 1, "what": "modelled: remote SD against colocated SD over alpha, fed measured components",
           "kind": "modelled", "created": time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime()), "targets": rows}
    path = Path(REPO) / "reports" / "crossover.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(r["target"], r["at_measured_alpha"], r["remote_beats_colocated_above"])
    print(f"wrote {path}")
    return doc


if __name__ == "__main__":
    main()

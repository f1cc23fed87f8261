"""The floor's calls read against the event model again, from each point's measured components (the JSON holds them):
costmodel.simulate_pipelined playing the point's step policy over its B streams in one batch (one wait, one verify),
fed its target's t_v(B, m), the server's device step and period, and the transit its measured restart implies
(ssd.fed_costs). Per call: the step policy against the better corner of the same call, each point measured against
that model (the goal: within 10%; where not, the component that differs, read off the point), and per speed goal the
model of its best point under each step setting: whether the components this machine measured allow the goal.

    python -m sdeth bench streams --call N --only-ssd --verdict-cache off --ssd-policy offered,policy,sync \
        --ssd-targets Qwen3-32B,Qwen2.5-72B,Qwen3-8B --ssd-points 4:4,1:4,1:1 --ssd-rows 16 --ssd-ranks synthetic:0.9 \
        --ssd-s 5 --budget-s 400 --models-compile default --compile "" --batches 1
"""
from __future__ import annotations

from ...costmodel import simulate_pipelined
from .ahead import SPEED_GOALS
from .ranks import Ranks
from .remote import model_tokens
from .ssd import fed_costs, model_cached
from .target import big_tv

MODEL_WITHIN = 0.10      # the goal: each point's tokens a step within this of the model's
CORNERS = ("offered", "sync")


def three_policy_calls(runs: dict, last: int = 2) -> dict:
    """The newest `last` calls whose cache-off points ran the step policy beside both corners."""
    got = {n: r for n, r in runs.items()
           if {"policy", *CORNERS} <= {p.get("step_policy") for p in _off(r)}}
    return dict(sorted(got.items(), key=lambda kv: int(kv[1].get("call") or 0))[-last:])


def _off(run: dict) -> list[dict]:
    return [p for p in run["ssd"]["points"] if "tpot_ms" in p and p["verdict_cache"]["spec"] == "off"]


def _model(p: dict, k: int) -> dict:
    return model_cached(p, "off", Ranks("coins", p["alpha"], 0), big_tv(p["target"], [p["B"]], k), k)


def policy_line(name: str, run: dict) -> str:
    """The step policy against the better corner measured in the same call, less that corner's interval."""
    by: dict[tuple, dict] = {}
    for p in _off(run):
        by.setdefault((p["target"], p["B"], p["N"]), {})[p["step_policy"]] = p
    by = {key: g for key, g in by.items() if "policy" in g and any(c in g for c in CORNERS)}
    met, short = 0, []
    for (target, b, n), g in by.items():
        best = max((g[c] for c in CORNERS if c in g), key=lambda p: p["speedup"])
        low = (best.get("speedup_interval") or [best["speedup"]])[0]
        if g["policy"]["speedup"] >= low:
            met += 1
        else:
            short.append(f"{target} B={b} N={n}: {g['policy']['speedup']} against {best['step_policy']} "
                         f"{best['speedup']} [{low}, ...]")
    return (f"{name}: the step policy >= the better corner less its interval at {met} of {len(by)} points"
            + (f"; short: {'; '.join(short)}" if short else ""))


def model_line(name: str, run: dict) -> str:
    """Each point's tokens a step over the model's; the points outside MODEL_WITHIN named with what differs."""
    k, inside, outside = run["ssd"]["k"], 0, []
    pts = [p for p in _off(run) if p.get("draft_ms_mean") and p.get("tokens_per_step")]
    for p in pts:
        m = _model(p, k)
        r = p["tokens_per_step"] / m["tokens_per_round"]
        if abs(r - 1) <= MODEL_WITHIN:
            inside += 1
            continue
        held = (p.get("emulation") or {}).get("held_commits", 0)
        why = (f"{held} commits held for the draft's own token (the model takes a position not drafted as given)"
               if held > p["steps"] else f"drafts verified a step {p['offered_mean']:.2f} against the model's "
               f"{m['verified_per_round']:.2f}: the targets' wait differs")
        outside.append(f"{p['target']} B={p['B']} N={p['N']} {p['step_policy']}: {r:.3f} ({why})")
    return (f"{name}: measured within {MODEL_WITHIN:.0%} of the model at {inside} of {len(pts)} points"
            + (f"; outside: {'; '.join(outside)}" if outside else ""))


def goal_line(name: str, run: dict, target: str, b: int, n: int, goal: float) -> str | None:
    """A speed goal: the best point measured, and the model of that point under each step setting (the best of them:
    what this machine's measured components allow, within the model's own noise of about 1%)."""
    got = [p for p in _off(run) if (p["target"], p["B"], p["N"]) == (target, b, n)]
    if not got:
        return None
    p, k = max(got, key=lambda p: p["speedup"]), run["ssd"]["k"]
    c = fed_costs(p, big_tv(target, [b], k), k)
    model = {pol: simulate_pipelined(p["alpha"], c, k, n_tokens=model_tokens(b), policy=pol, streams=b)["tokens_per_s"]
             * c.target_step / b for pol in ("policy", *CORNERS)}
    best = max(model, key=model.get)
    return (f"{name}: {target} B={b} N={n}: {p['speedup']} measured [{p['step_policy']}] (goal >= {goal}: "
            f"{'met' if p['speedup'] >= goal else 'missed'}); the model of the point, fed its components (period "
            f"{c.draft_period * 1e3:.2f} ms), at most {model[best]:.3f} [{best}]: the goal is "
            f"{'within' if model[best] >= goal else 'beyond'} what they allow")


def lines(runs: dict, last: int = 4) -> list[str]:
    """policy_line, model_line and each speed goal's goal_line of the newest `last` calls that ran the three."""
    out = []
    for name, run in three_policy_calls(runs, last).items():
        out += [policy_line(name, run), model_line(name, run)]
        out += [x for g in SPEED_GOALS if (x := goal_line(name, run, *g))]
    return out

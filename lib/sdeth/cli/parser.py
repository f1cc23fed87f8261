"""The command line's reference: `python -m sdeth`'s parser, every subcommand and flag (the worker and the benches
with their own parsers aside: cli.worker, study.bench.*, study.streambench, study.vllm.study)."""
from __future__ import annotations

import argparse
import sys

BENCH_MODES = "target-only,colocated,sync,adaptive,pipelined,cached"     # bench sd and rtt's --modes by default


def _bool_switch(v: str) -> bool:
    if v.lower() in ("on", "true", "1", "yes"):
        return True
    if v.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{v!r}: use on or off")


class Renamed(argparse.Action):
    """A flag's old name, kept for one release: it sets the new flag's value and says the new name on stderr."""

    def __init__(self, option_strings, dest, new: str = "", **kw):
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kw)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is now {self.new} (the old name goes in the next release)",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed(ap, old: str, new: str, **kw) -> None:
    """`old` as a kept name of the flag `new` (already added, same dest): type and nargs in kw as new's."""
    ap.add_argument(old, dest=new.lstrip("-").replace("-", "_"), action=Renamed, new=new, **kw)


def build_parser() -> argparse.ArgumentParser:
    from ..study.config import RunConfig
    rc = RunConfig()                # run's and bench's defaults: a run configuration's
    ap = argparse.ArgumentParser(prog="sdeth", description="Speculative decoding over Ethernet: runtime and study")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode a prompt set, target-only or speculative, and write a results JSON")
    r.add_argument("--pair", default=rc.pair, help="model pair preset (sdeth.models.presets.PAIRS)")
    r.add_argument("--target", help="override the preset's target (hub id or local dir)")
    r.add_argument("--draft", help="override the preset's draft (hub id or local dir)")
    r.add_argument("--mode", default=rc.mode, choices=["target-only", "sd", "pipelined"],
                   help="sd: synchronous rounds; pipelined: the draft streams ahead while the target verifies "
                        "(placement ethernet)")
    r.add_argument("--k", type=int, default=rc.k, help="speculative tokens per round (the most, if adaptive/pipelined)")
    r.add_argument("--adaptive", type=_bool_switch, metavar="on|off",
                   help="choose k per round from measured alpha and costs (default: on for pipelined, off for sd)")
    r.add_argument("--policy", default=rc.policy, help="pipelined: the step's policy, policy (long-run tokens/s; the "
                   "default when adaptive), sync (always wait for k), offered (go with what is on offer), adaptive "
                   "(one round's rate) or fixed (the default when not adaptive)")
    r.add_argument("--rtt-sweep", metavar="MS,MS,...",
                   help="the RTT sweep (e.g. 0,0.2,1,5,20): target-only, colocated SD, then sync and pipelined SD "
                        "over the link at each round trip; prints measured and predicted speedups")
    r.add_argument("--temperature", type=float, default=rc.temperature, help="0 = greedy")
    r.add_argument("--top-p", type=float, default=rc.top_p)
    r.add_argument("--top-k", type=int, default=rc.top_k)
    r.add_argument("--draft-sampled", action="store_true", help="draft samples from q (default: greedy draft)")
    r.add_argument("--prompts", default=rc.prompts, help="sharegpt:N[:seed] or humaneval:N[:seed]")
    r.add_argument("--max-tokens", type=int, default=rc.max_tokens)
    r.add_argument("--raw-prompts", action="store_true", help="skip the chat template")
    r.add_argument("--thinking", type=_bool_switch, help="Qwen3 thinking mode on|off (default: template's)")
    r.add_argument("--seed", type=int, default=rc.seed)
    r.add_argument("--device", default=rc.device)
    r.add_argument("--placement", default=rc.placement, choices=["colocated", "ethernet"],
                   help="colocated: one process; ethernet: draft and target workers on two (namespace) nodes")
    r.add_argument("--rtt-ms", type=float, default=rc.rtt_ms, help="ethernet: injected round trip (ms), half each way")
    r.add_argument("--impl", default=rc.impl, choices=["hf", "fast"], help="model code: transformers or sdeth's fast decoder")
    r.add_argument("--cache", default=rc.cache, help="pipelined: branches ahead from the draft server's verdict cache, "
                   "off | on | auto (on needs --impl fast; auto: asked wherever the draft server drafts them, each "
                   "record says what it got and why); FANOUT[xDEPTH[xBUDGET]] is read as on (the shape is the "
                   "server's --verdict-cache)")
    r.add_argument("--max-len", type=int, default=rc.max_len, help="longest prompt + max_tokens accepted")
    r.add_argument("--json", help="write the results JSON here")
    r.add_argument("--engine", default=rc.engine, choices=["sdeth", "vllm", "vllm-server"],
                   help="sdeth (this runtime); vllm (the reference engine, offline, colocated); vllm-server (its "
                        "OpenAI-compatible server, counters scraped from /metrics)")
    sub.add_parser("worker", help="a draft or target worker process (see `python -m sdeth worker -h`)",
                   add_help=False)
    d = sub.add_parser("down", help="scale this project's Deployments in a namespace to zero (GPU nodes idle)")
    d.add_argument("--namespace", default="sdeth")
    d.add_argument("--context", help="kubeconfig context (default: the current one)")
    rd = sub.add_parser("render", help="print a placement's manifests with parameters (| kubectl apply -f -)")
    rd.add_argument("placement", help="colocated | ethernet | ethernet-curve | vllm-target-only | vllm-sd | "
                    "vllm-remote-draft | probe")
    rd.add_argument("--keys", help="ethernet-curve, vllm-remote-draft: the key directory whose keys become the Secret "
                    "sdeth-keys")
    rd.add_argument("--target-node", required=True, help="the node for the target (and, colocated, the draft)")
    rd.add_argument("--draft-node", default="", help="the draft's node (ethernet, probe)")
    rd.add_argument("--pair", help="model pair preset for the workers")
    rd.add_argument("--target-model", default="Qwen/Qwen3-8B"), rd.add_argument("--draft-model", default="Qwen/Qwen3-1.7B")
    rd.add_argument("--k", type=int, default=5, help="vLLM's num_speculative_tokens")
    rd.add_argument("--image", help="the sdeth worker image (registry/name:tag)")
    rd.add_argument("--namespace", default="sdeth")
    b = sub.add_parser("bench", help="compare decoding modes on the same requests, with 95%% intervals (JSON)")
    b.add_argument("what", choices=["sd", "step", "rtt", "draft-loop", "targets", "wire", "streams", "vllm"], help="sd: target-only, "
                   "colocated, sync, adaptive, pipelined SD; step: the decode step, lever by lever (sdeth.study."
                   "bench.step); rtt: the link modes at each added round trip (--rtts); draft-loop: the pipelined "
                   "draft's loop, phase by phase (sdeth.study.bench.draftloop); targets: bigger targets' steps and "
                   "colocated SD on one GPU (`bench targets -h`); wire: round trips plain against CURVE (`bench wire -h`); "
                   "streams: many streams, colocated and over a draft server (`bench streams -h`); vllm: vLLM target-only, its "
                   "own draft and a remote draft server through its OpenAI server (`bench vllm -h`)")
    b.add_argument("--rtts", default="0,0.2,0.5,1,2,5", help="rtt: added round trips (ms)")
    b.add_argument("--pair", default="random-qwen3-8b/1.7b")
    b.add_argument("--synthetic-alpha", type=float, default=None,
                   help="accept each draft token with this probability; -1 for real acceptance (default: 0.71 "
                   "for a random-weight pair, whose own acceptance means nothing; real acceptance otherwise)")
    b.add_argument("--trace", default=None, help="trace-driven acceptance: the draft replays this trace JSON "
                   "(e.g. reports/traces/embedded_greedy.json), scaled to --synthetic-alpha (-1: the trace's own)")
    b.add_argument("--device", default="cuda:0"), b.add_argument("--draft-device", default="cuda:1")
    b.add_argument("--impl", default="fast", choices=["hf", "fast"])
    b.add_argument("--compile", default="default", help="torch.compile mode for the fast decoder ('' = off)")
    b.add_argument("--capacity", type=int, default=1024, help="CUDA-graph cache length (tokens)")
    b.add_argument("--requests", type=int, default=16, help="requests, each its own prompt and seed")
    b.add_argument("--context", type=int, default=512, help="prompt length (random token ids)")
    b.add_argument("--max-tokens", type=int, default=128, help="generated tokens per request")
    b.add_argument("--k", type=int, default=rc.k, help="k of the fixed-k modes (colocated, sync)")
    b.add_argument("--k-max", type=int, default=8, help="the most k of adaptive and pipelined")
    b.add_argument("--modes", default=BENCH_MODES,
                   help="cached: pipelined with branches sent ahead by the batched draft server's verdict cache (a "
                   "fast-decoder draft with real acceptance; left out of the default otherwise); auto: pipelined, "
                   "asking for branches wherever the draft server has them; pipelined-sync, pipelined-offered, "
                   "pipelined-adaptive: pipelined under that step policy (pipelined: the step policy)")
    b.add_argument("--cache", default=rc.cache, help="a pipelined run's branches: off, on, auto (their shape is the "
                   "draft server's --verdict-cache; a FANOUTxDEPTH shape reads as on)")
    b.add_argument("--seed", type=int, default=rc.seed)
    b.add_argument("--json", required=True)
    b.add_argument("--draft-fast", default=rc.draft_fast, help="sd: the draft decoder's levers (FastOptions spec)")
    b.add_argument("--target-fast", default=rc.target_fast, help="sd: the target decoder's levers (scope; its numerics stay)")
    b.add_argument("--emulate-target", default=rc.target_emulate, metavar="PATH[:MODEL]", help="sd: an emulated target (no model, "
                   "synthetic answers, host-side) that takes the forward times measured in PATH's target.points, "
                   "e.g. reports/gpu/bench_streams_2.json:Qwen3-8B (needs synthetic or trace-driven acceptance)")
    b.add_argument("--models", default="Qwen3-1.7B,Qwen3-0.6B,Qwen3-8B", help="step: model shapes (random weights)")
    b.add_argument("--budget-s", type=float, default=480, help="step: start no new lever after this long")
    b.add_argument("--levers", default=None, help="step: comma list of lever names (default: all of study.bench.step's LEVERS)")
    b.add_argument("--kernels", default="", help="step: measure the fused-kernel levers instead (FastOptions kernels=, "
                   "comma list of torch,attn,gemv,all): batch 1 at --context and --kv-rows rows at --row-contexts")
    b.add_argument("--kv-rows", type=int, default=16, help="step --kernels: independent rows (cache rows) of the batched step")
    add_renamed(b, "--rows", "--kv-rows", type=int)
    b.add_argument("--row-contexts", default="512,2048", help="step --kernels: contexts of the batched rows")
    ky = sub.add_parser("keys", help="make a CURVE key directory for the link (copy it to both nodes, or make it the "
                        "Secret of the ethernet-curve placement)")
    ky.add_argument("dir", help="the directory to create (it must not hold keys already)")
    ky.add_argument("--clients", default="client", help="one key pair per named client (comma list, e.g. "
                    "target-0,target-1): each authorized, each in DIR/clients/NAME for its node alone; a draft server "
                    "keeps each client's sequences under its key (default: one pair, `client`, shared by the nodes)")
    sub.add_parser("prepare", help="prepare the embedded pair (dequantize the target, assemble the draft)")
    sk = sub.add_parser("soak", help="many short requests over the testbed with random faults; checks for leaks")
    sk.add_argument("--requests", type=int, default=2000), sk.add_argument("--seed", type=int, default=0)
    sk.add_argument("--json", default="", help="also write the figures here")
    sk.add_argument("--clients", type=int, default=1, help="1: a draft worker and a target worker; N > 1: N target "
                    "workers drafting through one draft server, each with its own controller, all at once (mode sd)")
    st = sub.add_parser("status", help="the milestones M0-M4 from the committed results, as Markdown (a milestone comment)")
    st.add_argument("--milestone", help="one milestone (M0 ... M4)")
    st.add_argument("--cluster", action="store_true", help="instead: what of ours is up on the cluster, and since when")
    st.add_argument("--namespace", default="sdeth"), st.add_argument("--context", default=None)
    rp = sub.add_parser("reap", help="scale the GPU workers to zero if the controller's Lease is stale (the CronJob's command)")
    rp.add_argument("--namespace", default="sdeth"), rp.add_argument("--context", default=None)
    rp.add_argument("--stale-minutes", type=float, default=15.0)
    t = sub.add_parser("trace", help="record a pair's acceptance trace (greedy, teacher forcing) for trace-driven timing")
    t.add_argument("--pair", default="embedded")
    t.add_argument("--prompts", default="sharegpt:64", help="held-out prompts (sharegpt:N[:seed], humaneval:N)")
    t.add_argument("--max-tokens", type=int, default=128, help="target tokens generated per prompt")
    t.add_argument("--out", default="reports/traces/embedded_greedy.json")
    dv = sub.add_parser("draft-variants", help="the embedded draft's alpha in other numerics and with a pruned "
                        "output layer (its token ranking is made first if missing)")
    dv.add_argument("--rank", default="lib/sdeth/assets/embedded-draft/token_rank.json")
    dv.add_argument("--prompts", default="sharegpt:256:1000", help="held-out prompts (the draft card's)")
    dv.add_argument("--out", default="reports/draft_variants_embedded.json")
    ch = sub.add_parser("chains", help="record a draft's greedy continuations from every prefix of the target's "
                        "output (what an emulated draft device replays)")
    ch.add_argument("--pair", default="embedded")
    ch.add_argument("--prompts", default="sharegpt:4")
    ch.add_argument("--max-tokens", type=int, default=32, help="the target's tokens per prompt (>= the runs' max_tokens)")
    ch.add_argument("--depth", type=int, default=17, help="draft tokens per prefix (> the pipelined window)")
    ch.add_argument("--out", required=True)
    c = sub.add_parser("calibrate", help="time a target step, a draft step and target forwards of m tokens")
    c.add_argument("--pair", default="embedded")
    c.add_argument("--context", type=int, default=256)
    c.add_argument("--device", default="cpu")
    return ap

"""One experiment = a config -> a results dict (config, hardware, requests, summary) -> JSON.

    res = run(RunConfig(mode="sd", k=3, prompts="sharegpt:8"))
    save(res, "out.json")
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict

import torch

from ... import costmodel, hardware
from ...runtime.engine import Engine, median_forward_s, prefill
from ...runtime.loop import Drafter, generate_sd, generate_target_only
from ...runtime import make_engine
from ..config import SCHEMA, ConfigError, RunConfig, encode_prompts, save  # noqa: F401  (the study's API)
from ..summary import model_curves, summarize, sweep_table  # noqa: F401


def run(cfg: RunConfig, pair=None, progress: bool = True, on_testbed=None) -> dict:
    """Run every prompt of cfg.prompts through cfg.mode; returns the results dict. on_testbed: a
    running Testbed to use for placement 'ethernet' (its delay must be cfg.rtt_ms; see sweep())."""
    from tqdm.auto import tqdm
    from ...models.presets import load_pair
    cfg = cfg.check()
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    if cfg.engine == "vllm":
        from ..vllm.baseline import run_vllm
        return run_vllm(cfg, pair)
    if cfg.engine == "vllm-server":
        from ..vllm.baseline import run_vllm_server
        return run_vllm_server(cfg, pair)
    s = cfg.sampling()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
    encoded = encode_prompts(cfg, pair.tokenizer)
    bar = tqdm(encoded, desc=f"{cfg.mode} k={cfg.k} {cfg.placement}", disable=not progress)
    testbed = None
    if cfg.placement == "ethernet":
        reqs, testbed = run_requests(cfg, bar, on_testbed)
    else:
        engine_cfg = cfg.engine_config()
        target = make_engine(pair.target, "target", "target", engine_cfg, vocab=pair.vocab_size)
        drafter = Drafter(make_engine(pair.draft, "draft", "draft", engine_cfg, vocab=pair.vocab_size), s,
                          seed=cfg.seed + 1)
        if cfg.device.startswith("cuda"):      # capture (and compile) the widths before the clock runs
            target.warm(cfg.k + 1)
            drafter.engine.warm(2)
        eos = pair.tokenizer.eos_token_id
        est = costmodel.AdaptivePolicy()       # adaptive k: learns over the whole run
        reqs = []
        for pid, ids in bar:
            if cfg.mode == "target-only":
                r = generate_target_only(target, ids, cfg.max_tokens, s, eos, gen, pid)
            else:
                r = generate_sd(target, drafter, ids, cfg.max_tokens, cfg.k, s, eos, gen, pid,
                                est if cfg.adapts else None)
            reqs.append(asdict(r))
    return {"schema": SCHEMA, "config": {**asdict(cfg), "pair_resolved": pair.describe()},
            "hardware": hardware.describe(cfg.device), "testbed": testbed,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "requests": reqs, "summary": summarize(reqs, cfg)}


def can_branch(cfg: RunConfig) -> bool:
    """Whether cfg's draft can draft branches: the batched draft server's, a fast-decoder draft with real acceptance
    (a synthetic, trace-driven or emulated draft is served one row over its engine, which cannot fork)."""
    return (cfg.impl == "fast" and cfg.synthetic_alpha is None and not cfg.synthetic_trace
            and not cfg.draft_emulate)


def testbed_for(cfg: RunConfig, **testbed_kw):
    """A two-node testbed whose workers run cfg's pair, devices and engine options (not started yet). A pipelined
    run that asks for branches (cache on or a shape) on the fast decoder, real acceptance, gets the batched draft
    server with its verdict cache on (its branches sent ahead), unless testbed_kw picks the draft's role; any other
    run the draft of one row over its engine."""
    from ...place.testbed import Testbed
    kw = dict(up_ms=cfg.rtt_ms / 2, down_ms=cfg.rtt_ms / 2, netns=cfg.netns, device=cfg.device,
              draft_device=cfg.draft_device, target=cfg.target, draft=cfg.draft, worker_config=cfg.worker_config())
    if (cfg.mode == "pipelined" and cfg.cache != "auto" and cfg.cache_spec.on and can_branch(cfg)
            and "draft_server" not in testbed_kw):         # (a caller that picks the draft's role keeps it)
        if cfg.cache != "on":
            print(f"--cache {cfg.cache}: branches come from the draft server's verdict cache now, in its own shape "
                  f"(--verdict-cache on): read as --cache on", file=sys.stderr)
        kw.update(draft_server=True, verdict_cache="on")
    return Testbed(cfg.pair, **{**kw, **testbed_kw})


def run_requests(cfg: RunConfig, prompts, testbed=None, **testbed_kw) -> tuple[list[dict], dict]:
    """Send each (id, token ids) prompt to the target worker of a two-node testbed, request i with seed
    cfg.seed + i; the testbed is started here and torn down after, unless a running one is passed in.
    Returns (request records, the testbed's description)."""
    from contextlib import nullcontext
    from ...wire import protocol
    from ...wire.auth import Keys
    from ...wire.transport import Client
    reqs = []
    with nullcontext(testbed) if testbed is not None else testbed_for(cfg, **testbed_kw) as tb:
        # a request's whole decode; SDETH_CLIENT_TIMEOUT (seconds) overrides it, e.g. to see a stall sooner
        client = Client(tb.target_addr, timeout_s=float(os.environ.get("SDETH_CLIENT_TIMEOUT", 60 + 5 * cfg.max_tokens)),
                        decode=protocol.Decoder("a controller", protocol.TARGET_SENDS), gone_fast=True,
                        keys=Keys.from_env())     # $SDETH_KEYS: CURVE, as the workers (which inherit it) use
        try:
            for i, (pid, ids) in enumerate(prompts):
                t_sent = time.time()
                client.send(protocol.Generate(pid, ids, cfg.max_tokens, cfg.mode, cfg.k, cfg.adapts, seed=cfg.seed + i,
                                              cache=cfg.branch_cache(), policy=cfg.step_policy,
                                              **protocol.sampling_fields(cfg)))
                reply = _await_reply(client, tb, pid)
                if isinstance(reply, protocol.Error):
                    raise ConfigError(f"target worker failed on {pid}: {reply.message}\n{tb.log('target')[-1500:]}")
                rec = reply.record
                if tb.relay:                      # what the link did meanwhile (the relay's injected faults)
                    rec["fault_events"] = sorted(rec.get("fault_events", []) + tb.fault_events(t_sent, time.time()),
                                                 key=lambda e: e["at"])
                reqs.append(rec)
        finally:
            client.close()
        return reqs, tb.describe()


def _await_reply(client, tb, pid: str):
    """The target worker's reply to request pid, watching its process meanwhile: if it exits, a clear error
    naming it and its exit status (and its log's tail) at once, not a timeout."""
    from ...place.testbed import TestbedError
    from ...wire.transport import PeerGone
    t_end = time.time() + client.timeout_s
    while time.time() < t_end:
        try:
            reply = client.recv(0.2)
        except PeerGone:                  # the connection closed: say why if its process exited
            time.sleep(0.5)
            if tb.exit_status("target") is None:
                raise
            reply = None
        if reply is not None:
            return reply
        status = tb.exit_status("target")
        if status is not None:
            raise TestbedError(f"the target worker exited with status {status} during request {pid!r}; its log "
                               f"ends:\n{tb.log('target')[-1500:]}")
    raise TimeoutError(f"no reply from the target worker within {client.timeout_s:.0f} s for request {pid!r} "
                       "(SDETH_CLIENT_TIMEOUT sets the wait)")


@torch.inference_mode()
def calibrate(pair, context: int = 256, widths=(1, 2, 3, 4, 5, 6, 8), reps: int = 9) -> dict:
    """Median cost (s) of a target step, a draft step, and a target forward of m tokens, at a
    given context length: the inputs of the cost model, measured on the hardware at hand."""
    ids = list(range(100, 100 + context))
    out = {"context": context, "verify_s": {}}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        eng = Engine(model, role)
        eng.start(context + max(widths) + 2)
        prefill(eng, ids)
        out[f"{role}_step"] = median_forward_s(eng, [7], reps)
        if role == "target":
            out["verify_s"] = {m: median_forward_s(eng, ids[:m], reps) for m in widths}
    return out


SWEEP_RTTS = (0.0, 0.2, 1.0, 5.0, 20.0)


def first_prompt(spec: str) -> str:
    """A prompt spec's set and seed with one prompt ('sharegpt:8:3' -> 'sharegpt:1:3'): a warm-up request."""
    from ...models import prompts as P
    if str(spec).startswith("random:"):
        _, length, seed = P.random_spec(spec)
        return f"random:1:{length}:{seed}"
    name, _, seed = P.parse_spec(spec)
    return f"{name}:1:{seed}"


def sweep(cfg: RunConfig, rtts=SWEEP_RTTS, pair=None, progress: bool = True) -> dict:
    """The RTT sweep: colocated SD (one process holding both models), then, on one testbed whose relay is
    re-set between RTTs, target-only on the target node's worker (the baseline: the same process that serves the
    link modes) and sync SD and pipelined SD over the link at each injected round trip. Returns
    {"runs": [results dicts], "table": rows with measured and predicted speedups}."""
    from dataclasses import replace
    from ...models.presets import load_pair
    cfg = cfg.check()
    pair = pair or load_pair(cfg.pair, cfg.target, cfg.draft, device=cfg.device)
    # not timed: a process's first requests pay one-time costs (allocations, kernels chosen for new shapes), which
    # would land on whichever mode ran first
    warm = replace(cfg, prompts=first_prompt(cfg.prompts), max_tokens=min(4, cfg.max_tokens), rtt_ms=0.0)
    run(replace(warm, mode="sd", placement="colocated"), pair, False)
    runs = [run(replace(cfg, mode="sd", placement="colocated", rtt_ms=0.0), pair, progress)]
    with testbed_for(cfg, up_ms=0.0, down_ms=0.0, relay=True) as tb:
        for mode in ("target-only", "sd", "pipelined"):
            run(replace(warm, mode=mode, placement="ethernet"), pair, False, tb)
        runs.insert(0, run(replace(cfg, mode="target-only", placement="ethernet", rtt_ms=0.0), pair, progress, tb))
        for rtt in rtts:
            tb.set_delay(rtt / 2, rtt / 2)
            for mode in ("sd", "pipelined"):
                runs.append(run(replace(cfg, mode=mode, placement="ethernet", rtt_ms=rtt), pair, progress, tb))
    return {"schema": "sdeth.sweep/1", "runs": runs, "table": sweep_table(runs)}


def provision(placement: str, pair: str, device: str = "cpu", namespace: str = "sdeth", kube_context: str = "",
              target_node: str = "", draft_node: str = "", image: str = "", bring_up_timeout_s: float = 900,
              keys_dir: str = "") -> dict:
    """M0: bring up the two nodes, start both workers, probe the link between them, tear everything down.
    placement 'local': two namespace "nodes" on this machine (testbed); 'k8s': two GPU nodes of a cluster
    (the GPU workloads scaled to zero on leaving, also on error), placed by the `ethernet-curve` overlay: CURVE
    on the link and NetworkPolicies, its keys from keys_dir (`python -m sdeth keys DIR`; "": a new key directory
    under the cache, named in the result). Returns {"nodes", "link_kind", "link"} (and "keys_dir" on k8s)."""
    from ...place import cluster, netprobe
    from ...place.testbed import LINK_SCENARIOS, Testbed, probe_link
    if placement == "local":
        with Testbed(pair, netns=None, device=device) as tb:
            d = tb.describe()
            nodes = [{"node": d["target_node"], "role": "target", "address": tb.target_addr},
                     {"node": d["draft_node"], "role": "draft", "address": tb.draft_bind()}]
            return {"nodes": nodes, "link_kind": d["kind"],
                    "link": probe_link(tb, LINK_SCENARIOS[:1], scale=0.5)[0]["naive"]}
    if placement == "k8s":
        with cluster.Cluster(namespace, kube_context or None) as c:
            nodes = c.nodes()
            keys_dir = keys_dir or str(_new_keys(namespace))
            c.apply(cluster.render("ethernet-curve", target_node, draft_node, pair if pair != "embedded" else None,
                                   image=image or None, namespace=namespace, keys_dir=keys_dir))
            c.wait_ready(["sdeth-target", "sdeth-draft"], timeout_s=bring_up_timeout_s)
            link = netprobe.analyse(cluster.run_probe(c, target_node, draft_node, image or None), clock_offset_s=None)
            return {"nodes": nodes, "link_kind": f"pod network between {target_node} and {draft_node}", "link": link,
                    "keys_dir": keys_dir}
    raise ValueError(f"placement {placement!r}: use 'local' or 'k8s'")


def _new_keys(namespace: str):
    """A fresh CURVE key directory for one deployment, under the cache (its secrets readable by this user only)."""
    import tempfile
    from ...paths import cache_dir
    from ...wire.auth import make_keys
    parent = cache_dir() / "keys"
    parent.mkdir(parents=True, exist_ok=True)
    return make_keys(tempfile.mkdtemp(prefix=f"{namespace}-", dir=parent))

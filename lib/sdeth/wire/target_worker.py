"""The target worker: decodes requests from a controller, with SD against a remote draft worker when
one answers, alone otherwise. `python -m sdeth worker --role target --bind ... --draft-addr ...`.
"""
from __future__ import annotations

import time

import torch

from ..costmodel import AdaptivePolicy, FixedPolicy
from ..models.presets import tokenizer_hash
from ..runtime.loop import DraftUnavailable, generate_sd, generate_target_only
from ..runtime.pipeline import StreamView, generate_pipelined, parse_cache
from ..runtime import make_engine
from ..runtime.verify import Sampling
from . import protocol
from .draft_worker import MAX_K, WARM_WIDTHS
from .health import DraftHealth
from .remote import RemoteDrafter, RemoteStream
from .transport import reply, serve_requests


def serve_target(bind: str, pair, draft_addr: str | None, draft_timeout_s: float = 5.0,
                 max_seconds: float = 0, engine_opts: dict | None = None, spin_s: float = 0.0) -> None:
    """Decode requests from a controller; SD with the remote draft when it answers."""
    target = make_engine(pair.target, "target", "target", vocab=pair.vocab_size, **(engine_opts or {}))
    target.warm(WARM_WIDTHS)
    eos = pair.tokenizer.eos_token_id
    hello = protocol.Hello(protocol.PROTOCOL_VERSION, "target", pair.config.target, pair.vocab_size,
                    tokenizer_hash(pair.tokenizer), pair.config.dtype)
    drafter, why_not = None, ""
    health = DraftHealth(draft_addr) if draft_addr else None
    if health is not None:
        health.wait_first()
    estimators: dict[str, AdaptivePolicy] = {}      # per mode; they carry what they learnt to the next request
    print(f"sdeth target worker: {pair.config.target} on {bind}, draft at {draft_addr}", flush=True)
    for sock, ident, msg, t1 in serve_requests(bind, max_seconds):
        if isinstance(msg, protocol.Ping):
            reply(sock, ident, protocol.Pong(msg.t0, t1, time.time()))
            continue
        if not isinstance(msg, protocol.Generate):
            reply(sock, ident, protocol.Error("bad-message", f"a target worker takes Generate, not {type(msg).__name__}"))
            continue
        bad = protocol.check_generate(msg, pair.vocab_size, target.capacity, MAX_K)
        if bad is not None:
            print(f"sdeth target worker: refused: {bad.message}", flush=True)
            reply(sock, ident, bad)
            continue
        try:
            s = Sampling(*protocol.sampling_args(msg))
            gen = torch.Generator(device=target.device).manual_seed(msg.seed)   # where the draws happen
            draft_seed = msg.seed + 1_000_003           # the draft's own draws: fresh per request, reproducible
            if msg.mode == "target-only":
                r = generate_target_only(target, msg.prompt_ids, msg.max_tokens, s, eos, gen, msg.req)
                rec = {**r.__dict__, "bytes_sent": 0, "bytes_received": 0}
            else:
                kind = RemoteStream if msg.mode == "pipelined" else RemoteDrafter
                if drafter is not None and type(drafter) is not kind:
                    drafter.client.close()
                    drafter = None
                t_req = time.time()
                if health is not None and not health.up:
                    if drafter is not None:            # away: decode alone now, reconnect when it is back
                        drafter.client.close()
                        drafter = None
                    why_not = f"draft worker at {draft_addr} down since {time.strftime('%H:%M:%S', time.localtime(health.since))}"
                elif drafter is None and draft_addr:
                    try:
                        drafter = kind(draft_addr, hello, s, timeout_s=draft_timeout_s, device=target.device, spin_s=spin_s)
                    except (DraftUnavailable, ConnectionRefusedError) as e:
                        why_not = str(e)
                        if health is not None and isinstance(e, DraftUnavailable):
                            health.mark_down(why_not)
                b0 = (drafter.client.sent, drafter.client.received) if drafter else (0, 0)
                est = estimators.setdefault(f"{msg.mode}-{msg.k}-{msg.adaptive}",
                                            AdaptivePolicy() if msg.adaptive or msg.mode != "pipelined" else FixedPolicy())
                cache_used, cache_why = "off", ""
                if msg.mode == "pipelined":
                    if drafter is not None:
                        drafter.window, drafter.est = 2 * msg.k + 2, est
                        drafter.cache, drafter.watch, cache_why = outcome_cache(msg.cache, msg.k, drafter.peer, est)
                        cache_used = "x".join(map(str, drafter.cache)) if drafter.cache[0] else "off"
                    r = generate_pipelined(target, drafter or _NoDraft(why_not), msg.prompt_ids, msg.max_tokens,
                                           msg.k, s, eos, gen, msg.req, est, draft_timeout_s, draft_seed)
                else:
                    r = generate_sd(target, drafter or _NoDraft(why_not), msg.prompt_ids, msg.max_tokens, msg.k, s,
                                    eos, gen, msg.req, est if msg.adaptive else None, draft_seed)
                if drafter is not None and r.tokens_without_draft:
                    drafter.client.close()
                    drafter = None           # reconnect (and re-handshake) for the next request
                    if health is not None:
                        health.mark_down(f"lost in request {msg.req!r}")
                elif drafter is not None and msg.mode != "pipelined":
                    drafter.end()          # (generate_pipelined ends its stream itself)
                b1 = (drafter.client.sent, drafter.client.received) if drafter else b0
                events = health.events_since(t_req) if health is not None else []
                if r.tokens_without_draft and not events:
                    events = [{"event": "draft unavailable", "at": time.time(), "why": why_not}]
                rec = {**r.__dict__, "bytes_sent": b1[0] - b0[0], "bytes_received": b1[1] - b0[1],
                       "draft_unavailable": why_not if r.tokens_without_draft else "", "fault_events": events,
                       "cache": cache_used, "cache_choice": cache_why}
            reply(sock, ident, protocol.Generated(msg.req, rec))
        except Exception as e:
            reply(sock, ident, protocol.Error("internal", f"{type(e).__name__}: {e}"))


def outcome_cache(spec: str, k_max: int, peer: protocol.Welcome, est) -> tuple[tuple, int, str]:
    """A pipelined request's outcome cache: (fanout, depth, ranks) with fanout 0 for off, the draft's next
    choices to watch (the cache off under 'auto': they measure the hit rate it would get), and, under 'auto',
    why (the policy's model decides: costmodel.AdaptivePolicy.choose_cache)."""
    if spec != "auto":
        return parse_cache(spec), 0, ""
    fanout, depth, ranks = parse_cache("on")
    if not peer.rows:
        return (0, depth, ranks), 0, "off: the draft worker cannot draft branch rows (its engine is not the fast decoder)"
    on, why = est.choose_cache(fanout, depth, ranks, k_max)
    return ((fanout, depth, ranks) if on else (0, depth, ranks)), ranks, why


class _NoDraft:
    """Stands in when no draft worker answered: every round falls back to the target."""
    compute_s = 0.0
    streamed = 0
    view = StreamView()

    def __init__(self, why: str):
        self.why = why

    def start(self, *a, **kw):
        raise DraftUnavailable(self.why or "no draft worker configured")

    def propose(self, *a, **kw):
        raise DraftUnavailable(self.why)

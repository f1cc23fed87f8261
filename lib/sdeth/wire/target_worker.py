"""The target worker: decodes requests from a controller, with SD against a remote draft server when one
answers, alone otherwise. `python -m sdeth worker --role target --bind ... --draft-addr ...`.

Each Generate is served in three steps: connect (a handle on the draft server, wire.draft_handles', re-made after
a loss, none while the heartbeat says the draft is away), decode (the request's mode), record (the request's
figures, its bytes on the link, and why it lost its draft if it did).
"""
from __future__ import annotations

import time

import torch

from ..costmodel import AdaptivePolicy, step_setting
from ..models.presets import tokenizer_hash
from ..runtime.loop import DraftUnavailable, generate_sd, generate_target_only
from ..runtime.pipeline import StreamView, generate_pipelined
from ..runtime.specs import AHEAD
from ..runtime import make_engine
from ..runtime.verify import Sampling
from . import protocol
from .health import DraftHealth
from .draft_handles import ServerDraft, ServerStream
from .server_config import MAX_K
from .serving import serve_requests
from .transport import Log, reply

DECODE = protocol.Decoder("a target worker", protocol.TARGET_TAKES)
DRAFT_SEED_OFFSET = 1_000_003      # the draft's own draws: seeded from the request's, reproducible
WARM_WIDTHS = 10                   # forward widths captured as CUDA graphs before serving (verify of k <= 9)


class TargetWorker:
    """One target engine for the worker's life, a heartbeat on the draft server, a handler per message."""

    def __init__(self, pair, draft_addr: str | None, draft_timeout_s: float = 5.0,
                 engine_opts: dict | None = None, spin_s: float = 0.0, keys=None):
        self.pair, self.draft_addr, self.draft_timeout_s, self.spin_s = pair, draft_addr, draft_timeout_s, spin_s
        self.keys = keys                     # wire.auth.Keys: CURVE both ways (its clients, and to the draft)
        self.target = make_engine(pair.target, "target", "target", vocab=pair.vocab_size, **(engine_opts or {}))
        self.target.warm(WARM_WIDTHS)
        self.eos = pair.tokenizer.eos_token_id
        self.hello = protocol.Hello(protocol.PROTOCOL_VERSION, "target", pair.config.target, pair.vocab_size,
                                    tokenizer_hash(pair.tokenizer), pair.config.dtype)
        self.drafter = None                  # ServerDraft | ServerStream while connected
        self.why_not = ""                    # why the last request had no draft
        self.health = DraftHealth(draft_addr, keys=keys) if draft_addr else None
        if self.health is not None:
            self.health.wait_first()
        self.estimators: dict[str, AdaptivePolicy] = {}   # per mode; they carry what they learnt onwards
        self.log = Log("target worker")
        self.handlers = {protocol.Ping: self.handle_ping, protocol.Generate: self.handle_generate}

    def serve(self, bind: str, max_seconds: float = 0) -> None:
        self.log.line(f"{self.pair.config.target} on {bind}, draft at {self.draft_addr}")
        for sock, ident, msg, t1, peer in serve_requests(bind, DECODE, self.log, max_seconds, keys=self.keys):
            try:
                out = self.handlers[type(msg)](msg, t1)
            except Exception as e:
                out = protocol.Error("internal", f"{type(msg).__name__} failed: {type(e).__name__}: {e}")
                self.drop_drafter()          # its socket may hold replies of the failed request
            if isinstance(out, protocol.Error):
                self.log.refused(peer, out.code, f"{type(msg).__name__} {getattr(msg, 'req', '')!r}: {out.message}")
            reply(sock, ident, out)

    def drop_drafter(self) -> None:
        if self.drafter is not None:
            self.drafter.client.close()
            self.drafter = None

    def handle_ping(self, msg: protocol.Ping, t1: float):
        return protocol.Pong(msg.t0, t1, time.time())

    def handle_generate(self, msg: protocol.Generate, t1: float):
        bad = protocol.check_generate(msg, self.pair.vocab_size, self.target.capacity, MAX_K)
        if bad is not None:
            return bad
        s = Sampling(*protocol.sampling_args(msg))
        gen = torch.Generator(device=self.target.device).manual_seed(msg.seed)   # where the draws happen
        if msg.mode == "target-only":
            r = generate_target_only(self.target, msg.prompt_ids, msg.max_tokens, s, self.eos, gen, msg.req)
            return protocol.Generated(msg.req, {**r.__dict__, "bytes_sent": 0, "bytes_received": 0})
        t_req = time.time()
        drafter = self.connect(self.handle_kind(msg.mode), s)
        b0 = (drafter.client.sent, drafter.client.received) if drafter else (0, 0)
        r, cache_used, cache_why = self.decode(msg, drafter, s, gen)
        b1 = (drafter.client.sent, drafter.client.received) if drafter else b0
        self.after(msg, r, drafter)
        return protocol.Generated(msg.req, {**r.__dict__, "bytes_sent": b1[0] - b0[0], "bytes_received": b1[1] - b0[1],
                                            **self.draft_record(r, t_req), "cache": cache_used,
                                            "cache_choice": cache_why})

    @staticmethod
    def handle_kind(mode: str):
        """The handle a request of `mode` needs on the draft server."""
        return ServerStream if mode == "pipelined" else ServerDraft

    def connect(self, kind, s: Sampling):
        """The handle on the draft server for this request (kind: ServerDraft or ServerStream), or None
        (why_not says why): dropped while the heartbeat says the draft is away, re-made when it is back."""
        if self.drafter is not None and (type(self.drafter) is not kind or (self.health and not self.health.up)):
            self.drop_drafter()
        if kind is None:
            return None
        if self.health is not None and not self.health.up:
            since = time.strftime('%H:%M:%SZ', time.gmtime(self.health.since))
            self.why_not = f"draft server at {self.draft_addr} down since {since} ({self.health.why})"
        elif self.drafter is None and self.draft_addr:
            try:
                self.drafter = kind.connect(self.draft_addr, self.hello, s, timeout_s=self.draft_timeout_s,
                                            spin_s=self.spin_s, health=self.health, keys=self.keys,
                                            device=self.target.device)
            except (DraftUnavailable, ConnectionRefusedError) as e:
                self.why_not = str(e)
                if self.health is not None and isinstance(e, DraftUnavailable):
                    self.health.mark_down(self.why_not)
        return self.drafter

    @staticmethod
    def policy_for(msg: protocol.Generate) -> AdaptivePolicy:
        """Sync SD: adaptive k's estimates. Pipelined: the step's policy named in the message ("": the step policy
        when adaptive, else the fixed rule)."""
        if msg.mode != "pipelined":
            return AdaptivePolicy()
        return step_setting(msg.policy or ("policy" if msg.adaptive else "fixed"))()

    def decode(self, msg: protocol.Generate, drafter, s: Sampling, gen):
        """Decode one SD request (sync or pipelined); (record, the branch cache used, why)."""
        est = self.estimators.setdefault(f"{msg.mode}-{msg.k}-{msg.adaptive}-{msg.policy}", self.policy_for(msg))
        source = drafter or _NoDraft(self.why_not)
        draft_seed = msg.seed + DRAFT_SEED_OFFSET
        if msg.mode != "pipelined":
            return generate_sd(self.target, source, msg.prompt_ids, msg.max_tokens, msg.k, s, self.eos, gen, msg.req,
                               est if msg.adaptive else None, draft_seed), "off", ""
        cache_used, cache_why = "off", ""
        if drafter is not None:
            drafter.window, drafter.est = protocol.stream_window(msg.k), est
            drafter.branches, cache_why = server_branches(msg.cache, drafter.peer)
            cache_used = AHEAD if drafter.branches else "off"
        r = generate_pipelined(self.target, source, msg.prompt_ids, msg.max_tokens, msg.k, s, self.eos, gen, msg.req,
                               est, self.draft_timeout_s, draft_seed)
        return r, cache_used, cache_why

    def after(self, msg: protocol.Generate, r, drafter) -> None:
        """A request that lost its draft drops the handle (re-made, with a new handshake, next time) and
        tells the heartbeat; a sync request that kept it ends its draft-side state."""
        if drafter is None:
            return
        if r.tokens_without_draft:
            self.why_not = drafter.lost or f"lost in request {msg.req!r}"
            self.drop_drafter()
            if self.health is not None and not drafter.lost_answered:   # (a draft that answered is alive)
                self.health.mark_down(self.why_not)
        elif msg.mode != "pipelined":
            drafter.end()          # (generate_pipelined ends its stream itself)

    def draft_record(self, r, t_req: float) -> dict:
        """Why this request decoded without its draft (empty when it did not), and the faults met on the way."""
        events = self.health.events_since(t_req) if self.health is not None else []
        if r.tokens_without_draft and not events:
            events = [{"event": "draft unavailable", "at": time.time(), "why": self.why_not}]
        return {"draft_unavailable": self.why_not if r.tokens_without_draft else "", "fault_events": events}


def serve_target(bind: str, pair, draft_addr: str | None, draft_timeout_s: float = 5.0,
                 max_seconds: float = 0, engine_opts: dict | None = None, spin_s: float = 0.0, keys=None) -> None:
    """Decode requests from a controller; SD with the remote draft server when it answers. keys: CURVE on both
    links (wire.auth.Keys); None: plain TCP."""
    TargetWorker(pair, draft_addr, draft_timeout_s, engine_opts, spin_s, keys).serve(bind, max_seconds)


def server_branches(spec: str, peer: protocol.Welcome) -> tuple[bool, str]:
    """A pipelined request's branches on a draft server: whether to ask for its verdict cache's branches ahead
    (Open.branches), and why. The server's cache sets their shape (its --verdict-cache); they take its spare rows
    only (live streams step first), so 'auto' asks wherever the server has the cache."""
    if spec in ("off", "", "0"):
        return False, ""
    if not peer.rows and peer.sequences <= 1:
        return False, "off: the draft server drafts one row (--role draft): it has no free rows for branches"
    if not peer.rows:
        return False, "off: the draft server runs no verdict cache (start it with --verdict-cache on)"
    return True, "on: the draft server sends its verdict cache's branches ahead (their shape is its --verdict-cache)"


class _NoDraft:
    """Stands in when no draft server answered: every round falls back to the target."""
    compute_s = 0.0
    streamed = 0
    view = StreamView()

    def __init__(self, why: str):
        self.why = why

    def start(self, *a, **kw):
        raise DraftUnavailable(self.why or "no draft server configured")

    def propose(self, *a, **kw):
        raise DraftUnavailable(self.why)

"""The draft worker: serves proposals (sync SD) and streams of drafts (pipelined SD) to target workers.
`python -m sdeth worker --role draft --bind tcp://ADDR:PORT` (the CLI is in `sdeth.cli`).
"""
from __future__ import annotations

import os
import time

from ..models.presets import tokenizer_hash
from ..runtime.loop import Drafter, q_support
from ..runtime.pipeline import StreamDrafter
from ..runtime import make_engine
from ..runtime.verify import Sampling
from . import protocol
from .transport import reply, serve_requests

WARM_WIDTHS = 10     # forward widths captured as CUDA graphs before serving (verify of k <= 9)
MAX_K = 16           # the most draft tokens a round may ask for
WARM_ROWS = 6        # row forwards captured too (the outcome cache: the chain's rows plus a branch row each)


def welcome(pair, role_model, rows: bool = False) -> protocol.Welcome:
    return protocol.Welcome(protocol.PROTOCOL_VERSION, role_model, pair.vocab_size, tokenizer_hash(pair.tokenizer),
                            pair.config.dtype, rows)


def q_pairs(q, q_top: int):
    """A sampled draft's q as (ids, probs) of its q_top non-zero entries per token (None, None for a
    greedy draft): only those cross the wire."""
    if q is None:
        return None, None
    top = q_support(q, q_top)
    return top.indices.tolist(), top.values.tolist()


def serve_draft(bind: str, pair, die_after: int = 0, max_seconds: float = 0, engine_opts: dict | None = None,
                spin_s: float = 0.0, idle_s: float = 10.0) -> None:
    """Serve proposals until killed (or max_seconds). die_after > 0 exits the process abruptly
    after that many proposals: fault injection for tests. engine_opts: sdeth.runtime.make_engine's.
    idle_s: a request whose target says nothing for this long is freed (its target died or gave up)."""
    welcomed: set[bytes] = set()
    drafters: dict[str, Drafter] = {}
    streams: dict[str, tuple[bytes, StreamDrafter]] = {}
    served = 0
    # one engine (one cache, its CUDA graphs) for the worker's life
    engine = make_engine(pair.draft, "draft", "draft", vocab=pair.vocab_size, **(engine_opts or {}))
    me = welcome(pair, pair.config.draft, rows=StreamDrafter.can_branch(engine) > 0)
    engine.warm(WARM_WIDTHS)
    if hasattr(engine, "warm_rows"):
        engine.warm_rows(WARM_ROWS)

    def send_steps(sock, ident, req, steps) -> None:
        nonlocal served
        for st in steps:
            reply(sock, ident, protocol.Drafted(req, st.epoch, st.pos, st.token, st.ms, st.q_idx, st.q_val, st.restart_ms,
                                                period_ms=st.period_ms, alts=st.alt_ids))
            for b in st.branched:           # the outcome cache's tokens drafted in the same forward
                reply(sock, ident, protocol.Drafted(req, st.epoch, b.pos, b.token, 0.0, b.q_idx, b.q_val, None,
                                                    b.fork, b.corr))
            served += 1
            if die_after and served >= die_after:
                os._exit(17)

    seen: dict[str, float] = {}          # request -> when its target last spoke (Start, Commit, Propose)

    def expire() -> None:
        """Free the state of requests whose target has said nothing for idle_s (a target that died)."""
        now = time.time()
        for req in [r for r, t in seen.items() if now - t > idle_s]:
            seen.pop(req)
            if streams.pop(req, None) is not None or drafters.pop(req, None) is not None:
                print(f"sdeth draft worker: freed request {req!r}: no word from its target for {idle_s:.0f} s", flush=True)

    def run_ahead(sock) -> bool:
        """Between messages: queue the next draft step if there is room, and send the oldest one once its
        token is on the host. Never waits for the device while a step runs (the loop looks at the socket
        between calls); True while there is work in flight or room to draft."""
        expire()
        for req, (ident, d) in streams.items():
            try:
                if d.can_step():
                    d.launch()
                if d.ready():               # on a CPU always: the launch computed the step
                    send_steps(sock, ident, req, [d.settle()])
            except Exception as e:      # this request's stream ends; the worker serves on
                streams.pop(req)
                reply(sock, ident, protocol.Error("internal", f"{type(e).__name__}: {e}"))
                return False
            return bool(d.flight) or d.can_step()
        return False

    print(f"sdeth draft worker: {pair.config.draft} on {bind}", flush=True)
    for sock, ident, msg, t1 in serve_requests(bind, max_seconds, run_ahead, spin_s):
        if hasattr(msg, "req") and not isinstance(msg, protocol.End):
            seen[msg.req] = time.time()
        try:
            if isinstance(msg, protocol.Ping):
                reply(sock, ident, protocol.Pong(msg.t0, t1, time.time()))
            elif isinstance(msg, protocol.Hello):
                err = protocol.check_hello(msg, me)
                if err is None:
                    welcomed.add(ident)
                reply(sock, ident, err or me)
            elif ident not in welcomed:
                reply(sock, ident, protocol.Error("version", "send Hello first (protocol handshake)"))
            elif isinstance(msg, protocol.Start):
                bad = protocol.check_start(msg, pair.vocab_size, engine.capacity)
                if bad is not None:
                    print(f"sdeth draft worker: refused: {bad.message}", flush=True)
                    reply(sock, ident, bad)
                    continue
                s = Sampling(*protocol.sampling_args(msg))
                if msg.stream:
                    try:
                        sd = StreamDrafter(engine, msg.q_top, msg.window, msg.fanout, msg.depth, msg.ranks, msg.watch)
                    except ValueError as e:     # an outcome cache this draft engine cannot draft
                        reply(sock, ident, protocol.Error("mismatch", str(e)))
                        continue
                    sd.start(msg.prompt_ids, msg.size, msg.first, s, msg.seed)
                    streams.clear()            # one request at a time per draft worker (batch 1)
                    streams[msg.req] = (ident, sd)
                    reply(sock, ident, protocol.Started(msg.req, sd.prefill_s * 1e3))
                    continue
                d = Drafter(engine, q_top=msg.q_top)
                d.start(msg.prompt_ids, msg.size, s, msg.seed)
                drafters.clear()
                drafters[msg.req] = d
                reply(sock, ident, protocol.Started(msg.req, d.prefill_s * 1e3))
            elif isinstance(msg, protocol.Commit):
                st = streams.get(msg.req)
                if st is None:
                    reply(sock, ident, protocol.Error("unknown-request", f"no stream {msg.req!r} (send Start first)"))
                    continue
                if not (msg.pos >= 0 and 0 <= msg.token < pair.vocab_size):
                    streams.pop(msg.req)       # a target that sends this has lost the stream's thread: end it
                    reply(sock, ident, protocol.Error("bad-message", f"Commit {msg.req!r}: position {msg.pos} / token "
                                                      f"{msg.token} (token ids are in [0, {pair.vocab_size})); stream ended"))
                    continue
                send_steps(sock, st[0], msg.req, st[1].commit(msg.pos, msg.token))
            elif isinstance(msg, protocol.Propose):
                d = drafters.get(msg.req)
                if d is None:
                    reply(sock, ident, protocol.Error("unknown-request", f"no request {msg.req!r} (send Start first)"))
                    continue
                if not (1 <= msg.k <= MAX_K and msg.n_prev >= 0 and 0 <= msg.nxt < pair.vocab_size):
                    reply(sock, ident, protocol.Error("bad-message", f"Propose {msg.req!r}: k={msg.k} (use 1 to {MAX_K}), "
                                                      f"n_prev={msg.n_prev} (>= 0), nxt={msg.nxt} (a token id below "
                                                      f"{pair.vocab_size})"))
                    continue
                c0 = d.compute_s
                toks, q = d.propose(msg.n_prev, msg.nxt, msg.k)
                idx, val = q_pairs(q, d.q_top)
                reply(sock, ident, protocol.Proposal(msg.req, toks, (d.compute_s - c0) * 1e3, idx, val,
                                              (time.time() - t1) * 1e3))
                served += 1
                if die_after and served >= die_after:
                    os._exit(17)           # a crash, as far as the target can tell
            elif isinstance(msg, protocol.End):
                seen.pop(msg.req, None)
                drafters.pop(msg.req, None)
                streams.pop(msg.req, None)
                reply(sock, ident, protocol.Ended(msg.req))
            else:
                reply(sock, ident, protocol.Error("bad-message", f"a draft worker does not take {type(msg).__name__}"))
        except Exception as e:  # keep serving others
            print(f"sdeth draft worker: {type(msg).__name__} failed: {type(e).__name__}: {e}", flush=True)
            reply(sock, ident, protocol.Error("internal", f"{type(e).__name__}: {e}"))

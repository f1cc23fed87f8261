"""The draft worker: serves proposals (sync SD) and streams of drafts (pipelined SD) to target workers.
`python -m sdeth worker --role draft --bind tcp://ADDR:PORT` (the CLI is in `sdeth.cli.worker`).

Terms: a *peer* is one connected target (its zmq routing id, and the address zmq saw); a *request* is one
sequence a peer started (Start) and drafts for until End; a sync request is served by a `Drafter` (one
Proposal per Propose), a pipelined one by a `StreamDrafter` (Drafted messages streamed between messages).
The worker serves one request at a time: a new Start replaces the request in hand, and a peer whose request
it replaced is told so at once (an Error `busy`).
"""
from __future__ import annotations

import os
import threading
import time

from ..models.presets import tokenizer_hash
from ..runtime.loop import Drafter, q_support
from ..runtime.streamdraft import StreamDrafter
from ..runtime import make_engine
from ..runtime.verify import Sampling
from . import protocol
from .serving import serve_requests
from .transport import Log, reply

WARM_WIDTHS = 10     # forward widths captured as CUDA graphs before serving (verify of k <= 9)
MAX_K = 16           # the most draft tokens a round may ask for
WARM_ROWS = 6        # row forwards captured too (the outcome cache: the chain's rows plus a branch row each)
PREFILL_THREAD_IDS = 256   # a prompt longer than this prefills on its own thread; heartbeats are answered meanwhile
PREFILL_POLL_S = 0.001     # how often the loop looks whether that prefill is done
MAX_HELD = 256             # messages held while it runs (each checked, a Start within the cache); more: busy
DECODE = protocol.Decoder("a draft worker", protocol.DRAFT_TAKES)


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


def drafted_messages(req: str, st) -> list[protocol.Drafted]:
    """One settled draft step (runtime.streamdraft.Step) as Drafted messages: its token, then the outcome
    cache's branch tokens drafted in the same forward."""
    out = [protocol.Drafted(req, st.epoch, st.pos, st.token, st.ms, st.q_idx, st.q_val, st.restart_ms,
                            period_ms=st.period_ms, alts=st.alt_ids)]
    out += [protocol.Drafted(req, st.epoch, b.pos, b.token, 0.0, b.q_idx, b.q_val, None, b.fork, b.corr)
            for b in st.branched]
    return out


class _Prefill:
    """A Start whose prefill runs on a thread of its own, so that the serving loop answers heartbeats (and holds
    other messages) meanwhile; `error` is what the prefill raised, if anything."""

    def __init__(self, ident: bytes, msg: protocol.Start, drafter, run):
        self.ident, self.msg, self.drafter, self.error = ident, msg, drafter, None
        self.thread = threading.Thread(target=self._run, args=(run,), name="draft-prefill", daemon=True)
        self.thread.start()

    def _run(self, run) -> None:
        try:
            run()
        except Exception as e:       # reported to the peer by DraftWorker.prefilled
            self.error = e


def _is_step(m) -> int:
    """1 for a message that is a proposal or a draft step of the chain (not a branch token)."""
    return int(isinstance(m, protocol.Proposal) or (isinstance(m, protocol.Drafted) and m.fork < 0))


class DraftWorker:
    """One draft engine (one cache, its CUDA graphs) for the worker's life, and a handler per message."""

    def __init__(self, pair, engine_opts: dict | None = None, die_after: int = 0, idle_s: float = 10.0):
        self.pair, self.die_after, self.idle_s = pair, die_after, idle_s   # die_after > 0: exit abruptly after
        self.engine = make_engine(pair.draft, "draft", "draft", vocab=pair.vocab_size, **(engine_opts or {}))
        self.welcome = welcome(pair, pair.config.draft, rows=StreamDrafter.can_branch(self.engine) > 0)
        self.engine.warm(WARM_WIDTHS)
        if hasattr(self.engine, "warm_rows"):
            self.engine.warm_rows(WARM_ROWS)
        self.log = Log("draft worker")
        self.welcomed: set[bytes] = set()
        self.drafters: dict[str, tuple[bytes, Drafter]] = {}           # sync requests: req -> (peer, drafter)
        self.streams: dict[str, tuple[bytes, StreamDrafter]] = {}      # pipelined requests
        self.seen: dict[str, float] = {}     # request -> when its peer last spoke (Start, Commit, Propose)
        self.served = 0                      # proposals and streamed steps sent (for die_after)
        self.outbox: list[tuple[bytes, object]] = []    # (peer, message) for peers other than the sender
        self.prefill: _Prefill | None = None             # a long prompt prefilling on its own thread
        self.held: list[tuple] = []                      # messages that wait for it: (ident, message, t1, peer)
        self.handlers = {protocol.Ping: self.handle_ping, protocol.Hello: self.handle_hello,
                         protocol.Start: self.handle_start, protocol.Propose: self.handle_propose,
                         protocol.Commit: self.handle_commit, protocol.End: self.handle_end}

    def serve(self, bind: str, max_seconds: float = 0, spin_s: float = 0.0, keys=None) -> None:
        """Serve until killed (or max_seconds); keys: CURVE (wire.auth.Keys), None for plain TCP."""
        self.log.line(f"{self.pair.config.draft} on {bind}")
        for sock, ident, msg, t1, peer in serve_requests(bind, DECODE, self.log, max_seconds, self.run_ahead, spin_s,
                                                         keys):
            if self.prefill is None or not self._needs_engine(ident, msg):
                self.answer(sock, ident, msg, t1, peer)
            elif len(self.held) < MAX_HELD:      # the engine is prefilling: in order, once it is done
                self.held.append((ident, msg, t1, peer))
            else:
                self.send(sock, ident, [self._refuse(peer, msg, protocol.Error(
                    "busy", f"{MAX_HELD} messages already wait for a long prompt's prefill: send again later"))])

    def _needs_engine(self, ident: bytes, msg) -> bool:
        """Whether answering msg would touch the engine (so that it waits for a prefill in progress): not a
        Ping, a Hello, a peer's message before its handshake, nor a Start the checks refuse."""
        if isinstance(msg, (protocol.Ping, protocol.Hello)) or ident not in self.welcomed:
            return False
        return not (isinstance(msg, protocol.Start)
                    and protocol.check_start(msg, self.pair.vocab_size, self.engine.capacity) is not None)

    def answer(self, sock, ident: bytes, msg, t1: float, peer: str) -> None:
        self.send(sock, ident, self.dispatch(ident, msg, t1, peer))
        while self.outbox:                # what this message meant for other peers
            other, note = self.outbox.pop(0)
            reply(sock, other, note)

    def send(self, sock, ident: bytes, out: list) -> None:
        """Send the replies in order; a proposal or a draft step counts once all its messages are sent."""
        step = 0
        for m in out:
            if step and _is_step(m):
                self._count(step)
            reply(sock, ident, m)
            step = step or _is_step(m)
        self._count(step)

    def dispatch(self, ident: bytes, msg, t1: float, peer: str) -> list:
        """The replies to one message; an Error reply is logged with the peer."""
        if not isinstance(msg, (protocol.Ping, protocol.Hello)) and ident not in self.welcomed:
            out = [protocol.Error("version", "send Hello first (protocol handshake)")]
        else:
            try:
                out = self.handlers[type(msg)](ident, msg, t1)
            except Exception as e:  # this message failed; the worker serves on
                out = [protocol.Error("internal", f"{type(msg).__name__} failed: {type(e).__name__}: {e}")]
            if isinstance(msg, (protocol.Start, protocol.Propose, protocol.Commit)) and (
                    msg.req in self.drafters or msg.req in self.streams):   # only requests it holds
                self.seen[msg.req] = time.time()
        return [self._refuse(peer, msg, m) if isinstance(m, protocol.Error) else m for m in out]

    def _refuse(self, peer: str, msg, err: protocol.Error) -> protocol.Error:
        self.log.refused(peer, err.code, f"{type(msg).__name__}: {err.message}")
        return err

    def handle_ping(self, ident, msg: protocol.Ping, t1: float) -> list:
        return [protocol.Pong(msg.t0, t1, time.time())]

    def handle_hello(self, ident, msg: protocol.Hello, t1: float) -> list:
        err = protocol.check_hello(msg, self.welcome)
        if err is None:
            self.welcomed.add(ident)
        return [err or self.welcome]

    def handle_start(self, ident, msg: protocol.Start, t1: float) -> list:
        bad = protocol.check_start(msg, self.pair.vocab_size, self.engine.capacity)
        if bad is not None:
            return [bad]
        s = Sampling(*protocol.sampling_args(msg))
        if msg.stream:
            try:
                d = StreamDrafter(self.engine, msg.q_top, msg.window, msg.fanout, msg.depth, msg.ranks, msg.watch)
            except ValueError as e:     # an outcome cache this draft engine cannot draft
                return [protocol.Error("mismatch", str(e))]
            run = lambda: d.start(msg.prompt_ids, msg.size, msg.first, s, msg.seed)   # noqa: E731
        else:
            d = Drafter(self.engine, q_top=msg.q_top)
            run = lambda: d.start(msg.prompt_ids, msg.size, s, msg.seed)   # noqa: E731
        table = self.streams if msg.stream else self.drafters
        if len(msg.prompt_ids) > PREFILL_THREAD_IDS and str(getattr(self.engine, "device", "cpu")) == "cpu":
            self._one_request(ident)                     # answered when its thread is done (run_ahead)
            table[msg.req] = (ident, d)
            self.prefill = _Prefill(ident, msg, d, run)
            return []
        run()               # (on a GPU even a long prompt's prefill takes milliseconds)
        self._one_request(ident)
        table[msg.req] = (ident, d)
        return [protocol.Started(msg.req, d.prefill_s * 1e3)]

    def prefilled(self, sock) -> None:
        """A long prompt's prefill is done: its Started (or Error), then the messages held meanwhile, in order,
        until one starts another long prefill."""
        p, self.prefill = self.prefill, None
        if p.error is None:
            self.seen[p.msg.req] = time.time()       # (the idle sweep counts from the answer)
            self.send(sock, p.ident, [protocol.Started(p.msg.req, p.drafter.prefill_s * 1e3)])
        else:
            for table in (self.drafters, self.streams):
                table.pop(p.msg.req, None)
            self.send(sock, p.ident, [protocol.Error("internal", f"Start failed: {type(p.error).__name__}: {p.error}")])
        while self.held and self.prefill is None:
            self.answer(sock, *self.held.pop(0))

    def _one_request(self, ident: bytes) -> None:
        """Batch 1: the one engine cache holds the newest request only; another peer's request it ends is told
        so at once (an Error to that peer), not left to time out."""
        for table in (self.drafters, self.streams):
            for req, (owner, _) in table.items():
                if owner != ident:
                    self.outbox.append((owner, protocol.Error(
                        "busy", f"request {req!r} ended: another target started a request on this draft worker, "
                                f"which drafts one sequence at a time")))
            table.clear()

    def handle_propose(self, ident, msg: protocol.Propose, t1: float) -> list:
        owner, d = self.drafters.get(msg.req, (None, None))
        if owner != ident:
            return [protocol.Error("unknown-request", f"no request {msg.req!r} (send Start first)")]
        if not (1 <= msg.k <= MAX_K and msg.n_prev >= 0 and 0 <= msg.nxt < self.pair.vocab_size):
            return [protocol.Error("bad-message", f"Propose {msg.req!r}: k={msg.k} (use 1 to {MAX_K}), n_prev="
                                   f"{msg.n_prev} (>= 0), nxt={msg.nxt} (a token id below {self.pair.vocab_size})")]
        c0 = d.compute_s
        toks, q = d.propose(msg.n_prev, msg.nxt, msg.k)
        idx, val = q_pairs(q, d.q_top)
        return [protocol.Proposal(msg.req, toks, (d.compute_s - c0) * 1e3, idx, val, (time.time() - t1) * 1e3)]

    def handle_commit(self, ident, msg: protocol.Commit, t1: float) -> list:
        owner, sd = self.streams.get(msg.req, (None, None))
        if owner != ident:
            return [protocol.Error("unknown-request", f"no stream {msg.req!r} (send Start first)")]
        if not (msg.pos >= 0 and 0 <= msg.token < self.pair.vocab_size):
            self.streams.pop(msg.req)       # a target that sends this has lost the stream's thread: end it
            return [protocol.Error("bad-message", f"Commit {msg.req!r}: position {msg.pos} / token {msg.token} "
                                   f"(token ids are in [0, {self.pair.vocab_size})); stream ended")]
        steps = sd.commit(msg.pos, msg.token)
        return [m for st in steps for m in drafted_messages(msg.req, st)]

    def handle_end(self, ident, msg: protocol.End, t1: float) -> list:
        for table in (self.drafters, self.streams):
            if table.get(msg.req, (None,))[0] == ident:
                del table[msg.req]
                self.seen.pop(msg.req, None)
        return [protocol.Ended(msg.req)]

    def _count(self, n: int) -> None:
        """Note n proposals or draft steps sent (die_after's count)."""
        self.served += n
        if self.die_after and self.served >= self.die_after:
            os._exit(17)           # a crash, as far as the target can tell

    def expire(self) -> None:
        """Free the state of requests whose peer has said nothing for idle_s (a target that died)."""
        now = time.time()
        for req in [r for r, t in self.seen.items() if now - t > self.idle_s]:
            del self.seen[req]
            if self.streams.pop(req, None) is not None or self.drafters.pop(req, None) is not None:
                self.log.line(f"freed request {req!r}: no word from its target for {self.idle_s:.0f} s")

    def run_ahead(self, sock) -> bool:
        """Between messages: queue the next draft step if there is room, and send the oldest one once its
        token is on the host. Never waits for the device while a step runs (the loop looks at the socket
        between calls); True while there is work in flight or room to draft."""
        if self.prefill is not None:
            if self.prefill.thread.is_alive():
                time.sleep(PREFILL_POLL_S)
                return True
            self.prefilled(sock)
        self.expire()
        for req, (ident, d) in self.streams.items():
            try:
                if d.can_step():
                    d.launch()
                if d.ready():               # on a CPU always: the launch computed the step
                    self.send(sock, ident, drafted_messages(req, d.settle()))
            except Exception as e:      # this request's stream ends; the worker serves on
                self.streams.pop(req)
                reply(sock, ident, protocol.Error("internal", f"{type(e).__name__}: {e}"))
                return False
            return bool(d.flight) or d.can_step()
        return False


def serve_draft(bind: str, pair, die_after: int = 0, max_seconds: float = 0, engine_opts: dict | None = None,
                spin_s: float = 0.0, idle_s: float = 10.0, keys=None) -> None:
    """Serve proposals until killed (or max_seconds). die_after > 0 exits the process abruptly
    after that many proposals: fault injection for tests. engine_opts: sdeth.runtime.make_engine's.
    idle_s: a request whose target says nothing for this long is freed (its target died or gave up).
    keys: serve only CURVE clients these keys authorize (wire.auth.Keys); None: plain TCP."""
    DraftWorker(pair, engine_opts, die_after, idle_s).serve(bind, max_seconds, spin_s, keys)

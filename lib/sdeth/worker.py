"""Draft and target workers: `python -m sdeth worker --role draft|target --bind tcp://ADDR:PORT ...`.

Sockets are zmq ROUTER (servers) and DEALER (clients); every message is one msgpack frame from
`sdeth.protocol`. Workers bind to the address they are given, never to every interface by default.
"""
from __future__ import annotations

import os
import sys
import time
import uuid

import torch
import zmq

from . import protocol as W
from .synthetic import make_engine
from .costmodel import Estimator, TakeWhatIsThere
from .loop import DraftUnavailable, Drafter, Request, generate_sd, generate_target_only
from .pipeline import StreamDrafter, StreamView, generate_pipelined
from .verify import Sampling


def _welcome(pair, role_model) -> W.Welcome:
    from .models import tokenizer_hash
    return W.Welcome(W.PROTOCOL_VERSION, role_model, pair.vocab_size, tokenizer_hash(pair.tokenizer),
                     pair.config.dtype)


WARM_WIDTHS = 10     # forward widths captured as CUDA graphs before serving (verify of k <= 9)


def _reply(sock, ident: bytes, msg) -> None:
    sock.send_multipart([ident, W.encode(msg)])


def _q_pairs(q, q_top: int):
    """A sampled draft's q as (ids, probs) of its q_top non-zero entries per token (None, None for a
    greedy draft): only those cross the wire."""
    if q is None:
        return None, None
    top = torch.topk(q, min(q_top or q.shape[-1], q.shape[-1]), dim=-1)
    return top.indices.tolist(), top.values.tolist()


def _requests(bind: str, max_seconds: float = 0, idle=None):
    """The server loop both workers share: bind a ROUTER to exactly `bind`, yield (sock, ident, message,
    receive time) for each well-formed message; malformed or oversized ones get an Error reply here.
    idle(sock) -> bool: background work (the pipelined draft's run-ahead), one step per call, done
    only when no message is waiting; True while there is more."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(bind)
    t_end = time.time() + max_seconds if max_seconds else float("inf")
    busy = False
    try:
        while time.time() < t_end:
            if not sock.poll(0 if busy else 500):
                busy = bool(idle and idle(sock))
                continue
            busy = idle is not None
            frames = sock.recv_multipart()
            t_recv = time.time()
            if len(frames) != 2:
                continue                   # not a DEALER peer speaking our framing
            ident, data = frames
            try:
                msg = W.decode(data)
            except W.ProtocolError as e:
                _reply(sock, ident, W.Error(e.code, str(e)))
                continue
            yield sock, ident, msg, t_recv
    finally:
        sock.close()


def serve_draft(bind: str, pair, die_after: int = 0, max_seconds: float = 0, engine_opts: dict | None = None) -> None:
    """Serve proposals until killed (or max_seconds). die_after > 0 exits the process abruptly
    after that many proposals: fault injection for tests. engine_opts: synthetic.make_engine's."""
    me = _welcome(pair, pair.config.draft)
    welcomed: set[bytes] = set()
    drafters: dict[str, Drafter] = {}
    streams: dict[str, tuple[bytes, StreamDrafter]] = {}
    served = 0
    # one engine (one cache, its CUDA graphs) for the worker's life
    engine = make_engine(pair.draft, "draft", "draft", vocab=pair.vocab_size, **(engine_opts or {}))
    engine.warm(WARM_WIDTHS)

    def run_ahead(sock) -> bool:
        """One draft step for the first stream with room in its window; True if any stepped."""
        nonlocal served
        for req, (ident, d) in streams.items():
            if d.can_step():
                c0 = d.compute_s
                try:
                    epoch, pos, tok, q = d.step()
                except Exception as e:      # this request's stream ends; the worker serves on
                    streams.pop(req)
                    _reply(sock, ident, W.Error("internal", f"{type(e).__name__}: {e}"))
                    return False
                idx, val = _q_pairs(q, d.q_top)
                _reply(sock, ident, W.Drafted(req, epoch, pos, tok, (d.compute_s - c0) * 1e3, idx, val))
                served += 1
                if die_after and served >= die_after:
                    os._exit(17)
                return True
        return False

    print(f"sdeth draft worker: {pair.config.draft} on {bind}", flush=True)
    for sock, ident, msg, t1 in _requests(bind, max_seconds, run_ahead):
        try:
            if isinstance(msg, W.Ping):
                _reply(sock, ident, W.Pong(msg.t0, t1, time.time()))
            elif isinstance(msg, W.Hello):
                err = W.check_hello(msg, me)
                if err is None:
                    welcomed.add(ident)
                _reply(sock, ident, err or me)
            elif ident not in welcomed:
                _reply(sock, ident, W.Error("version", "send Hello first (protocol handshake)"))
            elif isinstance(msg, W.Start):
                s = Sampling(msg.temperature, msg.top_p, msg.top_k, msg.draft_sampled)
                if msg.stream:
                    sd = StreamDrafter(engine, msg.q_top, msg.window)
                    sd.start(msg.prompt_ids, msg.size, msg.first, s, msg.seed)
                    streams.clear()            # one request at a time per draft worker (batch 1)
                    streams[msg.req] = (ident, sd)
                    _reply(sock, ident, W.Started(msg.req, sd.prefill_s * 1e3))
                    continue
                d = Drafter(engine, q_top=msg.q_top)
                d.start(msg.prompt_ids, msg.size, s, msg.seed)
                drafters.clear()
                drafters[msg.req] = d
                _reply(sock, ident, W.Started(msg.req, d.prefill_s * 1e3))
            elif isinstance(msg, W.Commit):
                st = streams.get(msg.req)
                if st is None:
                    _reply(sock, ident, W.Error("unknown-request", f"no stream {msg.req!r} (send Start first)"))
                    continue
                st[1].commit(msg.pos, msg.token)
            elif isinstance(msg, W.Propose):
                d = drafters.get(msg.req)
                if d is None:
                    _reply(sock, ident, W.Error("unknown-request", f"no request {msg.req!r} (send Start first)"))
                    continue
                c0 = d.compute_s
                toks, q = d.propose(msg.n_prev, msg.nxt, msg.k)
                idx, val = _q_pairs(q, d.q_top)
                _reply(sock, ident, W.Proposal(msg.req, toks, (d.compute_s - c0) * 1e3, idx, val))
                served += 1
                if die_after and served >= die_after:
                    os._exit(17)           # a crash, as far as the target can tell
            elif isinstance(msg, W.End):
                drafters.pop(msg.req, None)
                streams.pop(msg.req, None)
                _reply(sock, ident, W.Ended(msg.req))
            else:
                _reply(sock, ident, W.Error("bad-message", f"a draft worker does not take {type(msg).__name__}"))
        except Exception as e:  # keep serving others
            _reply(sock, ident, W.Error("internal", f"{type(e).__name__}: {e}"))


class Client:
    """A DEALER socket with request/reply, a timeout, and byte counters. After a timeout the socket is
    replaced (a late reply must not be taken for the next one)."""

    def __init__(self, addr: str, timeout_s: float = 5.0):
        self.addr, self.timeout_s = addr, timeout_s
        self.sent = self.received = 0
        self._open()

    def _open(self):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # a fixed routing id per socket: after a dropped TCP connection (a relay restarted) zmq
        # reconnects and the server still knows this peer's handshake
        self.sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
        self.sock.connect(self.addr)

    def call(self, msg, timeout_s: float | None = None):
        self.send(msg)
        reply = self.recv(timeout_s or self.timeout_s)
        if reply is None:
            self.sock.close()
            self._open()
            raise TimeoutError(f"no answer from {self.addr} within {timeout_s or self.timeout_s:.1f} s")
        return reply

    def send(self, msg) -> None:
        data = W.encode(msg)
        self.sock.send(data)
        self.sent += len(data)

    def recv(self, timeout_s: float):
        """The next message, or None after timeout_s (0: only what has already arrived)."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        data = self.sock.recv()
        self.received += len(data)
        return W.decode(data)

    def close(self):
        self.sock.close()


class RemoteDrafter:
    """The target's handle on a draft worker: the Drafter interface over the wire."""

    def __init__(self, addr: str, hello: W.Hello, s: Sampling, q_top: int = 64, timeout_s: float = 5.0,
                 device="cpu"):
        self.client = Client(addr, timeout_s)
        self.s, self.q_top, self.seq = s, q_top, 0
        self.device = torch.device(device)        # the target's: q is rebuilt where the target verifies
        reply = self._call(hello)
        if isinstance(reply, W.Error):
            raise ConnectionRefusedError(f"draft worker at {addr} refused the handshake: {reply.message}")
        self.peer = reply
        self.compute_s = 0.0
        self.req = ""

    def _call(self, msg):
        try:
            reply = self.client.call(msg)
        except TimeoutError as e:
            raise DraftUnavailable(str(e)) from None
        if isinstance(reply, W.Error) and not isinstance(msg, W.Hello):
            raise DraftUnavailable(f"draft worker error ({reply.code}): {reply.message}")
        return reply

    def start(self, prompt_ids, size, s=None, seed=None):
        """seed: the draft's sampling seed for this request (None: a fresh one)."""
        seed = int.from_bytes(os.urandom(7), "little") if seed is None else seed
        self.seq += 1
        self.req = f"{os.getpid()}-{self.seq}-{uuid.uuid4().hex[:6]}"
        s = s or self.s
        self.compute_s = 0.0
        self._call(W.Start(self.req, list(prompt_ids), size, s.temperature, s.top_p, s.top_k, s.draft_sampled,
                           self.q_top, seed))

    def propose(self, n_prev: int, nxt: int, k: int):
        p = self._call(W.Propose(self.req, n_prev, nxt, k))
        self.compute_s += p.draft_ms / 1e3
        return p.tokens, self._q(p.q_idx, p.q_val, len(p.tokens))

    def _q(self, idx, val, rows: int | None = None):
        """A sampled draft's q from its wire pairs: [rows, V] (or [V] for rows=None) on the target's
        device, V the pair's shared tokenizer size (the logits are cut to it on both sides)."""
        if idx is None:
            return None
        shape = (self.peer.vocab_size,) if rows is None else (rows, self.peer.vocab_size)
        return torch.zeros(shape, device=self.device).scatter_(
            -1, torch.tensor(idx, device=self.device), torch.tensor(val, device=self.device))

    def end(self):
        try:
            self.client.call(W.End(self.req), timeout_s=1.0)
        except (TimeoutError, W.ProtocolError):
            pass


class RemoteStream(RemoteDrafter):
    """The target's handle on a draft worker in pipelined mode (sdeth.pipeline's stream interface):
    Commits go out without waiting; Drafted messages are taken in whenever the target looks."""

    def __init__(self, addr: str, hello: W.Hello, s: Sampling, q_top: int = 64, timeout_s: float = 5.0,
                 device="cpu", window: int = 16):
        super().__init__(addr, hello, s, q_top, timeout_s, device)
        self.window, self.view, self.est, self.by_commit = window, StreamView(), None, False

    def _expect(self, msg, kind, timeout_s: float):
        """Send msg; the reply of type `kind` for this request (stale Drafted messages are skipped)."""
        self.client.send(msg)
        t_end = time.perf_counter() + timeout_s
        while (left := t_end - time.perf_counter()) > 0:
            reply = self.client.recv(left)
            if isinstance(reply, W.Error):
                raise DraftUnavailable(f"draft worker error ({reply.code}): {reply.message}")
            if isinstance(reply, kind) and reply.req == self.req:
                return reply
        raise DraftUnavailable(f"no {kind.__name__} from {self.client.addr} within {timeout_s:.1f} s")

    def start(self, prompt_ids, size, first, s=None, seed=None):
        seed = int.from_bytes(os.urandom(7), "little") if seed is None else seed
        self.seq += 1
        self.req = f"{os.getpid()}-{self.seq}-{uuid.uuid4().hex[:6]}"
        s = s or self.s
        self.compute_s, self.streamed = 0.0, 0
        self.view.reset()
        # not waiting for Started: the draft's prefill overlaps the target's first steps
        self.client.send(W.Start(self.req, list(prompt_ids), size, s.temperature, s.top_p, s.top_k, s.draft_sampled,
                                 self.q_top, seed, stream=True, first=first, window=self.window))

    def commit(self, pos: int, token: int) -> None:
        epoch = self.view.epoch
        self.view.on_commit(pos, token)
        if self.view.epoch != epoch:
            self.by_commit = True          # a correction: time its round trip on the first new token
        self.client.send(W.Commit(self.req, pos, token))

    def _take(self, msg) -> None:
        if isinstance(msg, W.Error):
            raise DraftUnavailable(f"draft worker error ({msg.code}): {msg.message}")
        if not isinstance(msg, W.Drafted) or msg.req != self.req:
            return
        self.compute_s += msg.draft_ms / 1e3
        self.streamed += 1
        q = self._q(msg.q_idx, msg.q_val)
        fresh = msg.epoch == self.view.epoch and self.view.received == 0
        self.view.on_drafted(msg.epoch, msg.pos, msg.token, q)
        if self.est is not None:
            self.est.observe_draft(msg.draft_ms / 1e3)
            if fresh and self.by_commit:   # the first token after a correction: a round trip + one step
                self.est.observe_rtt(time.perf_counter() - self.view.t_epoch - msg.draft_ms / 1e3)
        if fresh:
            self.by_commit = False

    def poll(self) -> None:
        while (msg := self.client.recv(0)) is not None:
            self._take(msg)

    def wait(self, timeout_s: float) -> None:
        msg = self.client.recv(timeout_s)
        if msg is None:
            raise DraftUnavailable(f"no draft token from {self.client.addr} within {timeout_s:.1f} s")
        self._take(msg)
        self.poll()

    def end(self):
        try:
            self._expect(W.End(self.req), W.Ended, 1.0)
        except (DraftUnavailable, W.ProtocolError):
            pass


def serve_target(bind: str, pair, draft_addr: str | None, draft_timeout_s: float = 5.0,
                 max_seconds: float = 0, engine_opts: dict | None = None) -> None:
    """Decode requests from a controller; SD with the remote draft when it answers."""
    from .models import tokenizer_hash
    target = make_engine(pair.target, "target", "target", vocab=pair.vocab_size, **(engine_opts or {}))
    target.warm(WARM_WIDTHS)
    eos = pair.tokenizer.eos_token_id
    hello = W.Hello(W.PROTOCOL_VERSION, "target", pair.config.target, pair.vocab_size,
                    tokenizer_hash(pair.tokenizer), pair.config.dtype)
    drafter, why_not = None, ""
    estimators: dict[str, Estimator] = {}      # per mode; they carry what they learnt to the next request
    print(f"sdeth target worker: {pair.config.target} on {bind}, draft at {draft_addr}", flush=True)
    for sock, ident, msg, t1 in _requests(bind, max_seconds):
        if isinstance(msg, W.Ping):
            _reply(sock, ident, W.Pong(msg.t0, t1, time.time()))
            continue
        if not isinstance(msg, W.Generate):
            _reply(sock, ident, W.Error("bad-message", f"a target worker takes Generate, not {type(msg).__name__}"))
            continue
        try:
            s = Sampling(msg.temperature, msg.top_p, msg.top_k, msg.draft_sampled)
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
                if drafter is None and draft_addr:
                    try:
                        drafter = kind(draft_addr, hello, s, timeout_s=draft_timeout_s, device=target.device)
                    except (DraftUnavailable, ConnectionRefusedError) as e:
                        why_not = str(e)
                b0 = (drafter.client.sent, drafter.client.received) if drafter else (0, 0)
                est = estimators.setdefault(f"{msg.mode}-{msg.k}-{msg.adaptive}",
                                            Estimator() if msg.adaptive or msg.mode != "pipelined" else TakeWhatIsThere())
                if msg.mode == "pipelined":
                    if drafter is not None:
                        drafter.window, drafter.est = 2 * msg.k + 2, est
                    r = generate_pipelined(target, drafter or _NoDraft(why_not), msg.prompt_ids, msg.max_tokens,
                                           msg.k, s, eos, gen, msg.req, est, draft_timeout_s, draft_seed)
                else:
                    r = generate_sd(target, drafter or _NoDraft(why_not), msg.prompt_ids, msg.max_tokens, msg.k, s,
                                    eos, gen, msg.req, est if msg.adaptive else None, draft_seed)
                if drafter is not None and r.tokens_without_draft:
                    drafter = None           # reconnect (and re-handshake) for the next request
                elif drafter is not None and msg.mode != "pipelined":
                    drafter.end()          # (generate_pipelined ends its stream itself)
                b1 = (drafter.client.sent, drafter.client.received) if drafter else b0
                rec = {**r.__dict__, "bytes_sent": b1[0] - b0[0], "bytes_received": b1[1] - b0[1],
                       "draft_unavailable": why_not if r.tokens_without_draft else ""}
            _reply(sock, ident, W.Generated(msg.req, rec))
        except Exception as e:
            _reply(sock, ident, W.Error("internal", f"{type(e).__name__}: {e}"))


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


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m sdeth worker")
    ap.add_argument("--role", required=True, choices=["draft", "target"])
    ap.add_argument("--bind", required=True, help="tcp://ADDR:PORT to listen on (only that address)")
    ap.add_argument("--pair", default="embedded")
    ap.add_argument("--target"), ap.add_argument("--draft")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--draft-addr", help="target role: tcp://ADDR:PORT of the draft worker")
    ap.add_argument("--draft-timeout", type=float, default=5.0, help="seconds before the target stops waiting for a proposal")
    ap.add_argument("--die-after", type=int, default=0, help="fault injection: exit after N proposals")
    ap.add_argument("--max-seconds", type=float, default=0, help="exit after this long (0: run until killed)")
    ap.add_argument("--impl", default="hf", choices=["hf", "fast"], help="model code: transformers, or sdeth.fastmodel")
    ap.add_argument("--compile", default="", help="fast impl: torch.compile mode for the graph widths "
                                                  "(e.g. max-autotune-no-cudagraphs); empty: off")
    ap.add_argument("--capacity", type=int, default=4096, help="CUDA-graph cache length (tokens)")
    ap.add_argument("--synthetic-alpha", type=float, default=None,
                    help="timing with random weights: accept each draft token with this probability (sdeth.synthetic)")
    ap.add_argument("--synthetic-seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.bind.startswith("tcp://*") or a.bind.startswith("tcp://0.0.0.0"):
        print("sdeth worker: binding every interface; pass the node's own address unless you mean it", file=sys.stderr)
    try:
        import setproctitle
        setproctitle.setproctitle(f"sdeth-worker --role {a.role} --bind {a.bind}")
    except ImportError:
        pass
    from .models import load_pair
    torch.set_num_threads(max(1, int(os.environ.get("SDETH_THREADS", torch.get_num_threads()))))
    if a.device.startswith("cuda"):
        torch.cuda.set_device(a.device)      # streams, graphs and syncs on this worker's GPU
    pair = load_pair(a.pair, a.target, a.draft, device=a.device, roles=(a.role,))
    opts = dict(impl=a.impl, compile_mode=a.compile or None, capacity=a.capacity,
                synthetic_alpha=a.synthetic_alpha, synthetic_seed=a.synthetic_seed)
    if a.role == "draft":
        serve_draft(a.bind, pair, a.die_after, a.max_seconds, opts)
    else:
        serve_target(a.bind, pair, a.draft_addr, a.draft_timeout, a.max_seconds, opts)
    return 0

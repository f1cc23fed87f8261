"""The target's handles on a remote draft worker: `RemoteDrafter` (a draft source for the sync loop)
and `RemoteStream` (a draft stream for the pipelined loop), over the transport.
"""
from __future__ import annotations

import collections
import os
import time
import uuid

import torch

from ..runtime.loop import DraftUnavailable
from ..runtime.pipeline import StreamView
from ..runtime.verify import Sampling
from . import protocol
from .transport import Client, PeerGone

HEALTH_SLICE_S = 0.1     # a reply is awaited in slices this long, the heartbeat's view read between them


DECODE = protocol.Decoder("a draft worker's client", protocol.DRAFT_SENDS)


def q_from_pairs(idx, val, vocab: int, device, rows: int | None = None):
    """A sampled draft's q from its wire pairs: [rows, V] (or [V] for rows=None) on the target's device, V the
    pair's shared tokenizer size (the logits are cut to it on both sides); None for a greedy draft (idx None)."""
    if idx is None:
        return None
    shape = (vocab,) if rows is None else (rows, vocab)
    return torch.zeros(shape, device=device).scatter_(-1, torch.tensor(idx, device=device),
                                                      torch.tensor(val, device=device))


class RemoteDrafter:
    """The target's handle on a draft worker: a draft source (runtime.roles.DraftSource) over the wire."""
    compute_s: float = 0.0      # the draft's model time since start(), as the draft worker reports it
    starts_async = True         # start() sends Start and returns; the Started reply is taken at the first propose

    def __init__(self, addr: str, hello: protocol.Hello, s: Sampling, q_top: int = 64, timeout_s: float = 5.0,
                 device="cpu", spin_s: float = 0.0, health=None, keys=None):
        self.client = Client(addr, timeout_s, spin_s, decode=DECODE, gone_fast=True, keys=keys)
        self.health = health      # wire.health.DraftHealth or None: a draft it marks down is not waited for
        self.lost = ""            # why the draft was lost in the current request ("" while it serves)
        self.lost_answered = False   # ... and whether the draft worker said so itself (it is alive)
        self.sampling, self.q_top, self.seq = s, q_top, 0
        self.device = torch.device(device)        # the target's: q is rebuilt where the target verifies
        reply = self._call(hello)
        if isinstance(reply, protocol.Error):
            raise ConnectionRefusedError(f"draft worker at {addr} refused the handshake: {reply.message}")
        self.peer = reply
        self.compute_s = self.held_s = 0.0
        self.req, self.starting, self.started_wait_s = "", False, 0.0
        self.bare_rtt_ms = self.ping()

    def ping(self, n: int = 20) -> float:
        """Median round trip (ms) of a bare Ping/Pong with the draft worker: the transport's floor."""
        rtts = []
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                if isinstance(self.client.call(protocol.Ping(time.time()), timeout_s=1.0), protocol.Pong):
                    rtts.append((time.perf_counter() - t0) * 1e3)
            except (TimeoutError, PeerGone):       # a draft gone quiet: the first Propose will say so (DraftUnavailable)
                break
        return sorted(rtts)[len(rtts) // 2] if rtts else float("nan")

    def unavailable(self, why: str, answered: bool = False) -> DraftUnavailable:
        """The error that ends drafting for this request; its reason is kept for the request's record. answered:
        the draft worker itself said no (an Error reply), so it is alive."""
        if not self.lost:
            self.lost, self.lost_answered = why, answered
        return DraftUnavailable(why)

    def _down(self) -> str:
        """Why the heartbeat says the draft is away, or '' while it is up (or there is no heartbeat)."""
        if self.health is None or self.health.up:
            return ""
        return f"the heartbeat marked the draft worker at {self.client.addr} down ({self.health.why})"

    def _recv(self, timeout_s: float):
        """The next message within timeout_s, or None; waits in slices and stops early (DraftUnavailable)
        when the connection closes or the heartbeat marks the draft down."""
        t_end = time.perf_counter() + timeout_s
        try:
            while True:
                msg = self.client.recv(min(HEALTH_SLICE_S, max(t_end - time.perf_counter(), 0)))
                if msg is not None:
                    return msg
                if why := self._down():        # also for the pipelined loop's short waits and polls
                    raise self.unavailable(why)
                if time.perf_counter() >= t_end:
                    return None
        except (PeerGone, protocol.ProtocolError) as e:
            raise self.unavailable(str(e)) from None

    def _call(self, msg):
        """Send msg and take the reply (msg None: only take the next message)."""
        if msg is not None:
            self.client.forget_gone()
            self.client.send(msg)
        reply = self._recv(self.client.timeout_s)
        if reply is None:
            self.client.reopen()          # a late reply must not be taken for the next one
            raise self.unavailable(f"no answer from {self.client.addr} within {self.client.timeout_s:.1f} s")
        if isinstance(reply, protocol.Error) and not isinstance(msg, protocol.Hello):
            raise self.unavailable(f"draft worker error ({reply.code}): {reply.message}", answered=True)
        return reply

    def _begin(self, seed: int | None) -> int:
        """A new request: its id, zeroed counters, and the draft's sampling seed (None: a fresh one)."""
        self.seq += 1
        self.req = f"{os.getpid()}-{self.seq}-{uuid.uuid4().hex[:6]}"
        self.lost, self.lost_answered = "", False
        self.compute_s = self.held_s = self.started_wait_s = 0.0
        return int.from_bytes(os.urandom(7), "little") if seed is None else seed

    def start(self, prompt_ids, size, s=None, seed=None):
        """Send Start and return: the draft's prefill runs while the target prefills (its Started is
        taken in before the first proposal; an error there makes that proposal fail: decode alone)."""
        seed = self._begin(seed)
        s = s or self.sampling
        self.client.forget_gone()
        self.client.send(protocol.Start(self.req, list(prompt_ids), size, q_top=self.q_top, seed=seed,
                                        **protocol.sampling_fields(s)))
        self.starting = True

    def _started(self) -> None:
        if self.starting:
            self.starting = False
            t0 = time.perf_counter()
            reply = self._call(None)
            self.started_wait_s = time.perf_counter() - t0
            if not isinstance(reply, protocol.Started) or reply.req != self.req:
                raise self.unavailable(f"draft worker answered Start with {type(reply).__name__}")

    def propose(self, n_prev: int, nxt: int, k: int):
        self._started()
        p = self._call(protocol.Propose(self.req, n_prev, nxt, k))
        self.compute_s += p.draft_ms / 1e3
        self.held_s += p.held_ms / 1e3
        return p.tokens, self._q(p.q_idx, p.q_val, len(p.tokens))

    def _q(self, idx, val, rows: int | None = None):
        return q_from_pairs(idx, val, self.peer.vocab_size, self.device, rows)

    def end(self):
        try:
            if self.starting:          # no proposal was asked for: take the Started first
                self.starting = False
                self.client.call_reply(timeout_s=1.0)
            self.client.call(protocol.End(self.req), timeout_s=1.0)
        except (TimeoutError, PeerGone, protocol.ProtocolError):
            pass


class RemoteStream(RemoteDrafter):
    """The target's handle on a draft worker in pipelined mode (sdeth.runtime.pipeline's stream interface):
    Commits go out without waiting; Drafted messages are taken in whenever the target looks."""
    streamed: int = 0           # tokens the draft streamed in this request

    def __init__(self, addr: str, hello: protocol.Hello, s: Sampling, q_top: int = 64, timeout_s: float = 5.0,
                 device="cpu", spin_s: float = 0.0, window: int = protocol.STREAM_WINDOW, health=None, keys=None):
        super().__init__(addr, hello, s, q_top, timeout_s, device, spin_s, health, keys)
        self.window, self.view, self.est, self.by_commit = window, StreamView(), None, False
        self.cache = (0, 4, 1)                          # the outcome cache: (fanout, depth, ranks); 0: off
        self.watch = 0                                  # cache off: ask for the draft's next choices (Start.watch)
        self.branched = 0                               # branch tokens the draft streamed in this request
        self.link_ms = self.bare_rtt_ms if self.bare_rtt_ms == self.bare_rtt_ms else 0.0   # two transits, learnt
        self.transits = collections.deque(maxlen=8)     # recent observations of them (ms)

    def _expect(self, msg, kind, timeout_s: float):
        """Send msg; the reply of type `kind` for this request (stale Drafted messages are skipped)."""
        self.client.send(msg)
        t_end = time.perf_counter() + timeout_s
        while (left := t_end - time.perf_counter()) > 0:
            reply = self._recv(left)
            if isinstance(reply, protocol.Error):
                raise self.unavailable(f"draft worker error ({reply.code}): {reply.message}", answered=True)
            if isinstance(reply, kind) and reply.req == self.req:
                return reply
        raise self.unavailable(f"no {kind.__name__} from {self.client.addr} within {timeout_s:.1f} s")

    def start(self, prompt_ids, size, first, s=None, seed=None):
        seed = self._begin(seed)
        s = s or self.sampling
        self.streamed = self.branched = 0
        self.restarts_ms: list[float] = []     # commit that corrected the draft -> its first new token
        self.periods_ms: list[float] = []      # the draft's step to step, where it timed one (Drafted.period_ms)
        self.by_commit = False
        self.view.reset()
        self.client.forget_gone()
        # not waiting for Started: the draft's prefill overlaps the target's first steps
        self.client.send(protocol.Start(self.req, list(prompt_ids), size, q_top=self.q_top, seed=seed, stream=True,
                                        first=first, window=self.window, fanout=self.cache[0], depth=self.cache[1],
                                        ranks=self.cache[2], watch=0 if self.cache[0] else self.watch,
                                        **protocol.sampling_fields(s)))

    def commit(self, pos: int, token: int) -> None:
        epoch, hits = self.view.epoch, self.view.hits
        self.view.on_commit(pos, token)
        if self.view.epoch != epoch:       # a correction: time its round trip on the first new token (not a hit's)
            self.by_commit = self.view.hits == hits
        self.client.send(protocol.Commit(self.req, pos, token))

    def _take(self, msg) -> None:
        if isinstance(msg, protocol.Error):
            raise self.unavailable(f"draft worker error ({msg.code}): {msg.message}", answered=True)
        if not isinstance(msg, protocol.Drafted) or msg.req != self.req:
            return
        q = self._q(msg.q_idx, msg.q_val)
        if msg.fork >= 0:                  # a branch token: drafted in a main token's step (its time counted there)
            self.branched += 1
            hits = self.view.hits
            self.view.on_drafted(msg.epoch, msg.pos, msg.token, q, msg.fork, msg.corr)
            if self.view.hits != hits:
                self.by_commit = False     # a hit: no restart to time
            return
        self.compute_s += msg.draft_ms / 1e3
        self.streamed += 1
        if msg.period_ms > 0:
            self.periods_ms.append(msg.period_ms)
            if self.est is not None:
                self.est.observe_period(msg.period_ms / 1e3, cached=self.cache[0] > 0)
        fresh = msg.epoch == self.view.epoch and self.view.received == 0
        self.view.on_drafted(msg.epoch, msg.pos, msg.token, q, alts=msg.alts)
        restart = self._restart_ms(msg, fresh)
        if restart is not None:
            self.restarts_ms.append(restart)
        if self.est is not None:
            self.est.observe_draft(msg.draft_ms / 1e3)
            if fresh and self.by_commit:   # the policy's round trip: as the target lived it (see _restart_ms)
                self.est.observe_rtt(time.perf_counter() - self.view.t_epoch - msg.draft_ms / 1e3)
        if fresh:
            self.by_commit = False

    def _restart_ms(self, msg, fresh: bool) -> float | None:
        """Restart latency (a correcting commit sent -> the draft's first new token received) = the draft's
        own span (commit received -> token sent, offset-free; Drafted.restart_ms) + the link's two transits.
        The target sees a token only when it looks; timed on its clock alone the figure would also hold a
        plain step it took meanwhile. (The policy's estimate keeps that: it is the delay the target lived
        through, and the event model's predictions were checked against it.) Each observation (seen minus
        the draft's span) is the two transits plus however late the target looked, so the transits are the
        least of the last few observations (seeded by the bare round trip at connect; a token that arrived
        while the target waited gives them exactly)."""
        if not (fresh and self.by_commit):
            return msg.restart_ms + self.link_ms if msg.restart_ms is not None else None
        seen = (time.perf_counter() - self.view.t_epoch) * 1e3
        if msg.restart_ms is None:
            return seen                   # a draft that does not report its span: the target's clock
        self.transits.append(max(seen - msg.restart_ms, 0.0))
        self.link_ms = min(self.transits)
        return msg.restart_ms + self.link_ms

    def poll(self) -> None:
        while (msg := self._recv(0)) is not None:
            self._take(msg)

    def wait(self, timeout_s: float) -> bool:
        msg = self._recv(timeout_s)
        if msg is None:
            return False
        self._take(msg)
        self.poll()
        return True

    def end(self):
        try:
            self._expect(protocol.End(self.req), protocol.Ended, 1.0)
        except (DraftUnavailable, PeerGone, protocol.ProtocolError):
            pass

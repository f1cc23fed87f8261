"""The target side's one client of a draft server (wire.draft_server): `DraftServerClient`, one connection and
many sequences (a target's batch), under the sync loop's and the pipelined loop's handles (wire.draft_handles), the
benchmarks' emulated targets and vLLM's remote draft proposer (wire.vllm_link).

The client keeps each sequence's settled context (`ServerTrack.context`), so that a `desync` answer costs one
re-open (the next generation, the whole context) and never a wrong draft.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

import msgspec
import zmq

from ..runtime.loop import DraftUnavailable
from ..runtime.verify import Sampling
from . import protocol
from .health import bare_rtt_ms
from .transport import Client, PeerGone

DECODE = protocol.Decoder("a draft server's client", protocol.SERVER_SENDS)
AGAIN = ("desync", "reclaimed")    # a row refused for these is opened again (next generation) and asked again
HEALTH_SLICE_S = 0.1     # a reply is awaited in slices this long, the heartbeat's view read between them


@dataclass(eq=False)
class ServerTrack:
    """One sequence as its client knows it."""
    seq: str
    s: Sampling
    seed: int
    q_top: int
    gen: int = 0
    context: list[int] = field(default_factory=list)   # settled: the prompt, accepted drafts, the target's tokens
    have: int = 0                  # tokens the draft holds, as far as this client knows
    prev: list[int] = field(default_factory=list)      # the last proposal
    reopened: int = 0              # desyncs recovered


@dataclass
class RoundCosts:
    """What the server reported for the newest round, and totals (ms)."""
    draft_ms: float = 0.0
    queued_ms: float = 0.0
    held_ms: float = 0.0
    host_ms: float = 0.0
    batch: int = 0
    wait_ms: float = 0.0           # this client's send -> last reply


class DraftServerClient:
    """One connection to the draft server at addr. wait (the default): the handshake is awaited here
    (ConnectionRefusedError for an Error, TimeoutError for silence), sends block, and a fresh socket says Hello
    again at once. wait=False (vLLM's proposer, which must never block a step): the Hello goes out and its answer
    comes later as any message does (take); every send is a post (never blocks); a fresh socket says Hello only
    when asked (hello_again); the Hello is sent as given (no client id of its own: the caller starts afresh
    after a reconnection). decode: the messages it takes (the errors name who took them)."""

    def __init__(self, addr: str, hello: protocol.Hello, timeout_s: float = 5.0, spin_s: float = 0.0, keys=None,
                 wait: bool = True, decode: protocol.Decoder = DECODE):
        self.client = Client(addr, timeout_s, spin_s, decode=decode, gone_fast=True, keys=keys)
        self.addr, self.waits, self.hello = addr, wait, hello
        self.health = None         # wire.health.DraftHealth or None: a draft it marks down is not waited for
        self.peer: protocol.Welcome | None = None    # the handshake's Welcome (wait=False: the caller takes it)
        self.last = RoundCosts()
        self.n = 0
        if not wait:
            self.send(hello)
            return
        # a client id of its own: a reconnection (after a timeout, a fresh socket) takes its sequences back
        self.hello = msgspec.structs.replace(hello, client=hello.client or uuid.uuid4().hex)
        # a fresh socket (after a timeout, or its connection closed) says Hello at once: the server hands it the old
        # connection's sequences while it holds them (GONE_S after the old one closed); the Welcome is no reply
        # awaited, and is passed over
        self.client.on_reopen = lambda: self.client.send(self.hello)
        self._handshake()

    def _handshake(self, said: bool = False) -> None:
        """Hello, and its Welcome taken (said: the Hello is out already, a fresh socket's on_reopen)."""
        reply = self.client.call_reply() if said else self.client.call(self.hello)
        if not isinstance(reply, protocol.Welcome):
            raise ConnectionRefusedError(f"draft server at {self.addr} refused the handshake: "
                                         f"{getattr(reply, 'message', reply)}")
        self.peer = reply

    def open(self, seq: str, prompt_ids: list[int], s: Sampling = Sampling(), seed: int | None = None,
             q_top: int = 64) -> ServerTrack:
        """A new sequence; no wait (the server feeds its prompt while this client prefills its own)."""
        seed = int.from_bytes(os.urandom(7), "little") if seed is None else seed
        t = ServerTrack(seq, s, seed, q_top, context=list(prompt_ids), have=len(prompt_ids))
        self._send_open(t, t.context)
        return t

    def recv(self, timeout_s: float):
        """The next message within timeout_s, or None; waits in slices and stops early (DraftUnavailable) when
        the connection closes or the heartbeat marks the draft down."""
        t_end = time.perf_counter() + timeout_s
        try:
            while True:
                m = self.client.recv(min(HEALTH_SLICE_S, max(t_end - time.perf_counter(), 0)))
                if m is not None:
                    return m
                if self.health is not None and not self.health.up:
                    raise DraftUnavailable(f"the heartbeat marked the draft server at {self.addr} down "
                                           f"({self.health.why})")
                if time.perf_counter() >= t_end:
                    return None
        except PeerGone as e:
            raise DraftUnavailable(str(e)) from None

    def _send_open(self, t: ServerTrack, context: list[int]) -> None:
        self.send_open(t.seq, t.gen, context, t.s, q_top=t.q_top, seed=t.seed)

    def send(self, msg) -> None:
        """One message out: as the transport sends it, or (built with wait=False) posted."""
        if self.waits:
            self.client.send(msg)
        else:
            self.post(msg)

    def post(self, msg) -> None:
        """Send without blocking: a full send queue means the server is not taking messages (PeerGone)."""
        try:
            self.client.send(msg, zmq.NOBLOCK)
        except zmq.Again:
            raise PeerGone(f"{self.addr} takes no messages (send queue full)") from None

    def send_open(self, seq: str, gen: int, context, s: Sampling | None = None, **kw) -> None:
        """Open seq's generation gen on context (its ids); s: its sampling (None: Open's defaults); kw: Open's other
        fields (q_top, seed, stream, window, branches)."""
        sampling = protocol.sampling_fields(s) if s is not None else {}
        self.send(protocol.Open(seq, gen, list(context), **kw, **sampling))

    def send_rows(self, kind, rows: list, per: int | None = None) -> None:
        """rows in messages of kind (protocol.Rounds, protocol.Commits): at most per rows each (none for no rows),
        or all of them in one (per None)."""
        for i in [0] if per is None else range(0, len(rows), per):
            self.send(kind(rows if per is None else rows[i:i + per]))

    def take(self, timeout_s: float):
        """The next message within timeout_s (0: only what has arrived), or None; one that is no message of the
        protocol comes as the Error it would be answered with, never raised; PeerGone when the connection closes
        meanwhile."""
        try:
            return self.client.recv(timeout_s)
        except protocol.ProtocolError as e:
            return protocol.Error(e.code, str(e))

    def hello_again(self) -> None:
        """A fresh socket (what the old one still receives is never taken) and a Hello on it."""
        self.client.reopen()
        if not self.waits:                 # (a waiting client's fresh socket says it itself)
            self.send(self.hello)

    def rounds(self, items: list[tuple[ServerTrack, int, list[int], int]]) -> list[protocol.RowDraft]:
        """One round for each (track, accepted of its last proposal, the target's tokens, k): their proposals
        (RowDrafts, in the order given; an error row is one the server refused). A desync is recovered once
        here (re-open, ask again)."""
        rows = [self._row(t, a, toks, k) for t, a, toks, k in items]
        got = self._exchange(rows, {t.seq: t for t, *_ in items})
        again = [(t, k) for (t, *_, k), r in zip(items, got) if r.error in AGAIN]
        if again:
            for t, _ in again:
                t.gen, t.reopened, t.prev = t.gen + 1, t.reopened + 1, []
                self._send_open(t, t.context[:-1])
                t.have = len(t.context) - 1
            redo = self._exchange([self._row(t, 0, t.context[-1:], k, fresh=True) for t, k in again],
                                  {t.seq: t for t, _ in again})
            fixed = {r.seq: r for r in redo}
            got = [fixed.get(r.seq, r) if r.error in AGAIN else r for r in got]
        for (t, *_), r in zip(items, got):
            t.prev = [] if r.error else list(r.tokens)
        return got

    def _row(self, t: ServerTrack, accepted: int, tokens: list[int], k: int, fresh: bool = False) -> protocol.Row:
        if not fresh:
            t.context += t.prev[:accepted] + list(tokens)
        row = protocol.Row(t.seq, t.gen, t.have, accepted, list(tokens), k)
        t.have += accepted + len(tokens)
        return row

    def _exchange(self, rows: list[protocol.Row], tracks: dict) -> list[protocol.RowDraft]:
        """Send one Rounds; take Drafts until every row is answered (in the rows' order)."""
        t0 = time.perf_counter()
        self.client.forget_gone()
        self.send_rows(protocol.Rounds, rows)
        want, got = {(r.seq, r.gen) for r in rows}, {}
        t_end = t0 + self.client.timeout_s
        while want - got.keys():
            left = t_end - time.perf_counter()
            m = self.recv(left) if left > 0 else None
            if m is None:
                self.client.reopen()
                raise DraftUnavailable(f"no Drafts from {self.addr} within {self.client.timeout_s:.1f} s")
            if isinstance(m, protocol.Error) and m.code == "version":
                return self._forgotten(rows, got)
            if isinstance(m, protocol.Error):
                raise DraftUnavailable(f"draft server error ({m.code}): {m.message}")
            if isinstance(m, protocol.Drafts):
                self._note(m, t0)
                got.update({(r.seq, r.gen): r for r in m.rows if (r.seq, r.gen) in want})
        return [got[(r.seq, r.gen)] for r in rows]

    def _forgotten(self, rows: list[protocol.Row], got: dict) -> list[protocol.RowDraft]:
        """The server no longer knows this client (it restarted, or this client was silent past its TTL): say Hello
        again; the rows not answered come back as desync, so that rounds() opens them again."""
        try:
            self.client.reopen()           # (its fresh socket says Hello: on_reopen)
            self._handshake(said=True)
        except (TimeoutError, PeerGone, ConnectionRefusedError) as e:
            raise DraftUnavailable(f"draft server at {self.addr} forgot this client and refused it again: {e}") from None
        return [got.get((r.seq, r.gen)) or protocol.RowDraft(r.seq, r.gen, [], error="desync",
                                                              message="the server forgot this client")
                for r in rows]

    def _note(self, m: protocol.Drafts, t0: float) -> None:
        if m.batch:
            self.last = RoundCosts(m.draft_ms, m.queued_ms, m.held_ms, m.host_ms, m.batch,
                                   (time.perf_counter() - t0) * 1e3)
            self.n += 1

    def end(self, t: ServerTrack) -> None:
        self.end_seq(t.seq)

    def end_seq(self, seq: str) -> None:
        """End a sequence (or stream) and take its Ended, waiting at most a second."""
        try:
            self.send(protocol.End(seq))
            deadline = time.perf_counter() + 1.0
            while (left := deadline - time.perf_counter()) > 0:
                m = self.client.recv(left)
                if m is None or isinstance(m, protocol.Ended) and m.req == seq:
                    return
        except (PeerGone, protocol.ProtocolError):
            pass

    def close(self) -> None:
        self.client.close()


def ping_ms(addr: str, hello: protocol.Hello, n: int = 10, timeout_s: float = 2.0) -> float:
    """The link's round trip to the draft server at addr (the median of n Ping/Pong, ms)."""
    c = DraftServerClient(addr, hello, timeout_s=10)
    try:
        rtt = bare_rtt_ms(c.client, n, timeout_s)
    finally:
        c.close()
    if rtt is None:
        raise TimeoutError(f"draft server at {addr}: no Pong in {timeout_s:g} s")
    return rtt

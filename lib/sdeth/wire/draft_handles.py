"""A sequence's handle on a draft server, on a wire.draft_client.DraftServerClient: `ServerDraft` (one sequence as
the sync loop's draft source) and `ServerStream` (one pipelined sequence as the pipelined loop's draft stream), and
what they share (`DraftHandle`: its connection, the server's Welcome, why the draft was lost)."""
from __future__ import annotations

import itertools
import os
import time

import torch

from ..runtime.loop import DraftUnavailable
from ..runtime.verify import Sampling
from . import protocol
from .draft_client import DraftServerClient
from .health import bare_rtt_ms
from .transport import PeerGone

HANDLES = itertools.count()   # a handle's name (its sequences' ids are name-count: short, as they cross every round)


def q_from_pairs(idx, val, vocab: int, device, rows: int | None = None):
    """A sampled draft's q from its wire pairs: [rows, V] (or [V] for rows=None) on the target's device, V the
    pair's shared tokenizer size (the logits are cut to it on both sides); None for a greedy draft (idx None)."""
    if idx is None:
        return None
    shape = (vocab,) if rows is None else (rows, vocab)
    return torch.zeros(shape, device=device).scatter_(-1, torch.tensor(idx, device=device),
                                                      torch.tensor(val, device=device))


class DraftHandle:
    """What a sequence's handle on a draft server (ServerDraft, ServerStream) shares: its client's connection and
    the server's Welcome, and why the draft was lost in the current request (lost; lost_answered: the server said
    so itself, so it is alive). `connect` makes the target worker's handle, on a client of its own."""
    lost, lost_answered = "", False
    compute_s: float = 0.0        # the draft's model time since start(), as the server reports it
    streamed: int = 0             # a stream: the tokens it streamed in this request
    bare_rtt_ms: float | None = None   # the link's round trip, Ping/Pong at connect (the record's bare_rtt_ms) ...
    link_ms: float | None = None       # ... and a stream's link (two transits: the step policy's observe_link)

    @classmethod
    def connect(cls, addr: str, hello: protocol.Hello, s: Sampling, timeout_s: float = 5.0, spin_s: float = 0.0,
                health=None, keys=None, **kw):
        """A handle on the draft server at addr, on a client of its own (health: the heartbeat, which stops waits
        early when it marks the draft down); DraftUnavailable when none answers. kw: the handle's own."""
        try:
            c = DraftServerClient(addr, hello, timeout_s, spin_s, keys)
        except (TimeoutError, PeerGone) as e:
            raise DraftUnavailable(f"draft server at {addr}: {e}") from None
        c.health = health
        h = cls(c, s, **kw)
        h.bare_rtt_ms = h.link_ms = bare_rtt_ms(c.client)
        return h

    @property
    def client(self):
        return self.server.client

    @property
    def peer(self) -> protocol.Welcome:
        return self.server.peer

    def lose(self, e: DraftUnavailable, answered: bool) -> DraftUnavailable:
        """Keep the first reason the draft was lost in this request."""
        if not self.lost:
            self.lost, self.lost_answered = str(e), answered
        return e


class ServerDraft(DraftHandle):
    """One sequence on a draft server as the sync loop's draft source (runtime.roles.DraftSource)."""
    starts_async = True

    def __init__(self, client: DraftServerClient, s: Sampling = Sampling(), q_top: int = 64, device="cpu",
                 name: str = ""):
        self.server, self.sampling, self.q_top, self.device = client, s, q_top, torch.device(device)
        self.name, self.count, self.track = name or f"d{next(HANDLES)}", 0, None
        self.compute_s = self.held_s = 0.0      # the draft's model time, and the time the server held the rounds

    def start(self, prompt_ids, size, s=None, seed=None):
        if self.track is not None:
            self.end()
        self.lost, self.lost_answered = "", False
        self.count += 1
        self.compute_s = self.held_s = 0.0
        self.track = self.server.open(f"{self.name}-{self.count}", prompt_ids, s or self.sampling, seed, self.q_top)
        self.first = True

    def propose(self, n_prev: int, nxt: int, k: int):
        try:
            r = self.server.rounds([(self.track, n_prev, [nxt], k)])[0]
        except DraftUnavailable as e:
            raise self.lose(e, "draft server error" in str(e))
        if r.error:
            raise self.lose(DraftUnavailable(f"draft server refused the round ({r.error}): {r.message}"), True)
        self.compute_s += self.server.last.draft_ms / 1e3
        self.held_s += self.server.last.held_ms / 1e3
        return list(r.tokens), q_from_pairs(r.q_idx, r.q_val, self.server.peer.vocab_size, self.device, len(r.tokens))

    def end(self):
        if self.track is not None:
            self.server.end(self.track)
            self.track = None


class ServerStream(DraftHandle):
    """One pipelined sequence on a draft server as the pipelined loop's draft stream (runtime.roles.DraftStream):
    Open(stream) and the first token's commit at start, a Commits message per commit, Streamed rows into the
    view (runtime.pipeline.StreamView has the rules). With est (the pipelined loop's policy; generate_pipelined
    sets it) it feeds what the step's policy needs: the server's step, its period (launch to launch, between two
    tokens of one run) and a restart's latency (the commit that restarted the run to its first token, less a step).
    branches: ask for the server's verdict-cache branches ahead (Open.branches): the view holds them, and a
    rejection they foresaw finds its drafts already here (StreamView's rules)."""

    def __init__(self, client: DraftServerClient, s: Sampling = Sampling(), q_top: int = 64,
                 window: int = protocol.STREAM_WINDOW, device="cpu", name: str = "", branches: bool = False):
        from ..runtime.pipeline import StreamView
        self.server, self.sampling, self.q_top, self.window = client, s, q_top, window
        self.device = torch.device(device)
        self.branches = branches
        self.name, self.count, self.view = name or f"p{next(HANDLES)}", 0, StreamView()
        self.seq, self.gen, self.compute_s, self.streamed, self.branched = "", 0, 0.0, 0, 0
        self.est = None
        self._last = (-1, -1, 0.0)               # (epoch, pos, stepped_at) of the last token of this stream
        self.gaps_ms: list[float] = []           # this request's gaps between two tokens of one run, stepped at the
                                                 # server: its period, and a pause where the window was full
        self.restarts_ms: list[float] = []       # ... and restarts: the Commits that restarted the run, sent, to the
                                                 # new run's first token, here (runtime.pipeline.StreamStats)
        self.restarts_stepped_ms: list[float] = []   # ... to that token stepped at the server (its wall clock against
                                                     # this host's: one host, or clocks in step)

    def start(self, prompt_ids, size, first, s=None, seed=None):
        self.lost, self.lost_answered = "", False
        self.count += 1
        self.seq, self.compute_s, self.streamed, self.branched = f"{self.name}-s{self.count}", 0.0, 0, 0
        self.gaps_ms, self.restarts_ms, self.restarts_stepped_ms = [], [], []
        self.view.reset()
        s = s or self.sampling
        seed = int.from_bytes(os.urandom(7), "little") if seed is None else seed
        self.server.client.forget_gone()         # (a drop between requests, reconnected since, concerns none of this)
        self.server.send_open(self.seq, self.gen, prompt_ids, s, q_top=self.q_top, seed=seed, stream=True,
                              window=self.window, branches=self.branches)
        self.commit(0, first)

    def commit(self, pos: int, token: int) -> None:
        self.view.on_commit(pos, token)
        self.server.send_rows(protocol.Commits, [protocol.CommitRow(self.seq, self.gen, pos, token)])

    def _take(self, m) -> None:
        if isinstance(m, protocol.Error):
            raise self.lose(DraftUnavailable(f"draft server error ({m.code}): {m.message}"), True)
        if isinstance(m, protocol.Drafts):
            bad = [r for r in m.rows if r.seq == self.seq and r.error]
            if bad:
                raise self.lose(DraftUnavailable(f"draft server refused the stream ({bad[0].error}): "
                                                 f"{bad[0].message}"), True)
        if not isinstance(m, protocol.Streamed):
            return
        for r in m.rows:
            if r.seq != self.seq:
                continue
            self.compute_s += m.draft_ms / 1e3 / max(len(m.rows), 1)
            if r.fork < 0:                        # (a branch sent ahead says nothing of the stream's own timing)
                self.streamed += 1
                self._observe(r, m)
            else:
                self.branched += 1
            q = q_from_pairs(r.q_idx, r.q_val, self.server.peer.vocab_size, self.device)
            self.view.on_drafted(r.epoch, r.pos, r.token, q, r.fork, r.corr)

    def _observe(self, r, m) -> None:
        """The step's policy's inputs from one streamed token (see the class)."""
        est, (epoch, pos, at) = self.est, self._last
        self._last = (r.epoch, r.pos, m.stepped_at)
        if not m.batch:
            return
        period = m.stepped_at - at if r.epoch == epoch and r.pos == pos + 1 and m.stepped_at > at else None
        restart = (time.perf_counter() - self.view.t_epoch          # (epoch 0 waits for the prefill)
                   if 0 < r.epoch == self.view.epoch and self.view.received == 0 else None)
        if period is not None:
            self.gaps_ms.append(period * 1e3)
        if restart is not None:
            self.restarts_ms.append(restart * 1e3)
            self.restarts_stepped_ms.append((m.stepped_at - (time.time() - restart)) * 1e3)   # (sent, in wall time)
        if est is None:
            return
        est.observe_draft(m.draft_ms / 1e3)
        if period is not None:
            est.observe_period(period)
        if restart is not None:
            est.observe_rtt(restart - m.draft_ms / 1e3)

    def _recv(self, timeout_s: float):
        try:
            return self.server.recv(timeout_s)
        except DraftUnavailable as e:      # (the connection closed, or the heartbeat marked the draft down)
            raise self.lose(e, False)

    def poll(self) -> None:
        while (m := self._recv(0)) is not None:
            self._take(m)

    def wait(self, timeout_s: float) -> bool:
        m = self._recv(timeout_s)
        if m is None:
            return False
        self._take(m)
        self.poll()
        return True

    def end(self) -> None:
        if self.seq:
            self.server.end_seq(self.seq)
            self.seq = ""

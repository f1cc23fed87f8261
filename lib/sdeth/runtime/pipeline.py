"""Pipelined SD: the draft streams tokens ahead while the target verifies; the target never idles
longer than the cost model says is worth it.

Positions count generated tokens (0 = the target's first token, from prefill). Both sides keep the
same picture of the sequence:

  draft  -> target   Drafted(epoch, pos, token, q): the draft's next token, drafted on the
                     assumption that everything it sent before in this epoch is accepted.
  target -> draft    Commit(pos, token): the target's own token at `pos` (a correction, the bonus
                     after a full acceptance, or a plain target step); every position before `pos`
                     is final as the draft drafted it or as earlier Commits said.

The draft, on Commit(pos, t): if it drafted pos as t, nothing changes (its run-ahead stays valid);
if it drafted something else, it rolls back to pos, takes t, and starts a new epoch; if it has not
drafted pos yet, it takes t as the next token of its chain. The target applies the same rule to
its picture: it compares t with the draft's token at pos as soon as it has it (messages keep their
order, so a Drafted for pos+1 with no Drafted for pos means the draft took t), and ignores tokens
of an old epoch. This is PEARL's post-verify (Liu et al. 2024: keep drafting while the target
verifies, assume acceptance) without its rigid segments, and AMUSD's asynchronous rollback; the
bonus token is not thrown away: when the draft guessed it (probability ~alpha) the run-ahead
survives.

Each target round verifies m >= 0 streamed drafts in one forward of [x, d1..dm] (x: the last
committed token, not yet in its cache) and commits the accepted ones plus its own token; m = 0 is
a plain target step. m is chosen per round by costmodel.AdaptivePolicy.choose_m from the measured alpha,
draft step, verify costs and round trip: wait for more drafts only when that pays. Lossless for the
same reason as synchronous SD: every committed token is either the target's own sample or a draft
token accepted against the q the draft used, in the context the target committed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..costmodel import AdaptivePolicy
from .engine import Engine, HostCopy
from .loop import (DraftUnavailable, RequestRecord, _done, _finish, begin_request, choose_host_token, draft_prefill,
                   draft_token, note_round, note_width, q_support, start_draft)
from .roles import DraftStream
from .verify import Sampling, read_verdict


# ------------------------------------------------------------------------------------- draft side
@dataclass
class Step:
    """One drafted position, launched on the device and (after settle) read to the host."""
    epoch: int
    pos: int
    tok: torch.Tensor                   # the token on the device (0-d); it feeds the next step there
    q: torch.Tensor | None              # a sampled draft's distribution [V] on the device
    copies: tuple                       # HostCopy of the token (and of q's top pairs)
    clock: object                       # the forward's timing mark (ForwardClock.last)
    token: int = -1                     # after settle: the token on the host
    q_idx: list | None = None           # after settle: q's non-zero ids and their probabilities
    q_val: list | None = None
    ms: float = 0.0                     # after settle: the step's device time
    restart_ms: float | None = None     # after settle, the first step after a restart: ms since that commit


class StreamDrafter:
    """The draft's side: a chain of tokens for positions 0.., its cache holding all but the last.

    Steps are launched ahead of their host read: `launch()` queues the next position's forward with the
    newest token as it lies on the device, `settle()` reads the oldest launched step (waiting for it alone),
    `ready()` says whether that would wait; the worker looks at its socket while a step runs, so a commit is
    seen at once and a restart is queued right behind the step in flight. `depth` steps may be queued: 2 keeps
    the device from ever waiting for the host between steps, but a restart then waits for two stale steps
    (measured on two H200s: median restart 5.7 ms at depth 2), so the default is 1. `step()` is launch + settle."""

    def __init__(self, engine: Engine, q_top: int = 0, window: int = 16):
        self.engine, self.q_top, self.window = engine, q_top, window
        self.gen = torch.Generator(device=engine.device)
        self.s = Sampling()
        self.chain: list[int] = []          # settled tokens
        self.flight: list[Step] = []        # launched, not settled: positions len(chain), len(chain)+1, ...
        self.fed = 0            # tokens (chain, then flight) in the draft's cache
        self.epoch = 0
        self.acked = 0          # positions < acked are final (the target said so)
        self.t_restart = None   # when the last restart's commit arrived, until its first step settles
        self.depth = 1          # steps queued on the device at most (see above)

    def start(self, prompt_ids: list[int], size: int, first: int, s: Sampling, seed: int = 0) -> None:
        self.s = s
        self.prefill_s = draft_prefill(self.engine, self.gen, prompt_ids, size, seed)
        self.base, self.size = len(prompt_ids), size
        self.chain, self.flight, self.fed, self.epoch, self.acked = [first], [], 0, 0, 1

    @property
    def compute_s(self) -> float:
        return self.engine.forward_s

    @property
    def ahead(self) -> int:
        """Positions drafted or launched."""
        return len(self.chain) + len(self.flight)

    def can_step(self) -> bool:
        """Room in the window past the settled positions, in the request's cache, and in the queue."""
        return (len(self.flight) < self.depth and self.ahead < self.acked + self.window
                and self.base + self.ahead < self.size)

    def launch(self) -> None:
        """Queue the next position's forward (nothing waits for the device)."""
        if self.flight:
            assert self.fed == self.ahead - 1, "only the newest token is unfed while steps are in flight"
            feed = self.flight[-1].tok
        else:
            feed = self.chain[self.fed:]
        logits = self.engine.forward(feed)[-1]
        self.fed = self.ahead
        tok, q = draft_token(logits, self.s, self.gen, self.q_top)
        copies = (HostCopy(tok),)
        if q is not None:
            top = q_support(q, self.q_top)
            copies += (HostCopy(top.indices), HostCopy(top.values))
        self.flight.append(Step(self.epoch, self.ahead, tok, q, copies, self.engine.clock.last()))

    def ready(self) -> bool:
        return bool(self.flight) and self.flight[0].copies[0].done()

    def settle(self) -> Step:
        """Read the oldest launched step to the host (waiting for it) and add its token to the chain."""
        st = self.flight.pop(0)
        st.token = int(st.copies[0].value())
        if st.q is not None:
            st.q_idx, st.q_val = st.copies[1].value(), st.copies[2].value()
        st.ms = self.engine.clock.elapsed(st.clock) * 1e3
        self.chain.append(st.token)
        if self.t_restart is not None and st.epoch == self.epoch:
            st.restart_ms, self.t_restart = (time.perf_counter() - self.t_restart) * 1e3, None
        return st

    def step(self):
        """Draft the next position now. Returns (epoch, pos, token, q or None)."""
        self.launch()
        st = self.settle()
        return st.epoch, st.pos, st.token, st.q

    def commit(self, pos: int, token: int) -> list[Step]:
        """The target's token at pos. Returns the steps it made settle (launched at or before pos): they
        must reach the target before anything drafted after this commit."""
        settled = []
        while self.flight and self.flight[0].pos <= pos:
            settled.append(self.settle())
        if pos < len(self.chain):
            if self.chain[pos] != token:
                # positions < pos are all fed (pos was drafted from them); steps in flight are dropped
                self.engine.rollback(self.base + pos)
                self.chain, self.fed, self.flight = self.chain[:pos] + [token], pos, []
                self.epoch += 1
                self.t_restart = time.perf_counter()
        elif pos == len(self.chain):
            self.chain.append(token)
        else:
            raise ValueError(f"commit at position {pos}, but the draft's chain ends at {len(self.chain) - 1}")
        self.acked = max(self.acked, pos + 1)
        return settled


# ------------------------------------------------------------------------------------ target side
class StreamView:
    """The target's picture of the draft's stream (the same rules as StreamDrafter.commit)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.epoch = 0
        self.drafts: dict[int, tuple[int, torch.Tensor | None]] = {}
        self.unresolved: dict[int, int] = {}     # committed by the target, draft's token not seen yet
        self.t_epoch = time.perf_counter()
        self.received = 0                        # tokens received in this epoch

    def _restart(self, at: int) -> None:
        """The draft's token at `at` differs from ours: it rolls back there and starts a new epoch.
        Our commits after `at` still reach it (in order) and are compared in the new epoch."""
        self.epoch += 1
        self.drafts.clear()
        self.unresolved = {u: t for u, t in self.unresolved.items() if u > at}
        self.t_epoch = time.perf_counter()
        self.received = 0

    def on_drafted(self, epoch: int, pos: int, token: int, q) -> None:
        if epoch != self.epoch:
            return                               # run-ahead the draft has since dropped
        self.received += 1
        for u in [u for u in self.unresolved if u < pos]:
            del self.unresolved[u]               # the draft took our token there (drafted none)
        if pos in self.unresolved:
            if self.unresolved.pop(pos) != token:
                self._restart(pos)
            return
        self.drafts[pos] = (token, q)

    def on_commit(self, pos: int, token: int) -> None:
        d = self.drafts.pop(pos, None)
        for p in [p for p in self.drafts if p < pos]:
            del self.drafts[p]
        if d is not None:
            if d[0] != token:
                self._restart(pos)
        else:
            self.unresolved[pos] = token

    def chain(self, pos: int, n_max: int) -> list[tuple[int, torch.Tensor | None]]:
        """Usable drafts at pos, pos+1, ... (at most n_max)."""
        if self.unresolved:
            return []
        out = []
        while len(out) < n_max and pos + len(out) in self.drafts:
            out.append(self.drafts[pos + len(out)])
        return out


EXPLORE_EVERY = 16     # after this many plain steps in a row, verify the drafts on offer once


def generate_pipelined(target: Engine, stream: DraftStream, prompt_ids: list[int], max_tokens: int, k_max: int,
                       s: Sampling, eos: int | None, gen=None, prompt_id: str = "", est: AdaptivePolicy | None = None,
                       draft_timeout_s: float = 5.0, draft_seed: int | None = None) -> RequestRecord:
    """Pipelined SD for one request over a draft stream (roles.DraftStream). If the draft
    becomes unavailable, the request finishes on the target alone."""
    est = est or AdaptivePolicy()
    req, t0, t_first, size, x = begin_request(target, prompt_ids, max_tokens, k_max, s, gen, prompt_id)
    out = req.output_ids
    alive = start_draft(req, stream.start, prompt_ids, size, x, seed=draft_seed)
    view = stream.view
    wait_s = 0.0
    plain_run = 0                                  # plain steps in a row while drafts were on offer
    while not _done(out, eos, max_tokens):
        pos = len(out)                             # the position the next token goes to
        m_max = min(k_max, max_tokens - pos - 1)   # room for m drafts and the target's token
        drafts: list = []
        if alive and m_max >= 1:
            try:
                stream.poll()
                t_w = time.perf_counter()
                while True:
                    drafts = view.chain(pos, m_max)
                    m = est.choose_m(len(drafts), m_max, view.received == 0,
                                     time.perf_counter() - view.t_epoch)
                    if m == 0 and drafts and plain_run >= EXPLORE_EVERY:
                        m = min(len(drafts), 2)    # keep alpha's estimate current: verify what is here
                    if m <= len(drafts):
                        drafts = drafts[:m]
                        break
                    if time.perf_counter() - t_w > draft_timeout_s:
                        raise DraftUnavailable(f"no draft token within {draft_timeout_s:.1f} s")
                    stream.wait(draft_timeout_s)
                wait_s += time.perf_counter() - t_w
            except DraftUnavailable:
                alive, drafts = False, []
        m = len(drafts)
        plain_run = plain_run + 1 if m == 0 else 0
        v0 = target.forward_s
        ids = target.on_device([x] + [d for d, _ in drafts])
        logits = target.forward(ids)               # [m+1, V]
        if m:
            q = torch.stack([qq for _, qq in drafts]) if drafts[0][1] is not None else None
            n, y = read_verdict(ids[1:], q, logits, s, gen)   # the round's one host read
            target.rollback(target.pos - m + n)    # keep x and the n accepted
            est.observe_round(n, m)
            note_round(req, n, m)
            out.extend(d for d, _ in drafts[:n])
        else:
            y = choose_host_token(logits[-1], s, gen)
            if not alive:
                req.tokens_without_draft += 1
            elif m_max < 1:
                req.tail_steps += 1
            else:
                req.plain_steps += 1
        est.observe_verify(m + 1, target.forward_s - v0)
        note_width(req, m + 1, target.forward_s - v0)
        req.k_trace.append(m)
        out.append(y)
        x = y
        if alive:
            stream.commit(len(out) - 1, y)
    if alive:
        stream.end()
    req.verify_s = target.forward_s
    req.draft_s = stream.compute_s
    req.drafted = stream.streamed
    req.rtt_est_ms = est.rtt * 1e3 if est.rtt is not None else None
    req.restarts_ms = list(getattr(stream, "restarts_ms", []))
    req.wire_s = wait_s                            # target idle, waiting for streamed drafts
    return _finish(req, t0, t_first, eos, max_tokens)

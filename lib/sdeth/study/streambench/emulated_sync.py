"""The emulated sync target (Emulated): B streams in lockstep rounds through one DraftServerClient, a wait of
the measured t_v in place of the verify each round."""
from __future__ import annotations

import random
import time

from ...runtime.verify import Sampling
from ...wire import protocol
from .common import CONTEXT, PROMPT, REQUEST_LEAST, coins, first_end, hello, wait_until


class Emulated:
    """One emulated target: B streams in lockstep through one DraftServerClient, a verify wait of tv_ms a round."""

    def __init__(self, addr: str, index: int, B: int, k: int, tv_ms: float, alpha: float, seed: int, vocab: int,
                 prompt: int = PROMPT, context: int = CONTEXT, **_):
        from ...wire.draft_client import DraftServerClient
        self.server = DraftServerClient(addr, hello(vocab), timeout_s=60)
        self.index, self.k, self.tv_s, self.alpha, self.vocab = index, k, tv_ms / 1e3, alpha, vocab
        self.prompt, self.context = prompt, context
        self.rng, self.count = random.Random(seed), 0
        self.tracks = [self.fresh() for _ in range(B)]
        room = context - prompt - k              # a sequence ends when its next round would pass `ends`: staggered
        self.ends = [prompt + k + first_end(self.rng, room) for _ in range(B)]   # for the first, then the context
        self.items = [(t, 0, [self.rng.randrange(vocab)], k) for t in self.tracks]
        self.opened: dict = {}                 # stream -> when its new sequence was opened (perf_counter)
        self.rec = {key: [] for key in ("round_ms", "tpot_ms", "wait_ms", "draft_ms", "queued_ms", "held_ms",
                                        "host_ms", "batch", "tv_over", "open_to_first_draft_ms", "first_wait_ms")}
        self.rec["tokens"], self.rec["stream_tokens"], self.rec["request_tpot_ms"] = 0, [0] * B, []
        self.seq_at, self.seq_n = [None] * B, [0] * B    # a sequence's decode: since when (perf_counter), tokens

    def fresh(self):
        self.count += 1
        ids = [self.rng.randrange(self.vocab) for _ in range(self.prompt)]
        return self.server.open(f"t{self.index}-{self.count}", ids, Sampling(), self.rng.randrange(2 ** 31), 0)

    def verdicts(self, got) -> list[int]:
        """The coins for each stream's proposal; the next round's items (a finished sequence ends and a new one
        opens: the draft prefills it during this verify). Returns the tokens each stream got."""
        items, toks, self.opened = [], [], {}
        for j, (t, r) in enumerate(zip(self.tracks, got)):
            if r.error:
                raise RuntimeError(f"the draft server refused a row ({r.error}): {r.message}")
            a = coins(self.rng, min(self.k, len(r.tokens)), self.alpha)
            tok = self.rng.randrange(self.vocab)
            toks.append(a + 1)
            if t.have + a + 1 + self.k > self.ends[j]:
                self.server.client.send(protocol.End(t.seq))    # no wait for Ended (the next Rounds skips it)
                self.tracks[j] = t = self.fresh()
                self.ends[j] = self.context
                self.opened[j] = time.perf_counter()
                items.append((t, 0, [self.rng.randrange(self.vocab)], self.k))
            else:
                items.append((t, a, [tok], self.k))
        self.items = items
        return toks

    def round(self) -> None:
        """Rounds -> Drafts, coins and opens within the verify wait, the wait's end; one round recorded."""
        t0 = time.perf_counter()
        opened = self.opened
        got = self.server.rounds(self.items)
        t1 = time.perf_counter()
        cost = self.server.last
        toks = self.verdicts(got)
        wait_until(t1 + self.tv_s)
        t2 = time.perf_counter()
        r, ms = self.rec, (t2 - t0) * 1e3
        r["round_ms"].append(ms)
        r["tpot_ms"] += [ms / t for t in toks]
        r["tokens"] += sum(toks)
        r["stream_tokens"] = [n + t for n, t in zip(r["stream_tokens"], toks)]
        self.per_request(opened, toks, t2)
        for key, v in (("wait_ms", cost.wait_ms), ("draft_ms", cost.draft_ms), ("queued_ms", cost.queued_ms),
                       ("held_ms", cost.held_ms), ("host_ms", cost.host_ms), ("batch", cost.batch),
                       ("tv_over", (t2 - t1) / self.tv_s - 1)):
            r[key].append(v)
        for j, t_open in opened.items():
            r["open_to_first_draft_ms"].append((t1 - t_open) * 1e3)
            r["first_wait_ms"].append((t1 - t0) * 1e3)

    def per_request(self, opened: dict, toks: list, t_end: float, least: int = 0) -> None:
        """Each sequence's own TPOT, as serving benchmarks count it ((last token - first token) / (tokens - 1)):
        from the end of its first round (which waits for its prompt: the time to first token; that round's tokens
        past the first come with it) to its last token. Recorded when the sequence ends (or, with least > 0, at the
        point's end if it has that many tokens)."""
        for j, t in enumerate(toks):
            if j in opened:
                self.seq_at[j], self.seq_n[j] = t_end, t - 1
                continue
            self.seq_n[j] += t
            ended = j in self.opened or (least and self.seq_n[j] >= least)
            if ended and self.seq_at[j] is not None and self.seq_n[j]:
                self.rec["request_tpot_ms"].append((t_end - self.seq_at[j]) * 1e3 / self.seq_n[j])
                self.seq_at[j] = None

    def run(self, conn) -> dict:
        """The first round untimed (every prompt at once: the cold start), 'ready' to the parent, then rounds from
        the parent's start time for `seconds`."""
        t0 = time.perf_counter()
        self.verdicts(self.server.rounds(self.items))
        self.opened = {}
        conn.send({"ready": True, "cold_start_ms": round((time.perf_counter() - t0) * 1e3, 2)})
        start_at, seconds = conn.recv()
        self.window_from = start_at
        time.sleep(max(start_at - time.time(), 0))
        self.seq_at = [time.perf_counter()] * len(self.tracks)
        while time.time() < start_at + seconds:
            self.round()
        self.rec["t_end"] = time.time()
        self.per_request({}, [0] * len(self.tracks), time.perf_counter(), least=REQUEST_LEAST)
        for t in self.tracks:
            self.server.end(t)
        self.server.close()
        return self.rec

"""A draft server's settings, one frozen dataclass built where the command line is parsed and handed down whole
(`DraftServerConfig`), and the limits it holds each client to (`ServerLimits`, told in the Welcome).

Admission policy (wire.draft_server applies it; docs/reliability.md states it with its tests):
- a client (its owner: a per-client CURVE key across its connections, else one connection) holds at most
  `sequences_per_client` sequences, never more than `sequences - reserve`: the last `reserve` free rows go only
  to a client holding fewer than its fair share (sequences / the clients that said Hello);
- while a client under its fair share waits (it was refused a row within the last few seconds), a client at or
  over its fair share is refused new sequences (`fair_share`), so freed rows pass to the one waiting;
- a sequence that has not drafted for `idle_s` loses its row when a client under its fair share is refused one
  (the oldest idle first; its client is told `reclaimed` and opens it again when it resumes);
- connections: `clients` in all, `clients_per_peer` from one address, `clients_per_key` of one CURVE key; a Hello
  that finds the table full takes the place of the connection idle longest (Pings do not count) that holds no
  sequence, never a per-client key's last connection (a slot reserved per key);
- a sampled draft's reply is bounded: rows x k x q_top together fit `reply_bytes` (q_top 0, the whole vocabulary,
  is refused where it would not).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .protocol import MAX_MESSAGE_BYTES

MAX_K = 16
Q_BYTES = 14             # one (token id, probability) pair of a sampled draft's q in msgpack, at most
ROW_BYTES = 64           # a RowDraft's own fields, its tokens aside


@dataclass(frozen=True)
class ServerLimits:
    sequences_per_client: int = 0   # per owner (0: sequences - reserve)
    sequences: int = 0           # in all (0: the cache's rows)
    reserve: int = -1            # rows kept for clients under their fair share (-1: an eighth of sequences)
    context: int = 0             # tokens of one sequence, its drafts included (0: the cache's capacity)
    k: int = MAX_K               # draft tokens per round
    rows_per_message: int = 128  # rows of one Rounds
    tokens_per_row: int = 16     # a row's new tokens (the target's; more is a new context: Open)
    batch: int = 0               # rows in one draft step (0: every waiting row); clients taken in turn
    clients: int = 256           # connections that said Hello, in all (each is forgotten after ttl_s of silence)
    clients_per_key: int = 16    # ... of one per-client CURVE key
    clients_per_peer: int = 32   # ... from one address
    reply_bytes: int = MAX_MESSAGE_BYTES // 2   # one Drafts reply (a client's rows of one step), at most

    def resolved(self, rows: int, capacity: int) -> "ServerLimits":
        """The limits with their defaults (0, -1) taken from the cache's rows and capacity."""
        sequences = min(self.sequences or rows, rows)
        reserve = max(sequences // 8, 1 if sequences > 1 else 0) if self.reserve < 0 else min(self.reserve,
                                                                                             sequences - 1)
        most = max(1, sequences - reserve)
        return replace(self, sequences=sequences, reserve=reserve,
                       sequences_per_client=min(self.sequences_per_client or most, most),
                       context=min(self.context or capacity, capacity), batch=min(self.batch or rows, rows))

    def q_top_most(self, vocab: int) -> int:
        """The largest q_top a sampled draft may ask for: its client's rows x k x q_top fit reply_bytes."""
        per_q = self.sequences_per_client * self.k * Q_BYTES
        return max(0, min(vocab, (self.reply_bytes - self.sequences_per_client * ROW_BYTES * self.k) // per_q))


@dataclass(frozen=True)
class DraftServerConfig:
    """Everything a draft server is started with (`python -m sdeth worker --role draft-server` sets each)."""
    rows: int = 32                 # sequences drafted at once (cache rows, at most 128)
    capacity: int = 4096           # tokens per cache row
    ttl_s: float = 30.0            # seconds of silence (no message, no work of its own in flight) before a client
                                   # is forgotten and its sequences freed
    idle_s: float = 30.0           # seconds a sequence may go without a draft step and keep its row while another
                                   # client waits for one (then reclaimed: its client is told 'reclaimed')
    prefill_chunk: int = 0         # prompt tokens per forward (0: 2048 on a GPU, 256 on a CPU)
    prefill_budget: int = 0        # prompt tokens fed between two draft steps (0: one chunk)
    compile_mode: str = "auto"     # torch.compile mode of the batched block ('auto': 'default' on a GPU, eager on
                                   # a CPU; 'none': eager)
    fast: str = ""                 # the fast decoder's options (runtime.fastmodel.FastOptions; '': kernels=auto for a
                                   # bf16 draft on a GPU, torch's kernels elsewhere: draft_server.fused_fast)
    warm: bool = True              # capture the step graphs before serving (a GPU)
    spin_s: float = 0.0            # busy-poll the socket this long after a message
    messages_per_s: int = 4000     # what one client (a connection, or a per-client CURVE key) may send a second
    per_pass: int = 4              # messages of one client handled between two draft steps (others wait in turn)
    read_while_stepping: bool = False  # each draft step on a thread of its own while the loop takes messages off the
                                       # socket (served once the step ends). Off: on a CPU it cost 0.3-0.4 ms a step
                                       # and let an Open/End flood raise a neighbour's p99 2-3.6x (the decoding
                                       # shares the interpreter with the step); meant for a GPU, not yet measured there
    launch_ahead: str = "auto"     # streams: each step launched just before the one in flight ends, fed that step's
                                   # tokens on the device (runtime.batchstreams): on, off, or auto (on a GPU; a CPU
                                   # steps inline). Beside a verdict cache only while it can hold no branch (a
                                   # full server); its branches step inline
    verdict_cache: str = "off"     # streams: branches for the likely verdicts on free rows (runtime.verdictcache:
                                   # off, on or FANOUT[xDEPTH[xBUDGET]])
    die_after: int = 0             # fault injection (tests): exit abruptly once this many drafts went out (proposals
                                   # and streamed tokens; 0: never)
    report_s: float = 0.0          # log where the serving loop's time went (ms a step per part) every this many
                                   # seconds (0: never)
    limits: ServerLimits = field(default_factory=ServerLimits)

    def resolved(self, device_type: str) -> "DraftServerConfig":
        """The config with its defaults settled for the device ('cuda' or 'cpu') and its limits resolved."""
        cuda = device_type == "cuda"
        return replace(self, prefill_chunk=self.prefill_chunk or (2048 if cuda else 256),
                       launch_ahead=("on" if cuda else "off") if self.launch_ahead == "auto" else self.launch_ahead,
                       compile_mode=("default" if cuda else "none") if self.compile_mode == "auto"
                       else self.compile_mode, limits=self.limits.resolved(self.rows, self.capacity))

    def check(self) -> "DraftServerConfig":
        bad = [(n, v) for n, v in (("rows", self.rows), ("capacity", self.capacity), ("per_pass", self.per_pass),
                                   ("messages_per_s", self.messages_per_s)) if v < 1]
        neg = [(n, v) for n, v in (("die_after", self.die_after), ("report_s", self.report_s)) if v < 0]
        if self.launch_ahead not in ("auto", "on", "off"):
            raise ValueError(f"draft server config launch_ahead={self.launch_ahead!r}: use auto (on a GPU), on or off")
        if bad or neg or not 1 <= self.rows <= 128 or self.ttl_s <= 0 or self.idle_s <= 0:
            raise ValueError(f"draft server config {bad or neg or (self.rows, self.ttl_s, self.idle_s)}: rows 1 to "
                             f"128, capacity, per_pass and messages_per_s at least 1, ttl_s and idle_s above 0, "
                             f"die_after and report_s 0 or more")
        from ..runtime.verdictcache import VerdictSpec
        spec = VerdictSpec.parse(self.verdict_cache)     # (its error names the flag's forms)
        if spec.on and spec.depth > self.limits.k:
            raise ValueError(f"--verdict-cache {self.verdict_cache!r}: a branch drafts {spec.depth} tokens, more than "
                             f"the {self.limits.k} a reply is sized for (--limit-k): use a depth of at most "
                             f"{self.limits.k}, e.g. '{spec.fanout}x{self.limits.k}'")
        if not 1 <= self.limits.reply_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"limits.reply_bytes {self.limits.reply_bytes}: use 1 to the protocol's frame limit "
                             f"{MAX_MESSAGE_BYTES} (a larger reply is refused by its client)")
        return self._check_limits()

    def _check_limits(self) -> "DraftServerConfig":
        """The limits a server can serve under: a round drafts a token, a client holds a sequence, and a sampled
        draft's reply fits q_top 1 (each error names the flag and the fix)."""
        lim = self.limits
        if lim.k < 1:
            raise ValueError(f"--limit-k {lim.k}: a round drafts at least one token: use 1 or more (default {MAX_K})")
        if lim.sequences_per_client < 0:
            raise ValueError(f"--limit-sequences-per-client {lim.sequences_per_client}: use at least 1 (0: the rows "
                             f"less the reserve)")
        res = lim.resolved(self.rows, self.capacity)
        need = res.sequences_per_client * res.k * (ROW_BYTES + Q_BYTES)
        if res.reply_bytes < need:
            raise ValueError(f"--limit-reply-bytes {lim.reply_bytes}: a sampled draft's reply of "
                             f"{res.sequences_per_client} rows x k {res.k} with q_top 1 takes {need} bytes: use at "
                             f"least {need}, or lower --limit-sequences-per-client or --limit-k")
        return self


def limit_fields() -> list[str]:
    return [f.name for f in fields(ServerLimits)]

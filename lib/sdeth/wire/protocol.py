"""The wire: typed messages (msgspec structs, msgpack-encoded), plain data only (no torch, no pickle).

Who drives: the TARGET. It owns the request (the client talks to it) and asks the draft worker for
proposals, as in vLLM's draft-server proposal; a dead or slow draft is then just a missing proposal,
and the target finishes the request alone. Per round, target -> draft: the verdict on the previous
proposal (n accepted, the target's token) and k; draft -> target: k token ids, plus in sampled-draft
mode the draft's distributions as q_top (index, prob) pairs per token.

    target                                   draft
    Hello(proto, model, vocab, tok sha) ->   <- Welcome | Error
    Start(req, prompt ids, sampling)   ->    <- Started            (draft prefill)
    Propose(req, n_prev, nxt, k)       ->    <- Proposal(tokens, q) (one per round)
    End(req)                           ->    <- Ended
  pipelined (Start with stream=True; sdeth.runtime.pipeline has the rules):
    Commit(req, pos, token)            ->    (no reply)
                                             <- Drafted(epoch, pos, token, q)  (unasked, one per token)
    Ping(t0)                           ->    <- Pong(t0, t1, t2)   (link probe: four timestamps)
  a draft server (many sequences of many clients; wire.draft_server has the rules):
    Open(seq, gen, prompt ids, sampling) ->  (no reply)
    Rounds([Row(seq, gen, have, accepted, tokens, k), ...]) -> <- Drafts([RowDraft(seq, gen, tokens, q), ...])
    Open(seq, gen, context, stream=True) ... Commits([CommitRow(seq, gen, pos, token)]) -> (no reply)
                                             <- Streamed([StreamRow(seq, gen, epoch, pos, token, q)]) (unasked)
    End(seq)                           ->    <- Ended

and controller -> target worker: Generate(req, prompt ids, mode, k, sampling) -> Generated(record).
"""
from __future__ import annotations

import typing

import msgspec

PROTOCOL_VERSION = 3
MAX_MESSAGE_BYTES = 8 << 20     # a prompt of 2048 ids is ~10 KB; anything near this is an error
MAX_REQ_ID = 128                # characters in a request id
SEED_MAX = 1 << 62              # seeds are in [0, SEED_MAX] (the draft's own seed is derived by adding to it)
GEN_MAX = 1 << 31               # a sequence's generations (re-opens after a desync)

ReqId = typing.Annotated[str, msgspec.Meta(max_length=MAX_REQ_ID)]
Seed = typing.Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX)]
DraftSeed = typing.Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX + (1 << 32))]   # a Start's: a request's plus an offset
GenNo = typing.Annotated[int, msgspec.Meta(ge=0, le=GEN_MAX)]


class ProtocolError(ValueError):
    def __init__(self, code: str, message: str):   # code: as in Error.code
        super().__init__(message)
        self.code = code


class Hello(msgspec.Struct, tag="hello"):
    proto: int
    role: str
    model_id: str
    vocab_size: int          # the shared tokenizer's size (logits are cut to it; embeddings may be padded)
    tokenizer_sha: str
    dtype: str
    client: ReqId = ""       # a draft server: this client's own id (random, kept across its reconnections), so
                             # that a new connection of the same client takes its sequences back ('': none)


class Welcome(msgspec.Struct, tag="welcome"):
    proto: int
    model_id: str
    vocab_size: int
    tokenizer_sha: str
    dtype: str
    rows: bool = False       # a draft: it can draft the outcome cache's branches (rows of the fast decoder)
    sequences: int = 1       # a draft server: the sequences it drafts for at once (0: a draft worker of one)
    limits: dict[str, int] | None = None   # a draft server: what each client may ask for (its ServerLimits)


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "draft_sampled")   # Start's and Generate's, in Sampling's order


def sampling_fields(s) -> dict:
    """The sampling settings of `s` (a runtime Sampling or a RunConfig) as message fields."""
    return {f: getattr(s, f) for f in SAMPLING_FIELDS}


def sampling_args(msg) -> tuple:
    """A Start's or Generate's sampling settings, in the order runtime.verify.Sampling takes them."""
    return tuple(getattr(msg, f) for f in SAMPLING_FIELDS)


class Start(msgspec.Struct, tag="start"):
    req: ReqId
    prompt_ids: list[int]
    size: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    draft_sampled: bool = False
    q_top: int = 64
    seed: DraftSeed = 0
    stream: bool = False     # pipelined: draft ahead and stream Drafted messages, no Propose
    first: int = -1          # stream: the target's first token (position 0)
    window: int = 16         # stream: draft at most this far past the last position the target settled
    fanout: int = 0          # stream: the outcome cache's branches open at once (0: off)
    depth: int = 4           # stream: tokens drafted per branch
    ranks: int = 1           # stream: alternatives branched on per position
    watch: int = 0           # stream, cache off: send the draft's next `watch` choices with each token (Drafted.alts)


class Started(msgspec.Struct, tag="started"):
    req: ReqId
    prefill_ms: float


class Propose(msgspec.Struct, tag="propose"):
    req: ReqId
    n_prev: int      # tokens of the previous proposal the target accepted
    nxt: int         # the target's token after them
    k: int


class Proposal(msgspec.Struct, tag="proposal"):
    req: ReqId
    tokens: list[int]
    draft_ms: float                          # the draft model's compute for this proposal
    q_idx: list[list[int]] | None = None     # sampled draft: [k][q_top] token ids
    q_val: list[list[float]] | None = None   # and their probabilities
    held_ms: float = 0.0                     # the draft's time from receiving Propose to sending this (its own
                                             # clock, a difference: the target's wait minus it is the link's share)


class Commit(msgspec.Struct, tag="commit"):
    """Pipelined, target -> draft, no reply: the target's own token at `pos`; every earlier position
    is settled (as drafted, or as earlier Commits said). See sdeth.runtime.pipeline."""
    req: ReqId
    pos: int
    token: int


class Drafted(msgspec.Struct, tag="drafted"):
    """Pipelined, draft -> target, unasked: the draft's token at `pos` in run `epoch`."""
    req: ReqId
    epoch: int
    pos: int
    token: int
    draft_ms: float
    q_idx: list[int] | None = None
    q_val: list[float] | None = None
    restart_ms: float | None = None   # the first token after a commit that restarted the draft: ms from that
                                      # commit's arrival to this token's send, on the draft's own clock
    fork: int = -1                    # outcome cache: a branch token, valid if the target's token at `fork`
    corr: int = -1                    # is `corr` (runtime.pipeline's rules)
    period_ms: float = 0.0            # the draft's previous launch -> this step's, when it stepped on between
                                      # (its host's work included; runtime.streamdraft.Step.period_ms); 0: not timed
    alts: list[int] | None = None     # the draft's next choices at pos (Start.watch, or the outcome cache's ranks)


class End(msgspec.Struct, tag="end"):
    req: ReqId


class Ended(msgspec.Struct, tag="ended"):
    req: ReqId


class Ping(msgspec.Struct, tag="ping"):
    t0: float
    pad: bytes = b""


class Pong(msgspec.Struct, tag="pong"):
    t0: float
    t1: float        # server clock at receive
    t2: float        # server clock at send


STREAM_WINDOW = 8          # a draft server's stream: how far it drafts past what the client settled (Open.window),
                           # the one default every client of the server takes

class Open(msgspec.Struct, tag="open"):
    """Draft server: a sequence (or the same one again, under a new generation after a desync) and its
    context so far. No reply: the first Rounds row for it is answered once its prompt is fed."""
    seq: ReqId
    gen: GenNo
    prompt_ids: list[int]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    draft_sampled: bool = False
    q_top: int = 64
    seed: DraftSeed = 0
    stream: bool = False     # pipelined: the server drafts ahead (up to `window` past what the client settled)
    window: int = STREAM_WINDOW   # and streams each token in Streamed; the client sends Commits, not Rounds
    watch: int = 0           # stream: send the draft's next `watch` choices with each token (StreamRow.alts)
    branches: bool = False   # stream: send the server's verdict-cache branches ahead, as they are drafted
                             # (StreamRow.fork/corr), so that a foreseen rejection's drafts are at the client already


class Row(msgspec.Struct, array_like=True):
    """One sequence's round: the client believes the draft holds `have` tokens of it; of the last proposal it
    accepted `accepted`, then its target chose `tokens`; draft k more."""
    seq: ReqId
    gen: GenNo
    have: int
    accepted: int
    tokens: list[int]
    k: int


class Rounds(msgspec.Struct, tag="rounds"):
    """Draft server: the rounds of one client's sequences (a target's batch), answered by Drafts."""
    rows: list[Row]


class RowDraft(msgspec.Struct, array_like=True):
    seq: ReqId
    gen: GenNo
    tokens: list[int]
    q_idx: list[list[int]] | None = None
    q_val: list[list[float]] | None = None
    error: str = ""          # a row refused: desync (open the sequence again) | limit | bad-message | internal |
                             # reclaimed (idle while another client waited for a row: open it again to resume)
    message: str = ""


class CommitRow(msgspec.Struct, array_like=True):
    """A stream's position settled by the client's target (pos 0: its first token after the prompt); the rules
    are runtime.pipeline's (runtime.streamdraft.StreamDrafter.commit)."""
    seq: ReqId
    gen: GenNo
    pos: int
    token: int


class Commits(msgspec.Struct, tag="commits"):
    """Draft server, pipelined: one client's commits (no reply; drafts stream back in Streamed)."""
    rows: list[CommitRow]


class StreamRow(msgspec.Struct, array_like=True):
    seq: ReqId
    gen: GenNo
    epoch: int
    pos: int
    token: int
    q_idx: list[int] | None = None
    q_val: list[float] | None = None
    since: int = -1          # the first row after the server read a commit: that commit's position (else -1)
    read_at: float = 0.0     # ... and when the server read it (its wall clock, time.time())
    alts: list[int] | None = None   # the draft's next choices at pos (Open.watch)
    fork: int = -1           # a verdict-cache branch's token (Open.branches): valid if the target's token at `fork`
    corr: int = -1           # is `corr` (runtime.pipeline.StreamView's rules); -1: the stream's own draft


class Streamed(msgspec.Struct, tag="streamed"):
    """Draft server -> one client: the tokens its streams drafted in one batched step."""
    rows: list[StreamRow]
    batch: int = 0           # stream rows in the step (all clients')
    draft_ms: float = 0.0
    stepped_at: float = 0.0  # the step's tokens on the server's host (its wall clock, time.time())
    streams: int = 0         # streams the server holds (all clients'), at the step
    branch_rows: int = 0     # verdict cache: branch rows in the step (beside the `batch` stream rows)
    missed: list[str] = []   # verdict cache: streams whose restart (a Commit just read) found no branch; a foreseen
                             # one is answered at once with its branch's drafts (rows, since = the commit's pos)


class Drafts(msgspec.Struct, tag="drafts"):
    """Draft server -> one client: its rows drafted in one batched step (or refused), with the step's costs
    on the server's clock: draft compute (device), queueing (arrival to the step's start), host work."""
    rows: list[RowDraft]
    batch: int = 0           # sequences in the step (all clients')
    draft_ms: float = 0.0
    queued_ms: float = 0.0
    held_ms: float = 0.0     # arrival of the Rounds to this send
    host_ms: float = 0.0     # the step's host work: held - queued - draft


class Generate(msgspec.Struct, tag="generate"):
    """controller -> target worker: decode one request."""
    req: ReqId
    prompt_ids: list[int]
    max_tokens: int
    mode: str = "sd"               # sd | pipelined | target-only
    k: int = 3                     # speculative tokens per round (the most, when adaptive or pipelined)
    adaptive: bool = False         # choose k (sd) or when to wait for drafts (pipelined) from running estimates
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    draft_sampled: bool = False
    seed: Seed = 0
    cache: str = "off"             # pipelined: the outcome cache, "off", "auto" (the target's model decides per
                                   # request) or FANOUT[xDEPTH[xRANKS]]
    policy: str = ""               # pipelined: the step's policy (costmodel.POLICIES; "": "policy" when adaptive,
                                   # else "fixed")


class Generated(msgspec.Struct, tag="generated"):
    req: ReqId
    record: dict                   # loop.Request as a dict, plus link counters


class Error(msgspec.Struct, tag="error"):
    code: str        # bad-message | too-large | version | mismatch | unknown-request | busy | limit | auth | internal
    message: str


Message = (Hello | Welcome | Start | Started | Propose | Proposal | Commit | Drafted | End | Ended | Ping | Pong
           | Open | Rounds | Drafts | Commits | Streamed | Generate | Generated | Error)
_enc = msgspec.msgpack.Encoder()


def encode(msg: Message) -> bytes:
    return _enc.encode(msg)


def tag_of(data) -> str:
    """A frame's message type read from its first bytes, without decoding it ('' when they are not a tagged
    message's): the transport's look at a message it may drop unread."""
    b = bytes(data[:24])
    if len(b) < 8 or not 0x80 <= b[0] <= 0x8f or b[1:6] != b"\xa4type" or not 0xa0 <= b[6] <= 0xbf:
        return ""
    return b[7:7 + (b[6] & 0x1f)].decode("ascii", "replace")


def tag(msg_type) -> str:
    """A message type's tag (what tag_of reads)."""
    return msg_type.__struct_config__.tag


class Decoder:
    """bytes -> one of `types` (the messages one role takes); anything else is a ProtocolError, never another
    exception: too large, malformed, a message this role does not take, or nested too deeply. No message a worker
    takes holds containers a peer chooses, so there a deep frame is refused at its first level; a Generated record
    (read by controllers) is free-form, and its depth is bounded by Python's recursion limit (RecursionError, caught)."""

    def __init__(self, who: str, types: tuple):
        self.who, self.types = who, types
        self.names = ", ".join(t.__name__ for t in types)
        self._dec = msgspec.msgpack.Decoder(typing.Union[types] if len(types) > 1 else types[0])

    def __call__(self, data: bytes) -> Message:
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError("too-large", f"message of {len(data)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")
        try:
            return self._dec.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            why = str(e)
        except RecursionError:
            why = "containers nested too deeply"
        except Exception as e:    # a decoder fault must never take a worker down
            why = f"{type(e).__name__}: {e}"
        raise ProtocolError("bad-message", f"malformed message ({len(data)} bytes) for {self.who} (it takes "
                                           f"{self.names}): {why}") from None


DRAFT_TAKES = (Hello, Start, Propose, Commit, End, Ping)          # what a draft worker serves
DRAFT_SENDS = (Welcome, Started, Proposal, Drafted, Ended, Pong, Error)
SERVER_TAKES = (Hello, Open, Rounds, Commits, End, Ping)          # what a draft server serves
SERVER_SENDS = (Welcome, Drafts, Streamed, Ended, Pong, Error)
TARGET_TAKES = (Generate, Ping)                                   # what a target worker serves
TARGET_SENDS = (Generated, Pong, Error)
decode = Decoder("a peer", typing.get_args(Message))              # any message of the protocol


def check_hello(h: Hello, mine: Welcome) -> Error | None:
    """The draft's answer to a target's Hello: None when the two can work together."""
    if h.proto != PROTOCOL_VERSION:
        return Error("version", f"protocol version {h.proto} from the target, this draft speaks "
                                f"{PROTOCOL_VERSION}: run the same sdeth version on both nodes")
    if h.vocab_size != mine.vocab_size or h.tokenizer_sha != mine.tokenizer_sha:
        return Error("mismatch", f"target {h.model_id!r} has a tokenizer of {h.vocab_size} ids (sha {h.tokenizer_sha}), "
                                 f"draft {mine.model_id!r} one of {mine.vocab_size} ids (sha {mine.tokenizer_sha}): "
                                 f"the pair must share one tokenizer (embedding tables may differ by padding)")
    if h.dtype != mine.dtype:
        return Error("mismatch", f"target runs {h.dtype}, draft {mine.dtype}: start both with the same --dtype")
    return None


MODES_ON_THE_WIRE = ("sd", "pipelined", "target-only")


def _ids_error(ids, vocab: int, what: str) -> str | None:
    if not ids:
        return f"{what}: no token ids (send at least one)"
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    return None if bad is None else f"{what}: token id {bad} outside the vocabulary [0, {vocab})"


def _sampling_error(m) -> str | None:
    if not (m.temperature >= 0 and m.temperature < float("inf")):
        return f"temperature {m.temperature}: use 0 (greedy) or a positive number"
    if not 0 < m.top_p <= 1:
        return f"top_p {m.top_p}: use a value in (0, 1]"
    if m.top_k < 0:
        return f"top_k {m.top_k}: use 0 (off) or a positive count"
    return None


def check_start(m: Start, vocab: int, max_len: int) -> Error | None:
    """A draft worker's check of a Start before it touches its engine: None when it can be served."""
    why = (_ids_error(m.prompt_ids, vocab, "prompt") or _sampling_error(m)
           or (f"size {m.size}: the request's cache must hold the prompt ({len(m.prompt_ids)} ids) and at least "
               f"one more token, and at most this draft's {max_len}" if not len(m.prompt_ids) < m.size <= max_len else None)
           or (f"q_top {m.q_top}: use 0 (the whole vocabulary) to {vocab}" if not 0 <= m.q_top <= vocab else None)
           or (f"window {m.window}: use 1 to 64" if m.stream and not 1 <= m.window <= 64 else None)
           or (f"first token {m.first} outside the vocabulary [0, {vocab})" if m.stream and not 0 <= m.first < vocab
               else None)
           or (f"outcome cache fanout={m.fanout} depth={m.depth} ranks={m.ranks}: use fanout 0 (off) to 16, depth "
               f"and ranks 1 to 16" if m.stream and not (0 <= m.fanout <= 16 and 1 <= m.depth <= 16
                                                        and 1 <= m.ranks <= 16) else None)
           or (f"watch {m.watch}: use 0 (off) to 16" if not 0 <= m.watch <= 16 else None))
    return Error("bad-message", f"Start {m.req!r}: {why}") if why else None


def check_open(m: Open, vocab: int) -> tuple[str, str] | None:
    """A draft server's check of an Open: (field, why) when it cannot be served, else None (its limits on
    length and counts are the server's)."""
    for name, why in (("prompt_ids", _ids_error(m.prompt_ids, vocab, "context")), ("sampling", _sampling_error(m)),
                      ("q_top", f"q_top {m.q_top}: use 0 (the whole vocabulary) to {vocab}"
                                if not 0 <= m.q_top <= vocab else None),
                      ("window", f"window {m.window}: use 1 to 64" if m.stream and not 1 <= m.window <= 64 else None)):
        if why:
            return name, f"Open {m.seq!r}: {why}"
    return None


def check_generate(m: Generate, vocab: int, max_len: int, k_max: int) -> Error | None:
    """A target worker's check of a Generate: None when it can be served."""
    why = (_ids_error(m.prompt_ids, vocab, "prompt") or _sampling_error(m)
           or (f"mode {m.mode!r}: use one of {MODES_ON_THE_WIRE}" if m.mode not in MODES_ON_THE_WIRE else None)
           or (f"max_tokens {m.max_tokens}: use 1 to {max_len - len(m.prompt_ids)} (the prompt has "
               f"{len(m.prompt_ids)} ids, the cache {max_len})" if not 1 <= m.max_tokens <= max_len - len(m.prompt_ids)
               else None)
           or (f"k {m.k}: use 1 to {k_max}" if not 1 <= m.k <= k_max else None))
    if why is None:
        try:
            from ..runtime.streamdraft import parse_cache
            if m.cache != "auto":
                parse_cache(m.cache)
        except ValueError as e:
            why = str(e)
    return Error("bad-message", f"Generate {m.req!r}: {why}") if why else None

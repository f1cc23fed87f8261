"""The messages of the handshake, of a target and its draft worker, and of a controller and a target worker
(msgspec structs), with the protocol's version and the field types every message shares (wire.protocol has the flows)."""
from __future__ import annotations

import typing

import msgspec

from ..runtime.settings import STREAM_WINDOW

PROTOCOL_VERSION = 3
MAX_REQ_ID = 128                # characters in a request id
SEED_MAX = 1 << 62              # seeds are in [0, SEED_MAX] (the draft's own seed is derived by adding to it)
GEN_MAX = 1 << 31               # a sequence's generations (re-opens after a desync)

ReqId = typing.Annotated[str, msgspec.Meta(max_length=MAX_REQ_ID)]
Seed = typing.Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX)]
DraftSeed = typing.Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX + (1 << 32))]   # a Start's: a request's plus an offset
GenNo = typing.Annotated[int, msgspec.Meta(ge=0, le=GEN_MAX)]


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
    rows: bool = False       # a draft: it can draft branches (a draft worker: the outcome cache's rows of the fast
                             # decoder; a draft server: its verdict cache's, sent ahead where Open.branches asks)
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
    window: int = STREAM_WINDOW   # stream: draft at most this far past the last position the target settled
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

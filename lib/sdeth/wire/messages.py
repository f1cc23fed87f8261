"""The messages of the handshake, of a target and its draft (End, Ended), of a link probe (Ping, Pong) and of a
controller and a target worker (msgspec structs; a draft server's own are wire.server_messages'), with the protocol's
version and the field types every message shares (wire.protocol has the flows)."""
from __future__ import annotations

import typing

import msgspec

from ..runtime.settings import STREAM_WINDOW  # noqa: F401 (server_messages takes it from here)

PROTOCOL_VERSION = 4
MAX_REQ_ID = 128                # characters in a request id
SEED_MAX = 1 << 62              # seeds are in [0, SEED_MAX] (the draft's own seed is derived by adding to it)
GEN_MAX = 1 << 31               # a sequence's generations (re-opens after a desync)

ReqId = typing.Annotated[str, msgspec.Meta(max_length=MAX_REQ_ID)]
Seed = typing.Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX)]
DraftSeed = typing.Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX + (1 << 32))]   # an Open's: a request's plus an offset
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
    rows: bool = False       # a draft server: it drafts branches (its verdict cache's, sent ahead where
                             # Open.branches asks)
    sequences: int = 1       # a draft server: the sequences it drafts for at once
    limits: dict[str, int] | None = None   # a draft server: what each client may ask for (its ServerLimits)


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "draft_sampled")   # Open's and Generate's, in Sampling's order


def sampling_fields(s) -> dict:
    """The sampling settings of `s` (a runtime Sampling or a RunConfig) as message fields."""
    return {f: getattr(s, f) for f in SAMPLING_FIELDS}


def sampling_args(msg) -> tuple:
    """An Open's or Generate's sampling settings, in the order runtime.verify.Sampling takes them."""
    return tuple(getattr(msg, f) for f in SAMPLING_FIELDS)


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
    cache: str = "off"             # pipelined: branches ahead from the draft server, "off", "on", "auto" (asked
                                   # wherever the server drafts them) or FANOUT[xDEPTH[xRANKS]] (the shape is the
                                   # server's: read as on)
    policy: str = ""               # pipelined: the step's policy (costmodel.POLICIES; "": "policy" when adaptive,
                                   # else "fixed")


class Generated(msgspec.Struct, tag="generated"):
    req: ReqId
    record: dict                   # loop.Request as a dict, plus link counters


class Error(msgspec.Struct, tag="error"):
    code: str        # bad-message | too-large | version | mismatch | unknown-request | busy | limit | auth | internal
    message: str

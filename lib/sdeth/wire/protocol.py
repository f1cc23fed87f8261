"""The wire: typed messages (msgspec structs, msgpack-encoded), plain data only (no torch, no pickle).

Who drives: the TARGET. It owns the request (the client talks to it) and asks the draft server for
proposals, as in vLLM's draft-server proposal; a dead or slow draft is then just a missing proposal,
and the target finishes the request alone. Per round, target -> draft: the verdict on the previous
proposal (n accepted, the target's tokens) and k; draft -> target: k token ids, plus in sampled-draft
mode the draft's distributions as q_top (index, prob) pairs per token. The draft server (one row, or many
sequences of many clients; wire.draft_server has the rules):

    target                                   draft server
    Hello(proto, model, vocab, tok sha) ->   <- Welcome | Error
    Open(seq, gen, prompt ids, sampling) ->  (no reply)
    Rounds([Row(seq, gen, have, accepted, tokens, k), ...]) -> <- Drafts([RowDraft(seq, gen, tokens, q), ...])
    Open(seq, gen, context, stream=True) ... Commits([CommitRow(seq, gen, pos, token)]) -> (no reply)
                                             <- Streamed([StreamRow(seq, gen, epoch, pos, token, q)]) (unasked)
    End(seq)                           ->    <- Ended
    Ping(t0)                           ->    <- Pong(t0, t1, t2)   (link probe: four timestamps)

and controller -> target worker: Generate(req, prompt ids, mode, k, sampling) -> Generated(record).
"""
from __future__ import annotations

import typing

import msgspec

from ..runtime.settings import STREAM_WINDOW, stream_window  # noqa: F401 (a stream's window, by its k)
from .checks import (MODES_ON_THE_WIRE, _ids_error, _sampling_error, check_generate, check_hello,  # noqa: F401
                     check_open)
from .messages import (GEN_MAX, MAX_REQ_ID, PROTOCOL_VERSION, SAMPLING_FIELDS, SEED_MAX,  # noqa: F401
                       DraftSeed, End, Ended, Error, Generate, Generated, GenNo, Hello, Ping, Pong,
                       ReqId, Seed, Welcome, sampling_args, sampling_fields)
from .server_messages import (CommitRow, Commits, Drafts, Open, Rounds, Row, RowDraft,  # noqa: F401
                              Streamed, StreamRow)

MAX_MESSAGE_BYTES = 8 << 20     # a prompt of 2048 ids is ~10 KB; anything near this is an error


class ProtocolError(ValueError):
    def __init__(self, code: str, message: str):   # code: as in Error.code
        super().__init__(message)
        self.code = code


Message = (Hello | Welcome | End | Ended | Ping | Pong | Open | Rounds | Drafts | Commits | Streamed | Generate
           | Generated | Error)
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


SERVER_TAKES = (Hello, Open, Rounds, Commits, End, Ping)          # what a draft server serves
SERVER_SENDS = (Welcome, Drafts, Streamed, Ended, Pong, Error)
TARGET_TAKES = (Generate, Ping)                                   # what a target worker serves
TARGET_SENDS = (Generated, Pong, Error)
decode = Decoder("a peer", typing.get_args(Message))              # any message of the protocol

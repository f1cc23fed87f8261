"""A peer's messages checked before a worker or a server acts on them: the handshake (check_hello), a draft server's
Open, a target worker's Generate; each answer names the field and the fix."""
from __future__ import annotations

from .messages import PROTOCOL_VERSION, Error, Generate, Hello, Welcome
from .server_messages import Open


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
            from ..runtime.verdictcache import VerdictSpec
            if m.cache != "auto":
                VerdictSpec.parse(m.cache)
        except ValueError as e:
            why = str(e)
    return Error("bad-message", f"Generate {m.req!r}: {why}") if why else None

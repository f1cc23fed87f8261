"""The draft server: one draft model drafts for many sequences of many clients at once.
`python -m sdeth worker --role draft-server --bind tcp://ADDR:PORT` (the CLI is in `sdeth.cli.worker`): batched
over the fast decoder (build_server); `--role draft`: the same server with one row over any draft engine
(engine_server: transformers, synthetic or trace-driven acceptance, an emulated draft device), which serves one
sequence at a time: another client's Open is refused (`limit`) while the held one is in use, and takes the row
once the holder's connection closed or its sequence drafted nothing for `idle_s` (0.5 s for `--role draft`).

Terms: a *client* is one connection (a target worker, an emulated target, a vLLM proposer), known by its zmq
routing id from its Hello on; under CURVE with per-client keys its key names its *owner* (one client may hold
several connections, and its quotas count across them); under the shared deployment key and on plain TCP the
connection is its own owner. A *sequence* is
one stream a client decodes, keyed (client, sequence id) and numbered by a generation the client raises each
time it opens the sequence again. A client:

    Open(seq, gen, context)                              the sequence, no reply
    Rounds([Row(seq, gen, have, accepted, tokens, k)])   its streams' rounds (a target's batch), in one message
                                      <- Drafts([RowDraft(seq, gen, tokens, q)])   one message per step
    End(seq)                          <- Ended           (idempotent)

Rules. A row whose generation, or whose `have` (the context length the client believes the draft holds), does
not match the sequence is answered `desync` and never drafted: the client opens the sequence again under the
next generation, with its whole context. Rounds wait in a queue; the serving loop drafts every waiting row
whose prompt is fed in one batched step (runtime.batchdraft), taking clients in turn (round-robin, when
`limits.batch` caps the rows of a step), and answers each client with one Drafts per step. Prompts are fed in
chunks between steps, so a long prompt neither stalls other streams nor heartbeats (Ping is answered between
any two steps). A client silent for `ttl_s` (no message, and no work of its own in flight: a prompt being fed,
a round waiting) loses its sequences and its handshake; a sequence that has not drafted for `idle_s` loses its row
when a client under its fair share is refused one (its client is told `reclaimed` and opens it again to resume);
a Hello that finds the client table full takes the place of the idlest client that holds no row. Limits (ServerLimits) bound what each client may ask for,
and how many clients there are (nothing is stored for a peer before its Hello); the Welcome carries them; each
refusal names the limit and is logged with the peer and the field. The admission policy (fair shares, a reserve
for new clients, connections per address) is wire.server_config's; a client that says Hello again with the same
client id (`Hello.client`, from the same address or key) takes its sequences back from its old connection.

Streams (Open(stream=True)) are drafted a token a step and sent in Streamed; the client sends Commits. With
`verdict_cache` on (runtime.verdictcache), the rows no sequence holds draft *branches*: for a stream's drafts that
await their verdict, the continuation after each likely rejection (a position x one of the draft's next choices
there); a Commits that rejects a drafted token with a foreseen token adopts that branch (its row becomes the
stream's) and is answered at once with the branch's drafts (a new epoch); one not foreseen is answered `missed`
and restarts as without the cache. Live streams are stepped first, and an Open evicts branches for its row.
Open.watch asks for the draft's next choices with each streamed token (StreamRow.alts). Open.branches asks for the
stream's branches *ahead*: each branch token goes out in the step's Streamed as it is drafted (StreamRow.fork/corr,
at most AHEAD_ROWS rows a message; tokens past that are not sent ahead), so that a client which resolves its verdict against them verifies a foreseen
continuation in its very next step, without waiting for the answer to its Commits.

The parts: wire.clients.ClientTable (who said Hello, take-over, the TTL, quotas), wire.scheduler.Scheduler (which
rows step next, the prefill budget, branch planning), wire.bounds (what one request may ask for), and DraftServer's
handlers and steps (wire.server_core); the sequences are the drafter's (runtime.batchdraft, which also keeps the stepping rows low).

No request within the limits ends the process: a row drafts only within its own room (runtime.batchdraft), and an
error in a step is contained to the rows that caused it (refused `internal` and freed); the server serves on.
docs/reliability.md lists what is guaranteed, each with its test.
"""
from __future__ import annotations

from dataclasses import replace

from ..models.presets import tokenizer_hash
from ..runtime.batchdraft import BatchDrafter
from . import protocol
from .clients import GONE_S
from .server_config import DraftServerConfig, ServerLimits
from .server_core import DECODE, DraftServer, refusal  # noqa: F401
from .server_streams import AHEAD_ROWS  # noqa: F401

__all__ = ["DraftServer", "DraftServerConfig", "ServerLimits", "GONE_S", "build_server", "engine_server",
           "pair_server", "serve_draft_server"]
WARM_WIDTHS = 10     # an engine row's forward widths captured as CUDA graphs before serving (wider: on first use)


def welcome_of(pair, model_id: str) -> protocol.Welcome:
    """The Welcome a draft of `pair` answers Hellos with (the server sets what it can serve: rows, limits)."""
    return protocol.Welcome(protocol.PROTOCOL_VERSION, model_id, pair.vocab_size, tokenizer_hash(pair.tokenizer),
                            pair.config.dtype)


def build_server(fast, welcome: protocol.Welcome, cfg: DraftServerConfig) -> DraftServer:
    """The one constructor of a draft server: `fast` (a runtime.fastmodel.FastDecoder: the draft's weights) under
    a BatchDecoder of cfg.rows x cfg.capacity (compiled as cfg.compile_mode says; measured on an H200 with the
    Qwen3-1.7B shape: 2.4 ms a 16-row step compiled, 5.5 ms eager), its graphs captured when cfg.warm; welcome:
    the Welcome it answers Hellos with (its vocabulary is the drafter's)."""
    from ..runtime.batchmodel import BatchDecoder
    cfg = cfg.check().resolved(fast.device.type)
    dec = BatchDecoder(fast, cfg.rows, cfg.capacity, compile_mode=None if cfg.compile_mode == "none" else cfg.compile_mode)
    if cfg.warm:
        dec.warm()
    return DraftServer(BatchDrafter(dec, welcome.vocab_size, cfg.prefill_chunk), welcome, cfg)


def engine_server(engine, welcome: protocol.Welcome, cfg: DraftServerConfig) -> DraftServer:
    """A draft server of one row over any draft Engine (runtime.make_engine's: transformers, the fast decoder,
    synthetic or trace-driven acceptance, an emulated draft device): runtime.enginerow.EngineRow of cfg.capacity
    tokens, the engine's widths captured when cfg.warm. One row cannot fork: a verdict cache is refused."""
    from ..runtime.enginerow import EngineRow
    from ..runtime.verdictcache import VerdictSpec
    if VerdictSpec.parse(cfg.verdict_cache).on:
        raise ValueError(f"--verdict-cache {cfg.verdict_cache!r}: a draft of one row (--role draft) has no free rows "
                         "to draft branches on: use --verdict-cache off, or --role draft-server (the batched fast "
                         "decoder) for branches")
    if getattr(engine, "graphs_on", False) and cfg.capacity > engine.capacity:
        raise ValueError(f"--capacity {cfg.capacity}: this draft engine's graph cache holds {engine.capacity} tokens: "
                         f"use --capacity {engine.capacity} or less, or a larger capacity in --config")
    cfg = replace(cfg, rows=1).check().resolved(engine.device.type)
    if cfg.warm:
        engine.warm(WARM_WIDTHS)
    return DraftServer(BatchDrafter(EngineRow(engine, cfg.capacity), welcome.vocab_size, cfg.prefill_chunk), welcome, cfg)


def pair_server(pair, cfg: DraftServerConfig, engine_opts: dict | None = None) -> DraftServer:
    """A draft server over a model pair's draft: batched over the fast decoder (cfg.fast's options, or
    fused_fast's where none are given); with engine_opts (runtime.make_engine's: the run configuration's engine), one
    row over that engine."""
    if engine_opts is not None:
        from ..runtime import make_engine
        engine = make_engine(pair.draft, "draft", "draft", vocab=pair.vocab_size, **engine_opts)
        return engine_server(engine, welcome_of(pair, pair.config.draft), cfg)
    from ..runtime.fastmodel import FastDecoder
    from ..runtime.settings import FastOptionsError
    try:
        fast = FastDecoder(pair.draft, 8, cfg.fast or fused_fast(pair.draft))
    except FastOptionsError:
        if cfg.fast:
            raise
        fast = FastDecoder(pair.draft, 8)       # (the fused kernels refused this draft: no Triton, its head dims)
    return build_server(fast, welcome_of(pair, pair.config.draft), cfg)


def fused_fast(model) -> str | None:
    """The fast decoder's options where none are given, for this model's weights (fused_options)."""
    p = next(model.parameters())
    return fused_options(p.device.type, p.dtype)


def fused_options(device_type: str, dtype) -> str | None:
    """The draft's fast options where none are given: for bf16 weights on a GPU the fused kernels (kernels=auto: the
    fused attention, and the fused GEMVs at one token where the GPU's measured table says they pay; the 1.7B's step
    at one row 1.86 ms against torch's 2.18 on an H100); torch's kernels elsewhere (None)."""
    import torch
    return "kernels=auto" if device_type == "cuda" and dtype == torch.bfloat16 else None


def serve_draft_server(bind: str, pair, cfg: DraftServerConfig, max_seconds: float = 0, keys=None,
                       engine_opts: dict | None = None) -> None:
    """Serve until killed (or max_seconds): cfg.rows sequences of up to cfg.capacity tokens (engine_opts: one row
    over that engine, pair_server)."""
    pair_server(pair, cfg, engine_opts).serve(bind, max_seconds, keys)

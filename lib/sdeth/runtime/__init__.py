"""The decoding runtime: one engine over one model interface (`engine`, `fastmodel`), lossless
acceptance (`verify`), the sync and pipelined loops (`loop`, `pipeline`), the pipelined draft
(`streamdraft`), the roles a draft plays in them (`roles`), and synthetic acceptance for
random-weight timing (`synthetic`); `make_engine` builds the engine a worker or an experiment runs, from
one `EngineConfig` (`settings`: the runtime's settings as plain data, importable without torch). Knows nothing
of wires, clusters or notebooks."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .settings import EngineConfig

if TYPE_CHECKING:
    from .engine import Engine


def make_engine(model, name: str, role: str, config: EngineConfig | None = None, vocab: int | None = None,
                **opts) -> Engine:
    """The engine of `role` ('draft' or 'target') over `model`: transformers or fast decoder, compiled or not,
    synthetic, trace-driven, emulated or real, as `config` says (opts: EngineConfig fields that override it).
    vocab: the pair's tokenizer size (logits cut to it). The target needs only to know that acceptance is
    synthetic; the draft replays the trace."""
    from .engine import Engine
    from .synthetic import AcceptanceTrace, SyntheticEngine
    cfg = replace(config or EngineConfig(), **opts)
    if cfg.draft_emulate and role == "draft":       # a draft device we cannot run: its tokens replayed, paced
        from .emulated import emulated_draft
        return emulated_draft(model, cfg.draft_emulate, cfg.draft_chains, vocab=vocab)
    if cfg.target_emulate and role == "target":     # no model: synthetic answers at measured times
        from .emulated import emulated_target
        vocab = vocab or getattr(getattr(model, "config", None), "vocab_size", None)
        if not vocab:
            raise ValueError(f"target_emulate={cfg.target_emulate!r}: the emulated target needs the pair's vocabulary "
                             "size; pass vocab= (the tokenizer's size) or a model with config.vocab_size")
        return emulated_target(cfg.target_emulate, vocab, cfg.synthetic_seed, cfg.capacity)
    fast = cfg.draft_fast if role == "draft" else cfg.target_fast
    kw = dict(impl=cfg.impl, compile_mode=cfg.compile_mode or None, capacity=cfg.capacity, vocab=vocab,
              fast=fast or None)
    if cfg.synthetic_alpha is None and not cfg.synthetic_trace:
        return Engine(model, name, **kw)
    trace = (AcceptanceTrace.load(cfg.synthetic_trace, cfg.synthetic_alpha)
             if cfg.synthetic_trace and role == "draft" else None)
    alpha = trace.alpha if trace else (cfg.synthetic_alpha if cfg.synthetic_alpha is not None else 0.5)
    return SyntheticEngine(model, name, role=role, alpha=alpha, seed=cfg.synthetic_seed, trace=trace, **kw)

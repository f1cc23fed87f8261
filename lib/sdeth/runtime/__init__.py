"""The decoding runtime: one engine over one model interface (`engine`, `fastmodel`), lossless
acceptance (`verify`), the sync and pipelined loops (`loop`, `pipeline`), the pipelined draft and its
outcome cache (`streamdraft`), the roles a draft plays in them (`roles`), and synthetic acceptance for
random-weight timing (`synthetic`); `make_engine` builds the engine a worker or an experiment runs, from
one `EngineConfig`. Knows nothing of wires, clusters or notebooks."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .engine import Engine
from .synthetic import AcceptanceTrace, SyntheticEngine


DRAFT_SCRATCH = 32     # a fast draft's cache slots for the outcome cache's branch rows (fanout x depth at most)


@dataclass(frozen=True)
class EngineConfig:
    """What an engine is built from, for either role: plain data (a worker gets it inside its run
    configuration). Terms: *synthetic* acceptance accepts each draft token with probability
    synthetic_alpha (random-weight timing); *trace-driven* acceptance replays a recorded trace;
    a *FastOptions spec* ('scope=layer,weights=fp8,head=32768') sets the fast decoder's levers."""
    impl: str = "hf"                        # model code: hf (transformers) | fast (runtime.fastmodel)
    compile_mode: str | None = None         # fast: torch.compile mode inside the CUDA graphs (None: off)
    capacity: int = 4096                    # fast: CUDA-graph cache length (tokens)
    synthetic_alpha: float | None = None    # synthetic acceptance (None: real, or the trace's own)
    synthetic_seed: int = 0
    synthetic_trace: str | None = None      # trace-driven: the trace JSON the draft replays, scaled to synthetic_alpha
    draft_fast: str = ""                    # the draft decoder's FastOptions spec
    target_fast: str = ""                   # the target decoder's (its weights and output layer stay)
    draft_emulate: str = ""                 # an emulated draft device, PROFILE:SHAPE[:fp8] (runtime.emulated)
    draft_chains: str = ""                  # ... replaying the draft continuations recorded in this JSON
    target_emulate: str = ""                # an emulated target, PATH[:MODEL] of measured times (runtime.emulated)


def make_engine(model, name: str, role: str, config: EngineConfig | None = None, vocab: int | None = None,
                **opts) -> Engine:
    """The engine of `role` ('draft' or 'target') over `model`: transformers or fast decoder, compiled or not,
    synthetic, trace-driven, emulated or real, as `config` says (opts: EngineConfig fields that override it).
    vocab: the pair's tokenizer size (logits cut to it). The target needs only to know that acceptance is
    synthetic; the draft replays the trace."""
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
              fast=fast or None, scratch=DRAFT_SCRATCH if role == "draft" and cfg.impl == "fast" else 0)
    if cfg.synthetic_alpha is None and not cfg.synthetic_trace:
        return Engine(model, name, **kw)
    trace = (AcceptanceTrace.load(cfg.synthetic_trace, cfg.synthetic_alpha)
             if cfg.synthetic_trace and role == "draft" else None)
    alpha = trace.alpha if trace else (cfg.synthetic_alpha if cfg.synthetic_alpha is not None else 0.5)
    return SyntheticEngine(model, name, role=role, alpha=alpha, seed=cfg.synthetic_seed, trace=trace, **kw)

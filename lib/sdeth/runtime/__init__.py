"""The decoding runtime: one engine over one model interface (`engine`, `fastmodel`), lossless
acceptance (`verify`), the sync and pipelined loops (`loop`, `pipeline`), the roles a draft plays in
them (`roles`), and synthetic acceptance for random-weight timing (`synthetic`); `make_engine` builds
the engine a worker or an experiment runs. Knows nothing of wires, clusters or notebooks."""

from .engine import Engine
from .synthetic import AcceptanceTrace, SyntheticEngine


DRAFT_SCRATCH = 32     # a fast draft's cache slots for the outcome cache's branch rows (fanout x depth at most)


def make_engine(model, name: str, role: str, impl: str = "hf", compile_mode: str | None = None,
                capacity: int = 4096, synthetic_alpha: float | None = None, synthetic_seed: int = 0,
                vocab: int | None = None, synthetic_trace: str | None = None, draft_fast: str = "",
                target_fast: str = "", draft_emulate: str = "", draft_chains: str = "") -> Engine:
    """The engine a worker runs: transformers or fast decoder, compiled or not, synthetic or real;
    vocab: the pair's tokenizer size (logits cut to it). synthetic_trace: a trace JSON the draft replays
    (scaled to synthetic_alpha when that is set; the target needs only to know that it is synthetic).
    draft_fast / target_fast: the fast decoder's levers for that role (fastmodel.FastOptions spec).
    draft_emulate (PROFILE:SHAPE[:fp8]) with draft_chains: an emulated draft device (runtime.emulated)."""
    if draft_emulate and role == "draft":           # a draft device we cannot run: its tokens replayed, paced
        from .emulated import emulated_draft
        return emulated_draft(model, draft_emulate, draft_chains, vocab=vocab)
    fast = draft_fast if role == "draft" else target_fast
    kw = dict(impl=impl, compile_mode=compile_mode or None, capacity=capacity, vocab=vocab, fast=fast or None,
              scratch=DRAFT_SCRATCH if role == "draft" and impl == "fast" else 0)
    if synthetic_alpha is None and not synthetic_trace:
        return Engine(model, name, **kw)
    trace = AcceptanceTrace.load(synthetic_trace, synthetic_alpha) if synthetic_trace and role == "draft" else None
    alpha = trace.alpha if trace else (synthetic_alpha if synthetic_alpha is not None else 0.5)
    return SyntheticEngine(model, name, role=role, alpha=alpha, seed=synthetic_seed, trace=trace, **kw)

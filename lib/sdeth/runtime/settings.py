"""The runtime's settings as plain data, importable without torch (a run configuration, the command line and
the cluster's reaper read them): how an engine is built (`EngineConfig`), the fast decoder's levers
(`FastOptions`, a spec string such as 'scope=layer,weights=fp8,head=32768') and how tokens are sampled
(`Sampling`), and how far a stream drafts ahead (`stream_window`). The code that uses them is in runtime
(make_engine), runtime.fastmodel and runtime.verify."""
from __future__ import annotations

from dataclasses import dataclass, fields


def stream_window(k: int) -> int:
    """How far a stream drafts past the last position its target settled: two rounds of k drafts and their bonus
    tokens, 2 (k + 1). The one default of every stream: a draft worker's, a draft server's, the vLLM proposer's."""
    return 2 * (k + 1)


STREAM_WINDOW = stream_window(3)      # at the default k = 3 (a stream opened without its k: Start, Open, a stream handle)


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


class FastOptionsError(ValueError):
    pass


@dataclass(frozen=True)
class FastOptions:
    scope: str = "layer"        # what torch.compile compiles: 'layer' (one block, reused) or 'model' (one graph)
    weights: str = "bf16"       # 'bf16' (the model's own dtype), 'fp8' (W8A8, scaled), 'int8' (weight-only)
    head: int = 0               # keep this many output rows (0: all)
    head_rank: str = ""         # JSON list of token ids, most frequent first (empty: ids 0..head-1)
    kernels: str = "torch"      # fused Triton kernels (runtime.kernels): 'torch' (none), 'attn', 'gemv', 'all', 'auto'

    CHOICES = {"scope": ("layer", "model"), "weights": ("bf16", "fp8", "int8"),
               "kernels": ("torch", "attn", "gemv", "all", "auto")}

    @classmethod
    def parse(cls, spec: "str | FastOptions | None") -> "FastOptions":
        """'scope=layer,weights=fp8,head=32768' -> FastOptions; '' -> the defaults."""
        if isinstance(spec, FastOptions):
            return spec
        kw: dict = {}
        names = {f.name: f.type for f in fields(cls)}
        for part in filter(None, (spec or "").split(",")):
            key, _, val = part.partition("=")
            key, val = key.strip(), val.strip()
            if key not in names or not val:
                raise FastOptionsError(f"fast option {part!r}: use key=value with keys {sorted(names)}")
            if key in cls.CHOICES and val not in cls.CHOICES[key]:
                raise FastOptionsError(f"fast option {key}={val!r}: use one of {cls.CHOICES[key]}")
            if key == "head":
                if not val.isdigit():
                    raise FastOptionsError(f"fast option head={val!r}: the number of output rows to keep (0: all)")
                val = int(val)
            kw[key] = val
        return cls(**kw)

    def spec(self) -> str:
        """Every option, defaults included (what a results JSON records)."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.name != "head_rank" or self.head_rank)

    def __str__(self) -> str:
        d = FastOptions()
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if getattr(self, f.name) != getattr(d, f.name)) or "defaults"


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0    # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0              # 0 = off
    draft_sampled: bool = False # False: greedy draft (q one-hot, vLLM's default); True: draft samples from q

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature {self.temperature}: must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k {self.top_k}: must be >= 0 (0 turns it off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

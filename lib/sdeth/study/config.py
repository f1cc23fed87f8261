"""A run's configuration (what every results JSON stores), its checks, and the prompts it encodes.
Both the experiment runner and the vLLM baseline build on it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..models import prompts as P
from ..runtime.fastmodel import FastOptions
from ..runtime.verify import Sampling

MODES = ("target-only", "sd", "pipelined")
ENGINES = ("sdeth", "vllm", "vllm-server")
PLACEMENTS = ("colocated", "ethernet")
SCHEMA = "sdeth.results/1"


class ConfigError(ValueError):
    """A run configuration that cannot run, with the value and what to use instead."""


@dataclass(frozen=True)
class RunConfig:
    pair: str = "embedded"
    target: str | None = None       # override the preset's target id
    draft: str | None = None        # override the preset's draft id
    mode: str = "sd"                # target-only | sd (synchronous rounds) | pipelined (draft streams ahead)
    k: int = 3                      # speculative tokens per round (the most, when adaptive or pipelined)
    adaptive: bool | None = None    # choose k per round from measured alpha and costs (None: on for pipelined only)
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    draft_sampled: bool = False     # draft samples from q (else greedy draft, q one-hot)
    prompts: str = "sharegpt:8"
    max_tokens: int = 64
    chat: bool = True               # apply the chat template (False: raw prompt text)
    thinking: bool | None = None    # Qwen3's enable_thinking; None = template default
    seed: int = 0
    device: str = "cpu"
    placement: str = "colocated"    # colocated: one process | ethernet: draft and target workers on two nodes
    rtt_ms: float = 0.0             # ethernet: injected round trip, split evenly between the directions
    netns: bool | None = None       # ethernet: namespaces + veth (None: when root), else loopback
    max_len: int = 2048             # longest prompt + max_tokens accepted
    engine: str = "sdeth"           # sdeth (this runtime) | vllm (the reference engine, colocated only)
    impl: str = "hf"                # model code: hf (transformers) | fast (sdeth.runtime.fastmodel)
    compile: str = ""               # fast impl: torch.compile mode inside the CUDA graphs ("" = off)
    capacity: int = 4096            # CUDA-graph cache length (tokens); the CPU sizes each request's cache
    synthetic_alpha: float | None = None   # random-weight timing: accept each draft token with this probability
    draft_device: str | None = None # ethernet: the draft worker's device (None: the target's)
    synthetic_trace: str | None = None  # random-weight timing: the draft replays this acceptance trace (JSON),
                                        # scaled to synthetic_alpha when that is set (trace-driven)
    draft_fast: str = ""            # fast impl: the draft decoder's levers (runtime.fastmodel.FastOptions spec,
    target_fast: str = ""           # e.g. 'scope=layer,weights=fp8,head=32768'); the target's must keep its numerics
    draft_emulate: str = ""         # an emulated draft device, PROFILE:SHAPE[:fp8] (params/devices, runtime.emulated)
    draft_chains: str = ""          # ... replaying the draft's continuations recorded here (`python -m sdeth chains`)
    cache: str = "auto"             # pipelined: the outcome cache (runtime.pipeline), off | on | auto | FANOUT[xDEPTH[xRANKS]];
                                    # on: pipeline.CACHE_DEFAULT; auto: the target's event model turns CACHE_DEFAULT on
                                    # per request where it predicts a gain (costmodel.AdaptivePolicy.choose_cache)

    def check(self) -> "RunConfig":
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r}: use one of {MODES}")
        if self.k < 1:
            raise ConfigError(f"k={self.k}: speculative tokens per round must be >= 1")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens}: must be >= 1")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement {self.placement!r}: use one of {PLACEMENTS}")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r}: use one of {ENGINES}")
        if self.mode == "pipelined" and self.placement != "ethernet":
            raise ConfigError("mode 'pipelined' drafts ahead on its own worker while the target verifies: use "
                              "placement 'ethernet' (two workers; on one machine they share it)")
        if self.engine != "sdeth" and self.mode == "pipelined":
            raise ConfigError("engine 'vllm' has no pipelined mode: use mode 'sd' or 'target-only'")
        if self.engine != "sdeth" and self.placement != "colocated":
            raise ConfigError(f"engine {self.engine!r} runs its draft in the same process: use placement 'colocated'")
        if self.rtt_ms < 0:
            raise ConfigError(f"rtt_ms={self.rtt_ms}: must be >= 0")
        if self.impl not in ("hf", "fast"):
            raise ConfigError(f"impl {self.impl!r}: use 'hf' (transformers) or 'fast' (sdeth.runtime.fastmodel)")
        if self.compile and self.impl != "fast":
            raise ConfigError(f"compile={self.compile!r} needs impl 'fast'")
        for role, spec in (("draft", self.draft_fast), ("target", self.target_fast)):
            if spec and self.impl != "fast":
                raise ConfigError(f"{role}_fast={spec!r} needs impl 'fast'")
            try:
                opts = FastOptions.parse(spec)
            except ValueError as e:
                raise ConfigError(f"{role}_fast: {e}") from None
            if role == "target" and (opts.weights != "bf16" or opts.head):
                raise ConfigError(f"target_fast={spec!r}: the target's weights and output layer define the output; "
                                  "lighter weights or a pruned head belong to the draft (draft_fast)")
        if self.draft_emulate:
            from ..runtime.emulated import parse_emulation
            try:
                parse_emulation(self.draft_emulate)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if not self.draft_chains or not Path(self.draft_chains).exists():
                raise ConfigError(f"draft_emulate={self.draft_emulate!r} needs draft_chains: the recorded draft "
                                  f"continuations ({self.draft_chains!r} is missing; `python -m sdeth chains` records them)")
        if self.synthetic_alpha is not None and not 0 <= self.synthetic_alpha <= 1:
            raise ConfigError(f"synthetic_alpha={self.synthetic_alpha}: a probability in [0, 1]")
        if self.synthetic_trace and not Path(self.synthetic_trace).exists():
            raise ConfigError(f"synthetic_trace={self.synthetic_trace!r}: no such file (the committed one is "
                              "reports/traces/embedded_greedy.json; `python -m sdeth trace` records another)")
        if self.cache != "auto":
            from ..runtime.pipeline import parse_cache
            try:
                on = parse_cache(self.cache)[0] > 0
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if on and (self.impl != "fast" or self.draft_emulate):
                raise ConfigError(f"cache={self.cache!r} drafts branches as rows of the fast decoder: use impl "
                                  "'fast' (and a draft that is not emulated), or cache 'off'")
        self.sampling()                 # raises on bad temperature / top-p / top-k
        P.parse_spec(self.prompts)      # raises on a bad prompt spec
        return self

    @property
    def adapts(self) -> bool:
        return self.adaptive if self.adaptive is not None else self.mode == "pipelined"

    def outcome_cache(self) -> str:
        """The outcome cache this run uses (a pipeline.parse_cache spec): 'auto' resolved."""
        from ..runtime.pipeline import CACHE_DEFAULT
        if self.mode != "pipelined":
            return "off"
        if self.cache == "auto":
            return "auto"
        return CACHE_DEFAULT if self.cache == "on" else self.cache

    def engine_opts(self) -> dict:
        """What sdeth.runtime.make_engine takes (in-process engines)."""
        return dict(impl=self.impl, compile_mode=self.compile or None, capacity=self.capacity,
                    synthetic_alpha=self.synthetic_alpha, synthetic_trace=self.synthetic_trace,
                    draft_fast=self.draft_fast, target_fast=self.target_fast, draft_emulate=self.draft_emulate,
                    draft_chains=self.draft_chains)

    def worker_args(self) -> list[str]:
        """The same options as `sdeth worker` flags (both workers of a testbed)."""
        args = ["--impl", self.impl, "--capacity", str(self.capacity)] + (["--compile", self.compile] if self.compile else [])
        args += ["--synthetic-alpha", str(self.synthetic_alpha)] if self.synthetic_alpha is not None else []
        args += ["--draft-fast", self.draft_fast] if self.draft_fast else []
        args += ["--target-fast", self.target_fast] if self.target_fast else []
        if self.draft_emulate:
            args += ["--draft-emulate", self.draft_emulate, "--draft-chains", str(Path(self.draft_chains).resolve())]
        return args + (["--synthetic-trace", str(Path(self.synthetic_trace).resolve())] if self.synthetic_trace else [])

    @property
    def acceptance_kind(self) -> str:
        """How acceptance was produced: 'real' (the pair's models), 'synthetic' (a coin per position) or
        'trace-driven' (a recorded trace replayed)."""
        return "trace-driven" if self.synthetic_trace else "synthetic" if self.synthetic_alpha is not None else "real"

    def sampling(self) -> Sampling:
        try:
            return Sampling(self.temperature, self.top_p, self.top_k, self.draft_sampled)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def encode_prompts(cfg: RunConfig, tokenizer) -> list[tuple[str, list[int]]]:
    """(prompt id, token ids) for each prompt of cfg.prompts; `random:N:LEN[:seed]` draws ids uniformly
    from the tokenizer's range, each prompt from its own seed (random-weight timing runs)."""
    if str(cfg.prompts).startswith("random:"):
        return P.random_ids(cfg.prompts, len(tokenizer))
    out = []
    for p in P.load(cfg.prompts):
        ids = P.encode(p, tokenizer, chat=cfg.chat, thinking=cfg.thinking)
        if len(ids) + cfg.max_tokens > cfg.max_len:
            raise ConfigError(
                f"prompt {p.id} has {len(ids)} tokens; with max_tokens={cfg.max_tokens} it exceeds the cache of "
                f"max_len={cfg.max_len}: raise max_len (--max-len) or lower max_tokens")
        out.append((p.id, ids))
    return out


def save(res: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=str) + "\n")
    return path

"""A run's configuration (what every results JSON stores under `config`), parsed and checked once, and the
prompts it encodes. Both the experiment runner and the vLLM baseline build on it; a worker process gets it
whole, as JSON (`python -m sdeth worker --config JSON`).

Each small language inside it is a typed value with its own parse and error:
    prompts          PromptSpec      sharegpt:N[:seed], humaneval:N[:seed], random:N:LEN[:seed]
    cache            VerdictSpec     off | on | FANOUT[xDEPTH[xBUDGET]]         (runtime.verdictcache; or auto)
    draft_emulate    Emulation       PROFILE:SHAPE[:bf16|fp8]                   (runtime.emulated)
    target_emulate   TargetTimes     PATH[:MODEL], measured target forward times (runtime.emulated)
    draft_fast, target_fast  FastOptions  scope=...,weights=...,head=...        (runtime.fastmodel)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..costmodel import POLICIES
from ..models import prompts as P
from ..runtime.settings import EngineConfig, FastOptions, Sampling

MODES = ("target-only", "sd", "pipelined")
ENGINES = ("sdeth", "vllm", "vllm-server")
PLACEMENTS = ("colocated", "ethernet")
SCHEMA = "sdeth.results/1"


class ConfigError(ValueError):
    """A run configuration that cannot run, with the value and what to use instead."""


@dataclass(frozen=True)
class PromptSpec:
    """A prompt set: NAME:N[:SEED] draws N prompts of a named set (sharegpt, sharegpt-train, humaneval) with
    SEED; random:N:LEN[:SEED] makes N prompts of LEN uniform token ids, prompt i from SEED + i (timing runs).
    parse raises models.prompts.PromptError, naming the spec and the forms it takes."""
    name: str
    n: int
    seed: int = 0
    length: int | None = None       # random: token ids per prompt

    @classmethod
    def parse(cls, spec: str) -> "PromptSpec":
        if str(spec).startswith("random:"):
            n, length, seed = P.random_spec(spec)
            return cls("random", n, seed, length)
        return cls(*P.parse_spec(spec))

    def __str__(self) -> str:
        return f"{self.name}:{self.n}" + (f":{self.length}" if self.length is not None else "") + f":{self.seed}"


def parse_rtts(text: str, what: str = "round trips") -> list[float]:
    """'0,0.2,1' -> round trips in ms, each >= 0; ConfigError otherwise, naming `what` (e.g. the flag)."""
    try:
        rtts = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{what} {text!r}: give round trips in ms separated by commas, e.g. 0,0.2,1,5,20") from None
    if not rtts or min(rtts) < 0:
        raise ConfigError(f"{what} {text!r}: give round trips >= 0 ms, e.g. 0,0.2,1,5,20")
    return rtts


@dataclass(frozen=True)
class RunConfig:
    pair: str = "embedded"
    target: str | None = None       # override the preset's target id
    draft: str | None = None        # override the preset's draft id
    mode: str = "sd"                # target-only | sd (synchronous rounds) | pipelined (draft streams ahead)
    k: int = 3                      # speculative tokens per round (the most, when adaptive or pipelined)
    adaptive: bool | None = None    # choose k per round from measured alpha and costs (None: on for pipelined only)
    policy: str = ""                # pipelined: the step's policy, one of costmodel.POLICIES ("": "policy", the step
                                    # policy, when adaptive, else "fixed"); "sync" and "offered" are its corners
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
    cache: str = "auto"             # pipelined over the link: branches sent ahead by the draft server's verdict cache,
                                    # off | on | auto (asked for wherever the server drafts them); their shape is the
                                    # server's --verdict-cache (a FANOUT[xDEPTH[xBUDGET]] shape reads as on)
    target_emulate: str = ""        # an emulated target: no model, synthetic answers at the forward times measured in
                                    # PATH[:MODEL] (a results JSON's target.points; runtime.emulated.TargetTimes)

    def check(self) -> "RunConfig":
        """This configuration if it can run; ConfigError naming the value and what to use otherwise."""
        self._check_choices()
        self._check_levers()
        self._check_acceptance()
        self._check_cache()
        self.sampling()                 # raises on bad temperature / top-p / top-k
        self.prompt_spec                # raises on a bad prompt spec
        return self

    def _check_choices(self) -> None:
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
        if self.policy and self.policy not in POLICIES:
            raise ConfigError(f"policy {self.policy!r}: use one of {', '.join(POLICIES)} (the pipelined step's policy)")

    def _check_levers(self) -> None:
        if self.impl not in ("hf", "fast"):
            raise ConfigError(f"impl {self.impl!r}: use 'hf' (transformers) or 'fast' (sdeth.runtime.fastmodel)")
        if self.compile and self.impl != "fast":
            raise ConfigError(f"compile={self.compile!r} needs impl 'fast'")
        for role, spec in (("draft", self.draft_fast), ("target", self.target_fast)):
            if spec and self.impl != "fast":
                raise ConfigError(f"{role}_fast={spec!r} needs impl 'fast'")
            opts = self.fast_options(role)
            if role == "target" and (opts.weights != "bf16" or opts.head):
                raise ConfigError(f"target_fast={spec!r}: the target's weights and output layer define the output; "
                                  "lighter weights or a pruned head belong to the draft (draft_fast)")

    def _check_acceptance(self) -> None:
        if self.draft_emulate:
            self.emulation              # raises on a bad spec
            if not self.draft_chains or not Path(self.draft_chains).exists():
                raise ConfigError(f"draft_emulate={self.draft_emulate!r} needs draft_chains: the recorded draft "
                                  f"continuations ({self.draft_chains!r} is missing; `python -m sdeth chains` records them)")
        if self.synthetic_alpha is not None and not 0 <= self.synthetic_alpha <= 1:
            raise ConfigError(f"synthetic_alpha={self.synthetic_alpha}: a probability in [0, 1]")
        if self.target_emulate:
            self._check_target_emulation()
        if self.synthetic_trace and not Path(self.synthetic_trace).exists():
            raise ConfigError(f"synthetic_trace={self.synthetic_trace!r}: no such file (the committed one is "
                              "reports/traces/embedded_greedy.json; `python -m sdeth trace` records another)")

    def _check_target_emulation(self) -> None:
        times = self.target_emulation           # raises on a bad spec or file
        if self.acceptance_kind == "real" or self.draft_emulate:
            raise ConfigError(f"target_emulate={self.target_emulate!r} answers with the synthetic target's tokens: "
                              "set synthetic_alpha (or synthetic_trace), and no draft_emulate")
        if self.temperature != 0 or self.engine != "sdeth":
            raise ConfigError(f"target_emulate={self.target_emulate!r}: greedy decoding (temperature 0) in this "
                              f"runtime (engine 'sdeth'), not temperature {self.temperature}, engine {self.engine!r}")
        missing = [m for m in range(1, self.k + 2) if m not in times.step_ms]
        if missing:             # every width 1..k+1 a round may verify (adaptive k takes any up to k)
            raise ConfigError(f"k={self.k}: {times.source} has target times at widths {sorted(times.step_ms)}, "
                              f"none at {missing}; use k <= {missing[0] - 2} with target_emulate, or a file measured "
                              f"at every width 1..{self.k + 1}")

    def _check_cache(self) -> None:
        if self.cache != "auto" and self.cache_spec.on and (self.impl != "fast" or self.draft_emulate):
            raise ConfigError(f"cache={self.cache!r}: branches come from the batched draft server, which runs the fast "
                              "decoder: use impl 'fast' (and a draft that is not emulated), or cache 'off'")

    # ------------------------------------------------------------------ the typed values inside
    @property
    def prompt_spec(self) -> PromptSpec:
        return PromptSpec.parse(self.prompts)

    @property
    def cache_spec(self):
        """The branch cache as written (a runtime.verdictcache.VerdictSpec; 'auto' reads as the default)."""
        from ..runtime.verdictcache import VerdictSpec
        try:
            return VerdictSpec.parse("on" if self.cache == "auto" else self.cache)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def emulation(self):
        """The emulated draft device (a runtime.emulated.Emulation), or None."""
        from ..runtime.emulated import Emulation
        try:
            return Emulation.parse(self.draft_emulate) if self.draft_emulate else None
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def target_emulation(self):
        """The emulated target's measured times (a runtime.emulated.TargetTimes), or None."""
        from ..runtime.emulated import TargetTimes
        try:
            return TargetTimes.parse(self.target_emulate) if self.target_emulate else None
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def fast_options(self, role: str) -> FastOptions:
        """The fast decoder's levers for role 'draft' or 'target'."""
        try:
            return FastOptions.parse(self.draft_fast if role == "draft" else self.target_fast)
        except ValueError as e:
            raise ConfigError(f"{role}_fast: {e}") from None

    @property
    def adapts(self) -> bool:
        return self.adaptive if self.adaptive is not None else self.mode == "pipelined"

    @property
    def step_policy(self) -> str:
        """The pipelined step's policy by name ("" for the other modes)."""
        if self.mode != "pipelined":
            return ""
        return self.policy or ("policy" if self.adapts else "fixed")

    def branch_cache(self) -> str:
        """What a pipelined request asks of the draft server's branches (Generate.cache): 'off', 'on' (a shape
        reads as on: the server's --verdict-cache sets it) or 'auto'; 'off' for the other modes."""
        if self.mode != "pipelined" or not self.cache_spec.on:
            return "off"
        return "auto" if self.cache == "auto" else "on"

    def engine_config(self) -> EngineConfig:
        """What sdeth.runtime.make_engine builds both roles' engines from."""
        return EngineConfig(impl=self.impl, compile_mode=self.compile or None, capacity=self.capacity,
                            synthetic_alpha=self.synthetic_alpha, synthetic_trace=self.synthetic_trace,
                            draft_fast=self.draft_fast, target_fast=self.target_fast, draft_emulate=self.draft_emulate,
                            draft_chains=self.draft_chains, target_emulate=self.target_emulate)

    def engine_opts(self) -> dict:
        """engine_config() as make_engine's keyword arguments."""
        return asdict(self.engine_config())

    # ------------------------------------------------------------------ serialized, for a worker
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """The configuration a to_dict() (or a worker's --config) holds; ConfigError for a field it has not."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"run configuration: unknown field(s) {unknown}; the fields are {sorted(names)}")
        return cls(**d)

    def worker_config(self) -> dict:
        """to_dict() with its files as absolute paths: what a worker process gets (it may run elsewhere)."""
        d = self.to_dict()
        for f in ("synthetic_trace", "draft_chains"):
            if d[f]:
                d[f] = str(Path(d[f]).resolve())
        if self.target_emulate:
            t = self.target_emulation
            d["target_emulate"] = str(Path(t.source).resolve()) + self.target_emulate[len(t.source):]
        return d

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
    if cfg.prompt_spec.name == "random":
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

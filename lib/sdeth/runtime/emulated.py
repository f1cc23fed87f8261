"""An emulated draft device: the real draft's tokens, replayed, at the pace a device profile gives.

For a draft on hardware we cannot run here (an accelerator card), the draft worker answers with the tokens
the real draft model proposes (recorded on the same prompts by `record_chains`: exact for greedy decoding,
so acceptance is the real pair's and the output stays the target's) and takes the time the device's
profile gives one step (sdeth.devices.DeviceProfile.step_s for the model it stands for). Sleeping can be
faster than computing only because the tokens are replayed: every result says "emulated".

The recording: for each prompt, the target's greedy output t and, from every prefix t[:p], the draft's own
greedy continuation chain_p. Any context the draft sees in SD is t[:p] followed by the first j tokens of
chain_p (after a correction the context is a prefix of t again), so its next token is chain_p[j].

An emulated target (EmulatedTarget): for a target we cannot run beside its draft (one GPU shared by both
contends, so the two-GPU result cannot be made on it), the target engine runs no model: each forward answers
with the synthetic target's logits (sdeth.runtime.synthetic: all mass on the request's pseudo-random "true"
continuation, so greedy output and acceptance are the synthetic target's exactly) and takes the time measured
on real hardware for a forward of that many tokens (TargetTimes: a results JSON's `target.points`, B = 1).
Its tensors live on the host; figures from it say "emulated target".
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from .engine import Engine, ForwardClock
from .synthetic import prompt_key, request_seed, true_token


def pace(t0: float, seconds: float) -> None:
    """Return at t0 + seconds (perf_counter): sleep to about 1 ms before, then spin (sleep is coarser)."""
    end = t0 + seconds
    while (left := end - time.perf_counter()) > 0:
        if left > 2e-3:
            time.sleep(left - 1e-3)


class ChainsMiss(KeyError):
    pass


class DraftChains:
    """The recorded continuations of a draft, per prompt (keyed by its token ids)."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.by_key = {int(s["key"]): s for s in doc["sequences"]}
        self.depth = int(doc["depth"])

    @classmethod
    def load(cls, path) -> "DraftChains":
        import json
        return cls(json.load(open(path)))

    def next_token(self, key: int, context: list[int]) -> int:
        """The draft's greedy token after the prompt (by key) and `context` (the tokens since the prompt)."""
        seq = self.by_key.get(key)
        if seq is None:
            raise ChainsMiss(f"no recorded chains for this prompt (key {key}): record them on the same prompts")
        t, chains = seq["target"], seq["chains"]
        p = 0
        while p < len(context) and p < len(t) and context[p] == t[p]:
            p += 1
        j = len(context) - p
        if p >= len(chains) or j >= len(chains[p]):
            raise ChainsMiss(f"context of {len(context)} tokens past the recording (target {len(t)}, depth {self.depth})")
        return chains[p][j]


class EmulatedEngine(Engine):
    """An Engine that runs no model: each forward answers with the recorded draft's tokens (one-hot logits)
    and takes `step_s` per new token after the first forward of a request (the prefill takes
    `prefill_s`). Misses (contexts past the recording) answer token 0 and are counted."""
    keyed_by_prompt = True      # the recording is keyed by the prompt of a request's first forward (its prefill)

    def __init__(self, model, chains: DraftChains, step_s: float, name: str = "draft", prefill_s: float = 0.0,
                 vocab: int | None = None, **kw):
        super().__init__(model, name, cuda_graphs=False, vocab=vocab, **kw)
        self.chains, self.step_s, self.prefill_s = chains, step_s, prefill_s
        self.vocab_size = int(vocab or model.config.vocab_size)
        self.tokens: list[int] = []
        self.key, self.prompt_len, self.misses = 0, 0, 0

    def start(self, max_len: int) -> None:
        self.forward_s, self.forwards = 0.0, 0
        self.max_len, self.pos, self.tokens = max_len, 0, []

    def rollback(self, pos: int) -> None:
        if not 0 <= pos <= self.pos:
            raise ValueError(f"{self.name}: cannot roll back to {pos}, cache holds {self.pos}")
        self.pos, self.tokens = pos, self.tokens[:pos]

    def forward(self, ids) -> torch.Tensor:
        mark = self.clock.begin()
        t0 = time.perf_counter()
        new = [int(x) for x in torch.as_tensor(ids).reshape(-1).tolist()]
        if self.pos == 0:
            self.key, self.prompt_len = prompt_key(new), len(new)
        self.tokens += new
        self.pos += len(new)
        logits = torch.full((len(new), self.vocab_size), -1e4)
        for i in range(len(new)):
            end = self.pos - len(new) + i + 1
            if end < self.prompt_len:
                continue
            try:
                tok = self.chains.next_token(self.key, self.tokens[self.prompt_len:end])
            except ChainsMiss:
                tok, self.misses = 0, self.misses + 1
            logits[i, tok] = 0.0
        # a prefill takes prefill_s; any other forward one step (a few tokens cost one pass of the weights)
        pace(t0, self.prefill_s if self.forwards == 0 else self.step_s)
        self.clock.end(mark)
        self.forwards += 1
        return logits


class Emulation(NamedTuple):
    """An emulated draft device, written PROFILE:SHAPE[:bf16|fp8] (e.g. 'corsair:Qwen3-1.7B:fp8'): a device
    profile of params/devices, a model shape, and the bytes per weight."""
    profile: str
    shape: str
    bytes_per_param: float

    @classmethod
    def parse(cls, spec: str) -> "Emulation":
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"draft emulation {spec!r}: use PROFILE:SHAPE[:bf16|fp8], e.g. corsair:Qwen3-1.7B:fp8")
        fmt = parts[2] if len(parts) == 3 else "bf16"
        if fmt not in ("bf16", "fp8"):
            raise ValueError(f"draft emulation {spec!r}: weights {fmt!r}, use bf16 or fp8")
        return cls(parts[0], parts[1], {"bf16": 2.0, "fp8": 1.0}[fmt])


def parse_emulation(spec: str) -> Emulation:
    """'corsair:Qwen3-1.7B:fp8' -> (profile, model shape, bytes per parameter)."""
    return Emulation.parse(spec)


def emulated_draft(model, spec: str, chains_path: str, vocab: int | None = None) -> EmulatedEngine:
    """The emulated draft of `spec` (PROFILE:SHAPE[:bf16|fp8]) replaying the chains recorded in chains_path."""
    from .. import devices
    profile, shape, bpp = parse_emulation(spec)
    p = devices.load(profile)
    w, kv, layers = devices.model_bytes(shape, bpp)
    step = p.step_s(w, kv, layers)
    eng = EmulatedEngine(model, DraftChains.load(chains_path), step, prefill_s=4 * step, vocab=vocab)
    eng.emulation = {"profile": p.name, "shape": shape, "weights": "fp8" if bpp == 1 else "bf16",
                     "memory": p.memory(w, kv), "step_ms": step * 1e3, "kind": "emulated"}
    return eng


# ---------------------------------------------------------------- an emulated target: measured times, synthetic answers

PREFILL_MS_PER_TOKEN = 0.066   # Qwen3-8B shape on an H200: target-only TTFT 33.8 ms at 512-token prompts
                               # (reports/gpu/bench_sd_1.7b.json); a prefill takes the larger of this and the widest verify


@dataclass(frozen=True)
class TargetTimes:
    """Measured forward times of a target shape, written PATH[:MODEL]: a results JSON whose `target.points` hold,
    at B = 1, width m = k + 1 -> ms (k None: the plain step t(1); k >= 1: the verify t_v(1, k)), as
    `python -m sdeth bench streams` writes them (reports/gpu/bench_streams_2.json); the graph's replay time
    where measured, else the host's wall time. MODEL, if given, must be the file's `target.model`.
    Replay times are device time only: they leave out the launch and the logits' copy that a GPU target's forward
    also pays (in reports/gpu/bench_streams_2.json wall - replay is 0.10-0.13 ms a forward, at 5.0-5.7 ms), which
    slightly favours the emulated target; describe() states it, with the file's own gap where it has both."""
    source: str                 # the file, as given
    model: str
    hardware: str               # the file's hardware label (where the times were measured)
    created: str
    context: int | None         # the cache length the times were measured at
    step_ms: dict               # width m -> ms
    field: str                  # replay_ms | wall_ms
    wall_gap_ms: tuple | None = None    # (least, most) wall_ms - replay_ms over the widths, where the file has both

    @classmethod
    def parse(cls, spec: str) -> "TargetTimes":
        path, sep, model = spec.rpartition(":")
        if not sep or not path.endswith(".json"):
            path, model = spec, ""
        if not Path(path).is_file():
            raise ValueError(f"emulated target {spec!r}: no such file {path!r}; give PATH[:MODEL], a results JSON "
                             "with target.points, e.g. reports/gpu/bench_streams_2.json:Qwen3-8B")
        doc = json.loads(Path(path).read_text())
        target = doc.get("target") or {}
        points = [p for p in target.get("points", []) if p.get("B") == 1]
        if not points or 1 not in {p.get("width") for p in points}:
            raise ValueError(f"emulated target {spec!r}: {path} has no target.points at B = 1 with a plain step "
                             "(width 1); `python -m sdeth bench streams` writes them")
        if model and model != target.get("model"):
            raise ValueError(f"emulated target {spec!r}: {path} measured {target.get('model')!r}, not {model!r}")
        field = "replay_ms" if all("replay_ms" in p for p in points) else "wall_ms"
        gaps = [float(p["wall_ms"]) - float(p["replay_ms"]) for p in points if "wall_ms" in p and "replay_ms" in p]
        return cls(path, target.get("model", "?"), (doc.get("hardware") or {}).get("label", "unknown hardware"),
                   doc.get("created", ""), target.get("context"), {int(p["width"]): float(p[field]) for p in points},
                   field, (round(min(gaps), 4), round(max(gaps), 4)) if field == "replay_ms" and gaps else None)

    @property
    def max_width(self) -> int:
        return max(self.step_ms)

    def forward_s(self, m: int) -> float:
        """Seconds of a forward of m new tokens after the prefill (m = 1: a step; m = k + 1: a verify of k)."""
        if m not in self.step_ms:
            raise ValueError(f"emulated target: no measured time for a forward of {m} tokens in {self.source} "
                             f"(widths {sorted(self.step_ms)}): use k <= {self.max_width - 1}")
        return self.step_ms[m] / 1e3

    def prefill_s(self, n: int) -> float:
        """Seconds of the prefill of an n-token prompt: n x PREFILL_MS_PER_TOKEN, at least the widest verify."""
        return max(n * PREFILL_MS_PER_TOKEN, self.step_ms[self.max_width]) / 1e3

    @property
    def label(self) -> str:
        return f"emulated target (measured verify times from {self.source}, {self.hardware})"

    def time_note(self) -> str:
        """What the paced times include and leave out."""
        if self.field == "wall_ms":
            return "host wall time of each forward (launch and copy included)"
        gap = (f": wall - replay in this file is {self.wall_gap_ms[0]}-{self.wall_gap_ms[1]} ms a forward"
               if self.wall_gap_ms else "")
        return ("CUDA-graph replay time (device time only): it leaves out the launch and the logits' copy a GPU "
                f"target's forward also pays{gap}, so the emulated target is slightly faster than a real one")

    def describe(self) -> dict:
        return {"kind": "emulated", "label": self.label, "source": self.source, "model": self.model,
                "hardware": self.hardware, "measured": self.created, "context": self.context, "time_field": self.field,
                "time_note": self.time_note(), "wall_minus_replay_ms": self.wall_gap_ms,
                "forward_ms": {str(m): ms for m, ms in sorted(self.step_ms.items())},
                "prefill": f"n x {PREFILL_MS_PER_TOKEN} ms for an n-token prompt, at least the widest verify "
                           "(set, not measured by this file)",
                "outputs": "synthetic (sdeth.runtime.synthetic): the emulated target runs no model",
                "host_argmax_subtracted": True,
                "host": "each forward returns its time before the measured one by what the verdict's argmax over "
                        "its [m, vocab] logits takes on the host's cores (timed by each emulated target when it is "
                        "built, on its own host): a GPU target does that on the device in microseconds"}


class EmulatedTarget(Engine):
    """The target's Engine without a model: a forward of m new tokens answers with the synthetic target's logits
    [m, V] (float32, on the host: all mass on the request's true token at each next position, keyed by the prompt
    and `seed` as SyntheticEngine's) and returns at times.forward_s(m) after it began (a request's first forward,
    its prefill: times.prefill_s(m)). A prefill's rows all answer as its last (the only one read): a full
    [m, V] on the host would take longer than the prefill it stands for."""

    def __init__(self, times: TargetTimes, vocab: int, seed: int = 0, name: str = "target", capacity: int = 4096):
        # Engine.__init__ is skipped (it needs a model): every field it sets is set here (model, net, name, device,
        # vocab, impl, compile_mode, scratch, graphs, capacity, max_graph_width, graphs_on, clock, forwards, pos,
        # max_len) but fast and _fixed, which only Engine's own forwards read (overridden here; forward_rows
        # refuses impl 'emulated'); tests/test_emulated_target.py checks the list against a real Engine's
        self.model, self.net, self.name, self.device = None, None, name, torch.device("cpu")
        self.times, self.vocab_size, self.seed, self.request_seed = times, int(vocab), seed, seed
        self.vocab, self.impl, self.compile_mode, self.scratch, self.graphs = None, "emulated", None, 0, {}
        self.capacity, self.max_graph_width, self.graphs_on = capacity, times.max_width, False
        self.clock, self.forwards, self.pos, self.max_len = ForwardClock(False), 0, 0, 0
        self.host_s = host_argmax_s(self.vocab_size, times.max_width)

    def start(self, max_len: int) -> None:
        self.forward_s, self.forwards, self.max_len, self.pos = 0.0, 0, max_len, 0

    def rollback(self, pos: int) -> None:
        if not 0 <= pos <= self.pos:
            raise ValueError(f"{self.name}: cannot roll back to {pos}, cache holds {self.pos}")
        self.pos = pos

    def forward(self, ids) -> torch.Tensor:
        mark, t0 = self.clock.begin(), time.perf_counter()
        ids = torch.as_tensor(ids).reshape(-1)
        m = ids.numel()
        if self.pos + m > self.max_len:
            raise ValueError(f"{self.name}: {self.pos} + {m} tokens exceed the request's {self.max_len}")
        prefill = self.pos == 0
        if prefill:            # a new request: its own true continuation, keyed by its prompt (as SyntheticEngine's)
            self.request_seed = request_seed(self.seed, ids.tolist())
        seconds = self.times.prefill_s(m) if prefill else max(0.0, self.times.forward_s(m) - self.host_s[m])
        rows = 1 if prefill else m
        logits = torch.full((rows, self.vocab_size), -1e4)
        cols = [true_token(self.request_seed, self.pos + m - rows + 1 + i, self.vocab_size) for i in range(rows)]
        logits[torch.arange(rows), torch.tensor(cols)] = 0.0
        self.pos += m
        pace(t0, seconds)
        self.clock.end(mark)
        self.forwards += 1
        return logits.expand(m, -1) if prefill else logits


def host_argmax_s(vocab: int, widths: int, reps: int = 15) -> dict:
    """Width m -> the median seconds the greedy verdict (argmax over [m, vocab] float32 logits) takes on this host's
    cores: what an emulated target takes off its pace, since a GPU target does it on the device."""
    import statistics

    from .verify import verdict_greedy
    out = {}
    for m in range(1, widths + 1):
        logits, drafts, times = torch.full((m, vocab), -1e4), torch.zeros(m - 1, dtype=torch.long), []
        for _ in range(reps):
            t0 = time.perf_counter()
            verdict_greedy(drafts, logits).tolist()
            times.append(time.perf_counter() - t0)
        out[m] = statistics.median(times)
    return out


def emulated_target(spec: str, vocab: int, seed: int = 0, capacity: int = 4096) -> EmulatedTarget:
    """The emulated target of spec (PATH[:MODEL], TargetTimes) for a pair of `vocab` tokens; seed: the synthetic
    acceptance's seed (the draft's)."""
    eng = EmulatedTarget(TargetTimes.parse(spec), vocab, seed, capacity=capacity)
    eng.emulation = {**eng.times.describe(), "host_argmax_ms": ms_by_width(eng.host_s)}
    return eng


def ms_by_width(seconds: dict) -> dict:
    """Width m -> seconds, as a results JSON keeps it: str(m) -> ms (4 decimals), by width."""
    return {str(m): round(s * 1e3, 4) for m, s in sorted(seconds.items())}

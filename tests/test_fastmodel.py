"""sdeth.fastmodel computes the transformers model's function (fused projections, plain-tensor
cache, position masks), through prefill, decode, verify widths and rollbacks."""
import pytest
import torch

from sdeth.runtime.engine import Engine

from doubles import tiny_qwen3


def _tiny(kind):
    if kind == "qwen3":
        return tiny_qwen3(0)
    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kind", ["qwen3", "llama3-rope-scaled"])
def test_fast_decoder_matches_transformers(kind):
    model = _tiny(kind)
    ref, fast = Engine(model, "ref"), Engine(model, "fast", impl="fast")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (40,), generator=g).tolist()
    worst = 0.0
    for e in (ref, fast):
        e.start(64)
    steps = [("fwd", ids[:9]), ("fwd", ids[9:10]), ("fwd", ids[10:14]), ("rb", 11), ("fwd", ids[20:25]),
             ("rb", 12), ("fwd", ids[25:26]), ("fwd", ids[26:34])]
    for op, arg in steps:
        if op == "rb":
            ref.rollback(arg), fast.rollback(arg)
            continue
        a, b = ref.forward(arg), fast.forward(arg)
        assert a.shape == b.shape and ref.pos == fast.pos
        worst = max(worst, ((a - b).norm() / a.norm()).item())
    assert worst < 1e-5, worst


def test_fast_engine_sd_is_lossless():
    from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
    from sdeth.runtime.verify import Sampling
    target, draft = _tiny("qwen3"), _tiny("qwen3")
    torch.manual_seed(5)
    for p in draft.parameters():        # a different but related draft
        p.data += 0.02 * torch.randn_like(p)
    s = Sampling()
    prompt = list(range(3, 15))
    ref = generate_target_only(Engine(target, impl="fast"), prompt, 40, s, None)
    for k in (1, 3):
        out = generate_sd(Engine(target, impl="fast"), Drafter(Engine(draft, impl="fast"), s), prompt, 40, k, s, None)
        assert out.output_ids == ref.output_ids and out.accepted_tokens > 0

"""CUDA graphs in the engine (marker `gpu`: runs on a device machine, skipped elsewhere).
Random-weight models: the check is that graph replay computes what eager does, through rollbacks."""
import pytest
import torch

from sdeth.runtime.engine import Engine, prefill
from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
from sdeth.runtime.verify import Sampling

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _model(seed, layers=4, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).to("cuda", dtype).eval()


def test_graph_replay_matches_eager_through_rollbacks():
    m = _model(0)
    g, e = Engine(m, cuda_graphs=True, capacity=256), Engine(m, cuda_graphs=False)
    for eng in (g, e):
        eng.start(256)
    ids = torch.randint(0, 1000, (60,)).tolist()
    outs = {}
    for name, eng in (("graph", g), ("eager", e)):
        o = [prefill(eng, ids[:20])]
        o.append(eng.forward(ids[20:21]))
        o.append(eng.forward(ids[21:25]))        # a verify of 4
        eng.rollback(22)
        o.append(eng.forward(ids[30:34]))        # a different continuation after rollback
        o.append(eng.forward(ids[34:35]))
        for t in ids[35:45]:
            o.append(eng.forward([t]))
        outs[name] = o
    assert len(g.graphs) == 2                    # widths 1 and 4 captured once each
    for a, b in zip(outs["graph"], outs["eager"]):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_greedy_sd_with_graphs_is_identical_to_target_only():
    t, d = _model(0, 6), _model(1, 2)
    target = Engine(t, capacity=512)
    drafter = Drafter(Engine(d, capacity=512))
    s = Sampling()
    for i in range(4):
        prompt = torch.randint(0, 1000, (16 + i,), generator=torch.Generator().manual_seed(i)).tolist()
        base = generate_target_only(target, prompt, 48, s, None)
        sd = generate_sd(target, drafter, prompt, 48, 4, s, None)
        assert sd.output_ids == base.output_ids
    assert target.graphs_on and set(target.graphs) >= {1, 5}


# ------------------------------------------------------------------ sampling on the GPU (temperature > 0)
@pytest.mark.parametrize("k,draft_sampled", [(2, True), (3, False)])
def test_sampled_sd_colocated_on_the_gpu_reproduces_the_target(k, draft_sampled):
    """The chi-square check of test_verify with every tensor and generator on the device."""
    from test_verify import _chi2_pvalue
    assert _chi2_pvalue(k, Sampling(1.0, draft_sampled=draft_sampled), n=6000, device="cuda") > 1e-3


def test_sampled_pipelined_in_process_on_the_gpu_reproduces_the_target():
    from test_pipeline import _pvalue
    assert _pvalue(Sampling(1.0, draft_sampled=True), n=4000, device="cuda") > 1e-3


@pytest.mark.parametrize("mode,draft_sampled", [("target-only", False), ("sd", True), ("sd", False),
                                                ("pipelined", True)])
def test_sampled_decoding_over_the_link_on_the_gpu_reproduces_the_target(mode, draft_sampled):
    from test_ethernet import link_sampling_pvalue
    assert link_sampling_pvalue(mode, draft_sampled, "cuda:0", n=900) > 1e-3


@pytest.mark.parametrize("fast,compile_mode", [("scope=layer", "default"), ("scope=layer,head=500", "default"),
                                               ("scope=model", "default"), ("scope=layer", None)])
def test_levers_graph_equals_eager_and_rows_equal_chains(fast, compile_mode):
    """Every kept lever of the fast decoder (one compiled block, the whole step compiled, a pruned output
    layer) in CUDA graphs computes what the same decoder does eagerly, fp32; and rows decoded in one
    forward equal chains decoded alone."""
    m = _model(0)
    g = Engine(m, impl="fast", capacity=128, compile_mode=compile_mode, fast=fast, scratch=8)
    e = Engine(m, impl="fast", cuda_graphs=False, fast=fast)
    ids = torch.randint(0, 1000, (40,)).tolist()
    for eng in (g, e):
        eng.start(128)
        eng.forward(ids[:20])
    for w in (ids[20:21], ids[21:25], ids[25:26]):
        a, b = g.forward(w), e.forward(w)
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin) and torch.allclose(a[fin], b[fin], atol=1e-3, rtol=1e-3)
    vis = torch.zeros(2, 136, dtype=torch.bool)
    vis[0, :26], vis[0, 128] = True, True
    vis[1, :24], vis[1, 129] = True, True
    rows = g.forward_rows([7, 9], [26, 24], [128, 129], vis)
    for r, (keep, tok) in enumerate([(26, 7), (24, 9)]):
        c = Engine(m, impl="fast", cuda_graphs=False, fast=fast)
        c.start(128)
        c.forward(ids[:keep])
        want = c.forward([tok])[0]
        fin = torch.isfinite(want)
        assert torch.allclose(rows[r][fin], want[fin], atol=1e-3, rtol=1e-3), (fast, r)


# ------------------------------------------------------------------ fp8 weights (the 70B-class target's format)
@pytest.mark.parametrize("m", [1, 5, 16, 144])
def test_fp8w_linear_matches_its_dequantized_reference(m):
    """The weight-only fp8 kernel (runtime.fp8gemv) computes x times the dequantized weights: bf16 output
    rounding only, for one row, a few, and more rows than one block of the kernel (N not a multiple of 64)."""
    from sdeth.runtime.fastmodel import linear, quantize
    g = torch.Generator(device="cuda").manual_seed(m)
    w = torch.randn(3000, 1024, device="cuda", generator=g).to(torch.bfloat16) * 0.02
    x = torch.randn(m, 1024, device="cuda", generator=g).to(torch.bfloat16)
    kind, q, s = quantize(w, "fp8w")
    out = torch.full((m, 3000), float("nan"), device="cuda", dtype=torch.bfloat16)
    out.copy_(linear(x, (kind, q, s)))
    want = x.double() @ (q.double() * s.double()[:, None]).t()
    assert torch.isfinite(out).all() and _rel(out, want) < 5e-3


@pytest.mark.parametrize("m", [1, 16, 144])
def test_fp8_linear_matches_its_dequantized_reference(m):
    """torch._scaled_mm with per-row e4m3 weights and per-token e4m3 activations computes the product of the
    dequantized operands (fp32 reference of the same quantized values: rounding of the bf16 output only), and
    stays within activation rounding of the product with the dequantized weights and unquantized input."""
    from sdeth.runtime.fastmodel import FP8, FP8_MAX, linear, quantize
    g = torch.Generator(device="cuda").manual_seed(m)
    w = torch.randn(3072, 1024, device="cuda", generator=g).to(torch.bfloat16) * 0.02
    x = torch.randn(m, 1024, device="cuda", generator=g).to(torch.bfloat16)
    kind, q, s = quantize(w, "fp8")
    out = torch.full((m, 3072), float("nan"), device="cuda", dtype=torch.bfloat16)
    out.copy_(linear(x, (kind, q, s)))
    assert torch.isfinite(out).all()
    wd = q.double() * s.double()[:, None]                              # dequantized weights
    sx = x.double().abs().amax(-1, keepdim=True) / FP8_MAX
    xq = (x.double() / sx).clamp(-FP8_MAX, FP8_MAX).to(FP8).double() * sx
    rel = lambda a, b: float((a.double() - b).norm() / b.norm())        # noqa: E731
    assert rel(out, xq @ wd.t()) < 5e-3                                 # bf16 output rounding
    assert rel(out, x.double() @ wd.t()) < 0.05                         # e4m3 activations: ~2-3%
    assert rel(out, x.double() @ wd.t()) > 1e-3                         # (they are quantized: not bf16 by accident)


@pytest.mark.parametrize("fmt", ["fp8", "fp8w"])
def test_fused_fp8_model_runs_in_graphs_and_rows_equal_chains(fmt, monkeypatch):
    """A fused random model in fp8 (runtime.randomweights, built on the GPU) through the engine's graphs: finite
    logits, the graph equals the eager decoder (the same kernels: uncompiled), and rows of one forward equal chains
    decoded alone (other widths: other GEMM kernels, so bf16 rounding differs a little)."""
    from sdeth.models import presets
    from sdeth.runtime.randomweights import fused_random
    monkeypatch.setitem(presets.OTHER_SHAPES, "tiny-fp8", {**presets.shape("tiny-4L"), "vocab_size": 1024})  # N % 16
    m = fused_random("tiny-fp8", "cuda", fmt)
    assert m.fused["layers"][0]["wqkv"][1].dtype == torch.float8_e4m3fn
    g = Engine(m, impl="fast", capacity=128, scratch=8)
    e = Engine(m, impl="fast", cuda_graphs=False)
    ids = torch.randint(0, 1000, (40,)).tolist()
    for eng in (g, e):
        eng.start(128)
        eng.forward(ids[:20])
    for w in (ids[20:21], ids[21:25]):
        a, b = g.forward(w), e.forward(w)
        assert torch.isfinite(a).all() and _rel(a, b) < 1e-3
    vis = torch.zeros(2, 136, dtype=torch.bool)
    vis[0, :25], vis[0, 128] = True, True
    vis[1, :25], vis[1, 129] = True, True
    rows = g.forward_rows([7, 9], [25, 25], [128, 129], vis)
    # fp8 (W8A8) also quantizes activations per token: a bf16 rounding difference between kernels can move an e4m3
    # step (up to 6% of an element) and carries through the layers; weight-only fp8 keeps bf16 activations
    tol = 0.1 if fmt == "fp8" else 2e-2
    for r, tok in enumerate((7, 9)):
        e.rollback(25)
        want = e.forward([tok])[0]
        assert _rel(rows[r], want) < tol, r
    c = Engine(m, impl="fast", capacity=128, compile_mode="default")     # the compiled block in a graph too
    c.start(128)
    c.forward(ids[:20])
    e.rollback(20)
    got, want = c.forward(ids[20:21]), e.forward(ids[20:21])
    assert torch.isfinite(got).all() and _rel(got, want) < max(tol, 5e-2)   # fused kernels round bf16 differently


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())

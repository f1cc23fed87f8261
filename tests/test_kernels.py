"""The fused decode kernels (runtime.kernels, runtime.attention_kernels) against the torch path they replace: each kernel alone, a layer,
the fast decoder's chain and the batch decoder's rows (different lengths, widths 1 and 2, the scratch rows of
a padded bucket), with and without q/k norms and a qkv bias, and greedy decoding equal over many tokens.

Without a CUDA device the kernels run in Triton's interpreter (switched on by runtime.kernels before Triton
is first imported); fp32 results are compared tightly, bf16 ones within a few bf16 ulps (the interpreter
rounds fp32 to bf16 by truncation)."""
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")      # before Triton's first import; see runtime.kernels
pytest.importorskip("triton", reason="the fused kernels need Triton")

from doubles import tiny_qwen3                                     # noqa: E402
from sdeth.runtime import attention_kernels as A                   # noqa: E402
from sdeth.runtime import gemv_table as GT                         # noqa: E402
from sdeth.runtime import kernels as K                             # noqa: E402
from sdeth.runtime.batchmodel import BatchDecoder, batch_attention  # noqa: E402
from sdeth.runtime.fastmodel import FastDecoder, FastOptions, FastOptionsError, _norm, block, kernel_block  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if K.unavailable(DEV):
    pytest.skip(K.unavailable(DEV), allow_module_level=True)

TOL = {torch.float32: 2e-5, torch.bfloat16: 4e-2}       # max abs error relative to the reference's max abs


def close(got, want, dtype) -> None:
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item() + 1e-6
    assert err <= TOL[dtype] * scale, f"max abs error {err:.3g} over a reference of max {scale:.3g} ({dtype})"


def rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, generator=GEN) * scale).to(dtype).to(DEV)


GEN = torch.Generator().manual_seed(0)


# ------------------------------------------------------------------ the GEMVs

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 7, 20])
def test_gemv_kernels_equal_the_torch_ops(dtype, m):
    """norm_gemv (residual add + RMSNorm + bias), gemv (+ residual) and silu_gemv, for 1 to 20 rows (both the
    broadcast GEMV and the tl.dot tiles) and a K that is no multiple of the block."""
    k, n = 80, 96
    x, carry, norm = rand(m, k, dtype=dtype), rand(m, k, dtype=dtype), rand(k, dtype=dtype)
    w, bias = rand(n, k, dtype=dtype, scale=0.1), rand(n, dtype=dtype)
    x_new = torch.empty_like(x)
    close(K.norm_gemv(x, carry, norm, w, bias, 1e-6, x_out=x_new), F.linear(_norm(x + carry, norm, 1e-6), w, bias),
          dtype)
    close(x_new, x + carry, dtype)
    close(K.norm_gemv(x, None, norm, w, None, 1e-6), F.linear(_norm(x, norm, 1e-6), w), dtype)
    res = rand(m, n, dtype=dtype)
    close(K.gemv(x, w, residual=res), res + F.linear(x, w), dtype)
    gate_up, wd = rand(m, 2 * k, dtype=dtype), rand(n, k, dtype=dtype, scale=0.1)
    gate, up = gate_up.chunk(2, dim=-1)
    close(K.silu_gemv(gate_up, wd), F.linear(F.silu(gate) * up, wd), dtype)


def test_gemv_refuses_what_it_cannot_take():
    x = rand(40, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match="40 rows"):
        K.gemv(x, rand(8, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match="does not fit"):
        K.gemv(x[:2], rand(8, 12, dtype=torch.float32))
    with pytest.raises(TypeError, match="int8"):
        K.gemv(x[:2], ("int8", None, None))


# ------------------------------------------------------------------ the attention kernel

NQ, NKV, HD, CAP = 4, 2, 32, 48
SHAPE = (NQ, NKV, HD, 1e-6, HD ** -0.5)


def rope_tables(dtype):
    inv = 1.0 / (1e4 ** (torch.arange(0, HD, 2).float() / HD))
    emb = torch.cat([torch.outer(torch.arange(CAP).float(), inv)] * 2, dim=-1)
    return emb.cos().to(dtype).to(DEV), emb.sin().to(dtype).to(DEV)


def attention_case(dtype, qk_norm: bool, positions):
    """A cache of rows with random earlier entries, this step's qkv and layer weights for `positions` [R, W]."""
    R, W = positions.shape
    cache = [rand(R, NKV, CAP + 1, HD, dtype=dtype) for _ in range(2)]
    qkv = rand(R * W, (NQ + 2 * NKV) * HD, dtype=dtype)
    L = {"q_norm": rand(HD, dtype=dtype) if qk_norm else None, "k_norm": rand(HD, dtype=dtype) if qk_norm else None}
    return cache, qkv, L


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("width", [1, 2])
def test_attention_kernel_equals_torch_attention(dtype, qk_norm, width):
    """Rows of different lengths (the last one a padded bucket's scratch row: slot CAP, position 0); width 2 is
    two new tokens, causal between them, or (row 1) one token repeated at its own position."""
    first = torch.tensor([7, 30, 0, 0]) if width == 2 else torch.tensor([7, 30, 45, 0])
    positions = (first[:, None] + torch.arange(width)[None, :]).to(DEV)
    if width == 2:
        positions[1] = 30
        positions[3] = 0
    slots = positions.clone()
    slots[-1] = CAP
    (kc, vc), qkv, L = attention_case(dtype, qk_norm, positions)
    if width == 2:              # a token repeated at its own slot is the same token: the same q, k, v twice
        qkv.view(4, 2, -1)[[1, 3], 1] = qkv.view(4, 2, -1)[[1, 3], 0]
    cos, sin = rope_tables(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    got = A.decode_attention(qkv, kc, vc, positions, slots, cos, sin, L["q_norm"], L["k_norm"], SHAPE)
    R, W = positions.shape
    rows = torch.arange(R, device=DEV)[:, None].expand(R, W)
    visible = torch.arange(CAP + 1, device=DEV)[None, None, :] <= positions[:, :, None]
    want = batch_attention(qkv, L, kc2, vc2, rows, slots, cos[positions][:, :, None], sin[positions][:, :, None],
                           visible, SHAPE)
    close(got[:-W], want[:-W], dtype)              # the scratch row's output is never read
    close(kc, kc2, dtype)
    assert torch.equal(vc, vc2)


@pytest.mark.parametrize("splits", [0, 1, 3])
@pytest.mark.parametrize("width", [1, 2])
def test_split_attention_equals_torch_attention(splits, width):
    """Flash-decoding: each row's live slots in splits (0: as attention_splits chooses, here 5; 1; 3), each split's
    partials combined; rows whose new tokens fall in different splits, one at a split's edge, a scratch row."""
    cap, dtype = 300, torch.float32
    first = torch.tensor([250, 127, 3, 0])
    positions = (first[:, None] + torch.arange(width)[None, :]).to(DEV)
    slots = positions.clone()
    slots[-1] = cap
    R, W = positions.shape
    kc, vc = (rand(R, NKV, cap + 1, HD, dtype=dtype) for _ in range(2))
    qkv = rand(R * W, (NQ + 2 * NKV) * HD, dtype=dtype)
    L = {"q_norm": rand(HD, dtype=dtype), "k_norm": rand(HD, dtype=dtype)}
    inv = 1.0 / (1e4 ** (torch.arange(0, HD, 2).float() / HD))
    emb = torch.cat([torch.outer(torch.arange(cap + 2).float(), inv)] * 2, dim=-1)
    cos, sin = emb.cos().to(DEV), emb.sin().to(DEV)
    kc2, vc2 = kc.clone(), vc.clone()
    assert A.attention_splits(R, NKV, cap + 1, 64) == 5                # 8 (row, kv head) pairs: 5 tiles of slots
    got = A.decode_attention(qkv, kc, vc, positions, slots, cos, sin, L["q_norm"], L["k_norm"], SHAPE, splits=splits)
    rows = torch.arange(R, device=DEV)[:, None].expand(R, W)
    visible = torch.arange(cap + 1, device=DEV)[None, None, :] <= positions[:, :, None]
    want = batch_attention(qkv, L, kc2, vc2, rows, slots, cos[positions][:, :, None], sin[positions][:, :, None],
                           visible, SHAPE)
    close(got[:-W], want[:-W], dtype)
    # the scratch row's W tokens all write the scratch slot `cap`: which one wins is unspecified (on a GPU, for torch
    # and the kernel alike), and nothing reads it; every other slot must match
    close(kc[..., :cap, :], kc2[..., :cap, :], dtype)
    assert torch.equal(vc[..., :cap, :], vc2[..., :cap, :])


def test_attention_kernel_on_a_one_row_cache_and_refusals():
    """The fast decoder's cache [nkv, slots, hd] (one row); widths past the limit and bad shapes are refused."""
    positions = torch.arange(5, 8, device=DEV)[None]
    (kc, vc), qkv, L = attention_case(torch.float32, True, positions)
    cos, sin = rope_tables(torch.float32)
    o = A.decode_attention(qkv, kc[0], vc[0], positions, positions, cos, sin, L["q_norm"], L["k_norm"], SHAPE)
    assert o.shape == (3, NQ * HD) and torch.isfinite(o).all()
    wide = torch.arange(17, device=DEV)[None]
    with pytest.raises(ValueError, match="width 17"):
        A.decode_attention(torch.zeros(17, 128, device=DEV), kc, vc, wide, wide, cos, sin, None, None, SHAPE)
    with pytest.raises(ValueError, match="qkv"):
        A.decode_attention(qkv[:, :-1].contiguous(), kc, vc, positions, positions, cos, sin, None, None, SHAPE)


# ------------------------------------------------------------------ the decoders

def perturbed(model):
    """Norm weights and q/k/v biases (where the family has them) away from transformers' initial ones and zeros."""
    g = torch.Generator().manual_seed(3)
    for name, p in model.named_parameters():
        if "norm" in name or name.endswith("bias"):
            p.data += 0.3 * torch.randn(p.shape, generator=g)
    return model


def tiny_qwen2(seed: int = 0):
    """A tiny Qwen2-family model (heads of 32): a q/k/v bias, no q/k norms."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=300, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def tiny_qwen3_32(seed: int = 0):
    """doubles.tiny_qwen3 with heads of 32 (the attention kernel's smallest on a GPU)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).eval()


MODELS = {"qk-norm": lambda: perturbed(tiny_qwen3_32(0)), "qkv-bias": lambda: perturbed(tiny_qwen2(0))}


def chain_logits(dec: FastDecoder, ids: list[int], widths) -> list[torch.Tensor]:
    """The chain's logits for a prompt and then the widths' forwards, in turn."""
    out, pos = [], 0
    for w in widths:
        t = torch.tensor(ids[pos:pos + w], device=DEV)
        out.append(dec.forward(t, torch.arange(pos, pos + w, device=DEV)))
        pos += w
    return out


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("kernels", ["attn", "gemv", "all"])
def test_fast_decoder_levers_compute_what_torch_computes(family, kernels):
    """A prompt of 20 (torch's kernels: wider than the fused ones take), then widths 1, 2 and 9 (fused)."""
    model = MODELS[family]().to(DEV)
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    widths = (20, 1, 2, 9)
    want = chain_logits(FastDecoder(model, 64), ids, widths)
    got = chain_logits(FastDecoder(model, 64, f"kernels={kernels}"), ids, widths)
    for g, w in zip(got, want):
        close(g, w, torch.float32)


def test_bf16_decoder_with_every_kernel_stays_close():
    model = MODELS["qk-norm"]().to(DEV, torch.bfloat16)
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    want = chain_logits(FastDecoder(model, 64), ids, (12, 1, 2))
    got = chain_logits(FastDecoder(model, 64, "kernels=all"), ids, (12, 1, 2))
    for g, w in zip(got, want):
        assert (g - w).norm() / w.norm() < 0.03
        assert (g.argmax(-1) == w.argmax(-1)).float().mean() >= 0.6


@pytest.mark.parametrize("kernels", ["attn", "gemv", "all"])
def test_batch_rows_with_kernels_compute_what_torch_computes(kernels):
    """Three rows of different lengths in a bucket of four (the fourth a scratch row), a width-2 catch-up (row 1
    repeats its one new token at its own position) and then a width-1 step."""
    model = MODELS["qk-norm"]().to(DEV)
    decs = [BatchDecoder(FastDecoder(model, 8, f"kernels={k}"), rows=4, capacity=64) for k in ("torch", kernels)]
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (9, 5, 13)]
    last = torch.tensor([s[-3:-1] if r != 1 else [s[-3]] * 2 for r, s in enumerate(seqs)], device=DEV)
    pos = torch.tensor([[len(s) - 3, len(s) - 2] if r != 1 else [len(s) - 3] * 2 for r, s in enumerate(seqs)],
                       device=DEV)
    nxt, pos1 = torch.tensor([[s[-1]] for s in seqs], device=DEV), pos[:, -1:] + 1
    outs = []
    for dec in decs:
        for r, s in enumerate(seqs):
            p = torch.arange(len(s) - 3, device=DEV)[None]
            dec.forward(torch.tensor([s[:-3]], device=DEV), p, p, row0=r)
        outs.append([dec.step(last, pos, pos, top=int(pos.max()) + 1),
                     dec.step(nxt, pos1, pos1, top=int(pos1.max()) + 1)])
    for g_, w in zip(outs[1], outs[0]):
        assert g_.shape == (3, 300)
        close(g_, w, torch.float32)


def test_greedy_decoding_with_every_kernel_equals_torch():
    """The engine's greedy chain over 8 tokens, fused against torch (a float32 model)."""
    from sdeth.runtime.engine import Engine
    model = MODELS["qk-norm"]().to(DEV)
    prompt = torch.randint(0, 300, (10,), generator=torch.Generator().manual_seed(4)).tolist()
    runs = []
    for fast in ("kernels=torch", "kernels=all"):
        e = Engine(model, "tiny", capacity=64, impl="fast", fast=fast)
        e.start(64)
        tok = int(e.forward(prompt)[-1].argmax())
        toks = [tok]
        for _ in range(7):
            toks.append(int(e.forward([toks[-1]])[-1].argmax()))
        runs.append(toks)
    assert runs[0] == runs[1]


def test_kernel_options_are_checked():
    assert FastOptions.parse("kernels=all").kernels == "all"
    with pytest.raises(FastOptionsError, match="kernels='fused'"):
        FastOptions.parse("kernels=fused")
    model = tiny_qwen3(0).to(DEV)
    with pytest.raises(FastOptionsError, match="kernels=all needs bf16 weights.*weights=int8"):
        FastDecoder(model, 8, "kernels=all,weights=int8")
    with pytest.raises(FastOptionsError, match="scope=layer"):
        FastDecoder(model, 8, "kernels=attn,scope=model")
    with pytest.raises(FastOptionsError, match="head dims.*this model's: 16"):
        FastDecoder(model, 8, "kernels=attn")


def test_kernel_block_without_kernels_is_block():
    """kernel_block with torch's attention and parts computes block's layer exactly (the levers' common frame)."""
    from functools import partial
    from sdeth.runtime.fastmodel import attention
    fast = FastDecoder(MODELS["qk-norm"](), 16)
    L, m = fast.layers[0], 3
    x, carry = rand(m, 64, dtype=torch.float32).cpu(), rand(m, 64, dtype=torch.float32).cpu()
    pos = torch.arange(4, 4 + m)
    visible = fast.slots[None, :] <= pos[:, None]
    cos, sin = fast.cos[pos][:, None], fast.sin[pos][:, None]
    caches = [[c.clone() for c in (fast.k_cache[0], fast.v_cache[0])] for _ in range(2)]
    want = block(x, carry, L, *caches[0], pos, cos, sin, visible, fast.shape)
    attend = partial(attention, L=L, kc=caches[1][0], vc=caches[1][1], slots=pos, cos=cos, sin=sin, visible=visible,
                     shape=fast.shape)
    got = kernel_block(x, carry, L, attend, fast.eps, gemv=False)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


H200, OTHER = torch.device("cuda", 0), torch.device("cpu")


@pytest.fixture
def gpu_named(monkeypatch):
    """Make torch.cuda.get_device_name answer `name`, and the 'cuda:0' device have 132 SMs (the table's device
    test without the device)."""
    def set_name(name: str):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setitem(GT._SMS, H200, 132)
    return set_name


def test_auto_takes_the_attention_kernel_and_the_fused_gemvs_only_where_the_table_says_they_pay(gpu_named):
    from sdeth.runtime.fastmodel import AUTO_GEMV_TOKENS, fused_head, kernel_levers
    gpu_named(GT.GEMV_TABLE_DEVICE)
    small = dict(gemv_shapes=((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)), device=H200)  # Qwen3-0.6B
    assert GT.fused_gemv_pays(1, small["gemv_shapes"], H200)
    assert kernel_levers("auto", 1, 1, **small) == (True, True)
    assert kernel_levers("auto", AUTO_GEMV_TOKENS + 1, 1, **small) == (True, False)   # past the cap: cuBLAS's
    assert kernel_levers("auto", 1, 1, gemv_shapes=((4096, 1000),), device=H200) == (True, False)  # not measured
    assert kernel_levers("auto", 1, 1, device=H200) == (True, False)   # no shapes (quantized weights): cuBLAS's
    assert kernel_levers("auto", 1, 64, **small) == (False, False)     # prefill: torch's
    assert kernel_levers("torch", 1, 1) == (False, False) and kernel_levers("all", 16, 1) == (True, True)
    assert not GT.fused_gemv_pays(2, small["gemv_shapes"], H200) and not GT.fused_gemv_pays(1, (), H200)
    # the output layer decides on its own shape under auto: the full Qwen3 head was measured, a pruned one not
    head, pruned = torch.empty(151936, 1024), torch.empty(32768, 1024)
    assert fused_head("auto", 1, head, H200, True) and not fused_head("auto", 1, pruned, H200, True)
    assert fused_head("all", 1, pruned, H200, True) and not fused_head("all", 1, head, H200, False)


def test_the_gemv_table_applies_only_on_the_gpu_it_was_measured_on(gpu_named):
    """On another GPU (or none) auto keeps cuBLAS's GEMVs and the launcher takes the rule's configuration."""
    from sdeth.runtime.fastmodel import fused_head, kernel_levers
    shapes = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072))
    gpu_named("NVIDIA A100-SXM4-80GB")
    assert not GT.table_applies(H200) and not GT.fused_gemv_pays(1, shapes, H200)
    assert kernel_levers("auto", 1, 1, gemv_shapes=shapes, device=H200) == (True, False)
    assert not fused_head("auto", 1, torch.empty(151936, 1024), H200, True)
    assert GT.chosen_config(16, 2048, 2048, H200) == GT.gemv_rule(16, 2048, 2048, 132)
    assert not GT.table_applies(OTHER) and not GT.fused_gemv_pays(1, shapes, OTHER)
    gpu_named(GT.GEMV_TABLE_DEVICE)
    assert GT.table_applies(H200) and GT.fused_gemv_pays(1, shapes, H200)
    assert GT.chosen_config(16, 2048, 2048, H200) == GT.GEMV_TABLE[(16, 2048, 2048)][0]
    assert GT.table_config(3, 4096, 1024, H200) is None          # bucket 4: not measured


def test_each_gpu_takes_its_own_table_and_cublas_where_its_table_has_no_shape(gpu_named):
    """The H100's table (the 1.7B's and 0.6B's GEMVs measured there) serves an H100; the 8B's GEMVs, swept only on
    the H200, keep cuBLAS's on an H100; one GPU never reads another's configurations."""
    from sdeth.runtime.fastmodel import kernel_levers
    d17 = ((4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144))      # Qwen3-1.7B
    d8 = ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288))      # Qwen3-8B
    gpu_named(GT.GEMV_TABLE_H100_DEVICE)
    assert GT.table_applies(H200) and GT.fused_gemv_pays(1, d17, H200)
    assert kernel_levers("auto", 1, 1, gemv_shapes=d17, device=H200) == (True, True)
    assert not GT.fused_gemv_pays(1, d8, H200) and kernel_levers("auto", 1, 1, gemv_shapes=d8, device=H200) == (True, False)
    assert GT.table_config(1, 2048, 6144, H200) == GT.GEMV_TABLE_H100[(1, 2048, 6144)][0]
    assert GT.table_config(1, 4096, 4096, H200) is None
    assert GT.GEMV_TABLE_H100[(1, 12288, 2048)][0] != GT.GEMV_TABLE[(1, 12288, 2048)][0]   # (measured apart)
    gpu_named(GT.GEMV_TABLE_DEVICE)
    assert GT.table_config(1, 12288, 2048, H200) == GT.GEMV_TABLE[(1, 12288, 2048)][0]
    assert GT.fused_gemv_pays(1, d8, H200)


def test_the_gemv_table_holds_well_formed_entries_that_run():
    """Every entry: a configuration the launcher takes for its bucket (tl.sum up to 4 rows, tl.dot tiles of 16 rows
    above) and the two timings it was chosen by; each distinct configuration launched once on a small shape (its
    own K split, at most its BLOCK_K a split) equals torch's product."""
    entries = [e for table in GT.GEMV_TABLES.values() for e in table.items()]
    for (m, n, k), (cfg, fused_us, cublas_us) in entries:
        assert m == GT.m_bucket(m) and fused_us > 0 and cublas_us > 0
        assert cfg["DOT"] == (m > 4) and cfg["BLOCK_M"] >= m and cfg["SPLIT_K"] >= 1
        assert k % cfg["BLOCK_K"] == 0 or cfg["BLOCK_K"] >= k
    distinct = {tuple(sorted(cfg.items())): m for (m, _, _), (cfg, _, _) in entries}
    for items, m in distinct.items():
        cfg = dict(items)
        k = cfg["BLOCK_K"] * cfg["SPLIT_K"]
        x, w = rand(m, k, dtype=torch.float32), rand(2 * cfg["BLOCK_N"] + 3, k, dtype=torch.float32, scale=0.1)
        close(K._launch_gemv(x, w, config=cfg), F.linear(x, w), torch.float32)


CONFIGS = [   # (rows, config): tl.sum over 2-row tiles with K split in 3; tl.dot tiles of 16 rows with K split in 4;
    (1, dict(BLOCK_M=1, BLOCK_N=2, BLOCK_K=32, DOT=False, SPLIT_K=3)),      # and unsplit, for the same shapes
    (1, dict(BLOCK_M=1, BLOCK_N=8, BLOCK_K=64, DOT=False, SPLIT_K=1)),
    (16, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, DOT=True, SPLIT_K=4)),
    (13, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, DOT=True, SPLIT_K=1)),
    (3, dict(BLOCK_M=1, BLOCK_N=2, BLOCK_K=32, DOT=False, SPLIT_K=3)),      # several row tiles (grid_m > 1), split:
    (32, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, DOT=True, SPLIT_K=4)),    # each tile's own partials and ticket
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,cfg", CONFIGS)
def test_split_k_gemvs_equal_the_torch_ops(dtype, m, cfg):
    """The split-K kernel (the last split of a tile sums the partials) with each prologue and epilogue, an odd N
    and K (no multiple of any block), and its tickets back at zero after each call (a graph replays them)."""
    k, n = 200, 37
    x, carry, norm = rand(m, k, dtype=dtype), rand(m, k, dtype=dtype), rand(k, dtype=dtype)
    w, bias, res = rand(n, k, dtype=dtype, scale=0.1), rand(n, dtype=dtype), rand(m, n, dtype=dtype)
    x_new = torch.empty_like(x)
    got = K._launch_gemv(x, w, carry=carry, x_out=x_new, norm=norm, bias=bias, eps=1e-6, config=cfg)
    close(got, F.linear(_norm(x + carry, norm, 1e-6), w, bias), dtype)
    close(x_new, x + carry, dtype)
    close(K._launch_gemv(x, w, residual=res, config=cfg), res + F.linear(x, w), dtype)
    gate_up = rand(m, 2 * k, dtype=dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    close(K._launch_gemv(gate_up, w, silu=True, config=cfg), F.linear(F.silu(gate) * up, w), dtype)
    if cfg["SPLIT_K"] > 1:
        assert K._SCRATCH and all(int(count.sum()) == 0 for _, count in K._SCRATCH.values())
    with pytest.raises(ValueError, match="SPLIT_K=0"):
        K._launch_gemv(x, w, config={**cfg, "SPLIT_K": 0})


def test_split_k_scratch_grows_and_smaller_calls_stay_correct():
    """A call past the scratch's first size (N = 1100 at SPLIT_K=4, BLOCK_M=16: more than 1 << 16 partials) grows it,
    the old scratch kept; a smaller call after it still equals torch's product, its tickets back at zero."""
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, DOT=True, SPLIT_K=4)
    x, w = rand(16, 64, dtype=torch.float32), rand(1100, 64, dtype=torch.float32, scale=0.1)
    before = K._SCRATCH.get(x.device, (None, None))[0]
    close(K._launch_gemv(x, w, config=cfg), F.linear(x, w), torch.float32)
    part = K._SCRATCH[x.device][0]
    assert part.numel() >= 4 * 16 * 1100 > 1 << 16
    if before is not None and before.numel() < 4 * 16 * 1100:       # grown: the old one kept for captured graphs
        assert part is not before and any(t is before for t in K._OUTGROWN)
    small = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, DOT=True, SPLIT_K=4)
    xs, ws = rand(5, 64, dtype=torch.float32), rand(37, 64, dtype=torch.float32, scale=0.1)
    close(K._launch_gemv(xs, ws, config=small), F.linear(xs, ws), torch.float32)
    assert K._SCRATCH[x.device][0] is part and int(K._SCRATCH[x.device][1].sum()) == 0


def test_split_k_scratch_is_one_per_device_and_never_first_allocated_in_a_capture(monkeypatch):
    """Keyed by device only (a capture stream and a warm-up stream share it); inside a CUDA-graph capture a scratch
    that would have to grow is refused with what to do (on a CPU device nothing captures)."""
    part, count = K._split_scratch(DEV, 10, 10)
    assert K._split_scratch(DEV, 10, 10) == (part, count) and list(K._SCRATCH).count(DEV) == 1
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setitem(K._SCRATCH, cuda, (part, count))               # held: no allocation, no refusal
    assert K._split_scratch(cuda, 10, 10) == (part, count)
    with pytest.raises(RuntimeError, match="inside a CUDA-graph capture; run the same forward once before"):
        K._split_scratch(cuda, part.numel() + 1, 10)


@pytest.mark.parametrize("m", [1, 3, 16, 32])
def test_gemv_rule_outside_the_table(m, monkeypatch, gpu_named):
    """Shapes not in the table, or any shape on a device the table was not measured on, take the rule's
    configuration (tl.sum up to 4 rows; tl.dot tiles with K split above), which computes what torch computes."""
    monkeypatch.setattr(K, "INTERPRET", False)
    cfg = K.gemv_config(m, 2000, 2048, torch.device("cpu"))
    assert cfg["DOT"] == (m > 4) and cfg["BLOCK_M"] >= m and cfg["SPLIT_K"] >= 1
    if m == 16:         # 63 tiles of 32 outputs on the 4 'SMs' of a CPU device: no split
        assert cfg["SPLIT_K"] == 1 and cfg["BLOCK_N"] == 32
        assert K.gemv_config(m, 2048, 2048, torch.device("cpu")) == GT.gemv_rule(m, 2048, 2048, 4)  # not an H200
        gpu_named(GT.GEMV_TABLE_DEVICE)
        assert K.gemv_config(m, 2048, 2048, H200) == GT.GEMV_TABLE[(16, 2048, 2048)][0]
    rule = K.gemv_config(m, 44, 1024, torch.device("cpu"))
    if m > 4:           # 2 tiles on 4 'SMs': K split in 4
        assert rule["SPLIT_K"] == 4
    monkeypatch.undo()
    x, w = rand(m, 1024, dtype=torch.float32), rand(44, 1024, dtype=torch.float32, scale=0.1)
    close(K._launch_gemv(x, w, config=rule), F.linear(x, w), torch.float32)

"""Bigger targets without a GPU: the shapes' sizes against the model cards, random fused weights through the
fast decoder, the batch inputs of the benchmark, and the readers of its results (sdeth.study.predict.hetero)."""
import json

import pytest
import torch

from sdeth.models import presets
from sdeth.runtime.engine import Engine
from sdeth.runtime.fastmodel import FastOptionsError, linear, quantize
from sdeth.runtime.randomweights import fused_random
from sdeth.study.bench import targets as bigtargets
from sdeth.study.predict import hetero


@pytest.mark.parametrize("name", sorted(presets.PUBLIC_PARAMS))
def test_shapes_have_the_model_cards_parameter_counts(name):
    # the cards round to two or three figures (Qwen3-1.7B: 1.72e9 from its config)
    assert presets.shape_params(name) == pytest.approx(presets.PUBLIC_PARAMS[name], rel=0.015)


def test_unknown_shape_names_the_known_ones():
    with pytest.raises(presets.ModelError, match="Qwen2.5-72B"):
        presets.shape("Qwen3-70B")


def test_fused_random_model_decodes_through_the_engine_and_rows_equal_chains():
    m = fused_random("tiny-4L", "cpu", "bf16")
    assert m.weight_bytes() == pytest.approx(2 * presets.shape_params("tiny-4L"), rel=0.01)
    eng = Engine(m, impl="fast", scratch=8, capacity=64)
    eng.start(64)
    ids = list(range(1, 21))
    eng.forward(ids[:20])
    rows_in = bigtargets.batch_inputs(eng, rows=2, width=3, context=20)
    rows = eng.forward_rows(*rows_in)                                  # [6, V]: two rows of three tokens
    assert rows.shape == (6, 1000) and torch.isfinite(rows).all()
    chain = eng.forward(rows_in[0][:3].tolist())                       # row 0 decoded as the chain
    assert torch.allclose(rows[:3], chain, atol=2e-2, rtol=2e-2)


def test_batch_rows_see_the_prefix_and_their_own_earlier_tokens_only():
    eng = Engine(fused_random("tiny-2L", "cpu", "bf16"), impl="fast", scratch=8, capacity=32)
    eng.start(32)
    ids, pos, slots, vis = bigtargets.batch_inputs(eng, rows=2, width=2, context=10)
    assert pos.tolist() == [10, 11, 10, 11] and slots.tolist() == [32, 33, 34, 35]
    assert vis[:, :10].all() and not vis[:, 10:32].any()
    assert vis[1, 32:36].tolist() == [True, True, False, False]       # row 0, token 1: itself and token 0
    assert vis[2, 32:36].tolist() == [False, False, True, False]      # row 1, token 0: itself only


def test_fused_weights_refuse_levers_and_fp8_off_the_gpu():
    m = fused_random("tiny-2L", "cpu", "bf16")
    with pytest.raises(FastOptionsError, match="already bf16"):
        Engine(m, impl="fast", fast="weights=int8").start(16)
    with pytest.raises(ValueError, match="CUDA"):
        fused_random("tiny-2L", "cpu", "fp8")
    with pytest.raises(ValueError, match="fp4"):
        fused_random("tiny-2L", "cpu", "fp4")


def test_weight_only_fp8_on_the_cpu_is_the_dequantized_product():
    w, x = torch.randn(48, 32) * 0.02, torch.randn(3, 32)
    kind, q, s = quantize(w.bfloat16(), "fp8w")
    want = x @ (q.float() * s[:, None]).t()
    got = linear(x.bfloat16(), (kind, q, s)).float()
    assert float((got - want).norm() / want.norm()) < 1e-2


def _run(call, step72, step32):
    """A results file as bigtargets.run_call writes it (the fields the readers use)."""
    def target(model, weights, step, wbytes):
        return {"model": model, "weights": weights, "step_ms": step, "bytes_floor_ms": wbytes / 4.2e9,
                "step_over_floor": round(step / (wbytes / 4.2e9), 3), "weight_bytes": wbytes, "kernels": {"kernels_per_step": 9},
                "points": [{"B": 1, "k": 3, "path": "chain", "forward_ms": step * 1.1, "replay_ms": step * 1.05},
                           {"B": 16, "k": 8, "path": "rows", "forward_ms": step * 2}]}
    sd = {"target": "Qwen2.5-72B", "target_weights": "fp8", "draft": "Qwen3-1.7B", "acceptance": "synthetic",
          "speedup": 1.8, "speedup_ci95": [1.7, 1.9], "predicted_speedup": 1.8, "alpha": 0.71, "target_only_tokens_per_s": 27.0}
    return {"call": call, "created": "2026-12-01T20:00:00+0000", "hardware": {"gpu": "NVIDIA H200"},
            "targets": [target("Qwen2.5-72B", "fp8", step72, 71.5e9), target("Qwen3-32B", "bf16", step32, 64.0e9),
                        {"model": "Qwen3-14B", "error": "OutOfMemoryError"}],
            "sd": [sd, {"target": "Qwen3-32B", "draft": "Qwen3-1.7B", "skipped": "out of time"}]}


def test_readers_put_measured_steps_beside_the_model_and_check_the_70b_claim(tmp_path):
    for i, (a, b) in enumerate([(34.0, 18.3), (33.8, 18.2)], 1):
        (tmp_path / f"bench_targets_{i}.json").write_text(json.dumps(_run(i, a, b)))
    runs = hetero.load_targets(str(tmp_path / "bench_targets_*.json"))
    rows = hetero.target_rows(runs)
    assert [(r["target"], r["call"]) for r in rows] == [("Qwen2.5-72B", 1), ("Qwen3-32B", 1), ("Qwen2.5-72B", 2),
                                                        ("Qwen3-32B", 2)]                  # the failed 14B left out
    r32 = rows[1]
    assert r32["verify k=3 ms"] == pytest.approx(18.3 * 1.05) and r32["t(16) ms"] is None
    assert r32["measured / modelled"] == pytest.approx(18.3 / hetero.modelled_step_s("Qwen3-32B", 64.0e9) / 1e3, rel=1e-3)
    t = hetero.targets_with_measured(runs, 5.19e-3)
    assert t["Qwen3-32B on H200"] == {"step_s": pytest.approx(18.25e-3), "kind": "measured",
                                      "how": "sdeth.study.bench.targets, random bf16 weights, median of 2 calls"}
    assert t["70B-class on 2x H200"]["kind"] == "modelled" and "Qwen3-14B on H200" not in t
    claim = hetero.check_70b_claim(runs, 0.71, 0.2e-3, 1.96e-3)
    kinds = [r["step kind"] for r in claim["rows"]]
    assert kinds[0] == "modelled" and kinds[1].startswith("modelled-from-measured") and kinds[2] == "measured"
    assert claim["rows"][2]["step ms"] == pytest.approx(33.9)
    assert "1.80x [1.70, 1.90] (call 1)" in claim["text"] and len(hetero.sd_rows(runs)) == 2


def test_no_results_says_how_to_make_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="sdeth bench targets"):
        hetero.load_targets(str(tmp_path / "none_*.json"))

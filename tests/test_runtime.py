"""The runtime on the real embedded pair (CPU): losslessness, rollback, results JSON."""
import json

import pytest
import torch

from sdeth.study.runs import experiment
from sdeth.runtime.engine import CacheFull, Engine, prefill
from sdeth.study.runs.experiment import ConfigError, RunConfig
from conftest import REF

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("k", [1, 5])             # k=3: over the link (test_ethernet) and in the CLI test
def test_greedy_sd_is_identical_to_target_only(pair, target_only_ref, k):
    sd = experiment.run(RunConfig(mode="sd", k=k, **REF), pair, progress=False)
    for a, b in zip(target_only_ref["requests"], sd["requests"]):
        assert a["prompt_id"] == b["prompt_id"]
        assert a["output_ids"] == b["output_ids"], a["prompt_id"]
    s = sd["summary"]
    assert s["draft_acceptance_rate"] > 0.05      # the draft is doing something
    assert len(s["per_position_acceptance"]) == k


def test_rollback_then_reforward_gives_the_same_logits(pair):
    eng = Engine(pair.target)
    eng.start(64)
    ids = list(range(200, 220))
    prefill(eng, ids[:10])
    ref = eng.forward(ids[10:15]).clone()
    eng.forward([1, 2, 3])           # rejected speculation
    eng.rollback(10)
    assert torch.allclose(eng.forward(ids[10:15]), ref, atol=1e-5)
    with pytest.raises(CacheFull):
        eng.forward(list(range(60)))


def test_prompt_longer_than_cache_is_refused(pair):
    with pytest.raises(ConfigError, match="max_len"):
        experiment.run(RunConfig(prompts="sharegpt:4", max_len=16), pair, progress=False)


def test_cli_run_writes_results_json_and_prediction_is_close(tmp_path):
    from sdeth.cli import main
    out = tmp_path / "out.json"
    assert main(["run", "--pair", "embedded", "--mode", "sd", "--k", "3", "--prompts", "sharegpt:8",
                 "--max-tokens", "48", "--json", str(out)]) == 0
    def strict(c):
        raise AssertionError(f"results JSON holds {c}, which is not JSON")
    res = json.loads(out.read_text(), parse_constant=strict)
    assert {"config", "hardware", "requests", "summary"} <= res.keys()
    r = res["requests"][0]
    assert {"prompt_id", "output_ids", "ttft_ms", "tpot_ms", "e2e_s", "drafts", "draft_tokens",
            "accepted_tokens"} <= r.keys()
    s = res["summary"]
    for key in ("tokens_per_s", "tpot_ms", "ttft_ms", "e2e_s", "draft_acceptance_rate", "mean_acceptance_length",
                "per_position_acceptance", "alpha", "predicted_tokens_per_s"):
        assert s[key] is not None, key
    assert abs(s["predicted_tokens_per_s"] / s["tokens_per_s"] - 1) < 0.2


@pytest.mark.parametrize("args,msg", [(["--k", "0"], "k=0"), (["--temperature", "-1"], "temperature -1"),
                                      (["--prompts", "nope:3"], "unknown prompt set")])
def test_cli_bad_input_exits_2_with_message(capsys, args, msg):
    from sdeth.cli import main
    assert main(["run", *args]) == 2
    assert msg in capsys.readouterr().err


def test_draft_classes_fulfil_their_roles():
    """The contracts of sdeth.runtime.roles: each draft class against the role its loop needs."""
    from doubles import LocalStream
    from sdeth.runtime.loop import Drafter
    from sdeth.runtime.roles import DraftSource, DraftStream
    from sdeth.wire.draft_handles import ServerDraft, ServerStream
    from sdeth.wire.target_worker import _NoDraft
    for cls in (Drafter, ServerDraft, _NoDraft):
        assert all(hasattr(cls, m) for m in ("start", "propose", "compute_s")), cls
    for cls in (ServerStream, LocalStream):
        assert all(hasattr(cls, m) for m in ("start", "commit", "poll", "wait", "end", "compute_s", "streamed")), cls
    assert not isinstance(object(), DraftSource) and not isinstance(object(), DraftStream)

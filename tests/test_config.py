"""The run configuration: each small language a typed value with its own error, the whole configuration
serialized for a worker and read back, and the summary's named steps, each alone. No models."""
import json

import pytest

from sdeth.cli import main
from sdeth.cli.worker import worker_config, worker_parser
from sdeth.models.prompts import PromptError
from sdeth.runtime import EngineConfig
from sdeth.runtime.emulated import Emulation
from sdeth.runtime.verdictcache import VERDICT_DEFAULT, VerdictSpec
from sdeth.study import summary
from sdeth.study.config import ConfigError, PromptSpec, RunConfig, parse_rtts


def test_each_small_language_parses_to_a_typed_value():
    assert VerdictSpec.parse("2x4") == VerdictSpec(2, 4, 4) and VerdictSpec.parse("off") == VerdictSpec()
    assert VerdictSpec.parse("on") == VerdictSpec.parse(VERDICT_DEFAULT) and not VerdictSpec.parse("0").on
    assert PromptSpec.parse("sharegpt:8") == PromptSpec("sharegpt", 8, 0)
    assert PromptSpec.parse("random:16:512:3") == PromptSpec("random", 16, 3, 512)
    assert str(PromptSpec.parse("random:16:512")) == "random:16:512:0"
    assert Emulation.parse("corsair:Qwen3-1.7B:fp8").bytes_per_param == 1.0
    assert parse_rtts("0, 0.2,5") == [0.0, 0.2, 5.0]


@pytest.mark.parametrize("parse, bad, error, says", [
    (VerdictSpec.parse, "2x", ValueError, "FANOUT"), (VerdictSpec.parse, "0x4", ValueError, "each >= 1"),
    (PromptSpec.parse, "random:16", PromptError, "random:N:LEN"), (PromptSpec.parse, "wiki:3", PromptError, "sharegpt"),
    (Emulation.parse, "corsair", ValueError, "PROFILE:SHAPE"), (Emulation.parse, "a:b:int4", ValueError, "bf16 or fp8"),
    (parse_rtts, "1,x", ConfigError, "in ms"), (parse_rtts, "-1", ConfigError, ">= 0")])
def test_each_small_language_names_the_bad_value(parse, bad, error, says):
    with pytest.raises(error, match=says) as e:
        parse(bad)
    assert repr(bad) in str(e.value)


def test_the_configuration_checks_its_values_once():
    with pytest.raises(ConfigError, match="'2x'"):
        RunConfig(mode="pipelined", placement="ethernet", impl="fast", cache="2x").check()
    with pytest.raises(ConfigError, match="draft emulation"):
        RunConfig(draft_emulate="corsair").check()
    with pytest.raises(ConfigError, match="draft_fast"):
        RunConfig(impl="fast", draft_fast="scope=nowhere").check()
    c = RunConfig(mode="pipelined", placement="ethernet", impl="fast", cache="on", prompts="random:2:8").check()
    assert c.cache_spec == VerdictSpec.parse(VERDICT_DEFAULT) and c.prompt_spec.length == 8 and c.emulation is None


def test_the_branch_cache_a_pipelined_request_asks_for():
    """Generate.cache: 'auto' (the target asks wherever the server drafts branches), 'on' for on or any shape
    (the server's --verdict-cache sets the shape), 'off'; sync SD has no stream. Branches need the fast decoder."""
    with pytest.raises(ConfigError, match="impl 'fast'"):
        RunConfig(mode="pipelined", placement="ethernet", cache="2x4").check()
    assert RunConfig(mode="pipelined", placement="ethernet", impl="fast").branch_cache() == "auto"
    assert RunConfig(mode="pipelined", placement="ethernet", impl="fast", cache="on").check().branch_cache() == "on"
    assert RunConfig(mode="pipelined", placement="ethernet", impl="fast", cache="2x4").branch_cache() == "on"
    assert RunConfig(mode="pipelined", placement="ethernet", cache="off").branch_cache() == "off"
    assert RunConfig(mode="sd", impl="fast", cache="on").branch_cache() == "off"


def test_a_worker_gets_the_configuration_whole(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    c = RunConfig(pair="random-tiny", device="cpu", draft_device="cuda:1", impl="fast", capacity=256,
                  synthetic_alpha=0.6, synthetic_trace=str(trace), draft_fast="weights=fp8")
    sent = c.worker_config()
    assert sent["synthetic_trace"] == str(trace.resolve()) and RunConfig.from_dict(sent) == c
    a = worker_parser().parse_args(["--role", "draft", "--bind", "tcp://127.0.0.1:1", "--config", json.dumps(sent)])
    got = worker_config(a)
    assert got == c and got.engine_config() == EngineConfig(impl="fast", capacity=256, synthetic_alpha=0.6,
                                                             synthetic_trace=str(trace), draft_fast="weights=fp8")
    by_hand = worker_config(worker_parser().parse_args(
        ["--role", "target", "--bind", "tcp://127.0.0.1:1", "--pair", "random-tiny", "--device", "cpu"]))
    assert (by_hand.pair, by_hand.device, by_hand.impl) == ("random-tiny", "cpu", "hf")
    with pytest.raises(ConfigError, match="unknown field"):
        RunConfig.from_dict({**sent, "k_max": 8})
    assert main(["worker", "--role", "draft", "--bind", "tcp://127.0.0.1:1", "--config", "{no json"]) == 2


def test_a_renamed_flag_keeps_working_one_release_and_names_the_new_one(capsys):
    """--rows (cache rows) is --kv-rows now, on the draft server and on `bench step`: the old name sets the same
    value and says the new name; the new name says nothing."""
    from sdeth.cli.parser import build_parser
    old = worker_parser().parse_args(["--role", "draft-server", "--bind", "tcp://127.0.0.1:1", "--rows", "6"])
    assert old.kv_rows == 6 and "--rows is now --kv-rows" in capsys.readouterr().err
    new = worker_parser().parse_args(["--role", "draft-server", "--bind", "tcp://127.0.0.1:1", "--kv-rows", "7"])
    assert new.kv_rows == 7 and capsys.readouterr().err == ""
    assert worker_parser().parse_args(["--role", "draft-server", "--bind", "tcp://127.0.0.1:1"]).kv_rows == 32
    bench = build_parser().parse_args(["bench", "step", "--json", "x.json", "--rows", "8"])
    assert bench.kv_rows == 8 and "--rows is now --kv-rows" in capsys.readouterr().err
    assert build_parser().parse_args(["bench", "step", "--json", "x.json"]).kv_rows == 16


def _req(**kw):
    r = {"output_ids": [1, 2, 3, 4, 5], "e2e_s": 1.0, "ttft_ms": 200.0, "tpot_ms": 200.0, "verify_s": 0.5,
         "wire_s": 0.1, "draft_s": 0.2, "draft_prefill_s": 0.05, "drafts": 2, "draft_tokens": 6,
         "accepted_tokens": 3, "accepted_per_pos": [2, 1, 0], "rounds": 2, "verify_widths": {"4": [2, 0.5]},
         "bytes_sent": 100, "bytes_received": 60}
    return {**r, **kw}


def test_summary_steps_each_alone():
    reqs = [_req(), _req(e2e_s=2.0)]
    t = summary.Seconds.of(reqs)
    assert t.decode == pytest.approx(0.8 + 1.8) and t.prefill == pytest.approx(0.4)
    assert t.draft_total == pytest.approx(0.5) and summary.rounds(reqs) == 4
    assert summary.rounds([_req(k_trace=[3, 3, 1])]) == 3          # a varying k: one round per entry
    sync = summary.time_breakdown(t, "sd")["time_breakdown_s"]
    assert sync["other"] == pytest.approx(t.decode - 0.5 - 1.0 - 0.2) and "draft_compute_overlapped_s" not in sync
    piped = summary.time_breakdown(t, "pipelined")
    assert "wait for drafts" in piped["time_breakdown_s"] and piped["draft_compute_overlapped_s"] == pytest.approx(0.5)
    cfg = RunConfig(mode="sd", k=3, placement="ethernet")
    c, rate, figures = summary.sync_model(reqs, cfg, t, 0.5, [])
    assert c.draft_step == pytest.approx(0.4 / 12) and c.rtt == pytest.approx(0.2 / 4) and rate > 0
    assert figures["wire_ms_per_round"] == pytest.approx(50.0) and "link_ms_per_round" in figures
    head = summary.timing_and_acceptance(reqs, cfg)
    assert head["mode"] == "sd" and head["k"] == 3 and head["draft_acceptance_rate"] == pytest.approx(0.5)
    comp = summary.components(reqs, cfg, t)
    assert comp["bytes_per_round"] == pytest.approx(80.0)
    assert comp["components_ms_per_round"]["wire"] == pytest.approx(50.0)


def test_summary_cache_step_reports_the_commonest_choice():
    cfg = RunConfig(mode="pipelined", placement="ethernet", impl="fast", cache="auto")
    off = summary.cache_model([_req(cache="off")], cfg)
    assert "cache" not in off and off["cache_auto"] == {"off": 1}
    reqs = [_req(cache="ahead", stream_restarts=4, cache_hits=1, alt_judged=10, alt_among=4)] * 2 + [_req(cache="off")]
    ahead = summary.cache_model(reqs, cfg)
    assert ahead["cache"] == "ahead" and ahead["cache_hit_rate"] == pytest.approx(0.25)
    assert ahead["corrections_among_next_choices"] == pytest.approx(0.4)
    assert "not modelled" in ahead["cache_model"] and ahead["cache_auto"] == {"ahead": 2, "off": 1}
    asked = RunConfig(mode="pipelined", placement="ethernet", impl="fast", cache="on")
    why = "off: the draft server runs no verdict cache (start it with --verdict-cache on)"
    got = summary.cache_model([_req(cache="off", cache_choice=why, stream_restarts=4)] * 2, asked)
    assert got["cache"] == "off" and got["cache_choice"] == why      # asked, none drafted: no model


def test_the_run_configuration_and_the_command_lines_parser_import_no_torch():
    """The reaper (a CronJob with a 512 MiB limit) and `--help` parse the command line, whose defaults are
    RunConfig's: neither may pull in torch (221 MiB and 1.4 s when it did); nor may the wire's messages (plain data,
    whose stream window comes from runtime.settings)."""
    import subprocess
    import sys
    code = ("import sys; from sdeth.cli.parser import build_parser; build_parser(); import sdeth.study.config; "
            "import sdeth.wire.protocol; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout[:500]

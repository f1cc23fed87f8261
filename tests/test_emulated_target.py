"""The emulated target (sdeth.runtime.emulated.EmulatedTarget): no model, the synthetic target's answers at the
forward times measured on other hardware. Its pace (counted: forwards that fit in a window), its outputs (the
synthetic target's, so greedy SD with any draft equals target-only), and `bench sd --emulate-target` end to end."""
import json
import time
from pathlib import Path

import pytest
import torch

from sdeth.runtime.emulated import EmulatedTarget, TargetTimes, emulated_target
from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
from sdeth.runtime.pipeline import generate_pipelined
from sdeth.runtime.synthetic import SyntheticEngine
from sdeth.runtime.verify import Sampling
from sdeth.study.config import ConfigError, RunConfig

from doubles import LocalStream, tiny_qwen3

MEASURED = Path(__file__).resolve().parents[1] / "reports" / "gpu" / "bench_streams_2.json"


def times_file(tmp_path, step_ms: float, verify_ms: float, widths: int = 9) -> Path:
    """A results JSON in bench streams' shape: t(1) = step_ms, t_v(1, k) = verify_ms for k = 1..widths-1."""
    points = [{"B": 1, "k": None, "width": 1, "wall_ms": step_ms + 0.1, "replay_ms": step_ms}]
    points += [{"B": 1, "k": k, "width": k + 1, "wall_ms": verify_ms + 0.1, "replay_ms": verify_ms}
               for k in range(1, widths)]
    points += [{"B": 2, "k": None, "width": 1, "wall_ms": 99.0, "replay_ms": 99.0}]     # another batch: not read
    path = tmp_path / "times.json"
    path.write_text(json.dumps({"created": "2026-12-02T00:00:00Z", "hardware": {"label": "Test GPU"},
                                "target": {"model": "Qwen3-8B", "context": 512, "points": points}}))
    return path


def test_measured_times_are_read_and_bad_specs_say_what_to_give(tmp_path):
    t = TargetTimes.parse(f"{MEASURED}:Qwen3-8B")
    assert (t.model, t.hardware, t.field, t.max_width) == ("Qwen3-8B", "NVIDIA H200", "replay_ms", 9)
    assert t.forward_s(1) == pytest.approx(5.0476e-3) and t.forward_s(4) == pytest.approx(5.4931e-3)
    assert t.prefill_s(512) == pytest.approx(512 * 0.066e-3) and t.prefill_s(8) == pytest.approx(t.forward_s(9))
    assert t.label == f"emulated target (measured verify times from {MEASURED}, NVIDIA H200)"
    with pytest.raises(ValueError, match="use k <= 8"):
        t.forward_s(10)
    with pytest.raises(ValueError, match="measured 'Qwen3-8B', not 'Qwen3-14B'"):
        TargetTimes.parse(f"{MEASURED}:Qwen3-14B")
    with pytest.raises(ValueError, match="no such file"):
        TargetTimes.parse(str(tmp_path / "none.json"))
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ValueError, match="no target.points at B = 1"):
        TargetTimes.parse(str(tmp_path / "empty.json"))


def test_describe_says_what_the_paced_times_leave_out(tmp_path):
    """Replay times: device time only, the file's own wall - replay gap named; an explicit host-argmax field."""
    t = TargetTimes.parse(str(times_file(tmp_path, 4.0, 5.0)))
    d = t.describe()
    assert d["time_field"] == "replay_ms" and d["wall_minus_replay_ms"] == (0.1, 0.1)
    assert "leaves out the launch and the logits' copy" in d["time_note"] and "0.1-0.1 ms" in d["time_note"]
    assert d["host_argmax_subtracted"] is True and "before the measured" in d["host"]   # old readers' test too
    measured = TargetTimes.parse(str(MEASURED)).describe()
    assert 0.09 <= measured["wall_minus_replay_ms"][0] <= measured["wall_minus_replay_ms"][1] <= 0.14


def test_it_sets_every_field_an_engine_sets(tmp_path):
    """EmulatedTarget skips Engine.__init__: every field a real Engine sets is set (but the two only Engine's own
    forwards read), so the loops and the worker find what they read."""
    from sdeth.runtime.engine import Engine
    real = set(vars(Engine(tiny_qwen3(0), "target")))
    emu = set(vars(emulated_target(str(times_file(tmp_path, 1.0, 1.5)), vocab=300)))
    assert real - emu == {"fast", "_fixed"}, real - emu


def test_make_engine_says_when_an_emulated_target_has_no_vocabulary(tmp_path):
    from sdeth.runtime import EngineConfig, make_engine
    cfg = EngineConfig(target_emulate=str(times_file(tmp_path, 1.0, 1.5)), synthetic_alpha=0.7)
    with pytest.raises(ValueError, match="needs the pair's vocabulary size; pass vocab="):
        make_engine(None, "target", "target", cfg)
    assert make_engine(None, "target", "target", cfg, vocab=300).vocab_size == 300


def test_the_run_configuration_checks_an_emulated_target(tmp_path, monkeypatch):
    spec = f"{times_file(tmp_path, 4.0, 5.0, widths=5)}:Qwen3-8B"
    ok = RunConfig(pair="random-tiny", synthetic_alpha=0.7, k=4, target_emulate=spec).check()
    assert ok.engine_config().target_emulate == spec and ok.target_emulation.max_width == 5
    with pytest.raises(ConfigError, match="synthetic_alpha"):              # real acceptance: nothing to answer with
        RunConfig(pair="random-tiny", target_emulate=spec).check()
    with pytest.raises(ConfigError, match="use k <= 4"):
        RunConfig(pair="random-tiny", synthetic_alpha=0.7, k=5, target_emulate=spec).check()
    gaps = json.loads(Path(spec.rsplit(":", 1)[0]).read_text())        # widths 1, 2, 3, 5: none measured at 4
    gaps["target"]["points"] = [p for p in gaps["target"]["points"] if p["width"] != 4]
    (tmp_path / "gaps.json").write_text(json.dumps(gaps))
    with pytest.raises(ConfigError, match=r"widths \[1, 2, 3, 5\], none at \[4\]; use k <= 2"):
        RunConfig(pair="random-tiny", synthetic_alpha=0.7, k=4, target_emulate=str(tmp_path / "gaps.json")).check()
    assert RunConfig(pair="random-tiny", synthetic_alpha=0.7, k=2, target_emulate=str(tmp_path / "gaps.json")).check()
    with pytest.raises(ConfigError, match="temperature 0"):
        RunConfig(pair="random-tiny", synthetic_alpha=0.7, temperature=0.7, target_emulate=spec).check()
    with pytest.raises(ConfigError, match="no such file"):
        RunConfig(pair="random-tiny", synthetic_alpha=0.7, target_emulate="nowhere.json").check()
    monkeypatch.chdir(MEASURED.parents[2])
    rel = RunConfig(pair="random-tiny", synthetic_alpha=0.7, target_emulate="reports/gpu/bench_streams_2.json:Qwen3-8B")
    # a worker may start elsewhere: it gets the file's absolute path, the model kept
    assert rel.worker_config()["target_emulate"] == f"{MEASURED}:Qwen3-8B"


def count_forwards(eng: EmulatedTarget, width: int, window_s: float) -> int:
    """How many forwards of `width` tokens, each followed by its greedy verdict on the host, fit in window_s (each
    rolled back)."""
    from sdeth.runtime.verify import verdict_greedy
    n, t_end = 0, time.perf_counter() + window_s
    while time.perf_counter() < t_end:
        verdict_greedy(torch.zeros(width - 1, dtype=torch.long), eng.forward([1] * width)).tolist()
        eng.rollback(eng.pos - width)
        n += 1
    return n


def test_a_forward_of_m_tokens_takes_the_measured_time_of_m(tmp_path):
    """Counted, not timed one by one: a forward and its verdict never return early (the forward returns by the
    verdict's calibrated host time before t(m)), so no more than window/t(m) + 1 fit; a loaded host
    wakes the pacing late now and then, so at least 40% as many (the widths' times differ threefold, so the counts
    tell them apart)."""
    eng = emulated_target(str(times_file(tmp_path, 10.0, 30.0)), vocab=1000)
    eng.start(4096)
    t0 = time.perf_counter()
    eng.forward(list(range(100)))                                 # the prefill: max(100 x 0.066, 30) ms
    assert time.perf_counter() - t0 >= 0.030
    window = 0.6
    for width, ms in ((1, 10.0), (4, 30.0), (9, 30.0)):
        eng.forward_s = 0.0
        n = count_forwards(eng, width, window)
        assert window / (ms / 1e3) * 0.4 <= n <= window / (ms / 1e3) + 1, (width, n)
        assert eng.forward_s >= n * (ms / 1e3 - eng.host_s[width])   # the clock counts the paced time
    assert all(0 < eng.host_s[m] < 0.005 for m in (1, 4, 9))       # the host's argmax over 1,000 columns
    with pytest.raises(ValueError, match="no measured time for a forward of 10 tokens"):
        eng.forward([1] * 10)


def test_its_answers_are_the_synthetic_targets(tmp_path):
    """Row for row the same argmax as the synthetic target over a real model; then greedy SD (sync and pipelined)
    with a synthetic draft decodes exactly target-only's tokens, with drafts both accepted and rejected."""
    spec, seed, vocab = str(times_file(tmp_path, 1.0, 1.5)), 3, 300
    emu = emulated_target(spec, vocab, seed)
    target_model, draft_model = tiny_qwen3(0), tiny_qwen3(1)
    syn = SyntheticEngine(target_model, "target", role="target", alpha=0.6, seed=seed)
    prompt = list(range(5, 17))
    for e in (emu, syn):
        e.start(64)
    assert emu.forward(prompt)[-1].argmax() == syn.forward(prompt)[-1].argmax()
    for width, back in ((1, 0), (4, 2), (3, 0), (2, 1)):
        ids = list(range(20, 20 + width))
        assert torch.equal(emu.forward(ids).argmax(-1), syn.forward(ids).argmax(-1))
        emu.rollback(emu.pos - back), syn.rollback(syn.pos - back)
    s = Sampling()
    ref = generate_target_only(SyntheticEngine(target_model, role="target", seed=seed), prompt, 24, s, None)
    draft = lambda: SyntheticEngine(draft_model, "draft", role="draft", alpha=0.6, seed=seed)  # noqa: E731
    only = generate_target_only(emulated_target(spec, vocab, seed), prompt, 24, s, None)
    sd = generate_sd(emulated_target(spec, vocab, seed), Drafter(draft(), s), prompt, 24, 3, s, None)
    pipe = generate_pipelined(emulated_target(spec, vocab, seed), LocalStream(draft(), s, seed=1), prompt, 24, 4, s,
                              None)
    assert only.output_ids == sd.output_ids == pipe.output_ids == ref.output_ids and len(ref.output_ids) == 24
    assert sd.accepted_tokens > 0 and sd.rejections > 0 and pipe.accepted_tokens > 0


@pytest.mark.slow
def test_bench_sd_runs_every_link_mode_against_an_emulated_target(tmp_path):
    """target-only, sync and pipelined (under the step policy and at its two corners) over loopback workers, the
    target emulated (a 15 ms step, so that drafting pays beside the tiny CPU draft): identical outputs, speedups
    with intervals, every figure labelled, each pipelined row naming its step policy."""
    from sdeth.cli import main
    spec = f"{times_file(tmp_path, 15.0, 16.0)}:Qwen3-8B"
    out = tmp_path / "b.json"
    assert main(["bench", "sd", "--pair", "random-tiny", "--synthetic-alpha", "0.7", "--device", "cpu",
                 "--draft-device", "", "--impl", "hf", "--compile", "", "--capacity", "256", "--requests", "3",
                 "--context", "16", "--max-tokens", "16", "--k-max", "6",
                 "--modes", "sync,pipelined,pipelined-sync,pipelined-offered",
                 "--emulate-target", spec, "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    label = f"emulated target (measured verify times from {spec.rsplit(':', 1)[0]}, Test GPU)"
    assert res["target_emulation"]["label"] == label and res["config"]["target_emulate"] == spec
    rows = {r["mode"]: r for r in res["rows"]}
    assert list(rows) == ["target-only", "sync", "pipelined", "pipelined-sync", "pipelined-offered"]
    assert [rows[m]["step_policy"] for m in list(rows)[2:]] == ["policy", "sync", "offered"]
    for r in rows.values():
        assert r["identical_to_target_only"] and r["output_tokens"] == 48 and r["label"] == f"{r['mode']}: {label}"
        assert r["speedup_ci95"][0] <= r["speedup"] <= r["speedup_ci95"][1] and r["predicted_speedup"] is not None
    assert rows["sync"]["alpha"] > 0.3 and rows["pipelined"]["alpha"] > 0.3        # the pipelined target verified drafts
    # the target-only decode ran at the emulated step: ~15 ms a token (a loaded host adds to it, never less)
    assert 15e-3 <= res["runs"]["target-only"]["summary"]["costs"]["target_step"]
    te = res["target_emulation"]
    assert te["host_argmax_subtracted"] is True and set(te["host_argmax_ms_bench_process"]) == {str(m) for m in
                                                                                              range(1, 10)}

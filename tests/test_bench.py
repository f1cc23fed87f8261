"""The mode-comparing benchmark (sdeth.study.bench.modes): intervals, per-request synthetic sequences, and a
small end-to-end run on the CPU with the tiny random pair (timings meaningless there; the shape is not)."""
import pytest

from sdeth import metrics
from sdeth.runtime import synthetic


def test_ratio_ci_brackets_the_point_and_pairs_requests():
    num, den = [100, 120, 80, 110], [1.0, 1.1, 0.9, 1.0]
    p, lo, hi = metrics.ratio_ci(num, den)
    assert lo <= p <= hi and p == pytest.approx(410 / 4.0)
    # the same requests twice as fast: paired, the ratio is exactly 2 with no spread
    p, lo, hi = metrics.ratio_ci(num, [d / 2 for d in den], num, den)
    assert (p, lo, hi) == pytest.approx((2.0, 2.0, 2.0))
    with pytest.raises(ValueError, match="equal, non-empty"):
        metrics.ratio_ci([1], [1, 2])
    # a request that judged no draft (a pipelined run of plain steps) leaves resamples of it out
    p, lo, hi = metrics.ratio_ci([3, 0, 5], [4, 0, 6])
    assert p == pytest.approx(0.8) and 0.75 <= lo <= p <= hi <= 5 / 6 + 1e-9


def test_each_prompt_keys_its_own_synthetic_sequence():
    """Keyed by position alone, every request replayed one coin sequence; now each prompt has its own,
    and the target and the draft (same prompt) agree on it."""
    vocab, alpha = 1000, 0.7

    def heads(prompt):
        seed = synthetic._mix(7 ^ synthetic.prompt_key(prompt))
        return [synthetic.draft_token(seed, p, vocab, alpha) == synthetic.true_token(seed, p, vocab)
                for p in range(2000)]
    a, b = heads([1, 2, 3]), heads([1, 2, 4])
    assert a != b and heads([1, 2, 3]) == a
    assert abs(sum(a) / len(a) - alpha) < 0.04 and abs(sum(b) / len(b) - alpha) < 0.04


@pytest.mark.slow
def test_bench_compares_modes_on_the_same_requests(tmp_path):
    from sdeth.cli import main
    import json
    out = tmp_path / "b.json"
    assert main(["bench", "sd", "--pair", "random-tiny", "--synthetic-alpha", "0.7", "--device", "cpu",
                 "--draft-device", "", "--impl", "hf", "--compile", "", "--capacity", "256", "--requests", "3",
                 "--context", "16", "--max-tokens", "16", "--modes", "colocated,sync,pipelined",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = {r["mode"]: r for r in res["rows"]}
    assert list(rows) == ["target-only", "colocated", "sync", "pipelined"]
    assert res["acceptance"].startswith("synthetic") and res["hardware"]["label"]
    for r in rows.values():
        assert r["identical_to_target_only"] and r["output_tokens"] == 48
        assert r["speedup_ci95"][0] <= r["speedup"] <= r["speedup_ci95"][1]
    assert rows["target-only"]["speedup"] == pytest.approx(1.0)
    assert 0.3 < rows["sync"]["alpha"] < 1.0 and rows["sync"]["alpha_ci95"][0] <= rows["sync"]["alpha"]
    # each request its own prompt: three different prompt ids, seeds 0..2
    assert [q["prompt_id"] for q in res["runs"]["sync"]["requests"]] == ["random/0", "random/1", "random/2"]


def test_the_cached_mode_needs_a_draft_that_can_branch_and_the_default_leaves_it_out():
    """'cached' (branches sent ahead) runs against the batched draft server with its verdict cache, which drafts a
    fast-decoder draft with real acceptance only: asked for on another draft it is refused naming the fix; the
    default --modes leaves it out there (said on stderr), and keeps it where the draft can branch."""
    import pytest
    from sdeth.cli.measure import bench_modes
    from sdeth.cli.parser import BENCH_MODES
    from sdeth.study.bench.modes import branch_draft
    from sdeth.study.config import RunConfig
    real = RunConfig(mode="sd", placement="ethernet", impl="fast")
    synthetic = RunConfig(mode="sd", placement="ethernet", impl="fast", synthetic_alpha=0.7)
    assert branch_draft(real, ("sync", "cached")) == dict(draft_server=True, verdict_cache="on")
    assert branch_draft(synthetic, ("sync", "pipelined")) == {}
    with pytest.raises(ValueError, match="mode 'cached'.*drop 'cached' from --modes"):
        branch_draft(synthetic, ("sync", "cached"))
    assert "cached" not in bench_modes(BENCH_MODES, synthetic).split(",")
    assert bench_modes(BENCH_MODES, real) == BENCH_MODES and bench_modes("sync,cached", synthetic) == "sync,cached"

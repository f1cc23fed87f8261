import pytest

from sdeth import costmodel, metrics


def test_vllm_rate_to_alpha_and_back():
    # the user's numbers: 23.8% at k=5 (Qwen3-0.6B draft) and 40.5% (1.7B)
    a = metrics.alpha_from_rate(0.238, 5)
    assert a == pytest.approx(0.56, abs=0.005)
    assert metrics.rate_from_alpha(a, 5) == pytest.approx(0.238, abs=1e-6)
    assert metrics.alpha_from_rate(0.405, 5) == pytest.approx(0.71, abs=0.01)


def test_rate_falls_with_k_at_fixed_alpha():
    rates = [metrics.rate_from_alpha(0.7, k) for k in range(1, 8)]
    assert rates[0] == pytest.approx(0.7)
    assert all(a > b for a, b in zip(rates, rates[1:]))


@pytest.mark.parametrize("rate,k", [(-0.1, 5), (1.2, 5), (0.3, 0)])
def test_bad_rate_or_k(rate, k):
    with pytest.raises(ValueError):
        metrics.alpha_from_rate(rate, k)


def test_acceptance_summary_matches_vllm_definitions():
    # 10 drafts of k=3: positions accepted 7, 4, 2 times
    s = metrics.vllm_metrics(drafts=10, draft_tokens=30, accepted=13, accepted_per_pos=[7, 4, 2])
    assert s["draft_acceptance_rate"] == pytest.approx(13 / 30)
    assert s["mean_acceptance_length"] == pytest.approx(2.3)
    assert s["per_position_acceptance"] == pytest.approx([0.7, 0.4, 0.2])
    assert metrics.rate_from_alpha(s["alpha"], 3) == pytest.approx(13 / 30, abs=1e-6)
    # the position-based estimate: accepted / positions tried = 13 / (10 + 7 + 4)
    assert metrics.alpha_from_positions([0.7, 0.4, 0.2]) == pytest.approx(13 / 21)


def test_expected_tokens_and_speedup():
    assert costmodel.expected_tokens(0.0, 5) == 1
    assert costmodel.expected_tokens(1.0, 5) == 6
    assert costmodel.expected_tokens(0.5, 2) == pytest.approx(1.75)
    c = costmodel.Costs(target_step=0.010, draft_step=0.001, verify_s={4: 0.011})
    # E(0.8, 3) = 2.952 tokens per 3*1 + 11 = 14 ms round, against 1 token per 10 ms
    assert costmodel.speedup(0.8, 3, c) == pytest.approx(2.952 / 0.014 * 0.010, rel=1e-3)
    assert c.verify(2) == pytest.approx(0.010 + (0.011 - 0.010) / 3)      # interpolated
    assert c.verify(1) == 0.010


def test_best_k_shrinks_when_drafting_is_expensive():
    cheap = costmodel.Costs(target_step=0.010, draft_step=0.0005, verify_s={2: 0.0105, 9: 0.013})
    dear = costmodel.Costs(target_step=0.010, draft_step=0.006, verify_s={2: 0.0105, 9: 0.013})
    assert costmodel.best_k(0.8, cheap)[0] > costmodel.best_k(0.8, dear)[0]
    assert costmodel.best_k(0.8, cheap)[1] > 1 > costmodel.best_k(0.3, dear)[1]


def test_prometheus_spec_counters_are_summed_over_engines():
    from sdeth.study.vllm.baseline import scrape_spec_counters
    page = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 50.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""
    c = scrape_spec_counters(page)
    assert c["vllm:spec_decode_num_drafts"] == 12.0 and c["vllm:spec_decode_num_draft_tokens"] == 50.0
    assert c["vllm:spec_decode_num_accepted_tokens_per_pos"] == [8.0, 4.0]
    assert metrics.alpha_from_rate(c["vllm:spec_decode_num_accepted_tokens"] / c["vllm:spec_decode_num_draft_tokens"], 5) > 0

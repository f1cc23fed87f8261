"""The fast decoder's levers (sdeth.runtime.fastmodel): each computes what it claims, rows equal
separate chains, and SD with a lightened draft stays lossless."""
import pytest
import torch

from sdeth.runtime.engine import Engine
from sdeth.runtime.fastmodel import FastDecoder, FastOptions, FastOptionsError

from doubles import tiny_qwen3 as _tiny


def _run(model, fast, ids, split=9):
    e = Engine(model, impl="fast", fast=fast)
    e.start(64)
    a = e.forward(ids[:split])
    return torch.cat([a, e.forward(ids[split:split + 1]), e.forward(ids[split + 1:split + 5])])


IDS = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(1)).tolist()


def test_options_parse_and_name_the_bad_value():
    o = FastOptions.parse("scope=model, weights=fp8,head=128")
    assert (o.scope, o.weights, o.head) == ("model", "fp8", 128) and str(o) == "scope=model,weights=fp8,head=128"
    assert FastOptions.parse("") == FastOptions() and str(FastOptions()) == "defaults"
    for bad, word in [("weights=fp4", "fp4"), ("colour=red", "colour"), ("head=lots", "lots"), ("scope", "key=value")]:
        with pytest.raises(FastOptionsError, match=word):
            FastOptions.parse(bad)
    with pytest.raises(ValueError, match="impl='fast'"):
        Engine(_tiny(), impl="hf", fast="weights=fp8")


def test_config_keeps_the_targets_numerics():
    from sdeth.study.config import ConfigError, RunConfig
    RunConfig(impl="fast", draft_fast="weights=fp8,head=100", target_fast="scope=model").check()
    with pytest.raises(ConfigError, match="belong to the draft"):
        RunConfig(impl="fast", target_fast="weights=int8").check()
    with pytest.raises(ConfigError, match="needs impl 'fast'"):
        RunConfig(draft_fast="scope=layer").check()


@pytest.mark.parametrize("spec", ["scope=model", "scope=layer"])
def test_exact_levers_compute_the_same_function(spec):
    model = _tiny()
    ref, got = _run(model, "", IDS), _run(model, spec, IDS)
    assert ((ref - got).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("weights,tol", [("fp8", 0.08), ("int8", 0.02)])
def test_lighter_weights_stay_close(weights, tol):
    model = _tiny()
    ref, got = _run(model, "", IDS), _run(model, f"weights={weights}", IDS)
    err = ((ref - got).norm() / ref.norm()).item()
    assert 0 < err < tol, err           # changed (so the lever is on), and close
    net = FastDecoder(model, 16, f"weights={weights}")
    assert net.weight_bytes() < 0.6 * FastDecoder(model, 16).weight_bytes()


def test_pruned_head_keeps_the_ranked_rows_and_zeroes_the_rest(tmp_path):
    import json
    model = _tiny()
    ranked = list(range(299, -1, -3))              # a ranking: 299, 296, ...
    (tmp_path / "rank.json").write_text(json.dumps({"ranked_ids": ranked}))
    ref = _run(model, "", IDS)
    got = _run(model, f"head=50,head_rank={tmp_path / 'rank.json'}", IDS)
    keep = torch.tensor(sorted(ranked[:50]))
    assert torch.allclose(got[:, keep], ref[:, keep], atol=1e-5)
    out = torch.ones(300, dtype=torch.bool)
    out[keep] = False
    assert torch.isinf(got[:, out]).all() and (got[:, out] < 0).all()
    assert torch.softmax(got, -1)[:, out].sum() == 0
    with pytest.raises(FastOptionsError, match="only 100 ids"):
        FastDecoder(model, 16, f"head=200,head_rank={tmp_path / 'rank.json'}")


def test_rows_equal_separate_chains():
    """Three rows branch off a cached prefix at different points, two steps deep, in one forward per
    step: each row's logits equal a chain that decoded that row's tokens alone."""
    model = _tiny()
    prefix, cap, scratch = IDS[:12], 32, 8
    e = Engine(model, impl="fast", scratch=scratch)
    e.start(cap)
    e.forward(prefix)
    branch = [(12, [5, 6]), (10, [7, 8]), (12, [9, 10])]       # (tokens of the prefix kept, the row's tokens)
    got = []
    for d in range(2):
        ids, pos, slots = [], [], []
        vis = torch.zeros(len(branch), cap + scratch, dtype=torch.bool)
        for r, (keep, toks) in enumerate(branch):
            ids.append(toks[d])
            pos.append(keep + d)
            slots.append(cap + 2 * r + d)
            vis[r, :keep] = True
            vis[r, cap + 2 * r:cap + 2 * r + d + 1] = True
        got.append(e.forward_rows(ids, pos, slots, vis))
    assert e.pos == 12                                          # rows leave the chain where it was
    for r, (keep, toks) in enumerate(branch):
        c = Engine(model, impl="fast")
        c.start(cap)
        c.forward(prefix[:keep])
        for d in range(2):
            want = c.forward([toks[d]])[0]
            assert torch.allclose(got[d][r], want, atol=1e-5), (r, d)


def test_sd_with_a_lightened_draft_is_lossless():
    from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
    from sdeth.runtime.verify import Sampling
    target, draft = _tiny(), _tiny()
    torch.manual_seed(5)
    for p in draft.parameters():
        p.data += 0.02 * torch.randn_like(p)
    s = Sampling()
    prompt = list(range(3, 15))
    ref = generate_target_only(Engine(target, impl="fast"), prompt, 40, s, None)
    for spec in ("weights=fp8,head=150", "weights=int8,scope=model"):
        out = generate_sd(Engine(target, impl="fast"), Drafter(Engine(draft, impl="fast", fast=spec), s),
                          prompt, 40, 3, s, None)
        assert out.output_ids == ref.output_ids and out.accepted_tokens > 0, spec


def test_step_benchmark_records_each_lever_on_a_cpu():
    """`bench step` end to end on a tiny shape (no GPU, no compile): every lever row has its step, floor
    and fp32 check, a failing lever is recorded rather than fatal, and the summary reads the runs."""
    from sdeth.study.bench import step as stepbench
    res = stepbench.bench_step(("tiny-4L",), "cpu", context=32, capacity=96, compile_mode="", budget_s=600,
                               progress=lambda r: None, levers=("weights=int8", "head=32768"), profile=False, steps=4)
    rows = {r["lever"]: r for r in res["rows"]}
    assert {"base", "weights=int8", "head=32768"} <= set(rows)
    assert "head=32768" in rows and "1000 output rows" in rows["head=32768"]["error"]
    for lever in ("base", "weights=int8"):
        r = rows[lever]
        assert r["step_ms"] > 0 and r["floor_ms"] > 0 and r["graph_vs_fp32"] < 0.05, r
    assert rows["weights=int8"]["weight_bytes"] < rows["base"]["weight_bytes"] / 2
    together = next(r for r in res["rows"] if r["lever"].startswith("together"))
    assert together["rows4_ms"] > 0 and together["rows4_over_rows1"] > 0
    s = {r["lever"]: r for r in stepbench.summary(stepbench.merge_runs([res, res]))}
    assert s["base"]["runs"] == 2 and s["base"]["gain_ms"] == 0

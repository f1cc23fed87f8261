"""The sync-free round: device-side verdicts, one host read per round, steps launched ahead of their
read, and trace-driven acceptance."""
import json

import pytest
import torch

from sdeth.runtime import loop, streamdraft, synthetic, verify
from sdeth.runtime.verify import Sampling
from test_verify import DRAFT, V, BigramEngine


def test_draw_never_picks_a_zero_probability_id_and_follows_p():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    draws = torch.stack([verify.draw(p, gen) for _ in range(6000)])
    counts = torch.bincount(draws, minlength=6).float() / 6000
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts, p, atol=0.03)


@pytest.mark.parametrize("draft,n", [([3, 4, 5], 2), ([3, 4, 9], 3), ([0, 4, 9], 0)])
def test_greedy_verdict_is_a_device_tensor_with_the_same_answer(draft, n):
    logits = torch.full((4, 10), -5.0)
    for i, t in enumerate([3, 4, 9, 1]):
        logits[i, t] = 5.0
    v = verify.verdict_greedy(torch.tensor(draft), logits)
    assert isinstance(v, torch.Tensor) and v.shape == (2,)
    assert v.tolist() == [n, [3, 4, 9, 1][n]]


def test_sampled_verdict_takes_the_bonus_from_p_after_full_acceptance():
    """q == p everywhere: every draft is accepted, and the bonus row (q's zero row) is p itself."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]] * 3))
    q = torch.softmax(logits[:2], -1)
    seen = set()
    for _ in range(200):
        n, t = verify.verdict_sampled(torch.tensor([0, 1]), q, logits, Sampling(1.0, draft_sampled=True), gen).tolist()
        assert n == 2
        seen.add(t)
    assert seen == {0, 1, 2}


def test_launched_steps_settle_in_order_and_a_commit_settles_what_it_covers():
    """Depth 2 (as on a GPU): a commit at a position still in flight first settles it (it must reach the
    target before anything after the commit); a mismatch drops the later step in flight."""
    d = streamdraft.StreamDrafter(BigramEngine(DRAFT), window=8)
    d.depth = 2
    d.start([0], 32, first=3, s=Sampling())
    d.launch(), d.launch()
    assert len(d.flight) == 2 and not d.can_step()           # the queue is full
    assert [st.pos for st in d.flight] == [1, 2]
    settled = d.commit(1, (d.flight[0].tok.item() + 1) % V)  # differs from the draft's token at 1
    assert [st.pos for st in settled] == [1] and settled[0].epoch == 0
    assert d.flight == [] and d.epoch == 1 and len(d.chain) == 2
    d.launch()
    st = d.settle()
    assert (st.epoch, st.pos) == (1, 2)
    # the same chain as a draft that steps one at a time from the corrected token
    ref = streamdraft.StreamDrafter(BigramEngine(DRAFT), window=8)
    ref.start([0], 32, first=3, s=Sampling())
    ref.step()
    ref.commit(1, d.chain[1])
    assert ref.step()[0][2] == st.token


def _trace_file(tmp_path, seqs):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schema": "sdeth.trace/1", "pair": "test", "top": 8,
                                "sequences": [{"rank": s} for s in seqs]}))
    return path


def test_trace_scaling_hits_the_alpha_and_keeps_every_kept_event(tmp_path):
    seqs = ["0001020000300004" * 40, "0000000020001000" * 40]
    tr0 = synthetic.AcceptanceTrace.load(_trace_file(tmp_path, seqs))
    assert tr0.alpha0 == pytest.approx(tr0.realized_alpha)
    for target in (0.5, 0.95):
        tr = synthetic.AcceptanceTrace.load(_trace_file(tmp_path, seqs), target)
        assert tr.realized_alpha == pytest.approx(target, abs=0.03)
        for raw, new in zip(tr.raw, tr.seqs):
            changed = [(a, b) for a, b in zip(raw, new) if a != b]
            if target < tr.alpha0:      # only accepts become rejections, with ranks seen in the trace
                assert all(a == 0 and b in (1, 2, 3, 4) for a, b in changed)
            else:                       # only rejections become accepts
                assert all(a != 0 and b == 0 for a, b in changed)
    with pytest.raises(FileNotFoundError, match="sdeth trace"):
        synthetic.AcceptanceTrace.load(tmp_path / "missing.json")


def test_trace_driven_draft_ranks_the_true_token_as_recorded(tmp_path):
    from sdeth.models.presets import load_pair
    pair = load_pair("random-tiny", roles=("target", "draft"))
    tr = synthetic.AcceptanceTrace.load(_trace_file(tmp_path, ["0310"]))
    tgt = synthetic.SyntheticEngine(pair.target, "t", role="target", seed=5)
    dft = synthetic.SyntheticEngine(pair.draft, "d", role="draft", seed=5, trace=tr)
    prompt = list(range(10, 20))
    for e in (tgt, dft):
        e.start(64)
    t_logits = torch.cat([tgt.forward(prompt)[-1:], tgt.forward(torch.zeros(3, dtype=torch.long))])
    d_logits = torch.cat([dft.forward(prompt)[-1:], dft.forward(torch.zeros(3, dtype=torch.long))])
    truth = t_logits.argmax(-1)
    ranks = [int((row > row[t]).sum()) for row, t in zip(d_logits, truth)]
    assert ranks == [0, 3, 1, 0]
    # greedy SD through the real round logic reproduces target-only with this draft
    out_sd = loop.generate_sd(tgt, loop.Drafter(dft), prompt, 24, 3, Sampling(), None).output_ids
    out_t = loop.generate_target_only(tgt, prompt, 24, Sampling(), None).output_ids
    assert out_sd == out_t and len(out_t) == 24


def test_target_only_reads_one_step_behind_and_stops_at_max_tokens_and_eos():
    t = BigramEngine(DRAFT)
    t.start = lambda size: setattr(t, "pos", 0)
    r = loop.generate_target_only(t, [0], 7, Sampling(), None)
    assert len(r.output_ids) == 7 and t.pos == 1 + 6        # prefill + 6 steps, no step wasted
    eos = r.output_ids[3]
    r2 = loop.generate_target_only(t, [0], 7, Sampling(), eos)
    assert r2.output_ids == r.output_ids[:r.output_ids.index(eos) + 1]

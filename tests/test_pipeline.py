"""Pipelined SD (runtime.pipeline, runtime.streamdraft): lossless through every path of the streaming protocol,
driven by a simulated link with random interleavings (LocalStream), and the cost model's event simulation."""
import random
from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from sdeth import costmodel
from sdeth.runtime import loop, pipeline, streamdraft, verify
from sdeth.costmodel import Costs, AdaptivePolicy
from sdeth.runtime.verify import Sampling
from doubles import LocalStream
from test_verify import DRAFT, TARGET, V, BigramEngine


class RandomPolicy(AdaptivePolicy):
    """Chooses m at random (waits included), so that runs mix plain steps, bonus guesses kept and
    dropped, corrections, and the draft taking the target's tokens as given."""
    def __init__(self, seed):
        super().__init__()
        self.rng = random.Random(seed)

    def choose_m(self, available, m_max, fresh=False, since_s=0.0):
        return self.rng.randint(0, min(available + 1, m_max))


class PinnedRule(costmodel.StepPolicy):
    """The step policy held at a rule between its corners: wait for 2 when nothing is on offer, for 1 more when
    one is, never more than 3 (its waits, held choices and caps all played)."""
    def rule(self, m_max):
        return costmodel.WaitRule(2, 2, 3)


SETTINGS = {"policy": costmodel.StepPolicy, "sync": costmodel.SyncPolicy, "offered": costmodel.OfferedPolicy,
            "between": PinnedRule}


def _run(seed, s, max_tokens=40, k=4, die_after=0, gen=None, start=0, device="cpu", est=None):
    """est: the step's policy (RandomPolicy)."""
    stream = LocalStream(BigramEngine(DRAFT, device), s, seed=seed, die_after=die_after, window=2 * k + 2)
    return pipeline.generate_pipelined(BigramEngine(TARGET, device), stream, [start], max_tokens, k, s, None, gen,
                                       est=est or RandomPolicy(seed))


@pytest.mark.parametrize("die_after", [0, 5])
def test_greedy_pipelined_equals_target_only(die_after):
    s = Sampling()
    kinds = set()
    for seed in range(300):
        start = seed % V
        ref = loop.generate_target_only(BigramEngine(TARGET), [start], 40, s, None)
        r = _run(seed, s, die_after=die_after, start=start)
        assert r.output_ids == ref.output_ids, seed
        kinds |= {"plain" if m == 0 else "verify" for m in r.k_trace}
        if die_after:
            assert r.tokens_without_draft > 0
    assert kinds == {"plain", "verify"}


def test_stream_view_follows_the_draft():
    """Commit rules on both sides agree: kept, dropped (new epoch), and taken as given."""
    d = streamdraft.StreamDrafter(BigramEngine(DRAFT), window=8)
    d.start([0], 32, first=3, s=Sampling())
    view = pipeline.StreamView()
    msgs = [d.step()[0] for _ in range(3)]               # positions 1, 2, 3
    for m in msgs[:2]:
        view.on_drafted(*m)
    assert [t for t, _ in view.chain(1, 8)] == [msgs[0][2], msgs[1][2]]
    same = msgs[0][2]
    view.on_commit(1, same)                           # the target's token equals the draft's: kept
    d.commit(1, same)
    assert view.epoch == d.epoch == 0
    other = (msgs[1][2] + 1) % V
    view.on_commit(2, other)                          # differs: both start epoch 1
    d.commit(2, other)
    assert view.epoch == d.epoch == 1
    view.on_drafted(*msgs[2])                         # a stale token of epoch 0 is ignored
    assert view.chain(3, 8) == []
    view.on_commit(3, 4)                              # not drafted yet: the draft takes it
    d.commit(3, 4)
    assert d.chain[-1] == 4 and d.epoch == 1
    nxt = d.step()[0]
    assert nxt[1] == 4
    view.on_drafted(*nxt)
    assert view.unresolved == {} and [t for t, _ in view.chain(4, 8)] == [nxt[2]]


def test_commits_made_before_a_restart_is_seen_are_compared_in_the_new_epoch():
    """The target steps alone at p and p+1 before the draft's token for p arrives. The draft drafted p
    differently, restarts at p, drafts p+1 in the new epoch, then compares it with our p+1."""
    d = streamdraft.StreamDrafter(BigramEngine(DRAFT), window=8)
    d.start([0], 32, first=3, s=Sampling())
    view = pipeline.StreamView()
    x1 = d.step()[0]                                     # position 1, in flight
    y1, y2 = (x1[2] + 1) % V, 0
    view.on_commit(1, y1), view.on_commit(2, y2)      # two plain steps of the target
    d.commit(1, y1)                                   # the draft: mismatch, epoch 1
    z = d.step()[0]                                      # position 2 in epoch 1
    d.commit(2, y2)                                   # compared (or taken as given)
    view.on_drafted(*x1)                              # target learns of the mismatch: epoch 1
    view.on_drafted(*z)
    assert view.epoch == d.epoch, (view.epoch, d.epoch)
    nxt = d.step()[0]
    view.on_drafted(*nxt)
    assert view.epoch == d.epoch and [t for t, _ in view.chain(3, 8)] == [nxt[2]]


def _pvalue(s, n=8000, seed=0, device="cpu", policy=None):
    gen = torch.Generator(device).manual_seed(seed)
    counts = torch.zeros(V * V)
    for i in range(n):
        r = _run(seed * 100000 + i, s, max_tokens=3, k=3, gen=gen, device=device,
                 est=policy() if policy else None)
        b, c = r.output_ids[1:3]
        counts[b * V + c] += 1
    p = verify.probs(TARGET, s)
    pb = p[0] @ p                                      # token 1, after the target's own token 0
    expected = (pb[:, None] * p).reshape(-1) * n
    keep = expected > 5
    obs, exp = counts[keep], expected[keep]
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


@pytest.mark.parametrize("draft_sampled", [True, False])
def test_pipelined_sampling_reproduces_target_distribution(draft_sampled):
    assert _pvalue(Sampling(1.0, draft_sampled=draft_sampled)) > 1e-3


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_pipelined_equals_target_only_under_each_step_policy(setting):
    """The step policy at its corners (sync, offered), as it learns (policy) and held between them: it decides
    how many drafts to verify and when, never what is committed."""
    s = Sampling()
    est = SETTINGS[setting]()                    # one policy across requests, as a target worker keeps it
    for seed in range(100):
        start = seed % V
        ref = loop.generate_target_only(BigramEngine(TARGET), [start], 40, s, None)
        r = _run(seed, s, die_after=5 if seed % 4 == 0 else 0, start=start, est=est)
        assert r.output_ids == ref.output_ids, seed
        assert r.step_policy == ("PinnedRule" if setting == "between" else setting)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_pipelined_sampling_reproduces_target_distribution_under_each_step_policy(setting):
    assert _pvalue(Sampling(1.0), n=4000, policy=SETTINGS[setting]) > 1e-3


def test_stream_view_takes_a_branch_before_and_after_the_commit():
    """A hit: the target's commit selects a branch; the tokens it already holds become the new epoch's
    drafts at once, and the ones still on the wire (old epoch, same fork) are taken when they arrive."""
    view = pipeline.StreamView()
    view.on_drafted(0, 1, 7, None)                    # the draft's token at 1
    view.on_drafted(0, 2, 8, None, fork=1, corr=9)    # branch: if the target takes 9 at 1, then 8 at 2
    view.on_commit(1, 9)                              # a rejection with the branch's correction: a hit
    assert (view.epoch, view.hits, view.restarts) == (1, 1, 1)
    assert [t for t, _ in view.chain(2, 8)] == [8]
    view.on_drafted(0, 3, 4, None, fork=1, corr=9)    # the branch's next token, sent before the draft adopted
    view.on_drafted(0, 3, 5, None, fork=1, corr=6)    # another branch at 1: dropped
    view.on_drafted(1, 4, 2, None)                    # the draft's own next token in the new epoch
    assert [t for t, _ in view.chain(2, 8)] == [8, 4, 2]
    view.on_commit(2, 3)                              # a miss: no branch at 2
    assert (view.epoch, view.hits, view.restarts) == (2, 1, 2) and view.chain(3, 8) == []


def test_estimator_alpha_and_choices():
    e = AdaptivePolicy(alpha0=0.5, prior=2.0, decay=1.0)
    for _ in range(100):
        e.observe_round(2, 3)        # 2 accepted then a rejection
    assert abs(e.alpha - 2 / 3) < 0.01
    e.observe_draft(0.01)
    for m in range(1, 6):
        e.observe_verify(m, 5.0)                      # a first forward (graph capture): not counted
        e.observe_verify(m, 0.05 + 0.001 * m)
    assert e.choose_k(8, 3) == costmodel.best_k(e.alpha, e.costs(), 8)[0]
    assert e.choose_m(5, 5) >= 2                       # cheap drafts already here: verify several
    e.rtt = 1.0
    assert e.choose_m(0, 5, fresh=True, since_s=0.0) == 0   # a second away: step alone


def test_a_slow_draft_start_is_covered_by_plain_steps():
    """A draft on a slow device (a CPU draft for a GPU target: its step 234 ms against the target's 9 ms)
    is still prefilling when its first token is due: the policy steps alone rather than wait it out, while
    a fast draft's late token is still worth a short wait."""
    def policy(step, draft_step):
        e = AdaptivePolicy(alpha0=0.7)
        e.observe_draft(draft_step)
        for m in range(1, 5):
            e.observe_verify(m, step)
            e.observe_verify(m, step * (1 + 0.02 * m))
        e.rtt = 0.0002
        return e
    cpu_draft = policy(0.0088, 0.234)
    for since in (0.0, 0.1, 0.3, 1.0, 4.0):            # the first token due at 0.234 s; prefill took seconds
        assert cpu_draft.choose_m(0, 4, fresh=True, since_s=since) == 0, since
    gpu_draft = policy(0.0052, 0.002)
    for since in (0.0, 0.002, 0.005):                  # due at 2.2 ms, then a little late
        assert gpu_draft.choose_m(0, 4, fresh=True, since_s=since) >= 1, since


def test_event_model_outcome_cache():
    """No hits at no extra cost: the plain pipelined figure; every covered rejection a hit: faster, and the
    reported hit rate is what was put in."""
    c = Costs(0.05, 0.02, {m: 0.05 + 0.002 * m for m in range(2, 10)}, rtt=0.004)
    plain = costmodel.simulate_pipelined(0.7, c, 6, n_tokens=4000)
    none = costmodel.simulate_pipelined(0.7, c, 6, n_tokens=4000, cache=(2, 4, 0.0, 1.0))
    some = costmodel.simulate_pipelined(0.7, c, 6, n_tokens=4000, cache=(2, 4, 0.3, 1.0))
    every = costmodel.simulate_pipelined(0.7, c, 6, n_tokens=4000, cache=(16, 6, 1.0, 1.0))
    assert none["tokens_per_s"] == pytest.approx(plain["tokens_per_s"], rel=1e-9) and none["cache_hit_rate"] == 0
    assert every["tokens_per_s"] > some["tokens_per_s"] > plain["tokens_per_s"]
    assert every["cache_hit_rate"] > 0.95 and 0.15 < some["cache_hit_rate"] < 0.3
    assert costmodel.cache_terms(4, 4, 2, [0.0, 0.2, 0.1, 0.05], {1: 1.0, 4: 1.07}) == (2, 4, pytest.approx(0.3), 1.07)


def test_simulation_brackets():
    c = Costs(0.05, 0.01, {m: 0.05 + 0.002 * m for m in range(2, 10)}, rtt=0.001)
    lo = costmodel.simulate_pipelined(0.0, c, 4, n_tokens=3000)
    hi = costmodel.simulate_pipelined(1.0, c, 4, n_tokens=3000)
    assert 0.8 < lo["tokens_per_s"] * c.target_step <= 1.01      # never accepted: about target-only
    assert hi["tokens_per_s"] * c.target_step > 3                # always accepted: k+1 per verify


def test_the_draft_times_its_step_and_sends_its_next_choices():
    """Step.period_ms: launch to launch while the draft steps on (0 for the first step, after a pause and after
    a restart); watch: each token carries the draft's next choices there (never its own token); the view counts
    how often a correction is among them."""
    d = streamdraft.StreamDrafter(BigramEngine(DRAFT), window=4, watch=2)
    d.start([0], 32, first=3, s=Sampling())
    view = pipeline.StreamView()
    msgs = []
    while d.can_step():
        d.launch()
        st = d.settle()
        msgs.append((st, d.messages(st)[0]))
    assert msgs[0][0].period_ms == 0 and all(st.period_ms > 0 for st, _ in msgs[1:])
    for st, m in msgs:
        assert len(st.alt_ids) == 2 and st.token not in st.alt_ids and m[6] == st.alt_ids
        view.on_drafted(*m)
    assert not d.can_step()                               # the window is full: a pause
    st1 = msgs[0][0]
    view.on_commit(1, st1.alt_ids[1])                     # a correction among the draft's next two choices
    d.commit(1, st1.alt_ids[1])
    assert view.judged == 1 and view.among == 1 and view.epoch == d.epoch == 1
    d.launch()
    assert d.settle().period_ms == 0                      # the first step after the restart is not timed
    d.launch()
    assert d.settle().period_ms > 0


def test_the_event_model_charges_the_draft_host_and_the_step_in_flight():
    """A draft whose host adds to each device step (draft_period) is slower, and so is one whose link is the
    lived round trip rather than the link's own (the restart then waits two longer transits)."""
    c = Costs(0.005, 0.0015, {m: 0.005 * (1 + 0.01 * m) for m in range(2, 10)}, rtt=0.002, link_rtt=0.0002)
    fast = costmodel.simulate_pipelined(0.7, c, 8, n_tokens=4000)["tokens_per_s"]
    slow_host = costmodel.simulate_pipelined(0.7, replace(c, draft_period=0.0025), 8, n_tokens=4000)["tokens_per_s"]
    long_link = costmodel.simulate_pipelined(0.7, replace(c, link_rtt=None), 8, n_tokens=4000)["tokens_per_s"]
    assert slow_host < 0.95 * fast and long_link < fast

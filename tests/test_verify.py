"""Acceptance rules: greedy unit cases, and a chi-square test that speculative sampling (through the
real round logic, rollbacks included) reproduces the target's distribution."""
import pytest
import torch
from scipy.stats import chisquare

from sdeth.runtime import loop, verify
from sdeth.runtime.engine import ForwardClock
from sdeth.runtime.verify import Sampling


def test_greedy_accepts_longest_matching_prefix():
    logits = torch.full((4, 10), -5.0)
    for i, t in enumerate([3, 4, 9, 1]):   # target argmax at each of k+1 = 4 positions
        logits[i, t] = 5.0
    assert verify.verify_greedy(torch.tensor([3, 4, 5]), logits) == (2, 9)   # third differs: target's 9
    assert verify.verify_greedy(torch.tensor([3, 4, 9]), logits) == (3, 1)   # all accepted: bonus token
    assert verify.verify_greedy(torch.tensor([0, 4, 9]), logits) == (0, 3)


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1)])
def test_bad_sampling_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Sampling(**{"temperature": 0.7, **bad})


def test_top_k_top_p_filtering():
    p = verify.probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), Sampling(1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))
    p = verify.probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), Sampling(1.0, top_p=0.7))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))


class BigramEngine:
    """Stands in for Engine: the next-token logits depend on the current token only."""

    def __init__(self, table, device="cpu"):
        self.device = torch.device(device)
        self.table, self.pos, self.forward_s = table.to(self.device), 0, 0.0
        self.clock = ForwardClock(False)     # untimed: its marks read 0 s

    def on_device(self, ids):
        return torch.as_tensor(ids, device=self.device).reshape(-1)

    def start(self, size):
        self.pos = 0

    def forward(self, ids):
        ids = torch.as_tensor(ids, device=self.device).reshape(-1)
        self.pos += len(ids)
        return self.table[ids]

    def rollback(self, pos):
        assert 0 <= pos <= self.pos
        self.pos = pos


V = 5
_g = torch.Generator().manual_seed(1)
TARGET = torch.randn(V, V, generator=_g) * 1.5
DRAFT = torch.randn(V, V, generator=_g) * 1.5      # deliberately a different model


def _two_tokens(k, s, gen, drafter, start=0, device="cpu"):
    """First two tokens after `start` from SD (target and draft bigram models), through the real
    round logic: Drafter's verdict bookkeeping and both rollbacks."""
    t = BigramEngine(TARGET, device)
    t.pos = 1                  # `start` is the prompt's last token, in neither cache yet
    drafter.start([0], 8)      # a one-token "prompt": only its length matters to a bigram
    out, last, n_prev = [], start, 0
    while len(out) < 2:
        new, n_prev, _ = loop.speculative_step(t, drafter, last, n_prev, k, s, gen)
        out += new
        last = new[-1]
    return out[:2]


def _chi2_pvalue(k, s, n=12000, seed=0, device="cpu"):
    """device 'cuda': the same check with every tensor and generator on the GPU."""
    gen = torch.Generator(device).manual_seed(seed)
    drafter = loop.Drafter(BigramEngine(DRAFT, device), s, seed=seed + 1)
    counts = torch.zeros(V * V)
    for _ in range(n):
        a, b = _two_tokens(k, s, gen, drafter, device=device)
        counts[a * V + b] += 1
    p = verify.probs(TARGET, s)
    expected = (p[0][:, None] * p).reshape(-1) * n     # P(a | start=0) * P(b | a)
    impossible = expected == 0          # e.g. tokens that top-p removes: must never be produced
    if counts[impossible].sum() > 0:
        return 0.0
    keep, tiny = expected > 5, (expected > 0) & (expected <= 5)
    obs, exp = counts[keep], expected[keep]
    if tiny.any():   # fold the tiny cells into one so chi-square's approximation holds
        obs = torch.cat([obs, counts[tiny].sum(0, keepdim=True)])
        exp = torch.cat([exp, expected[tiny].sum(0, keepdim=True)])
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


@pytest.mark.parametrize("k,draft_sampled,top_p", [(2, True, 1.0), (3, False, 1.0), (2, True, 0.9)])
def test_speculative_sampling_reproduces_target_distribution(k, draft_sampled, top_p):
    assert _chi2_pvalue(k, Sampling(1.0, top_p=top_p, draft_sampled=draft_sampled)) > 1e-3


def test_a_broken_rule_fails_the_same_test(monkeypatch):
    """Sampling the correction from p instead of norm(max(p - q, 0)) biases towards the draft."""
    def broken(draft_tokens, q, target_logits, s, gen):
        p = verify.probs(target_logits, s)
        k = draft_tokens.numel()
        idx = torch.arange(k)
        ratio = p[idx, draft_tokens] / q[idx, draft_tokens]
        u = torch.rand(k, generator=gen)
        rej = (u > ratio).nonzero()
        if not rej.numel():
            return k, verify.sample(p[k], gen)
        n = int(rej[0])
        return n, verify.sample(p[n], gen)   # wrong: should be the residual
    monkeypatch.setattr(loop, "read_verdict", lambda t, q, l, s, g: broken(t, q, l, s, g))
    assert _chi2_pvalue(2, Sampling(1.0, draft_sampled=True)) < 1e-6

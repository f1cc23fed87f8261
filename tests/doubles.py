"""Test doubles for the runtime's roles (sdeth.runtime.roles), and the exact-distribution check of sampled
decoding that several tests share."""
import random

from sdeth.runtime.loop import DraftUnavailable
from sdeth.runtime.pipeline import StreamView
from sdeth.runtime.streamdraft import StreamDrafter
from sdeth.runtime.verify import Sampling


class LocalStream:
    """An in-process stream for tests: the draft and both directions of the 'link' are simulated,
    with a seeded random interleaving of drafting and delivery, so that every path of the protocol
    (run-ahead kept, dropped, adopted; stale epochs) is exercised deterministically."""

    def __init__(self, engine, s: Sampling = Sampling(), seed: int = 0, q_top: int = 0, window: int = 8,
                 max_steps_per_poll: int = 3, die_after: int = 0):
        self.d = StreamDrafter(engine, q_top, window)
        self.s, self.seed = s, seed
        self.rng = random.Random(seed)
        self.view = StreamView()
        self.max_steps, self.die_after, self.sent = max_steps_per_poll, die_after, 0
        self.to_draft: list[tuple[int, int]] = []
        self.to_target: list[tuple] = []

    @property
    def compute_s(self) -> float:
        return self.d.compute_s

    @property
    def streamed(self) -> int:
        return self.sent

    def start(self, prompt_ids, size, first, s=None, seed=None):
        self.view.reset()
        self.to_draft.clear(), self.to_target.clear()
        self.d.start(prompt_ids, size, first, s or self.s, self.seed if seed is None else seed)
        self.sent = 0

    def _to_draft(self) -> None:
        for st in self.d.commit(*self.to_draft.pop(0)):      # steps the commit settled go out first
            self.to_target.extend(self.d.messages(st))

    def commit(self, pos: int, token: int) -> None:
        self.view.on_commit(pos, token)
        self.to_draft.append((pos, token))

    def _tick(self, at_least_one: bool) -> None:
        for _ in range(self.rng.randint(0, len(self.to_draft))):
            self._to_draft()
        for _ in range(self.rng.randint(1 if at_least_one else 0, self.max_steps)):
            if self.die_after and self.sent >= self.die_after:
                raise DraftUnavailable("simulated draft death")
            if not self.d.can_step():
                while self.to_draft:             # the draft is blocked: let verdicts through
                    self._to_draft()
                if not self.d.can_step():
                    break
            msgs = self.d.step()
            self.to_target.extend(msgs)
            self.sent += 1
        n = len(self.to_target)
        for _ in range(self.rng.randint(min(n, 1 if at_least_one else 0), n)):
            self.view.on_drafted(*self.to_target.pop(0))

    def poll(self) -> None:
        self._tick(False)

    def wait(self, timeout_s: float) -> bool:
        self._tick(True)
        return True

    def end(self) -> None:
        pass


def two_token_chi2(engine, prompt: list[int], s: Sampling, counts: dict[tuple, int]) -> float:
    """p-value of observed (first, second) generated-token counts against the engine's exact joint
    distribution after `prompt` (tiny expected cells folded into one). Asserts that nothing was drawn
    outside the distribution's support (top-k, top-p, a vocabulary cut)."""
    from scipy.stats import chisquare
    from sdeth.runtime.verify import probs
    n = sum(counts.values())
    engine.start(len(prompt) + 4)
    p0 = probs(engine.forward(prompt)[-1], s)
    expected = {}
    for a in p0.nonzero().flatten().tolist():
        engine.rollback(len(prompt))
        p1 = probs(engine.forward([a])[-1], s)
        for b in p1.nonzero().flatten().tolist():
            expected[(a, b)] = float(p0[a] * p1[b]) * n
    assert set(counts) <= set(expected), set(counts) - set(expected)
    big = sorted(c for c in expected if expected[c] > 5)
    obs, exp = [counts.get(c, 0) for c in big], [expected[c] for c in big]
    if len(big) < len(expected):       # the tiny cells, folded into one
        obs.append(sum(v for c, v in counts.items() if c not in big))
        exp.append(sum(e for c, e in expected.items() if c not in big))
    return chisquare(obs, [e * sum(obs) / sum(exp) for e in exp]).pvalue


def tiny_qwen3(seed: int = 0):
    """A two-layer Qwen3 model (300 ids, GQA, tied output layer) with random weights from `seed`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).eval()

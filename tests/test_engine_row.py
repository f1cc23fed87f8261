"""The draft server of one row over any draft Engine (runtime.enginerow.EngineRow, wire.draft_server.engine_server):
its proposals are the one-sequence drafter's (transformers, synthetic and trace-driven engines), and SD through it,
sync and pipelined, gives the target's own output."""
import random

import pytest

from doubles import tiny_qwen3
from sdeth.runtime.batchdraft import BatchDrafter
from sdeth.runtime.engine import Engine
from sdeth.runtime.batchseq import CATCH_UP
from sdeth.runtime.enginerow import EngineRow
from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
from sdeth.runtime.pipeline import generate_pipelined
from sdeth.runtime.synthetic import AcceptanceTrace, SyntheticEngine
from sdeth.runtime.verify import Sampling
from sdeth.wire import protocol as W
from sdeth.wire.draft_client import DraftServerClient
from sdeth.wire.draft_handles import ServerDraft, ServerStream
from sdeth.wire.draft_server import DraftServerConfig, engine_server

VOCAB = 300
HELLO = W.Hello(W.PROTOCOL_VERSION, "target", "tiny", VOCAB, "sha", "float32")
ME = W.Welcome(W.PROTOCOL_VERSION, "tiny", VOCAB, "sha", "float32")


def _rounds(make_engine, prompts, rounds=8, seed=0):
    """Each prompt in turn on one row, rounds with random verdicts and k: (the row's proposals, Drafter's)."""
    rng = random.Random(seed)
    bd = BatchDrafter(EngineRow(make_engine(), 128), VOCAB, chunk=4)
    ref = Drafter(make_engine())
    got, want = [], []
    for i, p in enumerate(prompts):
        ref.start(p, 128)
        seq = bd.open(("c", str(i)), 0, p, Sampling(), 0, 0)
        n_prev, nxt = 0, rng.randrange(VOCAB)
        for _ in range(rounds):
            k = rng.randint(1, 5)
            bd.apply(seq, seq.n, n_prev, [nxt])
            while bd.prefill():
                pass
            got.append(bd.draft([(seq, k)])[0].tokens)
            want.append(ref.propose(n_prev, nxt, k)[0])
            n_prev, nxt = rng.randint(0, k), rng.randrange(VOCAB)
        bd.free(seq.key)
    return got, want


def test_one_row_over_an_engine_proposes_what_the_one_sequence_drafter_does():
    """Prompts longer and shorter than a catch-up (prefilled in chunks, or fed in the first step)."""
    model = tiny_qwen3(0)
    rng = random.Random(1)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (13, 5, 30)]
    got, want = _rounds(lambda: Engine(model, "d"), prompts)
    assert got == want


def test_one_row_keeps_a_trace_driven_drafts_positions():
    """A trace-driven draft (keyed by its request's prompt, ranks by position from it) proposes, on one row, the
    tokens the one-sequence drafter proposes: the engine sees the prompt whole, and each position once."""
    model = tiny_qwen3(0)
    trace = AcceptanceTrace(["0012003100", "0000300121"], top=4)
    rng = random.Random(2)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (CATCH_UP + 3, 3)]
    make = lambda: SyntheticEngine(model, "d", role="draft", seed=7, trace=trace)   # noqa: E731
    got, want = _rounds(make, prompts, rounds=10)
    assert got == want
    make = lambda: SyntheticEngine(model, "d", role="draft", alpha=0.6, seed=7)     # noqa: E731
    assert _rounds(make, prompts)[0] == _rounds(make, prompts)[1]


def test_one_row_cannot_fork_and_refuses_a_verdict_cache():
    with pytest.raises(ValueError, match="--verdict-cache off"):
        engine_server(Engine(tiny_qwen3(0), "d"), ME, DraftServerConfig(verdict_cache="on"))
    with pytest.raises(ValueError, match="cannot fork"):
        EngineRow(Engine(tiny_qwen3(0), "d"), 64).copy_prefix([0], [1], 4)


@pytest.fixture(scope="module")
def one_row():
    """A one-row draft server over a transformers engine (a related draft), serving in a thread."""
    from test_draft_server import serving, tiny_pair
    target, draft = tiny_pair()
    server = engine_server(Engine(draft, "d"), ME, DraftServerConfig(capacity=256, prefill_chunk=16))
    return target, serving(server)


@pytest.mark.parametrize("mode", ["sd", "pipelined"])
def test_sd_through_one_row_gives_the_target_output(one_row, mode):
    target, addr = one_row
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8]]
    c = DraftServerClient(addr, HELLO)
    try:
        eng = Engine(target, "t")
        for p in prompts:
            ref = generate_target_only(Engine(target, "r"), p, 24, Sampling(), None).output_ids
            if mode == "sd":
                d = ServerDraft(c)
                r = generate_sd(eng, d, p, 24, 3, Sampling(), None)
                d.end()
            else:
                r = generate_pipelined(eng, ServerStream(c), p, 24, 3, Sampling(), None)
            assert r.output_ids == ref and r.tokens_without_draft == 0 and r.rounds > 0, r
    finally:
        c.close()


def test_a_second_client_of_one_row_is_refused_and_decodes_alone(one_row):
    """One row holds one sequence: a second client's is refused (`limit`, sequences) while the first holds it;
    its request decodes on the target alone, with the target's output."""
    target, addr = one_row
    a, b = DraftServerClient(addr, HELLO), DraftServerClient(addr, HELLO)
    try:
        first = ServerDraft(a)
        first.start([1, 2, 3], 64)
        assert len(first.propose(0, 4, 3)[0]) == 3
        p = [5, 6, 7, 8]
        r = generate_sd(Engine(target, "t"), ServerDraft(b), p, 12, 3, Sampling(), None)
        assert r.output_ids == generate_target_only(Engine(target, "r"), p, 12, Sampling(), None).output_ids
        assert r.tokens_without_draft > 0 and r.rounds == 0
        first.end()
    finally:
        a.close()
        b.close()


def test_one_row_over_an_emulated_draft_replays_its_chains():
    """An emulated draft (the recorded chains, keyed by the prompt) through a one-row server: the proposals, the
    acceptance and the output of the one-sequence drafter, and no misses (each position fed once)."""
    from sdeth.runtime.emulated import DraftChains, EmulatedEngine
    from sdeth.study.runs.acceptance import chains_for
    from test_draft_server import serving, tiny_pair
    target, draft = tiny_pair()
    prompts = [("a", list(range(3, 7 + CATCH_UP))), ("b", list(range(40, 49)))]
    chains = DraftChains(chains_for(target, draft, prompts, max_new=30, depth=6))
    emu = EmulatedEngine(draft, chains, step_s=0.0)
    c = DraftServerClient(serving(engine_server(emu, ME, DraftServerConfig(capacity=128, prefill_chunk=4))), HELLO)
    try:
        for _, ids in prompts:
            ref = generate_sd(Engine(target), Drafter(EmulatedEngine(draft, chains, step_s=0.0)), ids, 30, 4,
                              Sampling(), None)
            d = ServerDraft(c)
            got = generate_sd(Engine(target), d, ids, 30, 4, Sampling(), None)
            d.end()
            assert got.output_ids == ref.output_ids and got.tokens_without_draft == 0
            assert (got.accepted_tokens, got.rounds) == (ref.accepted_tokens, ref.rounds)
        assert emu.misses == 0
    finally:
        c.close()

"""The draft server: batched rows compute what one row alone computes; many clients interleave through one
draft and each output is the target's own (greedy and sampled); desync, TTL, limits, turns, heartbeats."""
import threading
import time

import pytest
import torch

from doubles import tiny_qwen3, two_token_chi2
from sdeth.place.testbed import free_port
from sdeth.runtime.batchdraft import BatchDrafter, Desync
from sdeth.runtime.batchmodel import BatchDecoder
from sdeth.runtime.batchseq import CATCH_UP
from sdeth.runtime.engine import Engine
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.runtime.loop import Drafter, generate_sd, generate_target_only
from sdeth.runtime.verify import Sampling
from sdeth.wire import protocol as W
from sdeth.wire.draft_client import DraftServerClient
from sdeth.wire.draft_handles import ServerDraft
from sdeth.wire.draft_server import DraftServer, DraftServerConfig, ServerLimits, build_server

VOCAB = 300
HELLO = W.Hello(W.PROTOCOL_VERSION, "target", "tiny", VOCAB, "sha", "float32")


def tiny_pair():
    target, draft = tiny_qwen3(0), tiny_qwen3(0)
    torch.manual_seed(5)
    for p in draft.parameters():        # a related but different draft
        p.data += 0.02 * torch.randn_like(p)
    return target, draft


def tiny_server(draft, rows=8, capacity=256, **kw) -> DraftServer:
    """A draft server over a tiny model (kw: DraftServerConfig's fields), built as the CLI builds one."""
    me = W.Welcome(W.PROTOCOL_VERSION, "tiny", VOCAB, "sha", "float32")
    return build_server(FastDecoder(draft, 8), me, DraftServerConfig(rows=rows, capacity=capacity,
                                                                      **{"prefill_chunk": 16, **kw}))


def serving(server: DraftServer, seconds: float = 120) -> str:
    addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": seconds}, daemon=True).start()
    time.sleep(0.3)
    return addr


# ------------------------------------------------------------------ batched rows

def test_a_batched_row_equals_the_row_decoded_alone():
    """Three sequences of different lengths in one step (one row with a single new token, repeated at its
    own position) give each row's logits as the transformers model alone and as a batch of one."""
    model = tiny_qwen3(0)
    fast = FastDecoder(model, 8)
    many, one = BatchDecoder(fast, rows=4, capacity=64), BatchDecoder(fast, rows=1, capacity=64)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 5, 13)]
    for r, s in enumerate(seqs):
        pos = torch.arange(len(s) - 2)[None]
        many.forward(torch.tensor([s[:-2]]), pos, pos, row0=r)
    last = [s[-2:] if r != 1 else [s[-2], s[-2]] for r, s in enumerate(seqs)]    # row 1: one new token
    pos = torch.tensor([[len(s) - 2, len(s) - 1] if r != 1 else [len(s) - 2] * 2 for r, s in enumerate(seqs)])
    out = many.step(torch.tensor(last), pos, pos, top=int(pos.max()) + 1)
    ref = Engine(model, "ref")
    for r, s in enumerate(seqs):
        upto = s if r != 1 else s[:-1]
        ref.start(64)
        want = ref.forward(upto)[-1]
        p = torch.arange(len(upto) - 1)[None]
        one.forward(torch.tensor([upto[:-1]]), p, p)
        alone = one.step(torch.tensor([[upto[-1]]]), torch.tensor([[len(upto) - 1]]),
                         torch.tensor([[len(upto) - 1]]), top=len(upto))[0]
        assert torch.allclose(out[r], alone, atol=1e-5), r
        assert ((out[r] - want).norm() / want.norm()) < 1e-5, r


def test_the_batch_drafter_proposes_what_the_one_sequence_drafter_does():
    """Rounds with random verdicts and a k per row: every proposal equals loop.Drafter's."""
    import random
    model = tiny_qwen3(0)
    bd = BatchDrafter(BatchDecoder(FastDecoder(model, 8), rows=4, capacity=128), VOCAB, chunk=4)
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (CATCH_UP + 1, 5, CATCH_UP + 5)]   # (prefilled, not)
    ref = [Drafter(Engine(model, f"r{i}")) for i in range(3)]
    seqs = []
    for i, p in enumerate(prompts):
        ref[i].start(p, 128)
        seqs.append(bd.open(("c", str(i)), 0, p, Sampling(), 0, 0))
    state = [(0, rng.randrange(VOCAB)) for _ in prompts]
    for _ in range(8):
        ks = [rng.randint(1, 5) for _ in prompts]
        for s, (n_prev, nxt) in zip(seqs, state):
            bd.apply(s, s.n, n_prev, [nxt])
        while bd.prefill():
            pass
        out = bd.draft(list(zip(seqs, ks)))
        for i in range(3):
            assert ref[i].propose(*state[i], ks[i])[0] == out[i].tokens
            state[i] = (rng.randint(0, ks[i]), rng.randrange(VOCAB))
    with pytest.raises(Desync):
        bd.apply(seqs[0], seqs[0].n + 1, 0, [1])


# ------------------------------------------------------------------ many clients through one draft

def _client_runs(addr, target, prompts, s: Sampling, max_tokens: int, k: int, seeds=None):
    c = DraftServerClient(addr, HELLO)
    eng, sd, out = Engine(target, "t"), ServerDraft(c, s), []
    for i, p in enumerate(prompts):
        gen = torch.Generator().manual_seed(seeds[i]) if seeds else None
        out.append(generate_sd(eng, sd, p, max_tokens, k, s, None, gen=gen))
        sd.end()
    c.close()
    return out


def _in_threads(n, fn):
    res, errs = {}, []

    def run(i):
        try:
            res[i] = fn(i)
        except Exception as e:       # surfaced below
            errs.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    return [res[i] for i in range(n)]


def test_four_clients_interleaved_through_one_draft_each_get_the_target_output(pair, target_only_ref):
    """The embedded pair: four target clients, two prompts each, through one draft server at once."""
    from conftest import REF
    from sdeth.study.runs import experiment
    from sdeth.wire.draft_server import pair_server
    server = pair_server(pair, DraftServerConfig(rows=8, capacity=1024))
    me = server.welcome
    addr = serving(server)
    cfg = experiment.RunConfig(mode="sd", **REF)
    prompts = experiment.encode_prompts(cfg, pair.tokenizer)
    hello = W.Hello(W.PROTOCOL_VERSION, "target", "t", pair.vocab_size, me.tokenizer_sha, me.dtype)
    from sdeth.runtime import make_engine

    def client(i):
        c = DraftServerClient(addr, hello)
        eng = make_engine(pair.target, "target", "target", vocab=pair.vocab_size)
        sd, out = ServerDraft(c), []
        for _, ids in prompts[2 * i:2 * i + 2]:
            out.append(generate_sd(eng, sd, ids, REF["max_tokens"], 3, Sampling(), pair.tokenizer.eos_token_id))
            sd.end()
        c.close()
        return out
    runs = [r for rs in _in_threads(4, client) for r in rs]
    want = [r["output_ids"] for r in target_only_ref["requests"]]
    assert [r.output_ids for r in runs] == want
    assert sum(r.accepted_tokens for r in runs) > 0 and server.steps > 0
    assert max(server.batches) > 1          # rows of several clients shared a step
    assert not server.drafter.seqs                # every sequence ended


def test_four_clients_sampled_reproduce_the_target_distribution():
    """Speculative sampling through the shared draft (sampled draft, q on the wire): the first two tokens'
    joint distribution is the target's (chi-square), four clients interleaved."""
    target, draft = tiny_pair()
    addr = serving(tiny_server(draft))
    s, prompt, n = Sampling(1.0, top_k=3, draft_sampled=True), [3, 1, 4, 1, 5], 100
    runs = _in_threads(4, lambda i: _client_runs(addr, target, [prompt] * n, s, 3, 2,
                                                 seeds=list(range(i * n, (i + 1) * n))))
    counts = {}
    for r in (r for rs in runs for r in rs):
        key = tuple(r.output_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    assert sum(r.rounds for rs in runs for r in rs) > 2 * n       # the draft took part
    assert two_token_chi2(Engine(target, "ref"), prompt, s, counts) > 1e-3


def test_a_forced_desync_recovers_with_identical_output():
    """A client that loses count of what the draft holds is answered `desync`, opens the sequence again under
    the next generation, and decodes on: the same output as target-only, the draft still used."""
    target, draft = tiny_pair()
    server = tiny_server(draft)
    addr = serving(server)
    c = DraftServerClient(addr, HELLO)
    sd = ServerDraft(c)
    propose = sd.propose
    calls = []

    def lying_propose(n_prev, nxt, k):
        calls.append(1)
        if len(calls) == 3:
            sd.track.have += 1              # the client's count goes wrong once
        return propose(n_prev, nxt, k)
    sd.propose = lying_propose
    eng = Engine(target, "t")
    prompt = [5, 6, 7, 8, 9]
    got = generate_sd(eng, sd, prompt, 40, 4, Sampling(), None)
    want = generate_target_only(eng, prompt, 40, Sampling(), None)
    assert got.output_ids == want.output_ids
    assert sd.track.reopened == 1 and sd.track.gen == 1
    assert got.rounds > 3 and got.tokens_without_draft == 0
    c.close()


def test_a_killed_clients_sequences_are_freed_within_the_ttl(capsys):
    target, draft = tiny_pair()
    server = tiny_server(draft, ttl_s=1.0)
    addr = serving(server)
    c = DraftServerClient(addr, HELLO)
    tracks = [c.open(f"s{i}", [1, 2, 3, 4]) for i in range(3)]
    c.rounds([(t, 0, [5], 3) for t in tracks])
    assert len(server.drafter.seqs) == 3
    c.close()                               # gone without End
    t0 = time.time()
    while server.drafter.seqs and time.time() - t0 < 5:
        time.sleep(0.05)
    assert not server.drafter.seqs and time.time() - t0 < 3.0
    assert sorted(server.drafter.free_rows) == list(range(8))
    assert "freed 3 sequences: no word from the client for 1 s" in capsys.readouterr().out


# ------------------------------------------------------------------ limits, turns, liveness (no socket)

def _welcomed(server, ident=b"a", peer="10.0.0.1"):
    assert isinstance(server.dispatch(ident, HELLO, time.time(), peer)[0], W.Welcome)
    return ident


def _rows(out):
    return [r for m in out if isinstance(m, W.Drafts) for r in m.rows]


@pytest.mark.parametrize("field,limits,send", [
    ("k", {}, lambda s: [W.Rounds([W.Row("s0", 0, 4, 0, [1], 17)])]),
    ("tokens", {}, lambda s: [W.Rounds([W.Row("s0", 0, 4, 0, list(range(17)), 2)])]),
    ("context", {}, lambda s: [W.Open("s1", 0, [1] * 260)]),
    ("context", {"context": 12}, lambda s: [W.Rounds([W.Row("s0", 0, 4, 0, [1, 2, 3], 5)])]),
    ("sequences_per_client", {"sequences_per_client": 1}, lambda s: [W.Open("s1", 0, [1, 2])]),
    ("sequences", {"sequences": 1}, lambda s: [W.Open("s1", 0, [1, 2])]),
    ("rows_per_message", {"rows_per_message": 2}, lambda s: [W.Rounds([W.Row("s0", 0, 4, 0, [1], 2)] * 3)]),
])
def test_each_limit_is_refused_naming_it_and_logged_with_the_peer(field, limits, send, capsys):
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(**limits))
    ident = _welcomed(server)
    server.dispatch(ident, W.Open("s0", 0, [1, 2, 3, 4]), time.time(), "10.0.0.1")
    out = [m for msg in send(server) for m in server.dispatch(ident, msg, time.time(), "10.0.0.1")]
    errors = [(m.code, m.message) for m in out if isinstance(m, W.Error)] + [(r.error, r.message)
                                                                             for r in _rows(out) if r.error]
    assert errors and errors[0][0] == "limit" and errors[0][1].startswith(field + ":"), errors
    log = capsys.readouterr().out
    assert "peer=10.0.0.1" in log and "refused (limit)" in log and f"{field}:" in log
    assert isinstance(server.dispatch(ident, W.Ping(1.0), time.time(), "10.0.0.1")[0], W.Pong)


def test_rows_of_an_unknown_or_old_generation_are_desync_and_never_drafted():
    server = tiny_server(tiny_qwen3(0))
    ident = _welcomed(server)
    server.dispatch(ident, W.Open("s0", 3, [1, 2, 3, 4]), time.time(), "p")
    out = server.dispatch(ident, W.Rounds([W.Row("s0", 2, 4, 0, [1], 2), W.Row("zz", 0, 4, 0, [1], 2)]),
                          time.time(), "p")
    assert [r.error for r in _rows(out)] == ["desync", "desync"]
    assert not server.clients[ident].waiting


def test_clients_take_turns_when_a_step_is_capped():
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(batch=2))
    for c in (b"a", b"b", b"c"):
        _welcomed(server, c)
        for i in range(2):
            server.dispatch(c, W.Open(f"s{i}", 0, [1, 2]), time.time(), "p")
        server.dispatch(c, W.Rounds([W.Row(f"s{i}", 0, 2, 0, [3], 2) for i in range(2)]), time.time(), "p")
    while server.drafter.prefill():
        pass
    steps = [server.step() for _ in range(3)]
    assert [[ident for ident, _ in st] for st in steps] == [[b"a"], [b"b"], [b"c"]]
    assert all(len(m.rows) == 2 and m.batch == 2 for st in steps for _, m in st)
    assert server.step() == []


def test_a_long_prompt_is_fed_in_chunks_and_pings_are_answered_between():
    """Liveness off the compute path: a step of the serving loop feeds one chunk of a long prompt; the loop
    answers a Ping before the prompt is done, and a short sequence's round is drafted meanwhile."""
    server = tiny_server(tiny_qwen3(0), capacity=256)
    ident = _welcomed(server)
    server.dispatch(ident, W.Open("long", 0, list(range(200))), time.time(), "p")
    server.dispatch(ident, W.Open("short", 0, [1, 2]), time.time(), "p")
    server.dispatch(ident, W.Rounds([W.Row("long", 0, 200, 0, [7], 2), W.Row("short", 0, 2, 0, [3], 2)]),
                    time.time(), "p")
    sent = []

    class Sock:
        def send_multipart(self, frames):
            sent.append(W.decode(frames[-1]))
    server.idle(Sock())                     # feeds the short prompt first, then a chunk of the long one
    server.idle(Sock())
    assert [r.seq for m in sent for r in m.rows] == ["short"]       # drafted while the long prompt waits
    assert server.drafter.seqs[(ident, "long")].fed < 200
    assert isinstance(server.dispatch(ident, W.Ping(1.0), time.time(), "p")[0], W.Pong)
    while not any(r.seq == "long" for m in sent for r in m.rows):
        server.idle(Sock())
    assert server.drafter.seqs[(ident, "long")].n == 201


def test_target_workers_share_a_draft_server_over_the_wire(pair, target_only_ref):
    """`worker --role target --draft-server`: two target workers, one draft server, Generate from a controller
    each, sync and pipelined: the target's own output, the draft used."""
    from conftest import REF
    from sdeth.study.runs import experiment
    from sdeth.wire.draft_server import serve_draft_server
    from sdeth.wire.target_worker import TargetWorker
    from sdeth.wire.transport import Client
    draft_addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=serve_draft_server, args=(draft_addr, pair, DraftServerConfig(rows=4, capacity=1024)),
                     kwargs=dict(max_seconds=300), daemon=True).start()
    addrs = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    for a in addrs:
        w = TargetWorker(pair, draft_addr)
        threading.Thread(target=w.serve, args=(a,), kwargs={"max_seconds": 300}, daemon=True).start()
    time.sleep(0.5)
    prompts = experiment.encode_prompts(experiment.RunConfig(**REF), pair.tokenizer)

    def controller(i):
        c, out = Client(addrs[i], timeout_s=120), []
        for j, (_, ids) in enumerate(prompts[i::2][:2]):
            out.append(c.call(W.Generate(f"r{i}{j}", ids, REF["max_tokens"], "sd", 3)))
        out.append(c.call(W.Generate(f"p{i}", prompts[i][1], REF["max_tokens"], "pipelined", 3)))
        c.close()
        return out
    runs = _in_threads(2, controller)
    want = [r["output_ids"] for r in target_only_ref["requests"]]
    for i, out in enumerate(runs):
        assert [g.record["output_ids"] for g in out[:2]] == want[i::2][:2]
        assert all(g.record["rounds"] > 0 and not g.record["draft_unavailable"] for g in out[:2])
        assert out[2].record["output_ids"] == want[i]
        assert out[2].record["rounds"] > 0 and not out[2].record["draft_unavailable"], out[2].record


# ------------------------------------------------------------------ pipelined streams

def test_a_stream_row_drafts_what_the_stream_drafter_does():
    """Stream rows follow runtime.pipeline's commit rules: the same tokens, epochs and restarts as StreamDrafter
    under a scripted run of hits, rejections and extensions, two streams batched together."""
    from sdeth.runtime.streamdraft import StreamDrafter
    model = tiny_qwen3(0)
    bd = BatchDrafter(BatchDecoder(FastDecoder(model, 8), rows=4, capacity=128), VOCAB, chunk=4)
    prompts = [[5, 6, 7, 8, 9, 10], [3, 1, 4]]
    refs, seqs = [], []
    for i, p in enumerate(prompts):
        ref = StreamDrafter(Engine(model, f"r{i}"), window=6)
        ref.start(p, 128, 42, Sampling(), 0)
        refs.append(ref)
        seqs.append(bd.open_stream(("c", str(i)), 0, p, Sampling(), 0, 0, window=6))
        bd.commit(seqs[-1], 0, 42)
    script = [("step", 3), ("commit", 1, None), ("commit", 2, 7), ("step", 4), ("commit", 3, None),
              ("commit", 4, None), ("commit", 5, 11), ("step", 6), ("commit", 6, None), ("commit", 7, None),
              ("commit", 8, None), ("commit", 9, None), ("commit", 10, None), ("commit", 11, None), ("step", 2)]
    for op in script:
        if op[0] == "step":
            for _ in range(op[1]):
                while bd.prefill():
                    pass
                bd.stream_step([s for s in seqs if s.room])
                for r in refs:
                    while r.can_step():
                        r.step()
                        break
        else:
            for s, r in zip(seqs, refs):
                pos = op[1]
                if pos > len(s.chain):
                    continue
                tok = s.chain[pos] if op[2] is None and pos < len(s.chain) else (op[2] if op[2] is not None else 0)
                bd.commit(s, pos, tok)
                r.commit(pos, tok)
        for s, r in zip(seqs, refs):
            assert s.chain == r.chain + [st.token for st in r.flight] or s.chain == r.chain, (op, s.chain, r.chain)
            assert s.epoch == r.epoch


def pipelined_clients(addr: str, target) -> list:
    """Four clients in threads, each two pipelined requests through the server at addr: (result, target-only
    result, tokens streamed) per request."""
    from sdeth.runtime.pipeline import generate_pipelined
    from sdeth.wire.draft_handles import ServerStream

    def client(i):
        c, eng, out = DraftServerClient(addr, HELLO), Engine(target, f"t{i}"), []
        for j in range(2):
            prompt = [(i * 7 + j * 3 + q) % VOCAB for q in range(5 + j)]
            st = ServerStream(c, window=8)
            r = generate_pipelined(eng, st, prompt, 32, 4, Sampling(), None)
            st.end()
            out.append((r, generate_target_only(eng, prompt, 32, Sampling(), None), st.streamed))
        c.close()
        return out
    return [r for rs in _in_threads(4, client) for r in rs]


def test_four_pipelined_clients_through_one_draft_each_get_the_target_output():
    """Pipelined streams from four clients drafted in shared steps; every output the target's own."""
    target, draft = tiny_pair()
    server = tiny_server(draft)
    runs = pipelined_clients(serving(server), target)
    assert all(r.output_ids == ref.output_ids for r, ref, _ in runs)
    assert all(r.tokens_without_draft == 0 and streamed > 0 for r, _, streamed in runs)
    assert sum(r.accepted_tokens for r, _, _ in runs) > 0 and max(server.batches) > 1
    assert not server.drafter.seqs


def test_a_client_forgotten_past_the_ttl_says_hello_again_and_drafts_on():
    """A target silent longer than the server's TTL is forgotten; its next round is refused 'send Hello first',
    and the client says Hello again (once) and re-opens its sequence under the next generation: no round is lost."""
    target, draft = tiny_pair()
    server = tiny_server(draft, ttl_s=1.0)
    addr = serving(server)
    c = DraftServerClient(addr, HELLO)
    t = c.open("s", [1, 2, 3, 4])
    first = c.rounds([(t, 0, [5], 3)])[0]
    assert not first.error and len(first.tokens) == 3
    time.sleep(2.5)                         # past the TTL and a sweep
    assert not server.drafter.seqs
    sent, send = [], c.client.send
    c.client.send = lambda msg, flags=0: (sent.append(type(msg).__name__), send(msg, flags))[1]
    again = c.rounds([(t, 1, [7], 3)])[0]
    assert not again.error and len(again.tokens) == 3
    assert t.reopened == 1 and t.gen == 1 and len(server.drafter.seqs) == 1
    assert sent.count("Hello") == 1                                    # said once, on the fresh socket
    c.close()


# ------------------------------------------------------------------ owners: connections, keys, quotas across sockets

def test_the_welcome_carries_the_limits_each_client_is_held_to():
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(sequences_per_client=3, k=5))
    me = server.dispatch(b"a", HELLO, time.time(), "p")[0]
    assert me.limits["sequences_per_client"] == 3 and me.limits["k"] == 5
    assert me.limits["sequences"] == me.sequences == server.drafter.dec.rows and me.limits["context"] == server.drafter.dec.capacity
    assert W.decode(W.encode(me)).limits == me.limits          # it survives the wire


def test_connections_are_bounded_and_a_silent_one_is_forgotten(capsys, monkeypatch):
    """Nothing is kept for a peer before its Hello; after it, one ClientState per connection, at most limits.clients of
    them (a full table makes room only by a client that holds no row: tests/test_server_shared.py), and a
    connection silent past the TTL is forgotten like any other."""
    import sdeth.wire.clients as ds
    monkeypatch.setattr(ds, "SWEEP_S", 0.0)
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(clients=2), ttl_s=0.2)
    for i in range(50):                                     # unwelcomed peers: refused, nothing stored
        assert server.dispatch(b"x%d" % i, W.Open("s", 0, [1]), time.time(), "p")[0].code == "version"
    assert not server.clients
    _welcomed(server, b"a"), _welcomed(server, b"b")
    for ident in (b"a", b"b"):                              # each holds a row: no room is made
        server.dispatch(ident, W.Open("s", 0, [1, 2]), time.time(), "p")
    third = server.dispatch(b"c", HELLO, time.time(), "10.0.0.3")[0]
    assert third.code == "limit" and third.message.startswith("clients:")
    assert "peer=10.0.0.3: refused (limit): Hello: clients:" in capsys.readouterr().out
    assert isinstance(server.dispatch(b"a", HELLO, time.time(), "p")[0], W.Welcome)    # a known one says it again
    time.sleep(0.3)
    server.clients.expire()
    assert not server.clients
    _welcomed(server, b"c")


def test_a_keys_quotas_count_across_its_connections():
    """Under CURVE the key is the owner: its connections share sequences_per_client, and it may hold at most
    clients_per_key connections; another key is counted apart."""
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(sequences_per_client=2, clients_per_key=2))
    a1, a2, b1 = "10.0.0.1 key=a", "10.0.0.9 key=a", "10.0.0.2 key=b"
    for ident, peer in ((b"1", a1), (b"2", a2), (b"3", b1)):
        assert isinstance(server.dispatch(ident, HELLO, time.time(), peer)[0], W.Welcome)
    third = server.dispatch(b"4", HELLO, time.time(), a1)[0]
    assert third.code == "limit" and third.message.startswith("clients_per_key: key a holds 2")
    server.dispatch(b"1", W.Open("s0", 0, [1, 2]), time.time(), a1)
    server.dispatch(b"2", W.Open("s1", 0, [1, 2]), time.time(), a2)
    out = server.dispatch(b"1", W.Open("s2", 0, [1, 2]), time.time(), a1)
    assert _rows(out)[0].error == "limit" and "sequences_per_client: this client key holds 2" in _rows(out)[0].message
    server.dispatch(b"1", W.Open("s0", 1, [1, 2, 3]), time.time(), a1)          # re-opening its own: no new one
    assert (b"1", "s0") in server.drafter.seqs and server.drafter.seqs[(b"1", "s0")].gen == 1
    for i in range(2):                                                          # b is counted apart
        assert not _rows(server.dispatch(b"3", W.Open(f"t{i}", 0, [1, 2]), time.time(), b1))
    assert sum(1 for ident, _ in server.drafter.seqs if ident == b"3") == 2


def test_the_shared_deployment_key_leaves_each_connection_its_own_quota():
    """The default key (`client`, every node of a deployment holds it) names no one client: its connections are
    counted apart, as on plain TCP; a Hello that fails the handshake is told why even when the server is full."""
    server = tiny_server(tiny_qwen3(0), limits=ServerLimits(sequences_per_client=1, clients_per_key=1, clients=2))
    p1, p2 = "10.0.0.1 key=client", "10.0.0.2 key=client"
    for ident, peer in ((b"1", p1), (b"2", p2)):
        assert isinstance(server.dispatch(ident, HELLO, time.time(), peer)[0], W.Welcome)
        assert not _rows(server.dispatch(ident, W.Open("s", 0, [1, 2]), time.time(), peer))
    assert len(server.drafter.seqs) == 2
    old = W.Hello(W.PROTOCOL_VERSION + 1, "target", "tiny", VOCAB, "sha", "float32")
    assert server.dispatch(b"3", old, time.time(), p1)[0].code == "version"
    assert server.dispatch(b"3", HELLO, time.time(), p1)[0].code == "limit"


def test_a_commits_that_comes_during_a_step_is_read_then_and_restarts_the_stream_in_the_next():
    """read_while_stepping: a draft step runs on a thread of its own while the loop takes messages off the socket.
    A stream's steps are slowed to 0.4 s; a Commits that rejects its drafted token is sent in the middle of one:
    the server reads it during that step (its receive time inside the step's span, and the timeline's read stamp
    with it), and the step right after drafts the new epoch's first token. The same with the setting off: read
    only after the step."""
    def run(read_while_stepping: bool):
        server = tiny_server(tiny_pair()[1], read_while_stepping=read_while_stepping)
        inner = server.drafter.stream_step

        def slow(seqs):
            time.sleep(0.4)                         # (sleeps as a device step does: the GIL released)
            return inner(seqs)
        server.drafter.stream_step = slow
        addr = f"tcp://127.0.0.1:{free_port()}"
        th = threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 6}, daemon=True)
        th.start()                                  # (joined below: a process that ends while a step thread runs
        time.sleep(0.3)                             # beside a daemon server thread aborts)
        c = DraftServerClient(addr, HELLO, timeout_s=10)
        c.client.send(W.Open("s", 0, [3, 1, 4, 1, 5], stream=True, window=4))
        c.client.send(W.Commits([W.CommitRow("s", 0, 0, 7)]))
        first = None                                # (a step may draft pos 0 before the first commit is read:
        while first is None:                        # that restart is epoch 1; take a token drafted after it)
            m = c.client.recv(10)
            rows = [r for r in (m.rows if isinstance(m, W.Streamed) else []) if r.pos >= 1]
            first = rows[0] if rows else None
        t_sent = time.time()
        time.sleep(0.15)                            # the next step is under way
        c.client.send(W.Commits([W.CommitRow("s", 0, first.pos, (first.token + 1) % VOCAB)]))
        while True:
            m = c.client.recv(10)
            rows = [r for r in (m.rows if isinstance(m, W.Streamed) else [])
                    if r.epoch == first.epoch + 1 and r.since == first.pos]
            if rows:
                break
        c.client.send(W.End("s"))
        c.close()
        th.join(10)
        return server, rows[0], m.stepped_at, t_sent
    server, row, stepped_at, t_sent = run(True)
    assert server.overlap.read >= 1 and row.read_at >= t_sent
    spans = list(server.overlap.spans)
    during = [(a, b) for a, b in spans if a <= row.read_at <= b]
    assert during, (row.read_at, spans[-4:])          # read while a step ran ...
    after = [a for a, _ in spans if a >= during[0][1]]
    assert after and stepped_at - after[0] < 0.6      # ... and drafted by the step right after it
    print(f"read {row.read_at - t_sent:.3f} s after the send, inside a step of "
          f"{during[0][1] - during[0][0]:.3f} s; its first new draft stepped at +{stepped_at - t_sent:.3f} s")
    off, *_ = run(False)
    assert off.overlap.read == 0 and off.overlap.take is None


def test_a_handle_measures_the_links_round_trip_when_it_connects():
    """connect() times bare Ping/Pongs once: the record's bare_rtt_ms and a stream's link (the step policy's
    observe_link), as the draft of one sequence measured them."""
    from sdeth.wire.draft_handles import ServerStream
    addr = serving(tiny_server(tiny_qwen3(0)), 20)
    h = ServerStream.connect(addr, HELLO, Sampling())
    try:
        assert h.bare_rtt_ms is not None and 0 < h.bare_rtt_ms < 1000 and h.link_ms == h.bare_rtt_ms
    finally:
        h.server.close()


def test_a_bf16_draft_on_a_gpu_gets_the_fused_kernels_unless_told_and_any_other_keeps_torchs():
    """fused_fast: the draft server's fast options where none are given (its step measured 15% shorter on an H100)."""
    from types import SimpleNamespace
    from sdeth.wire.draft_server import fused_fast

    def model(device: str, dtype):
        return SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device(device), dtype=dtype)]))
    assert fused_fast(model("cuda:0", torch.bfloat16)) == "kernels=auto"
    assert fused_fast(model("cuda:0", torch.float16)) is None and fused_fast(model("cpu", torch.bfloat16)) is None

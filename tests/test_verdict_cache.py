"""The draft server's verdict cache (runtime.verdictcache): branches for the likely verdicts on free rows, adopted
when the target's token was foreseen. Lossless (greedy identical to target-only, sampled chi-square), counted
(a foreseen verdict answered without a fresh draft step), never at a live stream's cost (a full server drafts no
branch), and rows never leak (a property test over random commits)."""
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from doubles import two_token_chi2
from sdeth.runtime.batchdraft import BatchDrafter
from sdeth.runtime.batchmodel import BatchDecoder
from sdeth.runtime.engine import Engine
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.runtime.pipeline import generate_pipelined
from sdeth.runtime.loop import generate_target_only
from sdeth.runtime.verdictcache import VerdictCache, VerdictSpec, fanouts
from sdeth.runtime.verify import Sampling
from sdeth.wire import protocol as W
from sdeth.wire.draft_client import DraftServerClient
from sdeth.wire.draft_handles import ServerStream
from test_draft_server import HELLO, VOCAB, _in_threads, serving, tiny_pair, tiny_server

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def drafter(draft, rows=6, cache="2x3x4"):
    d = BatchDrafter(BatchDecoder(FastDecoder(draft, 8), rows, 128), VOCAB, 16)
    return d, (VerdictCache(d, VerdictSpec.parse(cache)) if cache != "off" else None)


def stepped(d, vc, seq, n):
    """n stream steps of seq (and the cache's branches), planning branches after each."""
    while d.waiting():
        d.prefill()
    for _ in range(n):
        extra = vc.rows(d.dec.rows) if vc else []
        out = d.stream_step([seq] + extra)
        if vc:
            vc.took({id(s): o for s, o in zip([seq] + extra, out)})
            vc.plan([seq])


def test_spec_parse_and_geometric_fanout():
    assert VerdictSpec.parse("off") == VerdictSpec() and not VerdictSpec().on
    assert VerdictSpec.parse("on") == VerdictSpec(4, 4, 8)
    assert VerdictSpec.parse("3x5") == VerdictSpec(3, 5, 6)
    with pytest.raises(ValueError, match="FANOUT"):
        VerdictSpec.parse("2xq")
    assert fanouts(0.7, 4, 8, 6) == [4, 3, 1, 0, 0, 0]       # round(4 * 0.7^i), the budget's 8 in all
    assert fanouts(0.2, 4, 8, 3) == [4, 1, 0]
    # with the ranks' shares: the budget on the (position, rank) pairs of most alpha^i * share
    assert fanouts(0.7, 4, 8, 8, [0.1, 0.9, 0.0, 0.0, 0.0]) == [1] * 8      # corrections always the 2nd choice
    assert fanouts(0.7, 4, 8, 6, [0.15, 0.5, 0.2, 0.1, 0.05]) == [3, 2, 1, 1, 1, 0]
    assert fanouts(0.7, 4, 8, 3, [0.1, 0.5, 0.2, 0.1, 0.05]) == [3, 3, 2]   # (fewer positions: more at each)
    assert fanouts(0.7, 2, 8, 8, [0.1, 0.2, 0.6, 0.1]) == [2, 2, 2, 2, 0, 0, 0, 0]   # (shares made non-increasing)


def test_an_adopted_branch_drafts_what_a_restart_would():
    """Greedy: the rejection at position 2 with the draft's second choice there adopts that branch; the stream's
    chain then equals that of a drafter without the cache restarted at the same (position, token), token for
    token, and the new epoch began."""
    _, draft = tiny_pair()
    d, vc = drafter(draft)
    ref, _ = drafter(draft, cache="off")
    seqs = [x.open_stream(("c", "s"), 0, PROMPT, Sampling(), 1, 0, window=6) for x in (d, ref)]
    for x, s in zip((d, ref), seqs):
        x.commit(s, 0, 7)
    stepped(d, vc, seqs[0], 5)
    stepped(ref, None, seqs[1], 5)
    assert seqs[0].chain == seqs[1].chain
    alt = seqs[0].alts[2][0]
    assert alt != seqs[0].chain[2] and (2, alt) in vc.held[seqs[0]]
    b = vc.on_commit(seqs[0], 2, alt)
    assert b is not None and len(b.out) == 3 and seqs[0].epoch == 1
    assert vc.ranked[1] == 1 and sum(vc.ranked) == 1 and vc.shares()[1] > 0.5     # the correction's rank, learned
    assert ref.commit(seqs[1], 2, alt) and seqs[1].epoch == 1
    stepped(ref, None, seqs[1], 3)
    assert seqs[0].chain == seqs[1].chain[:len(seqs[0].chain)] and len(seqs[0].chain) == 6
    assert vc.stats["hits"] == 1 and vc.stats["foreseen_tokens"] == 3
    assert vc.stats["hits_by_rank"] == {"1": 1} and vc.stats["hits_at"] == {"1": 1}    # the 2nd choice, 1 past acked
    assert not vc.held.get(seqs[0]) and sorted(d.free_rows + [seqs[0].row]) == list(range(6))


def test_a_full_drafter_makes_no_branch():
    """Every row holds a live stream: plan makes nothing; a new stream takes a row a branch held (evicted)."""
    _, draft = tiny_pair()
    d, vc = drafter(draft, rows=2)
    a = d.open_stream(("c", "a"), 0, PROMPT, Sampling(), 1, 0, window=6)
    d.commit(a, 0, 7)
    stepped(d, vc, a, 4)
    assert vc.branches() and not d.free_rows                 # the one free row went to a branch
    b = d.open_stream(("c", "b"), 0, PROMPT, Sampling(), 2, 0, window=6)
    assert not vc.branches() and vc.stats["evicted"] == 1
    d.commit(b, 0, 7)
    stepped(d, vc, a, 3)
    assert vc.plan([a, b]) == 0 and not vc.branches() and vc.stats["branches"] == 1


def test_a_full_drafter_that_turns_a_stream_over_makes_no_branch(monkeypatch):
    """Every row live; one stream ends (End) and its client's next Open comes a step later: the row it gave back
    is held for that Open, so no branch is planted between them (a branch there could be hit by another
    stream's commit before the Open evicts it). A row nobody opens again is spare after HOLD_S."""
    import sdeth.runtime.verdictcache as vcm
    _, draft = tiny_pair()
    d, vc = drafter(draft, rows=2)
    a, b = (d.open_stream(("c", x), 0, PROMPT, Sampling(), i, 0, window=6) for i, x in enumerate("ab"))
    for s in (a, b):
        d.commit(s, 0, 7)
    stepped(d, vc, a, 3)
    assert not d.free_rows and not vc.branches()
    d.free(("c", "b"))                                      # End of b ...
    stepped(d, vc, a, 2)                                    # ... a step (and plan) before the next Open
    assert not vc.branches() and vc.spare() == 0 and vc.stats["branches"] == 0
    c = d.open_stream(("c", "c"), 0, PROMPT, Sampling(), 3, 0, window=6)   # ... which takes the held row
    assert not vc.given_back and not d.free_rows and vc.stats["evicted"] == 0
    d.free(("c", "c"))                                      # an End with no Open after it
    monkeypatch.setattr(vcm, "HOLD_S", 0.0)                 # (HOLD_S passed)
    stepped(d, vc, a, 1)
    assert vc.branches() and vc.stats["branches"] >= 1


def test_a_branch_drafts_no_further_than_its_streams_window():
    """A branch adopted on a hit sends its drafts as the stream's: never more than the window its Open asked for,
    whatever the cache's depth."""
    _, draft = tiny_pair()
    d, vc = drafter(draft, rows=6, cache="2x6x4")
    seq = d.open_stream(("c", "s"), 0, PROMPT, Sampling(), 1, 0, window=2)
    d.commit(seq, 0, 7)
    stepped(d, vc, seq, 8)
    assert vc.branches() and all(len(b.out) == 2 for b in vc.branches())


def test_a_failed_step_drops_its_branches_and_spares_their_streams():
    """A step that fails refuses and frees its live rows; a branch in it (it carries its stream's key) is dropped,
    and its stream, when not in the step, keeps its row and is not refused."""
    from sdeth.wire.draft_server import DraftServerConfig
    server = tiny_server(tiny_pair()[1], rows=6, capacity=128, verdict_cache="2x3x4")
    seq = server.drafter.open_stream((b"c", "s"), 0, PROMPT, Sampling(), 1, 0, window=6)
    server.drafter.commit(seq, 0, 7)
    stepped(server.drafter, server.verdicts, seq, 4)
    branches = [b.row for b in server.verdicts.branches()]
    assert branches and DraftServerConfig(6, 128, verdict_cache="2x3x4").check()
    server._fail(branches, "internal", "step", "a test's error")
    assert server.drafter.seqs[(b"c", "s")] is seq and not server.verdicts.branches()
    assert sorted(server.drafter.free_rows + [seq.row]) == list(range(6))


def test_a_branch_deeper_than_a_reply_is_sized_for_is_refused_at_the_start():
    from sdeth.wire.draft_server import DraftServerConfig, ServerLimits
    with pytest.raises(ValueError, match="--verdict-cache '2x8': a branch drafts 8 tokens.*--limit-k.*'2x4'"):
        DraftServerConfig(6, 128, verdict_cache="2x8", limits=ServerLimits(k=4)).check()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=25))
def test_rows_never_leak(ops):
    """Random steps, commits (settled as drafted, rejected with a foreseen token or another), ends and opens:
    each row is held by exactly one live stream, one branch, or free."""
    _, draft = _PAIR
    d, vc = drafter(draft, rows=5, cache="2x2x3")
    live = {}
    for who, what, arg in ops:
        key = ("c", str(who))
        seq = live.get(key)
        if seq is None or what == 3:
            if seq is not None and arg == 0:
                d.free(key)
                live.pop(key)
                continue
            seq = live[key] = d.open_stream(key, 0, PROMPT, Sampling(), who, 0, window=4)
            d.commit(seq, 0, 7)
        if what == 0:
            stepped(d, vc, seq, arg + 1)
        elif what in (1, 2) and len(seq.chain) > seq.acked:
            pos = seq.acked + min(arg, len(seq.chain) - seq.acked - 1)
            alts = seq.alts.get(pos, [])
            tok = (alts[0] if alts and what == 1 else seq.chain[pos] if what == 2 and arg == 0
                   else (seq.chain[pos] + 1) % VOCAB)
            if vc.on_commit(seq, pos, tok) is None:
                d.commit(seq, pos, tok)
        held = [s.row for s in d.seqs.values()] + [b.row.row for b in vc.branches()]
        assert sorted(held + d.free_rows) == list(range(5)), (held, d.free_rows)


_PAIR = tiny_pair()


def _pipelined_runs(addr, target, n_streams, prompts, s, max_tokens, seeds=None, k=3, branches=False):
    def run(i):
        c = DraftServerClient(addr, HELLO, timeout_s=30)
        eng, out = Engine(target, "t"), []
        stream = ServerStream(c, s, q_top=0, window=6, branches=branches)
        for j, p in enumerate(prompts):
            gen = torch.Generator().manual_seed(seeds[i][j]) if seeds else None
            out.append(generate_pipelined(eng, stream, p, max_tokens, k, s, None, gen=gen, draft_seed=j))
            c.end_seq(stream.seq)                # (Ended taken: a close at once would drop the End)
        c.close()
        return out
    return _in_threads(n_streams, run)


def test_four_clients_greedy_with_the_cache_on_give_the_target_output_and_hits_are_answered_at_once():
    """Four pipelined clients through one server with the cache on: each output is target-only's; some
    rejections were foreseen (hits), their drafts sent at once with the Commit's answer (a hit's foreseen
    tokens reach the client before any step after the commit)."""
    target, draft = tiny_pair()
    server = tiny_server(draft, rows=16, verdict_cache="4x4x8")
    addr = serving(server)
    prompts = [[5 + i, 6, 7, 8, 9, 10 + i] for i in range(3)]
    runs = _pipelined_runs(addr, target, 4, prompts, Sampling(), 40)
    eng = Engine(target, "ref")
    want = [generate_target_only(eng, p, 40, Sampling(), None).output_ids for p in prompts]
    assert all([r.output_ids for r in rs] == want for rs in runs)
    s = server.verdicts.summary()
    assert s["hits"] >= 1 and s["foreseen_tokens"] >= 1 and s["rows_stepped"] > 0, s    # (a branch adopted before
                                                                                        # its first step sends none)
    assert s["hit_rate"] is not None and s["hits"] + s["misses"] == sum(s["rejections_at"].values())
    time.sleep(0.5)
    assert not server.drafter.seqs and not server.verdicts.branches(), (server.drafter.seqs, s)   # every stream ended, branches freed
    assert sorted(server.drafter.free_rows) == list(range(16))


def test_a_foreseen_verdict_is_answered_without_a_draft_step():
    """A client's Commits that rejects a drafted token with the draft's second choice there: the server's
    immediate answer (dispatch, no step run) carries the branch's continuation in the new epoch."""
    _, draft = tiny_pair()
    server = tiny_server(draft, rows=8, verdict_cache="2x3x4")
    ident = b"c1"
    me = server.dispatch(ident, HELLO, time.time(), "tcp://127.0.0.1:1")
    assert isinstance(me[0], W.Welcome)
    server.dispatch(ident, W.Open("s", 0, PROMPT, stream=True, window=6, q_top=0), time.time(), "p")
    server.dispatch(ident, W.Commits([W.CommitRow("s", 0, 0, 7)]), time.time(), "p")
    for _ in range(8):
        server.scheduler.prefill()
        server.stream_step()
        server.scheduler.plan()
    seq = server.drafter.seqs[(ident, "s")]
    alt = seq.alts[1][0]
    steps = server.drafter.dec.steps
    out = server.dispatch(ident, W.Commits([W.CommitRow("s", 0, 1, alt)]), time.time(), "p")
    assert server.drafter.dec.steps == steps                         # no draft step ran
    m = out[0]
    assert isinstance(m, W.Streamed) and not m.missed and m.rows
    assert [r.pos for r in m.rows] == list(range(2, 2 + len(m.rows))) and all(r.epoch == 1 for r in m.rows)
    assert m.rows[0].since == 1 and server.verdicts.stats["hits"] == 1
    out = server.dispatch(ident, W.Commits([W.CommitRow("s", 0, 2, (m.rows[0].token + 1) % VOCAB)]), time.time(), "p")
    if out:                                      # a miss is told at once too (no branch there, or another token)
        assert out[0].missed == ["s"] and not out[0].rows


@pytest.mark.parametrize("branches", [False, True], ids=["answered", "sent-ahead"])
def test_four_clients_sampled_with_the_cache_on_reproduce_the_target_distribution(branches):
    """Sampled drafts (q on the wire) through the cache: branch tokens are drawn from q by a generator of the
    branch's own; the first two tokens' joint distribution is the target's (chi-square), four clients; the
    branches answered to a Commits, or sent ahead with their q (Open.branches)."""
    target, draft = tiny_pair()
    server = tiny_server(draft, rows=16, verdict_cache="3x3x6")
    addr = serving(server)
    s, n = Sampling(1.0, top_k=3, draft_sampled=True), 60
    prompt = [3, 1, 4, 1, 5]
    runs = _pipelined_runs(addr, target, 4, [prompt] * n, s, 3, seeds=[list(range(i * n, (i + 1) * n))
                                                                       for i in range(4)], branches=branches)
    counts = {}
    for r in (r for rs in runs for r in rs):
        counts[tuple(r.output_ids[:2])] = counts.get(tuple(r.output_ids[:2]), 0) + 1
    assert server.verdicts.stats["branches"] > 0
    assert two_token_chi2(Engine(target, "ref"), prompt, s, counts) > 1e-3


@pytest.mark.slow
def test_the_embedded_pair_through_the_cache_gives_the_target_only_output(pair, target_only_ref):
    """The embedded pair, four clients of two pipelined streams each, the server's verdict cache on: every output
    is target-only's, and the cache foresaw some rejections."""
    from conftest import REF
    from sdeth.study.runs import experiment
    from sdeth.wire.draft_server import DraftServerConfig, pair_server
    from test_server_streams import B, CLIENTS, _serving, _streams
    server = pair_server(pair, DraftServerConfig(CLIENTS * B * 3, 1024, verdict_cache="4x4x8"))
    addr = _serving(server)
    prompts = experiment.encode_prompts(experiment.RunConfig(mode="sd", **REF), pair.tokenizer)
    me = server.welcome
    hello = W.Hello(W.PROTOCOL_VERSION, "target", "t", pair.vocab_size, me.tokenizer_sha, me.dtype)
    runs = _streams(addr, hello, pair, prompts)
    assert [r.output_ids for r in runs] == [r["output_ids"] for r in target_only_ref["requests"]]
    s = server.verdicts.summary()
    print(s)
    assert s["branches"] > 0 and s["hits"] >= 1, s


def test_the_event_models_verdict_terms_follow_the_fanout_rule():
    """costmodel.verdict_terms: the positions the fan-out covers (the same rule as the cache), and the hit
    probability from the ranks' shares weighted by where first rejections fall; a hit costs no restart in the
    model, so more hits give more tokens per round."""
    from sdeth.costmodel import Costs, simulate_pipelined, verdict_terms
    shares = [0.0, 0.5, 0.2, 0.1, 0.05, 0.0, 0.0, 0.0]
    t = verdict_terms(0.7, 4, 4, 8, shares)
    assert t.forks == 5 and t.depth == 4                    # fanouts(0.7, 4, 8, 8, shares) = 3, 2, 1, 1, 1
    w = [0.7 ** i for i in range(5)]
    want = (w[0] * 0.8 + w[1] * 0.7 + (w[2] + w[3] + w[4]) * 0.5) / sum(w)
    assert abs(t.hit - want) < 1e-9
    assert verdict_terms(0.7, 1, 4, 1, shares) == (1, 4, 0.5, 1.0)
    c = Costs(0.02, 0.002, {m: 0.02 + 0.001 * m for m in range(2, 6)}, rtt=0.0004)
    plain = simulate_pipelined(0.7, c, 4, n_tokens=4000, policy="offered")
    cached = simulate_pipelined(0.7, c, 4, n_tokens=4000, policy="offered", cache=t)
    assert cached["tokens_per_round"] > plain["tokens_per_round"] and cached["cache_hit_rate"] > 0.5


def test_four_clients_greedy_with_branches_sent_ahead_give_the_target_output_and_take_hits_from_their_view():
    """Branches sent ahead (Open.branches): four pipelined clients through one server with the cache on; each output
    is target-only's, and foreseen rejections were taken from the branches the client already held (its view's
    hits), not only from the answer to its Commits."""
    target, draft = tiny_pair()
    server = tiny_server(draft, rows=16, verdict_cache="4x4x8")
    addr = serving(server)
    prompts = [[5 + i, 6, 7, 8, 9, 10 + i] for i in range(3)]
    got, view_hits = {}, [0]
    orig = ServerStream.start

    def start(self, *a, **kw):                 # (each sequence's view hits, read before the next one resets it)
        view_hits[0] += self.view.hits if id(self) in got else 0
        got[id(self)] = self
        return orig(self, *a, **kw)
    ServerStream.start = start
    try:
        runs = _pipelined_runs(addr, target, 4, prompts, Sampling(), 40, branches=True)
    finally:
        ServerStream.start = orig
    view_hits[0] += sum(st.view.hits for st in got.values())
    eng = Engine(target, "ref")
    want = [generate_target_only(eng, p, 40, Sampling(), None).output_ids for p in prompts]
    assert all([r.output_ids for r in rs] == want for rs in runs)
    s = server.verdicts.summary()
    assert s["hits"] >= 1 and view_hits[0] >= 1, (s, view_hits)     # hits the clients took from their views
    time.sleep(0.5)
    assert not server.drafter.seqs and not server.verdicts.branches()
    assert sorted(server.drafter.free_rows) == list(range(16))


def test_a_hit_on_a_branch_sent_ahead_is_verified_in_the_next_step_without_waiting():
    """An emulated target that asks for the branches ahead (synthetic ranks: the target's token is the draft's next
    choice 90% of the time a draft is rejected) and never waits (policy 'offered'): after a hit, its very next step
    has the branch's drafts on offer, and no step waited for an answer."""
    from doubles import tiny_qwen3
    from sdeth.study import streambench as sb
    from sdeth.wire.draft_server import DraftServerConfig, ServerLimits, build_server
    server = build_server(FastDecoder(tiny_qwen3(0), 8), sb.welcome("tiny", 300, 32),
                          DraftServerConfig(32, 256, ttl_s=30, prefill_chunk=64, verdict_cache="4x4x8",
                                            limits=ServerLimits(reserve=0)))
    addr = serving(server)
    tv = {m: 12.0 + m for m in range(sb.PIPELINED_K + 1)}
    cmd = dict(mode="pipelined", addr=addr, B=1, k=sb.PIPELINED_K, tv_ms=tv, alpha=0.6, seed=7, vocab=300,
               window=sb.PIPELINED_WINDOW, prompt=8, context=120, ranks="synthetic:0.9", watch=8, foreseen=True,
               ahead=True, policy="offered")
    with sb.Targets(2) as pool:
        _, recs, _ = pool.point(2, cmd, 3.0)
    assert all("error" not in r for r in recs), recs
    hits = sum(r["hits"] for r in recs)
    offered = [x for r in recs for x in r["hit_offered"]]
    assert hits >= 5 and offered, (hits, [r["misses"] for r in recs])
    assert sum(x > 0 for x in offered) >= 0.8 * len(offered), offered       # the branch's drafts, at once
    assert max(x for r in recs for x in r["wait_ms"]) < 1.0 and not any(r["answer_ms"] for r in recs)


def test_a_branch_row_is_never_moved_down_before_a_step():
    """A branch lives a few steps: when a lower row frees, the next step leaves the branches where they are (moving
    one copies its whole context for a row or two saved)."""
    _, draft = tiny_pair()
    d, vc = drafter(draft, rows=6, cache="2x3x4")
    a = d.open_stream(("c", "a"), 0, PROMPT, Sampling(), 1, 0, window=6)
    d.commit(a, 0, 7)
    stepped(d, vc, a, 3)
    low = min(vc.branches(), key=lambda b: b.row.row)
    vc.discard([low.row])                                # the lowest branch row is free now
    rows = {id(b): b.row.row for b in vc.branches()}
    assert rows and max(rows.values()) > low.row.row
    moves = d.moves
    stepped(d, vc, a, 1)
    assert d.moves == moves
    assert all(b.row.row == rows[id(b)] for b in vc.branches() if id(b) in rows)


def test_the_stored_branch_calls_modelled_with_branches_placed_by_worth():
    """hitcurve.placed_lines over a stored call (geometric servers): each B=1 N=1 point with branches ahead, measured,
    then modelled with the rule it ran and with branches placed by worth; at a synthetic 0.9 (the correction is the
    draft's 2nd choice) placing by worth covers more positions and models faster at the 32B and the 72B."""
    import re

    from sdeth.study.streambench import hitcurve, ssd
    runs = {k: v for k, v in ssd.ssd_runs().items() if k.endswith("_19")}
    lines = hitcurve.placed_lines(runs)
    assert len(lines) == 6 and all("measured" in line and "modelled" in line for line in lines)
    for line in lines:
        geo, worth = (float(x) for x in re.findall(r"(?:geometric rule|by worth) ([\d.]+)x", line))
        if "Qwen3-8B" not in line:
            assert worth > geo * 1.03, line
    runs["bench_streams_ssd_19"] = {**runs["bench_streams_ssd_19"]}
    runs["bench_streams_ssd_19"]["ssd"] = {**runs["bench_streams_ssd_19"]["ssd"], "branch_plan": ssd.BRANCH_PLAN}
    assert hitcurve.placed_lines(runs) == []              # a call whose servers placed by worth: nothing to replay

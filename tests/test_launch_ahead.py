"""Stream steps launched ahead of their read (runtime.batchstreams, wire.stepahead): a step queued behind the one in
flight and fed its tokens on the device keeps only tokens the draft would have drafted, whatever commits come
between a launch and its read; through the server, pipelined clients get the target's output with drafts accepted."""
import random

import pytest
import torch

from doubles import tiny_qwen3
from sdeth.runtime.batchdraft import BatchDrafter
from sdeth.runtime.batchmodel import BatchDecoder
from sdeth.runtime.batchseq import CATCH_UP
from sdeth.runtime.fastmodel import FastDecoder
from sdeth.runtime.verify import Sampling
from test_draft_server import VOCAB, pipelined_clients, serving, tiny_pair, tiny_server


def _greedy(model, ctx: list[int]) -> tuple[int, float]:
    """The draft's greedy token after ctx, and the margin to its runner-up."""
    with torch.no_grad():
        logits = model(torch.tensor([ctx], device=model.device)).logits[0, -1]
    top = logits.topk(2)
    return int(top.indices[0]), float(top.values[0] - top.values[1])


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("seed,device", [(0, "cpu"), (1, "cpu"), (2, "cpu"), pytest.param(3, "cuda", marks=CUDA)])
def test_a_step_launched_ahead_keeps_only_what_the_draft_drafts_whatever_commits_come_between(seed, device):
    """Three streams under a random script of launches (each behind the step in flight, fed its tokens on the
    device), reads, commits that agree, restart, or extend the chain past the step in flight, prefills and an End:
    every token a read keeps is the draft's greedy token after the stream's context at its position, the chains
    follow the commits, and no step is left in flight. On a GPU the launches are queued for real (graphs)."""
    model = tiny_qwen3(0).to(device)
    bd = BatchDrafter(BatchDecoder(FastDecoder(model, 8), rows=4, capacity=200), VOCAB, chunk=4)
    rnd = random.Random(seed)
    prompts = [list(range(5, 14 + CATCH_UP)), [3, 1, 4], [2, 7, 1, 8, 2, 8]]     # (the first prefilled)
    seqs, drafted = [], []
    for i, p in enumerate(prompts):
        seqs.append(bd.open_stream(("c", str(i)), 0, p, Sampling(), 0, 0, window=6))
        bd.commit(seqs[-1], 0, 42 + i)
        drafted.append(set())
    prev, kept_total, restarts = None, 0, 0
    for op in range(120):
        if op == 80:                                   # a stream ended while its step may be in flight
            bd.free(seqs[2].key)
        r = rnd.random()
        live = [s for s in seqs if bd.holds(s)]
        if r < 0.6:
            while bd.prefill():
                pass
            rows = [s for s in live if s.room and s.ready and s.next_n + 1 < 190]
            nxt = bd.launch_streams(rows, prev) if rows else None
            if prev is not None:
                for seq, pos, d in bd.settle_streams(prev):
                    drafted[seqs.index(seq)].add(pos)
                    kept_total += 1
            prev = nxt
        else:
            seq = rnd.choice(live)
            i = seqs.index(seq)
            if seq.acked < len(seq.chain) and rnd.random() < 0.85:    # the next position the target verified
                pos, agree = seq.acked, rnd.random() < 0.75
            else:                                                      # the target ran past the chain
                pos, agree = len(seq.chain), False
            tok = seq.chain[pos] if agree else rnd.randrange(VOCAB)
            restarts += bd.commit(seq, pos, tok)
            drafted[i] = {p for p in drafted[i] if p < pos or p == pos and agree}
        for s, d in zip(seqs, drafted):
            base = prompts[seqs.index(s)]
            for p in sorted(x for x in d if x < len(s.chain)):
                want, margin = _greedy(model, base + s.chain[:p])
                if margin > 1e-3:
                    assert s.chain[p] == want, (seed, op, p, s.chain)
    if prev is not None:
        bd.settle_streams(prev)

    assert kept_total > 30 and restarts > 3
    assert all(s.flight is None for s in seqs if bd.holds(s))
    assert sorted(bd.free_rows + [s.row for s in bd.seqs.values()]) == list(range(4))


@pytest.mark.parametrize("launch_ahead", ["on", "off"])
def test_pipelined_clients_through_a_server_launching_ahead_get_the_target_output(launch_ahead):
    """Four pipelined clients through one server with its stream steps launched ahead (forced on a CPU, where a
    launch computes at once and each step's tokens go out with the next launch): every output is the target's
    own and drafts are accepted; the server launched ahead (or not, with it off)."""
    target, draft = tiny_pair()
    server = tiny_server(draft, launch_ahead=launch_ahead)
    runs = pipelined_clients(serving(server), target)
    assert all(r.output_ids == ref.output_ids for r, ref, _ in runs)
    assert all(streamed > 0 for _, _, streamed in runs)
    assert sum(r.accepted_tokens for r, _, _ in runs) > 0
    assert (server.ahead is not None and server.ahead.launched > 0) == (launch_ahead == "on")
    assert not server.drafter.seqs


def test_the_floor_goals_read_the_launched_ahead_points_beside_inline():
    """ahead.goal_lines: the period at B=1 against the device step, the restart in periods, each speed goal from the
    launched-ahead points (the server's default), the inline figure beside it; a goal missed says so."""
    from sdeth.study.streambench import ahead

    def point(spec, speedup, period, p99):
        return {"tpot_ms": {"mean": 1.0}, "target": "Qwen3-8B", "B": 1, "N": 1, "step_policy": "policy",
                "verdict_cache": {"spec": spec}, "speedup": speedup,
                "speedup_interval": [speedup - 0.05, speedup + 0.05],
                "server_period_ms_p50": period, "draft_ms_p50": 2.0, "server_batch": {"mean": 1.0},
                "restart_periods": {"p50_less_transit": 1.3, "p99": p99}}
    pts = [point("off", 1.45, 2.1, 2.5), point("off+inline", 1.2, 2.6, 2.0)]
    runs = {"c": {"ssd": {"caches": ["off", "off+inline"], "points": pts}}}
    lines = ahead.goal_lines(runs)
    assert "+0.10-0.10 ms (goal <= +0.2: met at 1 of 1 points)" in lines[0]
    assert "met at 1 of 1 points" in lines[1]
    assert "1.45" in lines[2] and "1.2 inline [policy]" in lines[2] and "(goal >= 1.4: met)" in lines[2]
    runs["c"]["ssd"]["points"][0].update(server_period_ms_p50=2.5, speedup=1.3)
    lines = ahead.goal_lines(runs)
    assert "met at 0 of 1 points" in lines[0] and "(goal >= 1.4: missed)" in lines[2]
    table = ahead.ahead_table(runs)
    assert list(table["steps"]) == ["inline", "launched ahead"]


@pytest.mark.parametrize("device,pad", [("cpu", False), ("cpu", True), pytest.param("cuda", True, marks=CUDA)])
def test_a_prompt_chunk_fills_its_row_as_the_eager_forward_does_padded_or_in_a_graph(device, pad):
    """BatchDecoder.prefill (padded to a graph width; on a GPU a graph replayed for any row) writes into its row the
    keys and values the eager forward writes, and nothing into the other rows."""
    model = tiny_qwen3(0).to(device)
    a, b = (BatchDecoder(FastDecoder(model, 8), rows=4, capacity=200) for _ in range(2))
    a.pad_prefill = pad
    rnd = random.Random(0)
    for row, n, cut in ((2, 37, 20), (1, 30, 17)):
        ids = [rnd.randrange(VOCAB) for _ in range(n)]
        for lo, hi in ((0, cut), (cut, n)):
            a.prefill(ids[lo:hi], lo, row)
            pos = torch.arange(lo, hi, device=device)[None]
            b.forward(torch.tensor([ids[lo:hi]], device=device), pos, pos, row0=row)
    torch.testing.assert_close(a.kv[..., :200, :], b.kv[..., :200, :], rtol=1e-4, atol=1e-4)
    assert not a.kv[:, :, [0, 3], :, :200].any()
    assert (sum(k[0] == "prefill" for k in a.graphs) == 2) == (device == "cuda")


@pytest.mark.parametrize("rows", [4, 8])
def test_beside_a_verdict_cache_steps_launch_ahead_only_while_no_branch_can_be_held(rows):
    """A server with a verdict cache and steps launched ahead: four pipelined clients on a full server (4 rows, no
    spare row for a branch) step launched ahead; with spare rows (8) branches are planted and step inline. No branch
    is ever planted while a step is in flight, and every output is the target's own either way."""
    target, draft = tiny_pair()
    server = tiny_server(draft, rows=rows, launch_ahead="on", verdict_cache="on")
    plan, in_flight = server.scheduler.plan, []

    def plan_checked():
        in_flight.append(server.ahead.flight is not None)
        plan()
    server.scheduler.plan = plan_checked
    runs = pipelined_clients(serving(server), target)
    assert all(r.output_ids == ref.output_ids for r, ref, _ in runs)
    assert in_flight and not any(in_flight)
    if rows == 4:
        assert server.ahead.launched > 0
    else:
        assert server.verdicts.stats["branches"] > 0 and server.verdicts.stats["rows_stepped"] > 0
    assert not server.drafter.seqs


def test_the_floor_calls_are_read_against_the_model_of_their_batches_and_restarts():
    """floormodel: the step policy against the better corner less its interval; each point against the event model
    fed its components (its B streams in one batch; the transit its measured restart implies where that is longer
    than the Commit's), a point outside 10% named with what differs; each speed goal beside what the model allows."""
    from sdeth.study.streambench import floormodel
    from sdeth.study.streambench.remote import model_one_way_ms

    def point(policy, speedup, tokens, held=0):
        return {"tpot_ms": {"mean": 1.0}, "target": "Qwen3-8B", "B": 1, "N": 1, "step_policy": policy, "alpha": 0.71,
                "verdict_cache": {"spec": "off"}, "speedup": speedup,
                "speedup_interval": [speedup - 0.05, speedup + 0.05], "tokens_per_step": tokens, "steps": 100,
                "emulation": {"held_commits": held}, "offered_mean": 1.0, "draft_ms_mean": 2.2,
                "server_period_ms_p25": 2.3, "server_period_ms_p50": 2.3,
                "timeline_ms": {"sent_to_read": {"p50": 0.2}, "sent_to_arrived": {"p50": 3.6}}}
    pts = [point("offered", 1.25, 1.3), point("sync", 0.9, 2.8), point("policy", 1.22, 1.3)]
    run = {"call": 7, "ssd": {"k": 4, "points": pts}}
    assert model_one_way_ms(pts[0]) == 0.2                       # a restart of 3.6 ms at a 2.3 ms period: 0.15 ms
    pts[0]["timeline_ms"]["sent_to_arrived"]["p50"] = 5.0        # ... of 5.0 ms: a link of 1.55 ms, half each way
    assert abs(model_one_way_ms(pts[0]) - 0.775) < 1e-9
    assert list(floormodel.three_policy_calls({"c": run, "d": {"ssd": {"points": pts[:2]}}})) == ["c"]
    assert "at 1 of 1 points" in floormodel.policy_line("c", run)
    pts[2]["speedup"] = 1.1
    assert "at 0 of 1 points; short: Qwen3-8B B=1 N=1: 1.1 against offered 1.25" in floormodel.policy_line("c", run)
    line = floormodel.model_line("c", run)
    assert "at 3 of 3 points" in line, line
    pts[2].update(tokens_per_step=0.9, steps=10, emulation={"held_commits": 50})
    line = floormodel.model_line("c", run)
    assert "at 2 of 3 points; outside: Qwen3-8B B=1 N=1 policy" in line and "50 commits held" in line, line
    pts[2]["emulation"]["held_commits"] = 0                     # no hold: the wait is named, drafts against the model's
    assert "drafts verified a step 1.00 against the model's" in floormodel.model_line("c", run)
    line = floormodel.goal_line("c", run, "Qwen3-8B", 1, 1, 1.4)
    assert "1.25 measured [offered] (goal >= 1.4: missed)" in line and "beyond what they allow" in line, line
    assert "within what they allow" in floormodel.goal_line("c", run, "Qwen3-8B", 1, 1, 1.0)
    assert floormodel.goal_line("c", run, "Qwen3-32B", 1, 4, 2.0) is None

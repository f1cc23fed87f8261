"""Pipelined streams through one draft server keep drafts on offer: the embedded pair, four clients of two
streams each, against target-only and against the event model (costmodel.simulate_pipelined) fed the steps
measured in the same run."""
import threading
import time

import pytest

from sdeth.costmodel import Costs, simulate_pipelined
from sdeth.runtime.pipeline import generate_pipelined
from sdeth.runtime.verify import Sampling
from sdeth.wire import protocol as W
from sdeth.wire.draft_client import DraftServerClient
from sdeth.wire.draft_handles import ServerStream
from sdeth.wire.draft_server import DraftServer

CLIENTS, B, K = 4, 2, 4


def _serving(server: DraftServer) -> str:
    from sdeth.place.testbed import free_port
    addr = f"tcp://127.0.0.1:{free_port()}"
    threading.Thread(target=server.serve, args=(addr,), kwargs={"max_seconds": 300}, daemon=True).start()
    time.sleep(0.3)
    return addr


def _streams(addr, hello, pair, prompts) -> list:
    """CLIENTS x B streams at once, each a pipelined target loop of its own (its engine, its connection)."""
    from sdeth.runtime import make_engine
    out, errs = {}, []

    def run(i):
        try:
            c = DraftServerClient(addr, hello, timeout_s=30)
            eng = make_engine(pair.target, "target", "target", vocab=pair.vocab_size)
            st = ServerStream(c, window=8)
            out[i] = generate_pipelined(eng, st, prompts[i][1], 32, K, Sampling(), pair.tokenizer.eos_token_id)
            c.close()
        except Exception as e:        # surfaced below
            errs.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS * B)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    return [out[i] for i in range(CLIENTS * B)]


def model_range(alpha: float, verify_s: float, step_s: float, rtt_s: float,
                period_s: float | None = None) -> tuple[float, float]:
    """The event model's drafts verified per round over the measured costs' spread on a shared CPU: the draft's
    period from its device step to 2.5 times it (host work between steps), or to 1.25 times the server's measured
    period (start to start) where a loaded host stretched it further; the verify from 0.8 to 1.25 times its mean.
    The model plays the loop's own step policy (costmodel.StepPolicy)."""
    def verified(v, period):
        c = Costs(v, step_s, {m: v for m in range(2, K + 2)}, rtt=rtt_s, draft_period=period)
        return simulate_pipelined(alpha, c, K, n_tokens=4000, policy="policy")["verified_per_round"]   # the loop's
    return verified(0.8 * verify_s, max(2.5 * step_s, 1.25 * (period_s or 0))), verified(1.25 * verify_s, step_s)


@pytest.mark.slow
def test_four_pipelined_clients_of_two_streams_keep_drafts_on_offer(pair, target_only_ref):
    from conftest import REF
    from sdeth.study.runs import experiment
    from sdeth.wire.draft_server import DraftServerConfig, pair_server
    server = pair_server(pair, DraftServerConfig(CLIENTS * B, 1024))
    me = server.welcome
    addr = _serving(server)
    prompts = experiment.encode_prompts(experiment.RunConfig(mode="sd", **REF), pair.tokenizer)
    hello = W.Hello(W.PROTOCOL_VERSION, "target", "t", pair.vocab_size, me.tokenizer_sha, me.dtype)
    runs = _streams(addr, hello, pair, prompts)
    assert [r.output_ids for r in runs] == [r["output_ids"] for r in target_only_ref["requests"]]
    assert all(r.tokens_without_draft == 0 for r in runs)
    assert max(server.batches) > B                    # streams of several clients shared a step
    assert not server.drafter.seqs                          # every stream ended
    rounds = sum(r.rounds for r in runs)
    verified = sum(sum(r.k_trace) for r in runs) / rounds
    accepted = sum(r.accepted_tokens for r in runs)
    alpha = accepted / (accepted + sum(r.rejections for r in runs))
    step_s = server.drafter.dec.clock.seconds / server.drafter.dec.steps
    rtt = [r.link_rtt_ms for r in runs if r.link_rtt_ms]
    starts = [a for a, _ in server.overlap.spans]       # the server's steps, start to start (a loaded host stretches
    gaps = sorted(b - a for a, b in zip(starts, starts[1:]))   # the period past any multiple of the device step)
    period = gaps[len(gaps) // 2] if gaps else None
    lo, hi = model_range(alpha, sum(r.verify_s for r in runs) / rounds, step_s, (min(rtt) if rtt else 0.3) / 1e3,
                         period)
    print(f"verified/round {verified:.2f} model [{lo:.2f}, {hi:.2f}] alpha {alpha:.2f} step {step_s * 1e3:.2f} ms "
          f"period {period * 1e3 if period else float('nan'):.2f} ms "
          f"verify {sum(r.verify_s for r in runs) / rounds * 1e3:.2f} ms rows max {max(server.batches)}")
    assert verified >= 0.5, f"{verified:.2f} drafts verified per round: the streams got few drafts"
    assert 0.85 * lo <= verified <= 1.15 * hi, (verified, lo, hi, alpha, step_s)

"""SD over a real link: the two-node testbed (namespaces + veth as root, else loopback), the wire
protocol's faults, and the target-only fallback when the draft dies."""
import os
import re
import threading
from dataclasses import replace
import time

import psutil
import pytest

from sdeth.study.runs import experiment
from sdeth.wire import protocol as W
from sdeth.study.runs.experiment import RunConfig
from sdeth.place.testbed import Testbed, free_port, leftovers
from sdeth.wire.transport import Client
from sdeth.wire.draft_client import DraftServerClient
from sdeth.wire.draft_handles import ServerDraft
from sdeth.wire.draft_server import DraftServerConfig, serve_draft_server
from sdeth.runtime.loop import DraftUnavailable
from sdeth.runtime.verify import Sampling
from conftest import REF, ref_outputs

pytestmark = pytest.mark.slow
MAX_TOKENS = REF["max_tokens"]


def test_greedy_sd_over_the_link_is_identical_to_target_only(pair, target_only_ref):
    eth = experiment.run(RunConfig(mode="sd", k=3, placement="ethernet", rtt_ms=1.0, **REF), pair, progress=False)
    assert [r["output_ids"] for r in eth["requests"]] == [r["output_ids"] for r in target_only_ref["requests"]]
    s = eth["summary"]
    assert s["tokens_without_draft"] == 0 and s["draft_acceptance_rate"] > 0.05
    assert 0 < s["bytes_per_round"] < 200          # token ids only, greedy draft
    assert s["wire_ms_per_round"] >= 0.9           # the injected 1 ms round trip is on the path
    assert eth["testbed"]["kind"].startswith("netns" if experiment.hardware.os.geteuid() == 0 else "loopback")
    assert not leftovers(os.getpid())


def test_draft_killed_mid_request_finishes_on_the_target(pair):
    cfg = RunConfig(mode="sd", k=3, placement="ethernet", prompts="sharegpt:2", max_tokens=48)
    reqs, _ = experiment.run_requests(cfg, experiment.encode_prompts(cfg, pair.tokenizer), draft_die_after=3,
                                       draft_timeout_s=2.0)
    base = experiment.run(RunConfig(mode="target-only", prompts="sharegpt:2", max_tokens=48), pair, progress=False)
    assert [r["output_ids"] for r in reqs] == [r["output_ids"] for r in base["requests"]]
    # the worker exits right after its 3rd reply, which may or may not get out first
    assert 2 <= reqs[0]["rounds"] <= 3 and reqs[0]["tokens_without_draft"] > 0
    assert reqs[1]["rounds"] == 0 and reqs[1]["tokens_without_draft"] > 0    # the draft stays gone
    assert not leftovers(os.getpid())


def test_pipelined_over_the_link_is_identical_at_rtt_0_and_5(pair, target_only_ref):
    """One testbed, its relay re-set between round trips (set_delay); the fixed policy (verify what
    the draft streamed) exercises acceptance, corrections, kept and dropped run-ahead on every round."""
    ref = [r["output_ids"] for r in target_only_ref["requests"]]
    with Testbed(relay=True) as tb:
        for rtt in (0.0, 5.0):
            tb.set_delay(rtt / 2, rtt / 2)
            cfg = RunConfig(mode="pipelined", k=3, adaptive=False, placement="ethernet", rtt_ms=rtt, **REF)
            res = experiment.run(cfg, pair, progress=False, on_testbed=tb)
            assert [r["output_ids"] for r in res["requests"]] == ref, rtt
            s = res["summary"]
            assert s["tokens_without_draft"] == 0 and s["plain_steps"] == 0
            assert s["drafts"] if "drafts" in s else s["draft_acceptance_rate"] > 0.05
            assert s["drafted_tokens"] >= sum(r["draft_tokens"] for r in res["requests"])
            if rtt:
                assert s["costs"]["rtt"] > 0.004           # the round trip the target measured
            assert 0.8 < s["predicted_over_measured"] < 1.25, s["predicted_over_measured"]   # the event model
    assert not leftovers(os.getpid())


def test_branches_ahead_from_a_draft_server_on_the_real_pair_are_identical_and_hit(pair):
    """The target worker with a draft server over the link (the embedded pair, fast decoder, 2 ms round trip):
    a pipelined request with the cache on asks for the server's verdict-cache branches ahead; greedy output equals
    target-only's, branch tokens come apart from the stream's own drafts, and some rejections are served by a
    branch already at the target. A server without the cache: the request decodes without, and says why."""
    common = dict(prompts="sharegpt:4", max_tokens=MAX_TOKENS, impl="fast")
    base = [r["output_ids"] for r in experiment.run(RunConfig(mode="target-only", **common), pair,
                                                    progress=False)["requests"]]
    cfg = RunConfig(mode="pipelined", k=4, placement="ethernet", rtt_ms=2.0, cache="on", **common)
    prompts = experiment.encode_prompts(cfg, pair.tokenizer)
    reqs, _ = experiment.run_requests(cfg, prompts, draft_server=True, verdict_cache="on")
    assert [r["output_ids"] for r in reqs] == base
    assert all(r["cache"] == "ahead" and r["cache_choice"].startswith("on: ") for r in reqs)
    assert all(r["tokens_without_draft"] == 0 and r["drafted"] > 0 for r in reqs)
    assert sum(r["branch_tokens"] for r in reqs) > 0
    assert 0 < sum(r["cache_hits"] for r in reqs) < sum(r["stream_restarts"] for r in reqs)
    plain, _ = experiment.run_requests(cfg, prompts[:1], draft_server=True)
    assert [r["output_ids"] for r in plain] == base[:1]
    assert plain[0]["cache"] == "off" and "--verdict-cache on" in plain[0]["cache_choice"]
    assert plain[0]["branch_tokens"] == 0 and plain[0]["cache_hits"] == 0
    assert not leftovers(os.getpid())


def test_a_run_that_asks_for_branches_gets_the_batched_server():
    """`--cache on` (pipelined, fast decoder, real acceptance) starts the batched draft server with its verdict cache;
    any other run the draft of one row over its engine; a caller that picks the draft's role keeps it."""
    def role(cfg, **kw):
        tb = experiment.testbed_for(cfg, **kw)
        tb.close()                                   # (nothing was started: its temporary directory goes)
        return tb.describe()["draft_role"], tb.verdict_cache
    pipe = dict(mode="pipelined", placement="ethernet", impl="fast")
    assert role(RunConfig(**pipe, cache="on")) == ("draft-server", "on")
    assert role(RunConfig(**pipe, cache="auto")) == ("draft", "off")
    assert role(RunConfig(**pipe, cache="on", synthetic_alpha=0.6)) == ("draft", "off")
    assert role(RunConfig(mode="sd", placement="ethernet")) == ("draft", "off")
    assert role(RunConfig(**pipe, cache="on"), draft_server=True) == ("draft-server", "off")


@pytest.mark.parametrize("rtt", [0.0, 5.0])
def test_pipelined_draft_killed_mid_request_finishes_on_the_target(pair, target_only_ref, rtt):
    cfg = RunConfig(mode="pipelined", k=3, adaptive=False, placement="ethernet", prompts="sharegpt:2",
                    max_tokens=MAX_TOKENS, rtt_ms=rtt)
    reqs, _ = experiment.run_requests(cfg, experiment.encode_prompts(cfg, pair.tokenizer), draft_die_after=12,
                                       draft_timeout_s=2.0)
    assert [r["output_ids"] for r in reqs] == [r["output_ids"] for r in target_only_ref["requests"][:2]]
    assert reqs[0]["rounds"] >= 1 and reqs[0]["tokens_without_draft"] > 0
    assert reqs[1]["rounds"] == 0 and reqs[1]["tokens_without_draft"] == MAX_TOKENS - 1
    assert not leftovers(os.getpid())


@pytest.fixture(scope="module")
def draft_server(pair):
    """`worker --role draft` in a thread: the draft server of one row over the run configuration's engine."""
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    t = threading.Thread(target=serve_draft_server, args=(addr, pair, DraftServerConfig()),
                         kwargs={"max_seconds": 120, "engine_opts": {}}, daemon=True)
    t.start()
    time.sleep(0.5)
    yield addr, port


def _hello(pair, **kw):
    from sdeth.models import tokenizer_hash
    h = dict(proto=W.PROTOCOL_VERSION, role="target", model_id="t", vocab_size=49152,
             tokenizer_sha=tokenizer_hash(pair.tokenizer), dtype="float32")
    return W.Hello(**{**h, **kw})


def test_worker_binds_only_the_address_it_is_given(draft_server):
    _, port = draft_server
    listening = [c.laddr.ip for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                 and c.status == psutil.CONN_LISTEN]
    assert listening == ["127.0.0.1"]


def test_bad_messages_get_error_replies_and_the_worker_keeps_serving(pair, draft_server):
    addr, _ = draft_server
    c = Client(addr, timeout_s=10)
    assert isinstance(reply := c.call(W.Ping(1.0)), W.Pong) and reply.t1 >= reply.t0
    for raw, code in [(b"\x00garbage", "bad-message"), (W.encode(W.Ping(1.0))[:-3], "bad-message"),
                      (b"\x81" * (W.MAX_MESSAGE_BYTES + 1), "too-large")]:
        c.sock.send(raw)
        assert c.sock.poll(10000)
        err = W.decode(c.sock.recv())
        assert isinstance(err, W.Error) and err.code == code, err
    assert c.call(W.Rounds([W.Row("x", 0, 1, 0, [1], 3)])).code == "version"          # no handshake yet
    assert c.call(_hello(pair, proto=99)).code == "version"
    assert "49152" in c.call(_hello(pair, vocab_size=151936)).message   # names both vocab sizes
    assert c.call(_hello(pair, dtype="bfloat16")).code == "mismatch"
    assert isinstance(c.call(_hello(pair)), W.Welcome)
    row, = c.call(W.Rounds([W.Row("nope", 0, 1, 0, [1], 3)])).rows
    assert row.error == "desync" and "no such sequence" in row.message
    c.close()
    # and it still serves a real request
    d = ServerDraft(DraftServerClient(addr, _hello(pair), timeout_s=30), Sampling())
    d.start([1, 2, 3, 4], 32)
    toks, q = d.propose(0, 5, 3)
    assert len(toks) == 3 and q is None and d.compute_s > 0
    d.end()
    d.server.close()


def test_sampled_draft_sends_sparse_q(pair, draft_server):
    addr, _ = draft_server
    d = ServerDraft(DraftServerClient(addr, _hello(pair), timeout_s=30), Sampling(0.7, draft_sampled=True), q_top=16)
    d.start([1, 2, 3, 4], 32)
    toks, q = d.propose(0, 5, 2)
    assert q.shape == (2, 49152) and ((q > 0).sum(-1) <= 16).all()
    assert q.sum(-1).sub(1).abs().max() < 1e-4 and all(q[i, t] > 0 for i, t in enumerate(toks))
    d.end()
    d.server.close()


def test_unreachable_peers_fail_fast_with_the_address():
    addr = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.time()
    with pytest.raises(TimeoutError, match=addr):
        Client(addr, timeout_s=1.0).call(W.Ping(0.0))
    with pytest.raises(DraftUnavailable, match=addr):
        ServerDraft.connect(addr, W.Hello(1, "target", "t", 1, "x", "float32"), Sampling(), timeout_s=1.0)
    assert time.time() - t0 < 5


def test_testbed_leaves_nothing_behind_on_error():
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed(start_workers=False) as tb:
            tb.run_in("draft", ["-c", "import time; time.sleep(60)"], "sleeper")
            pid = tb.procs["sleeper"].pid
            raise RuntimeError("boom")
    assert not leftovers(os.getpid()) and not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_four_timestamp_maths():
    from sdeth.place.netprobe import analyse
    # true one-way 10 ms up, 30 ms down, server clock 100 ms ahead, 1 ms server time
    s = [{"t0": 0.0, "t1": 0.110, "t2": 0.111, "t3": 0.041, "connect_s": 0.0, "first_on_connection": False}]
    a = analyse(s, clock_offset_s=0.100)
    assert a["rtt_ms"]["p50"] == pytest.approx(40) and a["up_ms"]["p50"] == pytest.approx(10)
    assert a["down_ms"]["p50"] == pytest.approx(30)
    naive = analyse(s, clock_offset_s=0.0)        # unsynchronised clocks move delay between directions
    assert naive["up_ms"]["p50"] == pytest.approx(110) and naive["down_ms"]["p50"] == pytest.approx(-70)
    ntp = analyse(s, clock_offset_s=None)         # NTP assumes symmetry: rtt/2 each way
    assert ntp["up_ms"]["p50"] == pytest.approx(20) and ntp["down_ms"]["p50"] == pytest.approx(20)


def test_probe_recovers_an_injected_asymmetric_delay():
    from sdeth.place.testbed import LINK_SCENARIOS, probe_link
    five_twenty = [s for s in LINK_SCENARIOS if s[3] == (5.0, 20.0)]
    with Testbed(start_workers=False) as tb:
        row, = probe_link(tb, five_twenty, scale=0.5)
    assert row["true_offset"]["up_ms"]["p50"] == pytest.approx(5.0, abs=1.0)
    assert row["true_offset"]["down_ms"]["p50"] == pytest.approx(20.0, abs=1.0)
    assert row["ntp"]["up_ms"]["p50"] == pytest.approx(row["ntp"]["down_ms"]["p50"], abs=1.0)
    assert not leftovers(os.getpid())


# ------------------------------------------------------------------ sampled decoding over the link
def link_sampling_pvalue(mode: str, draft_sampled: bool, device: str = "cpu", n: int = 400) -> float:
    """Real workers (the random-tiny pair on `device`), one request per seed: chi-square of the first two
    tokens' joint distribution (temperature 1, top-k 3: 9 cells) against the target's own."""
    import torch
    from doubles import two_token_chi2
    from sdeth.models import random_model
    from sdeth.runtime.engine import Engine
    s, prompt = Sampling(1.0, top_k=3, draft_sampled=draft_sampled), [3, 1, 4, 1, 5]
    counts, rounds = {}, 0
    with Testbed("random-tiny", device=device, netns=False) as tb:
        client = Client(tb.target_addr, timeout_s=60)
        for i in range(n):
            r = client.call(W.Generate(f"r{i}", prompt, 3, mode, 2, False, s.temperature, s.top_p, s.top_k,
                                       s.draft_sampled, seed=i))
            assert isinstance(r, W.Generated), r
            key = tuple(r.record["output_ids"][:2])
            counts[key] = counts.get(key, 0) + 1
            rounds += r.record["rounds"]
        client.close()
    assert rounds == 0 if mode == "target-only" else rounds > n // 2     # the draft took part
    eng = Engine(random_model("tiny-4L", device, torch.float32, seed=0), "ref")   # the worker's weights
    return two_token_chi2(eng, prompt, s, counts)


@pytest.mark.parametrize("mode,draft_sampled", [("target-only", False), ("sd", True), ("pipelined", True)])
def test_sampled_decoding_over_the_link_reproduces_the_target(mode, draft_sampled):
    """Caught a real bug: the draft worker was re-seeded with 0 on every request, so a sampled draft's
    proposal was a fixed function of the context and the output distribution was biased."""
    assert link_sampling_pvalue(mode, draft_sampled) > 1e-3


COMES_BACK = RunConfig(mode="sd", k=3, placement="ethernet", prompts="sharegpt:3", max_tokens=16)


@pytest.fixture(scope="module")
def alone(pair):
    """COMES_BACK's requests target-only, colocated (outputs and times), once for both of its faults."""
    cfg = replace(COMES_BACK, mode="target-only", placement="colocated")
    return experiment.run(cfg, pair, progress=False)["requests"]


@pytest.mark.parametrize("fault", ["draft restarted", "link cut"])
def test_the_draft_comes_back(pair, alone, fault):
    """The draft goes away (its worker killed, or the link cut at the relay): requests decode alone, identical,
    and after the first none waits for the draft; when it is back, a request 2 s later uses it again."""
    cfg = COMES_BACK
    prompts = experiment.encode_prompts(cfg, pair.tokenizer)
    ref = [r["output_ids"] for r in alone]
    with experiment.testbed_for(cfg, relay=True, draft_timeout_s=5.0) as tb:
        reqs, _ = experiment.run_requests(cfg, prompts, tb)
        assert [r["output_ids"] for r in reqs] == ref and all(r["tokens_without_draft"] == 0 for r in reqs)
        tb.kill("draft" if fault == "draft restarted" else "relay")
        reqs, _ = experiment.run_requests(cfg, prompts, tb)
        assert [r["output_ids"] for r in reqs] == ref
        assert all(r["tokens_without_draft"] > 0 and r["fault_events"] for r in reqs)
        # no timeout per request: after the first (which met the death), each takes about a target-only request
        assert all(r["e2e_s"] < a["e2e_s"] + 1.5 for r, a in zip(reqs[1:], alone[1:])), [r["e2e_s"] for r in reqs]
        if fault == "draft restarted":
            tb.start_draft()
        else:
            tb._start_relay()
        time.sleep(2.0)
        reqs, _ = experiment.run_requests(cfg, prompts[:1], tb)
        assert reqs[0]["output_ids"] == ref[0]
        assert reqs[0]["tokens_without_draft"] == 0 and reqs[0]["rounds"] > 0, reqs[0]["draft_unavailable"]
        assert "draft down" in tb.log("target") or " down (" in tb.log("target")
    assert not leftovers(os.getpid())


def test_the_target_dies_mid_request(pair):
    """The target worker is killed during a pipelined request: the controller's error names it and its exit
    status at once; the draft frees the request's state; closing the testbed leaves nothing behind."""
    from sdeth.place.testbed import TestbedError
    cfg = RunConfig(mode="pipelined", k=3, placement="ethernet", prompts="sharegpt:1", max_tokens=400, max_len=4096)
    prompts = experiment.encode_prompts(cfg, pair.tokenizer)
    with experiment.testbed_for(cfg) as tb:
        pids = {name: p.pid for name, p in tb.procs.items()}
        threading.Timer(1.5, tb.kill, args=("target",)).start()
        t0 = time.time()
        with pytest.raises(TestbedError, match=r"target worker exited with status -9 during request"):
            experiment.run_requests(cfg, prompts, tb)
        assert time.time() - t0 < 5.0                        # at once, not after the request's timeout
        t_end = time.time() + 20
        while "freed 1 sequences" not in tb.log("draft") and time.time() < t_end:
            time.sleep(0.2)
        assert re.search(r"freed 1 sequences: (its connection closed|no word from the client)", tb.log("draft"))
        port = int(tb.draft_bind().rsplit(":", 1)[1])
    assert not leftovers(os.getpid())
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not [c for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
                and c.status == psutil.CONN_LISTEN]


@pytest.mark.parametrize("mode", ["pipelined"])     # the stream: the mode a lost message could derail
def test_a_bad_link_changes_speed_never_output(pair, target_only_ref, mode):
    """Jitter, stalls (200-600 ms), connection resets and a 2 s cut in mid-request, injected at the relay:
    greedy output equals target-only's in every case; each request records the faults it met, and the
    time lost against the same requests on a clean link is reported."""
    from sdeth.place.relay import LinkFaults
    cfg = RunConfig(mode=mode, k=3, placement="ethernet", prompts="sharegpt:2", max_tokens=24)
    prompts = experiment.encode_prompts(cfg, pair.tokenizer)
    ref = ref_outputs(target_only_ref, pair, cfg.prompts, cfg.max_tokens)       # target-only's output
    cases = {"jitter": LinkFaults(jitter_ms=2.0, seed=1), "stalls": LinkFaults(stall_every=0.5, stall_ms=(200, 600), seed=2),
             "resets": LinkFaults(reset_every=0.6, seed=3), "cut": LinkFaults(cut_at=0.3, cut_s=2.0, seed=4)}
    with experiment.testbed_for(cfg, relay=True, draft_timeout_s=3.0) as tb:
        clean, _ = experiment.run_requests(cfg, prompts, tb)
        assert [r["output_ids"] for r in clean] == ref
        lost = {}
        for name, faults in cases.items():
            tb.set_faults(faults)
            reqs, _ = experiment.run_requests(cfg, prompts, tb)
            assert [r["output_ids"] for r in reqs] == ref, name
            lost[name] = sum(r["e2e_s"] for r in reqs) - sum(r["e2e_s"] for r in clean)
            events = [e["event"] for r in reqs for e in r["fault_events"]]
            if name != "jitter":
                assert name.rstrip("s") in events, (name, events)
        print(f"{mode}: seconds lost to faults against a clean link: {lost}")
    assert not leftovers(os.getpid())

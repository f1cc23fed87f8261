"""The vLLM study's measurement (study.vllm.study, study.vllm.measurement) without vLLM: TPOT and TTFT from a scripted
stream, nearest-rank percentiles and their intervals, the spec-decode counters' change from /metrics pages, and the
results JSON of a run against a stand-in OpenAI server (streamed token ids, /metrics, /version)."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sdeth.study.vllm import study as S
from sdeth.study.vllm.baseline import SPEC_COUNTERS, scrape_spec_counters
from sdeth.study.vllm.measurement import (counters_delta, identical, percentile, point_figures, read_stream,
                                          request_timing, t_interval)


def sse(*chunks):
    """Server-sent events of a streamed completion: one chunk of token ids per event, then [DONE]."""
    return ([f"data: {json.dumps({'choices': [{'text': 'x', 'token_ids': c}]})}\n".encode() for c in chunks]
            + [b"\n", b"data: [DONE]\n"])


def test_tpot_and_ttft_from_a_scripted_stream_count_tokens_not_chunks():
    clock = iter([1.10, 1.30, 1.50, 2.10]).__next__      # arrival of each chunk that carries tokens
    ids, chunks = read_stream(sse([5], [6, 7, 8], [], [9], [10, 11]), clock)
    assert ids == [5, 6, 7, 8, 9, 10, 11] and chunks == [(1.10, 1), (1.30, 3), (1.50, 1), (2.10, 2)]
    t = request_timing(1.0, chunks)
    # 7 tokens: (t_last - t_first) / 6, not / 3 chunks; TTFT from the send
    assert t["tokens"] == 7 and t["ttft_ms"] == pytest.approx(100.0) and t["tpot_ms"] == pytest.approx(1000 / 6)
    assert request_timing(1.0, [(1.2, 1)])["tpot_ms"] is None
    assert request_timing(1.0, [])["ttft_ms"] is None


def test_percentiles_are_nearest_rank_and_the_p99_of_eight_is_the_largest():
    xs = list(range(1, 101))
    assert percentile(xs, 50) == 50 and percentile(xs, 99) == 99 and percentile(xs, 100) == 100
    assert percentile([3, 1, 2, 8, 5, 4, 7, 6], 99) == 8 and percentile([3, 1, 2, 8, 5, 4, 7, 6], 50) == 4
    assert percentile([None, 2.0], 50) == 2.0 and percentile([], 50) is None
    m = t_interval([10.0, 12.0, 14.0])
    assert m["mean"] == 12.0 and m["low"] == pytest.approx(12 - 4.3027 * 2 / 3 ** 0.5, rel=1e-4)
    assert t_interval([5.0]) == {"mean": 5.0, "low": 5.0, "high": 5.0, "n": 1}


def page(drafts, tokens, accepted, per, engines=1):
    """A /metrics page with the four spec-decode counters, split evenly over `engines` engines."""
    lines = ["# HELP vllm:spec_decode_num_drafts ...", "vllm:num_requests_running 3.0"]
    for e in range(engines):
        lines += [f'{SPEC_COUNTERS[0]}_total{{engine="{e}"}} {drafts / engines}',
                  f'{SPEC_COUNTERS[1]}_total{{engine="{e}"}} {tokens / engines}',
                  f'{SPEC_COUNTERS[2]}_total{{engine="{e}"}} {accepted / engines}']
        lines += [f'{SPEC_COUNTERS[3]}_total{{engine="{e}",position="{i}"}} {v / engines}' for i, v in enumerate(per)]
    return "\n".join(lines) + "\n"


def test_counter_deltas_from_two_metrics_pages_summed_over_engines():
    before = scrape_spec_counters(page(10, 30, 12, [6, 4, 2], engines=2))
    after = scrape_spec_counters(page(50, 150, 72, [30, 24, 18], engines=2))
    d = counters_delta(after, before)
    assert d == {SPEC_COUNTERS[0]: 40, SPEC_COUNTERS[1]: 120, SPEC_COUNTERS[2]: 60, SPEC_COUNTERS[3]: [24, 20, 16]}
    assert counters_delta(scrape_spec_counters("vllm:num_requests_running 1.0\n"), {}) == {}   # target-only


def test_point_figures_pool_requests_over_repeats_and_sum_the_counters():
    rep = lambda wall, tpots, c: {"wall_s": wall, "counters": c, "requests": [                      # noqa: E731
        {"tokens": 10, "ttft_ms": 100.0 + i, "tpot_ms": t} for i, t in enumerate(tpots)]}
    c1 = {SPEC_COUNTERS[0]: 10, SPEC_COUNTERS[1]: 30, SPEC_COUNTERS[2]: 15, SPEC_COUNTERS[3]: [8, 5, 2]}
    c2 = {SPEC_COUNTERS[0]: 10, SPEC_COUNTERS[1]: 30, SPEC_COUNTERS[2]: 9, SPEC_COUNTERS[3]: [6, 2, 1]}
    f = point_figures([rep(2.0, [10, 20, 30, 40], c1), rep(4.0, [50, 60, 70, 80], c2)], k=3)
    assert f["kind"] == "measured" and f["requests"] == 8 and f["output_tokens"] == 80
    assert f["tokens_per_s_each"] == [20.0, 10.0] and f["tokens_per_s"]["mean"] == 15.0
    assert f["tpot_p50_ms"]["value"] == 40 and f["tpot_p99_ms"]["value"] == 80
    assert f["tpot_p50_ms"]["low"] <= 40 <= f["tpot_p50_ms"]["high"] and f["ttft_p50_ms"]["value"] == 101.0
    assert f["counters"][SPEC_COUNTERS[3]] == [14, 7, 3] and f["counters"][SPEC_COUNTERS[0]] == 20
    assert f["acceptance"]["draft_acceptance_rate"] == pytest.approx(24 / 60)
    assert f["acceptance"]["mean_acceptance_length"] == pytest.approx(1 + 24 / 20)
    assert "acceptance" not in point_figures([rep(1.0, [5, 6], {})], k=None)
    assert identical([[1, 2], [3]], [[1, 2], [4]]) == [1, 2]


# ------------------------------------------------------------------ against a stand-in OpenAI server

class FakeVLLM(BaseHTTPRequestHandler):
    """Streams max_tokens token ids in chunks of up to 3 (a step that accepted drafts), 5 ms apart; every
    request adds one draft of 3 tokens with 2 accepted to the counters."""
    lock, n = threading.Lock(), 0

    def log_message(self, *a):
        pass

    def _send(self, body: bytes, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/metrics":
            n = FakeVLLM.n
            self._send(page(n, 3 * n, 2 * n, [n, n, 0]).encode(), "text/plain")
        elif self.path == "/version":
            self._send(b'{"version": "0.0-stand-in"}')
        else:
            self._send(b'{"data": [{"id": "stand-in"}]}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] and body["return_token_ids"] and body["model"] == "stand-in"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        left, tok = body["max_tokens"], body["seed"] * 100
        while left > 0:
            take = min(3, left)
            self.wfile.write(f"data: {json.dumps({'choices': [{'token_ids': list(range(tok, tok + take))}]})}\n\n".encode())
            self.wfile.flush()
            tok, left = tok + take, left - take
            time.sleep(0.005)
        self.wfile.write(b"data: [DONE]\n\n")
        with FakeVLLM.lock:
            FakeVLLM.n += 1


@pytest.fixture
def fake_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_a_run_against_an_existing_endpoint_writes_every_point_labelled_with_its_figures(fake_server, tmp_path):
    out = tmp_path / "study.json"
    assert S.main(["--target-url", fake_server, "--label", "remote", "--prompts", "sharegpt:3", "--max-tokens", "7",
                   "--concurrency", "1,2", "--temperatures", "0,0.8", "--repeats", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["kind"] == "measured" and res["date"] == time.strftime("%Y-%m-%d") and res["vllm"] == "0.0-stand-in"
    assert res["hardware"]["label"] and res["models"]["target"] and res["settings"]["prompt_count"] == 3
    assert res["configs"] == {"remote": {"ran": True, "endpoint": fake_server, "model": "stand-in"}}
    # the proposer's deadline, the faults and the correction are the endpoint's, not known here: not recorded
    assert not set(S.STARTED_ONLY) & set(res["settings"]) and "cpu_correction" not in res["settings"]
    pts = {(p["temperature"], p["concurrency"]): p for p in res["points"]}
    assert set(pts) == {(0.0, 1), (0.0, 2), (0.8, 1), (0.8, 2)}
    for p in res["points"]:
        assert p["kind"] == "measured" and p["config"] == "remote" and p["variant"] == "plain"
        assert p["repeats"] == 2 and p["requests"] == 6 and p["output_tokens"] == 42
        assert p["tpot_p50_ms"]["value"] > 0 and p["ttft_p50_ms"]["value"] > 0
        assert len(p["tokens_per_s_each"]) == 2 and p["tokens_per_s"]["low"] <= p["tokens_per_s"]["mean"]
        # 3 requests a repeat, one draft each: 6 drafts, 12 of 18 tokens accepted
        assert p["counters"][SPEC_COUNTERS[0]] == 6 and p["acceptance"]["draft_acceptance_rate"] == pytest.approx(2 / 3)
        assert not any(k.startswith("_") for k in p)
        assert p["output_sha1"] == [S.output_digest(list(range(100 * i, 100 * i + 7))) for i in range(3)]
    assert not any("note" in p for p in res["points"])      # a correction at the endpoint is not known here


def test_bad_options_are_refused_naming_the_value_and_the_fix(capsys):
    with pytest.raises(S.StudyError, match=r"--configs target-only,eagle: \['eagle'\] unknown"):
        S.StudyOptions(configs=("target-only", "eagle")).check()
    with pytest.raises(S.StudyError, match="--target-url http://h:8000: name what it serves with --label"):
        S.StudyOptions(target_url="http://h:8000").check()
    with pytest.raises(S.StudyError, match="--concurrency"):
        S.StudyOptions(concurrency=(0, 2)).check()
    with pytest.raises(S.StudyError, match=r"--faults-at 0: give the concurrency .*>= 1"):
        S.StudyOptions(faults_at=0).check()
    with pytest.raises(S.StudyError, match="give the server's URL"):
        S.Endpoint("h:8000")
    # target-only first, whatever the order given: the others' identity and bound refer to it
    assert S.StudyOptions(configs=("remote", "target-only")).check().configs == ("target-only", "remote")
    assert S.main(["--concurrency", "one"]) == 2
    assert "give comma lists of numbers" in capsys.readouterr().err


def test_the_remote_configuration_meets_a_slowed_and_a_jittered_draft_and_is_set_against_target_only(fake_server):
    class Relay:                                 # the relay's variants as the study switches them
        variant, seen = "plain", []

        def set(self, v):
            self.variant = v
            self.seen.append(v)

    opts = S.StudyOptions(concurrency=(1, 2), temperatures=(0.0, 0.8), repeats=2, faults_at=2, max_tokens=4)
    ep, prompts, res, lines = S.Endpoint(fake_server), [[1, 2], [3, 4], [5]], {"points": []}, []
    S._measure(opts, "target-only", ep, prompts, 0, None, res, lambda r: None, lines.append)
    relay = Relay()
    S._measure(opts, "remote", ep, prompts, 0, 3, res, lambda r: None, lines.append, relay)
    assert relay.seen == ["slowed", "jittered", "plain", "slowed", "jittered"]
    got = {(p["config"], p["variant"], p["temperature"], p["concurrency"]): p for p in res["points"]}
    assert set(got) == {(c, "plain", t, n) for c in ("target-only", "remote") for t in (0.0, 0.8) for n in (1, 2)} | {
        ("remote", "slowed", 0.0, 2), ("remote", "jittered", 0.0, 2)}
    assert got[("remote", "plain", 0.0, 1)]["identical_to_target_only"] == [3, 3]
    assert "identical_to_target_only" not in got[("remote", "plain", 0.8, 1)]      # sampled: not comparable
    assert "identical_to_target_only" not in got[("target-only", "plain", 0.0, 1)]
    slowed, plain = got[("remote", "slowed", 0.0, 2)], got[("remote", "plain", 0.0, 2)]
    assert slowed["repeats"] == 2 and slowed["vs_plain"]["tpot_p50_ms"] == pytest.approx(
        slowed["tpot_p50_ms"]["value"] / plain["tpot_p50_ms"]["value"])
    assert "acceptance" in slowed and "acceptance" not in got[("target-only", "plain", 0.0, 1)]
    ref = got[("target-only", "plain", 0.0, 2)]        # TPOT <= target-only's p99 + the deadline (2 s)
    assert slowed["tpot_bound_ms"] == pytest.approx(ref["tpot_p99_ms"]["value"] + 2000.0) and slowed["within_bound"]
    assert S.deadline_bound(S.StudyOptions(deadline_ms=50, deadline_steps=3), ref) == pytest.approx(
        ref["tpot_p99_ms"]["value"] + max(50, 3 * ref["tpot_p50_ms"]["value"]))
    assert any("TPOT p99 x" in line for line in lines)


def test_an_endpoint_that_does_not_answer_is_a_study_error_naming_its_url(tmp_path, capsys):
    from sdeth.place.testbed import free_port
    url = f"http://127.0.0.1:{free_port()}"                  # nothing listens there
    assert S.main(["--target-url", url, "--label", "remote", "--prompts", "sharegpt:2", "--json",
                   str(tmp_path / "x.json")]) == 2
    assert f"--target-url {url}" in capsys.readouterr().err


def test_a_failed_point_keeps_the_points_measured_before_it_and_sampled_points_say_the_correction(fake_server,
                                                                                                   monkeypatch):
    calls, real = [], S.run_point

    def failing_third(*a, **kw):
        calls.append(a[2:4])
        if len(calls) == 3:
            raise OSError("connection reset")
        return real(*a, **kw)
    monkeypatch.setattr(S, "run_point", failing_third)
    opts = S.StudyOptions(concurrency=(1, 2), temperatures=(0.0, 0.8), max_tokens=4, faults_at=1)
    res, saved = {"points": [], "settings": {"cpu_correction": True}}, []
    with pytest.raises(OSError, match="connection reset"):
        S._measure(opts, "draft-model", S.Endpoint(fake_server), [[1, 2], [3]], 0, 3, res, saved.append, print)
    assert [(p["temperature"], p["concurrency"]) for p in res["points"]] == [(0.0, 1), (0.0, 2)] and saved
    logged = {"correction_logged": True}                      # the server's log said the stand-in was replaced
    res = {"points": [], "settings": {"cpu_correction": True}, "configs": {"draft-model": logged, "remote": logged}}
    monkeypatch.setattr(S, "run_point", real)
    S._measure(opts, "draft-model", S.Endpoint(fake_server), [[1, 2], [3]], 0, 3, res, lambda r: None, print)
    assert [("note" in p) for p in res["points"]] == [False, False, True, True]
    assert "enabled and logged" in res["points"][2]["note"]
    res["configs"]["draft-model"] = {"correction_logged": False}   # enabled, but nothing replaced (a fixed build)
    assert not S._corrected(opts, "draft-model", res) and S._corrected(opts, "remote", res)
    res["settings"]["cpu_correction"] = False                 # the plugin left out (VLLM_PLUGINS, not installed)
    S._measure(opts, "remote", S.Endpoint(fake_server), [[1, 2], [3]], 0, 3, res, lambda r: None, print)
    assert not any("note" in p for p in res["points"][4:])


def test_the_correction_is_recorded_as_vllm_would_load_it(monkeypatch):
    from importlib.metadata import entry_points
    installed = "sdeth_cpu_expand" in {e.name for e in entry_points(group="vllm.general_plugins")}
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert S.cpu_correction() == installed
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    assert not S.cpu_correction()
    monkeypatch.setenv("VLLM_PLUGINS", "other,sdeth_cpu_expand")
    assert S.cpu_correction() == installed


def test_the_kv_cache_scales_one_requests_need_to_the_most_in_flight_unless_set(monkeypatch):
    from sdeth.models.presets import load_pair
    from sdeth.study.vllm.baseline import KV_ENV
    from sdeth.study.config import RunConfig
    from sdeth.study.vllm.baseline import _job, engine_args
    pair = load_pair("embedded", roles=())
    monkeypatch.delenv(KV_ENV, raising=False)
    one = engine_args(_job(RunConfig(engine="vllm", mode="sd", prompts="sharegpt:2", max_len=512).check(), pair))
    eight = S._engine(S.StudyOptions(concurrency=(1, 8), prompts="sharegpt:2"), pair)[0]["kv_cache_memory_bytes"]
    assert eight == max(256 * 2**20, 8 * one["kv_cache_memory_bytes"])       # both models, KV_HEADROOM, x8
    monkeypatch.setenv(KV_ENV, "300")
    assert S._engine(S.StudyOptions(concurrency=(1, 8), prompts="sharegpt:2"), pair)[0][
        "kv_cache_memory_bytes"] == 300 * 2**20


def test_the_study_table_shows_the_tokens_per_s_interval_only_over_repeats():
    pytest.importorskip("pandas")
    from sdeth.study.vllm.measurement import study_table
    point = {"config": "target-only", "variant": "plain", "temperature": 0.0, "tpot_p50_ms": None,
             "tpot_p99_ms": None, "ttft_p50_ms": None}
    doc = {"points": [{**point, "concurrency": 1, "tokens_per_s": {"mean": 5.0, "low": 5.0, "high": 5.0, "n": 1}},
                      {**point, "concurrency": 2, "tokens_per_s": {"mean": 5.0, "low": 4.0, "high": 6.0, "n": 2}}]}
    assert study_table(doc)["tok/s 95%"].tolist() == ["", "[4.0, 6.0]"]

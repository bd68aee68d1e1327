"""The endpoint backend: the OpenAI-compatible client and its load patterns against llama.cpp's real server
(`llama-server` serving the embedded model's GGUF), failures from a server that misbehaves on purpose, and the
plugin with --infergate-endpoint. Capacity, /metrics, traffic files and two-server gates: test_endpoint_serving.py
(misbehaving server) and test_endpoint_llama.py (llama-server)."""

import json
import statistics
import time

import pytest
from openai_servers import FaultyServer, free_port

from pytest_infergate.endpoint import EndpointConfig, EndpointRequest, LoadPattern, Slo, run_load
from pytest_infergate.endpoint.load_run import LoadRun
from pytest_infergate.engine import Request
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.transcript import plain_text

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _requests(count: int, max_tokens: int = 8) -> list[EndpointRequest]:
    return [EndpointRequest(messages=CHAT, max_tokens=max_tokens, request_id=f"r{i}") for i in range(count)]


# --- configuration and inputs --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"url": "localhost:8000"}, r"is not an http\(s\) URL"),
    ({"url": "http://x", "timeout_s": 0}, "--infergate-endpoint-timeout must be positive"),
    ({"url": "http://x", "max_concurrency": 0}, "--infergate-endpoint-concurrency must be at least 1"),
    ({"url": "http://x", "api": "responses"}, "is not one of chat, completions"),
])
def test_bad_endpoint_config_names_the_option(kwargs, message):
    with pytest.raises(OptionError, match=message):
        EndpointConfig(**kwargs)


def test_base_url_gets_v1_once():
    assert EndpointConfig("http://h:1").base_url == "http://h:1/v1"
    assert EndpointConfig("http://h:1/v1/").base_url == "http://h:1/v1"


def test_engine_requests_translate_to_the_api():
    chat = EndpointRequest.from_engine_request(Request(messages=CHAT, max_new_tokens=5, stop_strings=("\n",)))
    assert chat.body("m", True) | {} == {"model": "m", "max_tokens": 5, "temperature": 0.0, "top_p": 1.0,
                                          "stream": True, "messages": CHAT, "stream_options": {"include_usage": True},
                                          "stop": ["\n"]}
    assert chat.path == "/chat/completions"
    ids = EndpointRequest.from_engine_request(Request(prompt_token_ids=[1, 2, 3]), api="completions")
    assert ids.body("m", False)["prompt"] == [1, 2, 3] and ids.path == "/completions"
    with pytest.raises(OptionError, match="needs --infergate-endpoint-api completions"):
        EndpointRequest.from_engine_request(Request(prompt_token_ids=[1, 2, 3]), api="chat")
    # the completions API (a base model's server) gets chat messages as the engine sends a base model them
    plain = EndpointRequest.from_engine_request(Request(messages=CHAT), api="completions")
    assert plain.path == "/completions" and plain.prompt == plain_text(CHAT) and plain.prompt.endswith("Assistant:")


def test_slo_and_pattern_validation():
    with pytest.raises(OptionError, match=r"unknown SLO key 'ttft' \(did you mean 'ttft_ms'\?\)"):
        Slo.parse({"ttft": 5})
    with pytest.raises(OptionError, match="must be a positive number of milliseconds"):
        Slo.parse({"ttft_ms": -1})
    with pytest.raises(OptionError, match="rate_per_s must be positive"):
        LoadPattern(rate_per_s=0)


def test_arrivals_have_the_requested_rate_and_burstiness():
    def gaps(burstiness):
        offsets = LoadPattern(rate_per_s=10, burstiness=burstiness, seed=1).arrival_offsets(4000)
        return [b - a for a, b in zip(offsets, offsets[1:])]

    poisson, bursty = gaps(1.0), gaps(0.25)
    assert statistics.mean(poisson) == pytest.approx(0.1, rel=0.08)
    assert statistics.mean(bursty) == pytest.approx(0.1, rel=0.15)
    cv = lambda xs: statistics.pstdev(xs) / statistics.mean(xs)  # noqa: E731
    assert cv(poisson) == pytest.approx(1.0, rel=0.1)  # exponential gaps
    assert cv(bursty) == pytest.approx(2.0, rel=0.15)  # gamma(k): cv = 1/sqrt(k)
    assert LoadPattern(concurrency=4).arrival_offsets(3) == [0.0, 0.0, 0.0]


# --- failures are classified and counted, never raised --------------------------------------------------------

@pytest.mark.parametrize("mode, kind", [("error500", "http_500"), ("stall", "timeout"),
                                        ("malformed", "malformed_stream"), ("no_done", "incomplete_stream")])
def test_failures_are_classified_and_every_request_accounted(mode, kind):
    with FaultyServer(mode, stall_s=3.0) as server:
        run = run_load(EndpointConfig(server.url, timeout_s=0.5), _requests(6), LoadPattern(concurrency=3))
    assert [r.request_id for r in run.results] == [f"r{i}" for i in range(6)]
    assert run.errors == {kind: 6} and run.success_rate == 0
    assert all(r.error_detail for r in run.results)


def test_partial_failures_give_success_rate_and_goodput():
    with FaultyServer("flaky", token_delay_s=0.001) as server:
        run = run_load(EndpointConfig(server.url), _requests(10, 5), LoadPattern(concurrency=1), Slo(e2e_ms=60_000))
    summary = run.summary()
    assert run.errors == {"http_500": 5} and summary["succeeded"] == 5 and run.success_rate == 0.5
    assert summary["goodput_per_s"] == pytest.approx(5 / run.duration_s)
    assert summary["usage_reported"] and summary["output_tokens"] == 25


def test_unmet_slo_counts_against_goodput_only():
    with FaultyServer("ok", token_delay_s=0.02) as server:
        run = run_load(EndpointConfig(server.url), _requests(4, 5), LoadPattern(concurrency=4), Slo(e2e_ms=1))
    assert run.success_rate == 1 and run.goodput_per_s == 0


def test_warmup_and_cooldown_seconds_keep_the_load_but_count_only_the_steady_state():
    # issue #35 point 6: time-based warmup and cooldown, as guidellm's --warmup / --cooldown
    from pytest_infergate.endpoint.load_run import add_to_measurement
    from pytest_infergate.measurement import Measurement

    pattern = LoadPattern(rate_per_s=20, seed=4, warmup_s=0.3, cooldown_s=0.3)
    with FaultyServer("ok", token_delay_s=0.01) as server:
        run = run_load(EndpointConfig(server.url), _requests(20, 5), pattern, scrape=False)
        counted, seconds = run.window()
        assert len(run.results) == 20 and run.success_rate == 1  # every request was sent and answered
        assert 0 < len(counted) < 20
        assert all(r.arrival >= run.started + 0.3 and r.finished <= run.started + run.duration_s - 0.3 for r in counted)
        assert seconds == pytest.approx(run.duration_s - 0.6)
        measurement = Measurement()
        add_to_measurement(run, measurement)
        assert len(measurement.samples["ttft_ms"]) == len(counted) and measurement.num_requests == 20
        assert run.summary()["requests_per_s"] == pytest.approx(len(counted) / seconds)
        assert "not counted: warmup 0.3 s, cooldown 0.3 s" in pattern.describe()
        with pytest.raises(OptionError, match="no request was sent after the 100 s warmup .* shorten warmup_s"):
            LoadRun(LoadPattern(warmup_s=100), run.results, run.duration_s, started=run.started).window()
    with pytest.raises(OptionError, match="warmup_s=-1 must be a number of seconds"):
        LoadPattern(warmup_s=-1)


# --- what leaves, and when --------------------------------------------------------------------------------------

def test_the_clock_starts_when_the_request_leaves_and_extra_fields_are_sent():
    # issue #35 points 3 and 4: TTFT and e2e were timed from before the request was built; no vendor fields
    import asyncio

    from pytest_infergate.endpoint.client import EndpointClient

    request = EndpointRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                              extra_body={"ignore_eos": True, "min_tokens": 4, "top_k": 1})

    async def one(url):
        async with EndpointClient(EndpointConfig(url)) as client:
            client.model = "faulty"
            before = time.perf_counter()
            return before, await client.send(request)

    with FaultyServer("ok") as server:
        before, result = asyncio.run(one(server.url))
    assert result.ok and result.sent_on_wire  # stamped by httpcore's trace, as the headers left
    (arrived,) = server.httpd.arrivals
    assert before <= result.arrival <= arrived <= result.first_token
    (body,) = server.httpd.bodies
    assert body["ignore_eos"] is True and body["min_tokens"] == 4 and body["top_k"] == 1 and body["max_tokens"] == 4
    with pytest.raises(OptionError, match="extra_body may not set stream"):
        EndpointRequest(prompt="x", extra_body={"stream": False}).body("m", True)
    # an engine Request's ignore_eos becomes the servers' field: a fixed output length
    fixed = EndpointRequest.from_engine_request(Request(prompt="x", max_new_tokens=8, ignore_eos=True), api="chat")
    assert fixed.body("m", True)["ignore_eos"] is True
    assert "ignore_eos" not in EndpointRequest.from_engine_request(Request(prompt="x"), api="chat").body("m", True)


def test_the_time_to_connect_counts_in_a_requests_latency(monkeypatch):
    # a server whose accept queue is full drops a connection attempt, and the client tries again a second later: its
    # user waits that long. A clock started at the headers left the wait out, and a 4-slot server read as meeting an
    # 800 ms SLO at 64 in flight (test_capacity_finds_the_knee_of_a_server_with_four_slots failed 4 runs in 13)
    import asyncio

    import anyio

    from pytest_infergate.endpoint.client import EndpointClient

    connect = anyio.connect_tcp

    async def slow_connect(*args, **kwargs):
        await asyncio.sleep(0.5)
        return await connect(*args, **kwargs)

    async def one(url):
        async with EndpointClient(EndpointConfig(url)) as client:
            client.model = "faulty"
            before = time.perf_counter()
            return before, await client.send(EndpointRequest(messages=CHAT, max_tokens=2))

    monkeypatch.setattr(anyio, "connect_tcp", slow_connect)
    with FaultyServer("ok") as server:
        before, result = asyncio.run(one(server.url))
    (arrived,) = server.httpd.arrivals
    assert result.ok and result.sent_on_wire and before <= result.arrival <= arrived - 0.5
    assert result.ttft_s >= 0.5 and result.e2e_s >= 0.5


def test_a_run_is_stopped_early_only_where_the_stop_cut_a_request():
    # a stop decided by one request while the last one was ending cut nothing, yet the run read as stopped early, and
    # a capacity point as "clearly over" with its whole batch sent (1 run of the 4-slot knee test in 15). Here the
    # second request ends 0-5 event-loop turns after the first decided the stop
    import asyncio

    from pytest_infergate.endpoint.client import EndpointResult, drive

    class Client:
        async def send(self, request, stream=True):
            for _ in range(int(request.request_id)):
                await asyncio.sleep(0)
            return EndpointResult(request.request_id, arrival=time.perf_counter(), finished=time.perf_counter())

    for turns in range(6):
        requests = [EndpointRequest(prompt="x", request_id=str(n)) for n in (0, turns)]
        run = asyncio.run(drive(Client(), requests, [0.0, 0.0], 2, stop=lambda *_: True))
        cut = [r.request_id for r in run.results if r.error == "cancelled"]
        assert (run.stopped == "stopped early") == bool(cut), (turns, run.stopped, cut)


# --- the plugin with --infergate-endpoint ---------------------------------------------------------------------

ENDPOINT_TEST = """
import pytest

@pytest.mark.infergate_budget({budget})
@pytest.mark.infergate_slo(e2e_ms=60000)
def test_load(infergate_endpoint):
    from pytest_infergate.engine import Request
    reqs = [Request(messages=[{{"role": "user", "content": "hi"}}], max_new_tokens=6) for _ in range(6)]
    m = infergate_endpoint.load(reqs, {{"concurrency": 3}}, label="c3")
    assert m.num_requests == 6
"""


@pytest.fixture
def run_plugin(pytester, cache_dir):
    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "-p", "no:cacheprovider", *args)

    return run


def test_server_down_at_start_is_one_clear_usage_error(pytester, run_plugin):
    pytester.makepyfile(ENDPOINT_TEST.format(budget=""))
    result = run_plugin(f"--infergate-endpoint=http://127.0.0.1:{free_port()}/v1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*infergate: endpoint http://127.0.0.1:*/v1 is not reachable*start the server*"])


def test_bad_endpoint_option_is_a_usage_error(pytester, run_plugin):
    pytester.makepyfile(ENDPOINT_TEST.format(budget=""))
    result = run_plugin("--infergate-endpoint=127.0.0.1:8000", "--infergate-endpoint-timeout=soon")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--infergate-endpoint-timeout / infergate_endpoint_timeout = 'soon' is not a number*"])


def test_endpoint_fixture_skips_without_the_option(pytester, run_plugin):
    """Skipped by design (the suite of a served model nobody asked to run without a server): counted with its
    reason, not listed among the checks that did not run as asked."""
    pytester.makepyfile(ENDPOINT_TEST.format(budget=""))
    result = run_plugin("-rs", "--infergate-json=out.json")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a live server; pass --infergate-endpoint URL*"])
    data = json.loads((pytester.path / "out.json").read_text())
    assert data["skipped_findings"] == {} and data["findings"] == [] and data["verdict"] == "pass"
    assert list(data["skips"].values()) == ["needs a live server; pass --infergate-endpoint URL"]


def test_failed_requests_fail_the_success_budget_with_their_kinds(pytester, run_plugin):
    pytester.makepyfile(ENDPOINT_TEST.format(budget="success_rate=1"))
    with FaultyServer("flaky") as server:
        result = run_plugin(f"--infergate-endpoint={server.url}", "--infergate-json=out.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*infergate perf gate failed*test_load*concurrency=3*",
                                 "*success_rate 50% < budget 100%*", "*failed requests*http_500*"])
    records = json.loads((pytester.path / "out.json").read_text())["records"]
    assert records[0]["backend"] == "endpoint" and records[0]["measurement"]["engine"]["errors"] == {"http_500": 3}


def test_a_served_models_load_runs_are_counted_on_the_terminal_as_a_local_measurement_is(pytester, run_plugin,
                                                                                          monkeypatch):
    """A served model's repetitions went unsaid while a local one's were counted (context.Steps): a slow server's
    save sat silent. Each load run is now one step of the same line, named by its test (here every step counts as
    long work)."""
    from pytest_infergate import context

    monkeypatch.setattr(context, "EVERY_S", 0.0)
    pytester.makepyfile(ENDPOINT_TEST.format(budget="success_rate=1"))
    with FaultyServer("ok") as server:
        result = run_plugin(f"--infergate-endpoint={server.url}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["infergate: measuring *.py::test_load::c3, repetition: 1 of 1, * s"])


def test_api_key_comes_from_the_named_environment_variable(pytester, run_plugin, monkeypatch):
    pytester.makepyfile(ENDPOINT_TEST.format(budget="success_rate=1"))
    with FaultyServer("ok", api_key="s3cret") as server:
        missing = run_plugin(f"--infergate-endpoint={server.url}", "--infergate-api-key-env=INFERGATE_TEST_KEY")
        assert missing.ret == pytest.ExitCode.USAGE_ERROR
        missing.stderr.fnmatch_lines(["*'INFERGATE_TEST_KEY', but that environment variable is not set*"])
        monkeypatch.setenv("INFERGATE_TEST_KEY", "s3cret")
        ok = run_plugin(f"--infergate-endpoint={server.url}", "--infergate-api-key-env=INFERGATE_TEST_KEY")
    ok.assert_outcomes(passed=1)


def test_bad_slo_marker_fails_collection(pytester, run_plugin):
    pytester.makepyfile("""
import pytest

@pytest.mark.infergate_slo(ttft=5)
def test_x(infergate_endpoint):
    pass
""")
    result = run_plugin()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x: infergate_slo: unknown SLO key 'ttft' (did you mean 'ttft_ms'?)*allowed: "
                                 "ttft_ms*"])


# --- a real server: llama.cpp serving the embedded model ------------------------------------------------------

def test_streaming_metrics_from_a_real_server(llama_server):
    config = EndpointConfig(llama_server.url, timeout_s=120)
    run = run_load(config, _requests(3, 16), LoadPattern(concurrency=1))
    assert run.errors == {} and run.success_rate == 1
    for r in run.results:
        assert r.text and r.finish_reason in ("length", "stop")
        assert r.token_times == sorted(r.token_times) and r.arrival < r.first_token <= r.token_times[0] <= r.finished
        assert len(r.itl_s) == len(r.token_times) - 1 and all(x >= 0 for x in r.itl_s)
        assert 1 <= r.num_output_tokens <= 16
        if r.num_output_tokens > 1:
            assert r.tpot_s == pytest.approx((r.finished - r.first_token) / (r.num_output_tokens - 1))
    greedy = {r.text for r in run.results}
    assert len(greedy) == 1, f"temperature 0 answers differ: {greedy}"


def test_200_concurrent_requests_are_all_accounted_for(llama_server):
    config = EndpointConfig(llama_server.url, timeout_s=300, max_concurrency=200)
    requests = _requests(200, 3)
    run = run_load(config, requests, LoadPattern(concurrency=200))
    assert sorted(r.request_id for r in run.results) == sorted(r.request_id for r in requests)
    assert run.errors == {} and all(r.num_output_tokens for r in run.results)


SERVER_SUITE = """
import pytest
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(messages=[{"role": "user", "content": f"Count to {i}."}], max_new_tokens=8) for i in range(4)]

@pytest.mark.infergate_budget(success_rate=1, ttft_ms_p95=120000)
def test_bench_runs_on_the_server(infergate_bench):
    m = infergate_bench(REQS, EngineConfig(max_batch_size=2), label="c2")
    assert m.engine["pattern"] == "concurrency=2" and len(m.samples["ttft_ms"]) == 4

def test_engine_experiments_skip(infergate_bench):
    infergate_bench(REQS, EngineConfig(batching="static"))

def test_local_model_tests_skip(infergate_model):
    pass

@pytest.mark.infergate_slo(ttft_ms=120000)
def test_sweep(infergate_endpoint):
    points = infergate_endpoint.sweep(REQS, concurrencies=[1, 2])
    assert [p.concurrency for p, _ in points] == [1, 2]

@pytest.mark.infergate_quality(min_rouge_l=0.2)
def test_quality(infergate_golden):
    result = infergate_golden.check(limit=6)
    assert result.precision == "endpoint" and result.summary["samples"] == 6
"""


@pytest.mark.embedded
def test_suite_against_a_real_server(pytester, cache_dir, llama_server):
    """Budgets, sweeps and the golden check against the local fp32 reference, through the plugin, to one report."""
    import shutil
    from pathlib import Path

    shutil.copytree(Path(__file__).parent.parent / "golden", pytester.path / "golden")
    pytester.makepyfile(SERVER_SUITE)
    result = pytester.runpytest("--infergate-model=smollm2-135m", f"--infergate-cache-dir={cache_dir}",
                                f"--infergate-endpoint={llama_server.url}", "--infergate-endpoint-timeout=300",
                                "--infergate-json=out.json", "--infergate-report=report.html", "-p", "no:cacheprovider",
                                "-rs")
    result.assert_outcomes(passed=3, skipped=2)
    result.stdout.fnmatch_lines(["*endpoint: http://127.0.0.1:*/v1 serving 'smollm2-135m' (chat API)*"])
    data = json.loads((pytester.path / "out.json").read_text())
    perf = [r for r in data["records"] if r["kind"] == "perf"]
    assert {r["label"] for r in perf} == {"c2", "sweep-c1", "sweep-c2"}
    assert all(r["backend"] == "endpoint" and r["precision"] == "endpoint" for r in perf)
    quality = next(r for r in data["records"] if r["kind"] == "quality")
    assert quality["precision"] == "endpoint" and quality["reference_precision"] == "fp32"
    assert 0 <= quality["summary"]["top1"] <= 1, "llama.cpp returns logprobs: top-1 agreement must be computed"
    assert data["environment"]["endpoint"]["served_model"] == "smollm2-135m"
    html = (pytester.path / "report.html").read_text()
    assert "Endpoint load runs" in html and "concurrency=2" in html


def test_local_precisions_run_beside_the_endpoint_when_asked(pytester, run_plugin):
    pytester.makepyfile("""
from pytest_infergate.engine import EngineConfig, Request

def test_speed(infergate_bench, infergate_precision):
    m = infergate_bench([Request(prompt="hello there", max_new_tokens=4)], EngineConfig(max_model_len=256,
                        kv_budget_bytes=8 << 20), repeats=1, warmup=0)
    assert m.num_requests == 1
""")
    with FaultyServer("ok") as server:
        only = run_plugin(f"--infergate-endpoint={server.url}", "-v")
        both = run_plugin(f"--infergate-endpoint={server.url}", "--infergate-precisions=fp32", "-v",
                          "--infergate-report=report.html")
    only.stdout.fnmatch_lines(["*test_speed?endpoint? PASSED*"])
    only.assert_outcomes(passed=1)
    both.stdout.fnmatch_lines(["*test_speed?endpoint? PASSED*", "*test_speed?fp32? PASSED*"])
    html = (pytester.path / "report.html").read_text()
    assert "<td>endpoint</td>" in html and "<td>fp32</td>" in html


@pytest.mark.embedded
def test_endpoint_golden_regression_round_trip(pytester, cache_dir, llama_server):
    """--infergate-update-golden writes the server's accepted outputs; an unchanged server passes against them;
    a changed answer fails, naming the sample."""
    import shutil
    from pathlib import Path

    shutil.copytree(Path(__file__).parent.parent / "golden", pytester.path / "golden",
                    ignore=shutil.ignore_patterns("SmolLM2-135M-Instruct"))
    pytester.makepyfile("def test_regression(infergate_golden):\n    infergate_golden.check_regression(limit=4)\n")
    args = ["--infergate-model=smollm2-135m", f"--infergate-cache-dir={cache_dir}", "-p", "no:cacheprovider",
            f"--infergate-endpoint={llama_server.url}", "--infergate-endpoint-timeout=300"]
    pytester.runpytest(*args, "--infergate-update-golden").assert_outcomes(passed=1)
    accepted = pytester.path / "golden" / "SmolLM2-135M-Instruct" / "endpoint" / "smollm2-135m.jsonl"
    lines = accepted.read_text().splitlines()
    assert json.loads(lines[0])["served_model"] == "smollm2-135m" and len(lines) == 5
    pytester.runpytest(*args).assert_outcomes(passed=1)
    changed = json.loads(lines[1])
    changed["token_ids"], changed["text"] = changed["token_ids"][:-1] + [42], changed["text"] + "?"
    accepted.write_text("\n".join([lines[0], json.dumps(changed)] + lines[2:]) + "\n")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*1 of 4 golden outputs of endpoint changed*", f"*{changed['id']}*"])


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_both_apis_stream_from_a_real_server(llama_server, api):
    request = EndpointRequest.from_engine_request(Request(prompt="The capital of France is", max_new_tokens=6), api)
    run = run_load(EndpointConfig(llama_server.url, timeout_s=120, api=api), [request])
    result = run.results[0]
    assert result.ok, result.error_detail
    assert result.text and result.num_output_tokens >= 1 and result.ttft_s > 0


def test_a_prompt_past_the_servers_context_is_counted_and_the_run_goes_on(llama_server):
    # llama.cpp's native server refuses the long prompt up front (HTTP 400, naming the context size); the
    # requests after it are answered. (llama-cpp-python's server answered 200, failed inside the stream and then
    # dropped the keep-alive connection; the client's retry of a stale pooled connection still covers that.)
    too_long = Request(prompt="word " * (llama_server.n_ctx + 200), max_new_tokens=4, request_id="too-long")
    short = [Request(prompt="The capital of France is", max_new_tokens=4, request_id=f"ok{i}") for i in range(3)]
    config = EndpointConfig(llama_server.url, timeout_s=120, api="completions")
    run = run_load(config, [short[0], too_long, *short[1:]], LoadPattern(concurrency=1))
    by_id = {r.request_id: r for r in run.results}
    assert set(by_id) == {"ok0", "too-long", "ok1", "ok2"}
    assert by_id["too-long"].error == "http_400" and "context" in by_id["too-long"].error_detail
    assert run.errors == {"http_400": 1} and run.success_rate == pytest.approx(0.75)
    assert all(by_id[f"ok{i}"].ok and by_id[f"ok{i}"].text for i in range(3))


def test_a_load_run_takes_only_requests():
    with pytest.raises(TypeError, match="takes EndpointRequest or engine Request objects, not str"):
        run_load(EndpointConfig("http://127.0.0.1:9"), ["hello"])


def test_every_request_is_recorded_and_the_report_shows_the_slow_tail():
    # issue #35 point 5: per-request records in the JSON, and the report's slow-tail view built from them
    from pytest_infergate.endpoint.load_run import add_to_measurement
    from pytest_infergate.measurement import Measurement
    from pytest_infergate.report import render
    from pytest_infergate.results.records import PerfRecord
    from pytest_infergate.results.run import RunResults

    with FaultyServer("flaky", token_delay_s=0.001) as server:
        run = run_load(EndpointConfig(server.url), _requests(6, 5), LoadPattern(concurrency=1))
    measurement = Measurement()
    add_to_measurement(run, measurement)
    assert [r["request_id"] for r in measurement.requests] == [f"r{i}" for i in range(6)]
    ok = [r for r in measurement.requests if r["error"] is None]
    failed = [r for r in measurement.requests if r["error"] is not None]
    assert len(ok) == 3 and len(failed) == 3 and all(r["error"] == "http_500" for r in failed)
    for r in ok:
        assert r["sent_on_wire"] and 0 <= r["sent_s"] <= r["first_token_s"] <= r["finished_s"]
        assert len(r["chunks_s"]) == r["output_tokens"] == 5 and r["chunks_s"] == sorted(r["chunks_s"])
    record = PerfRecord(test="t.py::test_load[endpoint]", label="", precision="endpoint",
                        measurement=Measurement.from_dict(measurement.to_dict()), backend="endpoint")
    html = render(RunResults(records=[record]))
    assert "The slow tail: slowest requests per load run" in html and "(6 requests recorded)" in html
    assert "http_500" in html


# --- the sweep profile (issue #35 point 6) -------------------------------------------------------------------------

def _point(role, e2e, rate=None, rps=1.0, goodput=None):
    from pytest_infergate.endpoint.sweep import SweepPoint

    return SweepPoint(role, LoadPattern(rate_per_s=rate) if rate else LoadPattern(concurrency=1), rps, goodput, e2e)


def test_the_sweep_profile_spaces_rates_between_its_ends_and_marks_the_knee_by_latency():
    from pytest_infergate.endpoint import sweep

    assert sweep.rates_between(2.0, 10.0, 6) == [3.6, 5.2, 6.8, 8.4]
    assert sweep.rates_between(2.0, 1.9, 6) == []  # no faster with requests at once: nothing between
    with pytest.raises(OptionError, match="at least 2 points"):
        sweep.rates_between(2.0, 10.0, 1)
    points = [_point("synchronous", 100.0), _point("throughput", 900.0, rps=10),
              _point("rate", 120.0, rate=3.6, goodput=3.5), _point("rate", 190.0, rate=5.2, goodput=5.0),
              _point("rate", 450.0, rate=6.8, goodput=4.0)]
    assert sweep.knee(points).offered_rps == 5.2  # 190 ms <= 2 x 100 ms; 450 ms is queueing
    assert sweep.best_goodput(points).offered_rps == 5.2
    line = sweep.describe(points)
    assert "knee at rate 5.2/s (median e2e 190 ms, within 2x the synchronous run's)" in line
    assert "best goodput 5 req/s at rate 5.2/s" in line
    assert sweep.knee(points[:2] + [_point("rate", 300.0, rate=3.6)]) is None
    assert "the knee is below the lowest rate" in sweep.describe(points[:2] + [_point("rate", 300.0, rate=3.6)])
    assert "no rate between" in sweep.describe(points[:2])


SWEEP_TEST = """
import pytest

@pytest.mark.infergate_slo(e2e_ms=60000)
def test_profile(infergate_endpoint):
    from pytest_infergate.engine import Request
    # three requests per slot: the throughput point (8 at once) has answers before its last wave, so a cooldown
    # leaves some counted (with one request per slot every answer lands in the final instant)
    requests = [Request(messages=[{"role": "user", "content": f"Say {i}."}], max_new_tokens=4) for i in range(24)]
    points = infergate_endpoint.sweep(requests, points=4, cooldown_s=0.01)
    assert [p.concurrency for p, _ in points[:2]] == [1, 8]
    assert all(p.rate_per_s and p.cooldown_s == 0.01 for p, _ in points[2:])
"""


def test_the_sweep_profile_runs_synchronous_throughput_and_rates_between_through_the_plugin(pytester, run_plugin):
    pytester.makepyfile(SWEEP_TEST)
    with FaultyServer("ok", token_delay_s=0.03) as server:
        result = run_plugin(f"--infergate-endpoint={server.url}", "--infergate-endpoint-concurrency=8",
                            "--infergate-json=out.json")
    result.assert_outcomes(passed=1)
    records = json.loads((pytester.path / "out.json").read_text())["records"]
    roles = [r["tags"]["sweep"] for r in records]
    assert roles[:2] == ["synchronous", "throughput"] and set(roles[2:]) == {"rate"} and len(roles) == 4
    assert [r["label"] for r in records[:2]] == ["sweep-sync", "sweep-throughput"]
    # a threaded server that only sleeps keeps its latency at any rate: the knee is the highest rate
    knees = [r for r in records if r["tags"]["knee"]]
    assert [r["label"] for r in records[2:]] == ["sweep-rate-1-of-2", "sweep-rate-2-of-2"]  # stable baseline keys
    assert knees == [records[-1]]
    assert sum(r["tags"]["best_goodput"] for r in records) == 1
    assert all("sweep profile: synchronous" in " ".join(r["notes"]) for r in records)

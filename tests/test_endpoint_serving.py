"""Serving beyond one machine, without a real server: p99.9 and directed budget keys, Prometheus metrics of vLLM,
SGLang, TGI and llama.cpp mapped to one vocabulary, traffic files and multi-turn sessions (on the engine too), the
capacity search on a server with a known number of slots, and the two-server quality comparison's arithmetic.
The same features against llama.cpp's real server are in test_endpoint_llama.py."""

import json
import math
import time

import pytest
from openai_servers import FaultyServer

from pytest_infergate.endpoint import EndpointConfig, EndpointRequest, LoadPattern, Slo, run_load
from pytest_infergate.endpoint.capacity import search_capacity, wilson
from pytest_infergate.endpoint.capacity_records import CapacitySpec, capacity_measurement
from pytest_infergate.endpoint.exchange import EndpointResult
from pytest_infergate.endpoint.server_metrics import ServerMetrics, parse_metrics, to_vocabulary
from pytest_infergate.errors import OptionError
from pytest_infergate.gates.pair import compare_servers, topk_pair_kl
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.budget import BudgetError, parse_budget
from pytest_infergate.perf.outcome import check_budget
from pytest_infergate.workloads import from_file
from pytest_infergate.workloads.traffic import Session, Turn, WorkloadError

CHAT = [{"role": "user", "content": "hi"}]


# --- p99.9 and directed budget keys ---------------------------------------------------------------------------

def test_p999_is_a_percentile_everywhere():
    m = Measurement(samples={"ttft_ms": [float(i) for i in range(1, 1001)], "kv_usage": [0.5]})
    summary = m.summary()
    assert summary["ttft_ms_p999"] == pytest.approx(999.001) and "ttft_ms_p90" in summary
    budget = parse_budget({"ttft_ms_p999": 990, "max_kv_usage": 0.9})
    [violation] = check_budget(m, budget)
    assert violation.key == "ttft_ms_p999" and violation.percentile == 99.9
    assert violation.sentence().startswith("ttft_ms_p999 999 ms > budget 990 ms")


@pytest.mark.parametrize("values, message", [
    ({"max_capacity_rps": 1}, "capacity_rps is higher-is-better, so its limit is a minimum; write min_capacity_rps"),
    ({"min_kv_usage": 1}, "kv_usage is lower-is-better, so its limit is a maximum; write max_kv_usage"),
    ({"ttft_ms_p998": 1}, "unknown budget key 'ttft_ms_p998'"),
    ({"max_preemptions": -1}, "must be a positive number"),
])
def test_directed_keys_must_match_the_metric(values, message):
    with pytest.raises(BudgetError, match=message):
        parse_budget(values)


def test_zero_is_a_limit_for_counts_only():
    assert parse_budget({"max_preemptions": 0}).limits[0].value == 0
    with pytest.raises(BudgetError, match="must be a positive number"):
        parse_budget({"min_capacity_rps": 0})


# --- /metrics of four servers in one vocabulary ---------------------------------------------------------------

VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 400.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 2.0
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.28
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.75
"""
TGI = "# TYPE tgi_queue_size gauge\ntgi_queue_size 4\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 9\n"
LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 100
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""


@pytest.mark.parametrize("text, expected", [
    (VLLM, {"running_requests": 3, "waiting_requests": 1, "kv_usage": 0.5, "prefix_cache_queries": 1000,
            "prefix_cache_hits": 400, "preemptions": 2}),
    (SGLANG, {"running_requests": 7, "kv_usage": 0.28, "prefix_cache_hit_rate_gauge": 0.75}),
    (TGI, {"waiting_requests": 4, "running_requests": 9}),
    (LLAMACPP, {"prompt_tokens": 300, "prefix_cache_hits": 100, "running_requests": 2, "waiting_requests": 5}),
])
def test_each_servers_names_map_to_one_vocabulary(text, expected):
    figures, _ = to_vocabulary(parse_metrics(text))
    assert figures == pytest.approx(expected)


def test_run_figures_are_peaks_of_gauges_and_deltas_of_counters():
    before, _ = to_vocabulary(parse_metrics(LLAMACPP))
    after, names = to_vocabulary(parse_metrics(LLAMACPP.replace(" 300", " 450").replace(" 100", " 250")))
    during = dict(after, running_requests=4.0)
    metrics = ServerMetrics("http://x/metrics", "llama.cpp", before, after, [[0.5, during]], names)
    # llama.cpp counts computed prompt tokens without the cached ones: 150 cached of 150 + 150
    assert metrics.figures() == {"prefix_cache_hit_rate": 0.5, "waiting_requests": 5, "running_requests": 4}
    assert metrics.missing() == ["kv_usage", "preemptions"]
    vllm_before, names = to_vocabulary(parse_metrics(VLLM))
    vllm_after = dict(vllm_before, prefix_cache_queries=1100, prefix_cache_hits=480, preemptions=5)
    assert ServerMetrics("u", "vLLM", vllm_before, vllm_after, [], names).figures()["prefix_cache_hit_rate"] == 0.8


def test_a_server_without_metrics_is_a_note_never_an_error():
    with FaultyServer("ok") as server:  # answers /metrics with 404
        run = run_load(EndpointConfig(server.url), [EndpointRequest(messages=CHAT, max_tokens=3)] * 2)
    assert run.errors == {} and not run.server_metrics.available
    assert "no Prometheus metrics at http://127.0.0.1:" in run.server_metrics.notes[0]
    assert "needs --metrics" in run.server_metrics.notes[0]


def test_malformed_metrics_text_is_a_clear_value_error():
    with pytest.raises(ValueError):
        parse_metrics("vllm:kv_cache_usage_perc{model_name=\"m\" not a number\n")


# --- traffic files ---------------------------------------------------------------------------------------------

def _write(tmp_path, lines, name="traffic.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_traffic_file_formats(tmp_path):
    path = _write(tmp_path, [
        {"prompt": "Once upon a time", "max_tokens": 7, "timestamp": 10.0},
        {"id": "chat", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "timestamp": 10.5},
        "",
        {"conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                           {"from": "human", "value": "Q2"}], "output_len": 9, "timestamp": 12.0},
    ])
    prompt, chat, session = from_file(path, max_new_tokens=5, time_scale=0.5, think_time_s=0.1)
    assert (prompt.prompt, prompt.max_new_tokens, prompt.arrival_s) == ("Once upon a time", 7, 0.0)
    assert chat.request_id == "chat" and chat.messages[0]["role"] == "system" and chat.arrival_s == 0.25
    assert isinstance(session, Session) and session.arrival_s == 1.0 and session.think_time_s == 0.1
    assert [t.content for t in session.turns] == ["Q1", "Q2"] and session.turns[0].recorded_answer == "A1"
    assert session.messages(1, ["live answer"]) == [{"role": "user", "content": "Q1"},
                                                    {"role": "assistant", "content": "live answer"},
                                                    {"role": "user", "content": "Q2"}]
    first_only = from_file(path, multi_turn=False, replay=False)[2]
    assert first_only.messages == [{"role": "user", "content": "Q1"}] and first_only.arrival_s == 0
    array = tmp_path / "sharegpt.json"
    array.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Hello"}]}]))
    assert from_file(array)[0].messages == [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize("lines, message", [
    (["{not json"], r"traffic.jsonl:1: not valid JSON .*write one JSON object per line"),
    ([{"prompt": "a"}, {"text": "b"}], r"traffic.jsonl:2: a record needs exactly one of \"prompt\", \"messages\" or "
                                       r"\"conversations\", got none \(unknown keys: text\)"),
    ([{"prompt": ""}], r"traffic.jsonl:1: \"prompt\" must be a non-empty string"),
    ([{"prompt": "a", "max_tokens": 0}], r"traffic.jsonl:1: \"max_tokens\" 0 must be a positive integer"),
    ([{"conversations": [{"from": "robot", "value": "x"}]}], r":1: message from 'robot' is not one of"),
    ([{"conversations": [{"from": "gpt", "value": "x"}]}], r":1: the conversation starts with an answer"),
    ([{"prompt": "a", "timestamp": 1}, {"prompt": "b"}], r"record 2 has no \"timestamp\" but others do"),
    ([{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}], r":2: id 'x' is already used at .*traffic.jsonl:1"),
    ([], r"holds no records"),
])
def test_a_bad_traffic_file_names_file_and_line(tmp_path, lines, message):
    with pytest.raises(WorkloadError, match=message):
        from_file(_write(tmp_path, lines))


def test_a_missing_traffic_file_is_named(tmp_path):
    with pytest.raises(WorkloadError, match="does not exist"):
        from_file(tmp_path / "nope.jsonl")


def test_sessions_send_the_live_answers_and_replay_timestamps(tmp_path):
    path = _write(tmp_path, [{"id": "s", "conversations": [{"from": "human", "value": "Q1"},
                                                           {"from": "gpt", "value": "recorded"},
                                                           {"from": "human", "value": "Q2"}], "timestamp": 0},
                             {"id": "late", "prompt": "p", "timestamp": 0.4}])
    with FaultyServer("ok", max_tokens=2) as server:
        run = run_load(EndpointConfig(server.url), from_file(path), LoadPattern(replay=True))
    by_id = {r.request_id: r for r in run.results}
    assert set(by_id) == {"s-t0", "s-t1", "late"} and run.errors == {}
    assert by_id["late"].arrival - by_id["s-t0"].arrival >= 0.39
    assert by_id["s-t1"].arrival >= by_id["s-t0"].finished  # turn 2 waits for the answer to turn 1
    assert by_id["s-t0"].text == "tok0 tok1 "


def test_a_failed_turn_aborts_the_rest_of_its_session_counted():
    session = Session([Turn(c, 3) for c in "abc"], session_id="s")
    with FaultyServer("error500") as server:
        run = run_load(EndpointConfig(server.url), [session])
    assert [(r.request_id, r.error) for r in run.results] == [("s-t0", "http_500"), ("s-t1", "session_aborted"),
                                                              ("s-t2", "session_aborted")]


def test_a_base_models_server_gets_sessions_as_a_plain_transcript_and_a_chat_refusal_names_the_fix():
    """Issue #44: a server whose model has no chat template refuses chat requests (vLLM: 400 "... must provide a
    chat template ..."); the failure says so and names --infergate-endpoint-api completions, under which each turn
    of a multi-turn session goes to /v1/completions as the conversation's plain-text transcript."""
    session = Session([Turn("Hello", 3), Turn("And then?", 3)], session_id="s")
    with FaultyServer("base_model") as server:
        refused = run_load(EndpointConfig(server.url), [session])
        assert refused.results[0].error == "no_chat_template"
        assert "has no chat template for its model (a base model): run with --infergate-endpoint-api " \
               "completions" in refused.results[0].error_detail
        assert "must provide a chat template" in refused.results[0].error_detail  # the server's own words
        server.httpd.bodies.clear()
        run = run_load(EndpointConfig(server.url, api="completions"), [session])
    assert all(r.ok for r in run.results), [(r.error, r.error_detail) for r in run.results]
    prompts = [body["prompt"] for body in server.httpd.bodies if "prompt" in body]
    assert prompts[-2:] == ["User: Hello\n\nAssistant:",
                            f"User: Hello\n\nAssistant: {run.results[0].text.strip()}\n\nUser: And then?\n\n"
                            "Assistant:"]


def test_sessions_on_the_engine_reuse_the_conversation_prefix(tmp_path, tiny_fp32):
    from pytest_infergate.engine import Engine, EngineConfig
    from pytest_infergate.workloads import run_sessions

    path = _write(tmp_path, [{"id": "s", "conversations": [
        {"from": "system", "value": "You answer about the sea. " * 4},
        {"from": "human", "value": "Tell me about the tides and the moon."}, {"from": "gpt", "value": "ok"},
        {"from": "human", "value": "And the waves?"}, {"from": "gpt", "value": "ok"},
        {"from": "human", "value": "And rivers?"}]}, {"prompt": "Once upon a time"}])
    config = EngineConfig(prefix_caching=True, max_model_len=1024, kv_budget_bytes=16 << 20)
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, config) as engine:
        session, single = run_sessions(engine, from_file(path, max_new_tokens=6))
    assert [r.request_id for r in session] == ["s-t0", "s-t1", "s-t2"] and len(single) == 1
    assert session[0].num_cached_tokens == 0
    for earlier, later in zip(session, session[1:]):  # everything before the new turn is cached, block-aligned
        assert later.prompt_token_ids[:len(earlier.prompt_token_ids)] == earlier.prompt_token_ids
        assert later.num_cached_tokens >= (len(earlier.prompt_token_ids) // 16) * 16 > 0


# --- capacity under an SLO -------------------------------------------------------------------------------------

def test_capacity_spec_is_validated():
    with pytest.raises(OptionError, match="capacity needs an SLO"):
        CapacitySpec(Slo())
    with pytest.raises(OptionError, match="search='qps' must be one of rate, concurrency"):
        CapacitySpec(Slo(e2e_ms=1), search="qps")
    with pytest.raises(OptionError, match="a concurrency search takes whole numbers"):
        CapacitySpec(Slo(e2e_ms=1), search="concurrency", bounds=(1.5, 4))
    assert CapacitySpec(Slo(e2e_ms=1), bounds=(1, 10)).grid() == [1, 2, 4, 8, 10]
    lo, hi = wilson(19, 20)
    assert lo == pytest.approx(0.764, abs=0.01) and hi == pytest.approx(0.991, abs=0.01)


@pytest.mark.slow  # builds a model, starts processes or runs many bootstraps
def test_capacity_finds_the_knee_of_a_server_with_four_slots():
    """4 slots, 4 tokens 50 ms apart: a request holds its slot 0.2 s or more (50 ms after each token), so the
    server answers at most 20 a second, and with c in flight (closed loop) a request takes c / 20 s or more once the
    queue has built. An e2e SLO of 800 ms can be met by 90% up to 16 in flight, fewer on a busy machine. The search
    read 32 and 64 in flight as met when its clock left out the seconds a connection waited in the server's full
    accept queue, and when a point was decided on the requests that had ended first (the fast ones): 4 runs in 13."""
    request = EndpointRequest(messages=CHAT, max_tokens=4)
    spec = CapacitySpec(Slo(e2e_ms=800), target_goodput=0.9, search="concurrency", bounds=(1, 64), budget_s=90,
                        min_requests=8)
    with FaultyServer("ok", token_delay_s=0.05, slots=4) as server:
        result = search_capacity(EndpointConfig(server.url), [request], spec)
    assert 4 <= result.capacity <= 16, result.describe()
    assert result.reason == "bracket resolved" and result.bracket == (result.capacity, result.capacity + 1)
    assert [p.load for p in result.points][:4] == [1, 2, 4, 8]  # the coarse sweep doubles, then bisection
    # the point above the knee failed: clearly (stopped early), after its whole run with its interval wholly below
    # the target (CI, a busy runner: 16 in flight, 26 of 33 met, [0.62, 0.89]), or where 16 in flight sit right at
    # the SLO, unresolved (the target inside its interval) -- never a capacity either way
    failing = [p for p in result.points if p.passed is False]
    assert failing and all(p.unresolved or p.stopped == "clearly over" or p.ci[1] < spec.target_goodput
                           for p in failing), result.describe()
    assert all(p.requests < spec.num_requests(p.load) for p in failing if p.stopped == "clearly over")
    measurement = capacity_measurement(result)
    assert measurement.samples["capacity_concurrency"] == [result.capacity]
    assert measurement.samples["capacity_rps"][0] == pytest.approx(result.best.throughput_rps)
    assert measurement.engine["capacity"]["points"][0]["latency_ms"]["e2e_ms_p999"] > 0


def test_a_point_whose_interval_holds_the_target_is_remeasured_then_unresolved():
    # issue #35 point 6: every second request fails, so attainment sits at the 50% target: neither pass nor fail
    spec = CapacitySpec(Slo(e2e_ms=60_000), target_goodput=0.5, search="concurrency", bounds=(2, 2), budget_s=60,
                        min_requests=10)
    with FaultyServer("flaky", max_tokens=2) as server:
        result = search_capacity(EndpointConfig(server.url), [EndpointRequest(messages=CHAT, max_tokens=2)], spec,
                                 warmup=0)
    (point,) = result.points
    assert point.unresolved and point.remeasured == 1 and point.requests == 20  # two batches pooled
    assert point.ci[0] < 0.5 < point.ci[1] and point.passed is False and result.capacity is None
    assert "unresolved (the SLO target inside the interval, not counted as passing): 2 (50.0%" in result.describe()


def test_a_point_stops_once_its_interval_lies_above_the_target():
    # issue #35 point 6: early stop when a point is decided, passing as well as failing
    spec = CapacitySpec(Slo(e2e_ms=60_000), target_goodput=0.5, search="rate", bounds=(20, 20), point_s=10,
                        budget_s=120, min_requests=12)
    with FaultyServer("ok", max_tokens=2) as server:
        result = search_capacity(EndpointConfig(server.url), [EndpointRequest(messages=CHAT, max_tokens=2)], spec,
                                 warmup=0)
    (point,) = result.points
    assert point.passed and point.stopped == "clearly met" and point.ci[0] > 0.5
    # 12 met of 12 already puts the interval above 50%: far fewer than the 200 planned were sent
    assert spec.min_requests <= point.requests < spec.num_requests(20) // 4 and point.cancelled > 0
    assert result.capacity == 20


def test_a_point_is_not_met_on_the_requests_that_ended_first():
    # half the answers are 1 token, half 30 tokens 50 ms apart (1.5 s) against an 800 ms SLO; 64 in flight: the short
    # ones end first. A stop that read the ended requests alone found the point clearly met after 35 of them, while
    # the long ones, every one a miss, were still in flight: a verdict on the survivors
    short, long = (EndpointRequest(messages=CHAT, max_tokens=n) for n in (1, 30))
    spec = CapacitySpec(Slo(e2e_ms=800), target_goodput=0.9, search="concurrency", bounds=(64, 64), budget_s=60,
                        min_requests=8)
    with FaultyServer("ok", token_delay_s=0.05) as server:
        result = search_capacity(EndpointConfig(server.url), [short, long], spec, warmup=0)
    (point,) = result.points
    assert point.passed is False and point.stopped == "clearly over" and result.capacity is None, result.describe()
    assert point.requests - point.met > math.floor(0.1 * spec.num_requests(64))  # the long ones counted, missed


def test_a_point_that_misses_more_than_the_target_allows_stops_early_as_clearly_over():
    # every answer takes >= 4 x 50 ms against a 100 ms SLO: after allowed + 1 misses the point is decided
    spec = CapacitySpec(Slo(e2e_ms=100), target_goodput=0.9, search="concurrency", bounds=(2, 2), budget_s=60,
                        min_requests=8)
    with FaultyServer("ok", token_delay_s=0.05, slots=4) as server:
        result = search_capacity(EndpointConfig(server.url), [EndpointRequest(messages=CHAT, max_tokens=4)], spec,
                                 warmup=0)
    (point,) = result.points
    planned = spec.num_requests(2)
    allowed = int((1 - spec.target_goodput) * planned + 1e-9)
    assert point.passed is False and point.stopped == "clearly over" and not point.unresolved
    assert point.met == 0 and allowed < point.requests < planned and result.capacity is None


def test_capacity_search_stops_within_its_time_budget():
    """A slow server (every answer after 2 s): the budget, not the server, ends the search, and the point it cut
    decides nothing."""
    spec = CapacitySpec(Slo(e2e_ms=10_000), target_goodput=0.9, bounds=(1, 8), budget_s=3, min_requests=10)
    stall_s = 2.0
    with FaultyServer("stall", stall_s=stall_s, max_tokens=2) as server:
        started = time.perf_counter()
        result = search_capacity(EndpointConfig(server.url, timeout_s=30), [EndpointRequest(messages=CHAT)], spec,
                                 warmup=0)
        elapsed = time.perf_counter() - started
    # the point alone would take 10 answers x 2 s; a search that sent another request after its budget would end
    # past budget + stall. The overrun was under 0.6 s on a loaded 2-core VM: 3x that is within the bound
    assert elapsed < spec.budget_s + stall_s, f"search took {elapsed:.1f}s"
    assert result.reason == "time budget spent" and result.capacity is None
    [point] = result.points
    assert point.passed is None and point.stopped == "time budget" and point.cancelled > 0
    assert point.requests + point.cancelled == spec.num_requests(1)


def test_capacity_against_a_dead_server_fails_the_lowest_point():
    spec = CapacitySpec(Slo(e2e_ms=1000), bounds=(1, 4), budget_s=10, min_requests=3)
    from openai_servers import free_port

    config = EndpointConfig(f"http://127.0.0.1:{free_port()}/v1", model="m")
    result = search_capacity(config, [EndpointRequest(messages=CHAT)], spec, warmup=0)
    assert result.capacity is None and result.reason == "the lowest load 1 already misses the SLO"
    assert result.points[0].errors == {"connect": 1} and capacity_measurement(result).samples["capacity_rps"] == [0]


# --- two servers: the quality comparison without a tokenizer ---------------------------------------------------

def _answer(pieces, tops):
    result = EndpointResult("x", text="".join(pieces))
    result.logprobs = [{"token": p, "logprob": top[p], "top": top} for p, top in zip(pieces, tops)]
    return result


def test_topk_pair_kl():
    same = {"a": math.log(0.6), "b": math.log(0.3)}
    assert topk_pair_kl(same, same) == pytest.approx(0.0, abs=1e-9)
    shifted = {"a": math.log(0.3), "b": math.log(0.6)}
    assert topk_pair_kl(same, shifted) > 0.1
    assert topk_pair_kl({"c": math.log(0.9)}, same) > topk_pair_kl({"a": math.log(0.9)}, same)


def test_compare_servers_uses_the_servers_tokens_up_to_the_first_difference():
    from pytest_infergate.quality.golden_files import GoldenSample

    top = {" Paris": math.log(0.9), " Lyon": math.log(0.05)}
    other = {" Lyon": math.log(0.6), " Paris": math.log(0.3)}
    dot = {".": math.log(0.99)}
    sample = GoldenSample(id="s1", category="facts", messages=None, prompt="The capital of France is",
                          max_new_tokens=4)
    same = compare_servers([sample], [_answer([" Paris", "."], [top, dot])], [_answer([" Paris", "."], [top, dot])],
                           [])
    assert same.summary["exact_match"] == 1 and same.summary["top1"] == 1 and same.reference_precision == \
        "reference-endpoint"
    differ = compare_servers([sample], [_answer([" Paris", "."], [top, dot])],
                             [_answer([" Lyon", "."], [other, dot])], [])
    quality = differ.samples[0]
    assert not quality.exact_match and quality.first_divergence == 0 and quality.first_divergence_char == 0
    assert quality.top1 == 0 and quality.mean_kl > 0  # only the first position: the contexts differ after it
    words = compare_servers([sample], [EndpointResult("x", text="Paris is big")],
                            [EndpointResult("x", text="Paris is small")], [])
    assert words.samples[0].first_divergence == 2 and "compared in words" in words.notes[0]


# --- the reference endpoint's options -------------------------------------------------------------------------

def test_reference_endpoint_options_are_checked_before_any_test(pytester, cache_dir):
    from openai_servers import free_port

    pytester.makepyfile("def test_x(infergate_endpoint):\n    pass\n")
    args = ["--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}", "-p", "no:cacheprovider"]
    alone = pytester.runpytest(*args, "--infergate-reference-endpoint=http://127.0.0.1:9/v1")
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    alone.stderr.fnmatch_lines(["*--infergate-reference-endpoint is the reference of --infergate-endpoint: give the "
                                "candidate server with --infergate-endpoint URL too*"])
    with FaultyServer("ok") as server:
        down = pytester.runpytest(*args, f"--infergate-endpoint={server.url}",
                                  f"--infergate-reference-endpoint=http://127.0.0.1:{free_port()}/v1")
        bad = pytester.runpytest(*args, f"--infergate-endpoint={server.url}", "--infergate-reference-endpoint=x:1")
    assert down.ret == bad.ret == pytest.ExitCode.USAGE_ERROR
    down.stderr.fnmatch_lines(["*endpoint http://127.0.0.1:*/v1 is not reachable*fix --infergate-reference-endpoint*"])
    bad.stderr.fnmatch_lines(["*--infergate-reference-endpoint 'x:1' is not an http(s) URL*"])


def test_ab_without_a_reference_endpoint_skips_with_the_option(pytester, cache_dir):
    pytester.makepyfile("""
from pytest_infergate.endpoint import EndpointRequest

def test_ab(infergate_endpoint):
    infergate_endpoint.ab([EndpointRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=2)])
""")
    with FaultyServer("ok") as server:
        result = pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                    f"--infergate-endpoint={server.url}", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs the other deployment; pass --infergate-reference-endpoint URL*"])


# --- request extras per workload line and per test (issue #35 point 4) -------------------------------------------

def test_a_workload_line_carries_ignore_eos_and_extra_body_to_the_server(tmp_path):
    from pytest_infergate.endpoint.client import session_request

    path = tmp_path / "traffic.jsonl"
    path.write_text(
        json.dumps({"prompt": "Count.", "max_tokens": 6, "ignore_eos": True, "extra_body": {"min_tokens": 4}}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"}], "extra_body": {"top_k": 3}}) + "\n")
    request, session = from_file(path)
    assert request.ignore_eos and request.extra_body == {"min_tokens": 4}
    assert EndpointRequest.coerce(request, "completions").body("m", True)["min_tokens"] == 4
    assert EndpointRequest.coerce(request, "completions").extra_body == {"ignore_eos": True, "min_tokens": 4}
    assert isinstance(session, Session) and session_request(session, 1, ["b"], "chat").extra_body == {"top_k": 3}
    with FaultyServer("ok", max_tokens=6) as server:
        run = run_load(EndpointConfig(server.url, api="completions"), [request], scrape=False)
        sent = server.httpd.bodies[-1]
    assert run.success_rate == 1 and sent["ignore_eos"] is True and sent["min_tokens"] == 4
    bad_lines = [({"prompt": "x", "extra_body": [1]}, r"traffic.jsonl:1: \"extra_body\" must be a JSON object"),
                 ({"prompt": "x", "ignore_eos": "yes"}, r"traffic.jsonl:1: \"ignore_eos\" 'yes' must be true or false")]
    for line, message in bad_lines:
        path.write_text(json.dumps(line) + "\n")
        with pytest.raises(WorkloadError, match=message):
            from_file(path)


EXTRAS_TEST = """
import pytest
from pytest_infergate.engine import Request

@pytest.mark.infergate_extra_body(min_tokens=3, top_k=5)
def test_extras(infergate_endpoint):
    own = Request(prompt="Count.", max_new_tokens=4, extra_body={"top_k": 9})
    plain = Request(prompt="Count.", max_new_tokens=4)
    infergate_endpoint.load([own, plain], {"concurrency": 1}, warmup=0)
"""


def test_a_test_marker_adds_extra_fields_to_every_request_and_a_bad_one_fails_collection(pytester, cache_dir):
    pytester.makepyfile(EXTRAS_TEST)
    args = ("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}", "-p", "no:cacheprovider",
            "--infergate-endpoint-api=completions")
    with FaultyServer("ok", max_tokens=4) as server:
        result = pytester.runpytest(f"--infergate-endpoint={server.url}", *args)
        bodies = list(server.httpd.bodies)
        pytester.makepyfile(EXTRAS_TEST.replace("min_tokens=3", 'model="other"'))
        bad = pytester.runpytest(f"--infergate-endpoint={server.url}", *args)
    result.assert_outcomes(passed=1)
    assert [(b["min_tokens"], b["top_k"]) for b in bodies[-2:]] == [(3, 9), (3, 5)]  # the request's own wins
    assert bad.ret != 0
    bad.stderr.fnmatch_lines(["*infergate_extra_body may not set model: the load generator sets them*"])


def test_a_fixed_output_workload_asks_for_exactly_its_tokens(tiny_source):
    from transformers import AutoTokenizer

    from pytest_infergate.workloads import chat_workload

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.path)
    requests = chat_workload(tokenizer, 3, prompt_tokens=(20, 40), max_new_tokens=(5, 9), fixed_output=True)
    assert all(r.ignore_eos and 5 <= r.max_new_tokens <= 9 for r in requests)
    assert all(EndpointRequest.coerce(r, "chat").extra_body == {"ignore_eos": True} for r in requests)
    assert not any(r.ignore_eos for r in chat_workload(tokenizer, 3, prompt_tokens=(20, 40)))

"""One bench whatever the target (gates.perf.PerfBench over a target's runs): what one kind of target cannot run
fails the test naming the fix; and one timing record of a request, wherever it ran (workloads.timings)."""

import pytest

from pytest_infergate.context import TestContext
from pytest_infergate.endpoint.exchange import EndpointResult
from pytest_infergate.engine import EngineConfig, Request
from pytest_infergate.gates.endpoint import ServedRuns
from pytest_infergate.gates.perf import PerfBench
from pytest_infergate.options import Options
from pytest_infergate.workloads.timings import RequestTimings


def _context(tmp_path):
    def fail(message):
        raise AssertionError(message)

    return TestContext("test_x.py::test_y", Options(cache_dir=tmp_path), lambda record: None, lambda finding: None,
                       fail, fail)


def test_speedup_on_a_served_model_fails_naming_the_fix(tmp_path):
    # nothing reaches the server: the served target says what it cannot run before anything is measured
    bench = PerfBench(_context(tmp_path), runs=ServedRuns(_context(tmp_path), bench=None, tokenizer_source=None))
    requests = [Request(prompt_token_ids=[7] * 8, max_new_tokens=2)]
    with pytest.raises(AssertionError, match="endpoint target: speedup\\(\\) compares two EngineConfigs") as failed:
        bench.speedup(requests, EngineConfig(), EngineConfig(cache_mode="none"), labels=("paged", "none"))
    assert "run it without --infergate-endpoint" in str(failed.value)


def test_a_served_models_load_tools_on_a_local_precision_fail_naming_the_fix(tiny_fp32, tmp_path):
    bench = PerfBench(_context(tmp_path), tiny_fp32, compare_side=lambda: tiny_fp32)
    try:
        for tool in (bench.sweep, bench.capacity, bench.load, bench.synchronous_rps, bench.workload):
            with pytest.raises(AssertionError, match="engine target: .*pass --infergate-endpoint URL"):
                tool()
        with pytest.raises(AssertionError, match="only a served model's load run takes"):
            bench([Request(prompt_token_ids=[7] * 8, max_new_tokens=2)], pattern={"concurrency": 2})
    finally:
        bench.close()


def test_the_engine_and_a_client_derive_latencies_from_one_record_the_same_way():
    engine = RequestTimings(arrival=10.0, first_scheduled=10.05, first_token=10.2, token_times=[10.2, 10.25, 10.36])
    engine.end(10.4)  # TPOT runs to the engine's last token
    served = EndpointResult("r0", arrival=10.0, first_token=10.2, token_times=[10.2, 10.25, 10.36], finished=10.4,
                            decode_end=10.4)  # a client ends the decode with the stream
    assert engine.ttft_s == served.ttft_s == pytest.approx(0.2) and engine.e2e_s == served.e2e_s
    assert engine.itl_s == served.itl_s and engine.queue_wait_s == pytest.approx(0.05)
    assert engine.tpot_s == pytest.approx(0.08) and served.tpot_s == pytest.approx(0.1)
    failed = EndpointResult("r1", arrival=10.0, first_token=10.2, token_times=[10.2, 10.3], finished=11.0,
                            error="timeout")
    assert failed.tpot_s is None  # a failed request has no decode end
    chunked = EndpointResult("r2", arrival=10.0, first_token=10.2, token_times=[10.2, 10.5], finished=10.5,
                             decode_end=10.5, num_output_tokens=4)  # chunks of two tokens each
    assert chunked.tpot_s == pytest.approx(0.1)

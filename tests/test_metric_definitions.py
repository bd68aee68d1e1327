"""One recorded stream through our definitions, vLLM bench serve's and guidellm's (written here from their
documentation), so the mapping table in docs/reference/metrics.md is a fact, not a claim."""

import pytest

from pytest_infergate.endpoint.exchange import EndpointResult
from pytest_infergate.stats import percentile

# a request sent at t=10.0 s whose 4 text chunks arrived at 10.200, 10.250, 10.310, 10.360, stream ended 10.370
STREAM = EndpointResult("r0", arrival=10.0, first_token=10.2, token_times=[10.2, 10.25, 10.31, 10.36], finished=10.37,
                        decode_end=10.37, num_output_tokens=4, finish_reason="length", status=200)


def vllm_bench(sent, chunks, end, output_len):
    latency = end - sent
    ttft = chunks[0] - sent
    return {"ttft": ttft, "tpot": (latency - ttft) / (output_len - 1),
            "itl": [b - a for a, b in zip(chunks, chunks[1:])], "e2el": latency}


def guidellm(sent, chunks, end, output_tokens):
    request_latency = end - sent
    ttft = chunks[0] - sent
    return {"time_to_first_token": ttft, "inter_token_latency": (request_latency - ttft) / (output_tokens - 1),
            "time_per_output_token": request_latency / output_tokens, "request_latency": request_latency}


def test_one_stream_maps_onto_vllm_bench_and_guidellm_as_documented():
    ours = {"ttft": STREAM.ttft_s, "tpot": STREAM.tpot_s, "itl": STREAM.itl_s, "e2e": STREAM.e2e_s}
    vllm = vllm_bench(10.0, STREAM.token_times, 10.37, 4)
    guide = guidellm(10.0, STREAM.token_times, 10.37, 4)
    assert ours["ttft"] == pytest.approx(vllm["ttft"]) == pytest.approx(guide["time_to_first_token"])
    assert ours["tpot"] == pytest.approx(vllm["tpot"]) == pytest.approx(guide["inter_token_latency"])
    assert ours["itl"] == pytest.approx(vllm["itl"])
    assert ours["e2e"] == pytest.approx(vllm["e2el"]) == pytest.approx(guide["request_latency"])
    # guidellm's TPOT includes the wait for the first token: not ours, and larger
    assert guide["time_per_output_token"] == pytest.approx(ours["e2e"] / 4) and guide["time_per_output_token"] > \
        ours["tpot"]


def test_percentiles_interpolate_linearly_as_numpy_and_the_benchmarks_do():
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0

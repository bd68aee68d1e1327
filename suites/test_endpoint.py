"""A live server under load (run with --infergate-endpoint URL; skipped without it): fixed concurrency, a request
rate with Poisson and with bursty arrivals, and a rate sweep, as `vllm bench serve` drives a server. Every request
must be answered (ini budget `test_endpoint.py: success_rate=1`); goodput counts the requests that met the SLO
(guide: "超时、限流和异常回退" - what users see under load, not only what the model can do)."""

import pytest

from pytest_infergate.workloads import chat_workload


@pytest.fixture
def workload(infergate_tokenizer):
    def make(num_requests: int, seed: int = 21):
        return chat_workload(infergate_tokenizer, num_requests, prompt_tokens=(20, 300), max_new_tokens=(16, 64),
                             seed=seed)

    return make


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
@pytest.mark.parametrize("concurrency", [1, 8])
def test_fixed_concurrency(infergate_endpoint, workload, concurrency):
    m = infergate_endpoint.load(workload(16), {"concurrency": concurrency}, label=f"c{concurrency}")
    assert m.num_requests == 16


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
@pytest.mark.parametrize("burstiness", [1.0, 0.25], ids=["poisson", "bursty"])
def test_request_rate(infergate_endpoint, workload, burstiness):
    m = infergate_endpoint.load(workload(24, seed=22), {"rate_per_s": 4, "burstiness": burstiness},
                                label=f"rate4-b{burstiness:g}")
    assert m.num_requests == 24


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
def test_rate_sweep(infergate_endpoint, workload):
    points = infergate_endpoint.sweep(workload(16, seed=23), rates=[1, 4, 16])
    assert [p.rate_per_s for p, _ in points] == [1, 4, 16]

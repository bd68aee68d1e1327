"""A live server under load (run with --infergate-endpoint URL; skipped without it): fixed concurrency, a request
rate with Poisson and with bursty arrivals, a rate sweep, as `vllm bench serve` drives a server; its capacity
under the SLO; and, with --infergate-reference-endpoint, an interleaved A/B against the reference deployment.
Every request must be answered (ini budget `test_endpoint.py: success_rate=1`); goodput counts the requests that
met the SLO (guide: "超时、限流和异常回退" - what users see under load, not only what the model can do)."""

import pytest


@pytest.fixture
def workload(infergate_endpoint):
    """Chat prompts sized by the local tokenizer; in an install without torch, run with
    --infergate-endpoint-api=completions and the server's /tokenize sizes them (see infergate_endpoint.workload)."""
    def make(num_requests: int, seed: int = 21):
        return infergate_endpoint.workload(num_requests, prompt_tokens=(20, 300), max_new_tokens=(16, 64), seed=seed)

    return make


@pytest.fixture
def synchronous_rps(infergate_endpoint, workload):
    """The server's rate one request at a time, measured once a session: the request rates below are multiples of
    it, so the suite passes on a small server (a fixed 4 req/s answered 12.5% of requests on one whose capacity
    was 0.77 req/s) and stresses a big one."""
    return infergate_endpoint.synchronous_rps(workload(8, seed=20))


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
@pytest.mark.parametrize("concurrency", [1, 8])
def test_fixed_concurrency(infergate_endpoint, workload, concurrency):
    m = infergate_endpoint.load(workload(16), {"concurrency": concurrency}, label=f"c{concurrency}")
    assert m.num_requests == 16


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
@pytest.mark.parametrize("burstiness", [1.0, 0.25], ids=["poisson", "bursty"])
def test_request_rate(infergate_endpoint, workload, synchronous_rps, burstiness):
    """Arrivals at the synchronous rate: a server that batches at all keeps up, one that cannot queues."""
    m = infergate_endpoint.load(workload(24, seed=22), {"rate_per_s": synchronous_rps, "burstiness": burstiness},
                                label=f"synchronous-rate-b{burstiness:g}")
    assert m.num_requests == 24


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
def test_rate_sweep(infergate_endpoint, workload, synchronous_rps):
    """Half, once and twice the synchronous rate (a baseline keys each point by its place, not its rate)."""
    shares = (0.5, 1, 2)
    rates = [round(synchronous_rps * share, 4) for share in shares]
    points = infergate_endpoint.sweep(workload(16, seed=23), rates=rates, names=[f"x{s:g}-sync" for s in shares])
    assert [p.rate_per_s for p, _ in points] == rates


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
def test_sweep_profile(infergate_endpoint, workload):
    """guidellm's sweep profile: one request at a time, all at once, then rates between; the knee (median e2e
    within 2x the synchronous run's) and the best goodput are marked in the records."""
    points = infergate_endpoint.sweep(workload(12, seed=26), points=4)
    assert len(points) >= 2 and points[0][0].concurrency == 1


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
def test_capacity(infergate_endpoint, workload, synchronous_rps):
    """Capacity under the SLO, as `vllm bench sweep serve_sla` finds it: the highest Poisson request rate at which
    95% of requests still meet it. Gate it with an ini budget line such as `test_capacity: min_capacity_rps=12`."""
    result = infergate_endpoint.capacity(workload(32, seed=24), search="rate", target_goodput=0.95,
                                         bounds=(synchronous_rps / 4, synchronous_rps * 16), budget_s=240,
                                         point_s=15)
    assert result.points, result.describe()


@pytest.mark.infergate_slo(ttft_ms=2000, tpot_ms=200)
def test_against_the_reference_deployment(infergate_endpoint, workload):
    """With --infergate-reference-endpoint (e.g. the fp16 deployment of a quantized one): the same load on both
    servers, interleaved A B A B, and the candidate's slowdown judged on a paired bootstrap CI (max_regression,
    default 0.10). Skipped with one server."""
    a, b = infergate_endpoint.ab(workload(16, seed=25), {"concurrency": 4})
    assert a.num_requests == b.num_requests

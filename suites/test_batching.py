"""Batch scheduling (guide, section 3 and pitfalls 3 and 5): sequential vs static vs dynamic vs continuous on one
workload under bursty and Poisson arrivals — throughput, TTFT p50/p99, padding waste with and without length
bucketing — and the guide's three service profiles, each gated by its own budget: chat (small window, TTFT
first), offline batch (large batch, throughput first), code completion (latency-sensitive)."""

import pytest

from pytest_infergate.workloads import chat_workload, with_burst_arrivals, with_poisson_arrivals

MODES = ["sequential", "static", "dynamic", "continuous"]


def workload(tokenizer, arrivals: str):
    requests = chat_workload(tokenizer, 8, prompt_tokens=(20, 200), max_new_tokens=(8, 16), seed=11)
    if arrivals == "poisson":
        return with_poisson_arrivals(requests, rate_per_s=2.0, seed=12)
    return with_burst_arrivals(requests, burst_size=4, gap_s=1.0)


@pytest.mark.parametrize("arrivals", ["bursty", "poisson"])
@pytest.mark.parametrize("mode", MODES)
def test_batching_modes(reference_only, needs_engine, infergate_bench, infergate_tokenizer, engine_config, mode,
                        arrivals, record_property):
    needs_engine("the batching-modes experiment (sequential / static / dynamic / continuous)")
    config = engine_config(batching=mode, max_batch_size=8, window_ms=200.0)
    m = infergate_bench(workload(infergate_tokenizer, arrivals), config, warmup=1, repeats=1,
                        label=f"{mode}-{arrivals}", tags={"experiment": "batching", "arrivals": arrivals})
    padding = sum(s["num_padding_tokens"] for s in m.steps)
    useful = sum(s["num_prefill_tokens"] + s["num_decode_tokens"] for s in m.steps)
    record_property("padding_share", round(padding / max(1, padding + useful), 3))
    assert m.num_failed == 0
    if mode in ("sequential", "continuous"):
        assert padding == 0


def test_length_bucketing_reduces_padding(reference_only, needs_engine, infergate_bench, infergate_tokenizer,
                                          engine_config, record_property):
    needs_engine("length bucketing")
    requests = chat_workload(infergate_tokenizer, 8, prompt_tokens=(20, 400), max_new_tokens=(4, 4), seed=13)
    waste = {}
    for bucketing in (False, True):
        config = engine_config(batching="static", max_batch_size=4, length_bucketing=bucketing)
        m = infergate_bench(requests, config, warmup=0, repeats=1, label=f"bucketing-{bucketing}")
        padding = sum(s["num_padding_tokens"] for s in m.steps)
        waste[bucketing] = padding / max(1, padding + sum(s["num_prefill_tokens"] + s["num_decode_tokens"]
                                                          for s in m.steps))
    record_property("padding_share_without_bucketing", round(waste[False], 3))
    record_property("padding_share_with_bucketing", round(waste[True], 3))
    assert waste[True] < waste[False]


PROFILES = {
    # chat: small dynamic window, modest batch, TTFT first
    "chat": dict(batching="continuous", max_batch_size=4, prefill_chunk_size=256),
    # offline batch: large batch, throughput first
    "offline": dict(batching="continuous", max_batch_size=32, max_batched_tokens=4096),
    # code completion: short outputs, latency-sensitive, small batch
    "code": dict(batching="continuous", max_batch_size=2),
}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_service_profile(reference_only, request, infergate_bench, infergate_tokenizer, engine_config, profile):
    if profile == "offline":
        requests = chat_workload(infergate_tokenizer, 16, prompt_tokens=(40, 200), max_new_tokens=(16, 32), seed=21)
    elif profile == "chat":
        requests = with_poisson_arrivals(chat_workload(infergate_tokenizer, 8, prompt_tokens=(20, 120),
                                                       max_new_tokens=(16, 32), seed=22), rate_per_s=2.0, seed=23)
    else:
        requests = with_poisson_arrivals(chat_workload(infergate_tokenizer, 8, prompt_tokens=(40, 160),
                                                       max_new_tokens=(8, 16), seed=24), rate_per_s=2.0, seed=25)
    # the budget scope "profile-<name>" comes from suites/conftest.py or the team's ini
    infergate_bench(requests, engine_config(**PROFILES[profile]), warmup=1, repeats=1, label=f"profile-{profile}")

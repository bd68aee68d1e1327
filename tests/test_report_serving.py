"""The report's serving and golden sections, rendered from synthetic RunResults (no model, no server): the server's
/metrics beside the client figures, the capacity chart with the SLO and the knee, A/B runs of two deployments,
golden near-ties vs drift, and batch invariance."""

import re

import pytest
from browser import needs_chromium, open_page

from pytest_infergate.endpoint.capacity_records import CapacityPoint, CapacityResult, CapacitySpec, capacity_measurement
from pytest_infergate.endpoint.load_run import Slo
from pytest_infergate.endpoint.server_metrics import ServerMetrics
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.conversations import PREFIX_CACHE_KEY, PrefixCacheUse
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.quality.golden_generation import BatchInvariance, Divergence, VariantResult
from pytest_infergate.quality.metrics import SampleQuality
from pytest_infergate.report import render
from pytest_infergate.results.records import (
    BatchInvarianceRecord,
    GoldenRecord,
    PerfRecord,
)
from pytest_infergate.results.run import RunResults
from pytest_infergate.status import Status

CANDIDATE, REFERENCE = "http://candidate:8000/v1", "http://reference:8001/v1"


def scraped(url: str, **after) -> dict:
    before = {"prompt_tokens": 100.0, "generation_tokens": 50.0, "preemptions": 0.0}
    metrics = ServerMetrics(url + "/metrics", "vLLM", before, {**before, **after},
                            [[0.5, {"kv_usage": 0.42, "running_requests": 6.0, "waiting_requests": 2.0}]],
                            notes=["vLLM exposes no prefix_cache_hit_rate: not measured, not gated"])
    return {**metrics.to_dict(), "prefix_cache_source": "", "cached_prompt_share": None}


def endpoint_record(test: str, engine: dict, samples: dict, **extra) -> PerfRecord:
    measurement = Measurement(samples={"ttft_ms": [40.0, 60.0], "tpot_ms": [5.0, 6.0], "e2e_ms": [300.0, 420.0],
                                       "tokens_per_s": [120.0], "success_rate": [1.0], **samples},
                              repetitions=1, num_requests=2, engine=engine)
    return PerfRecord(test=test, label=test.split("::")[-1], precision="endpoint",
                      measurement=measurement, backend="endpoint",
                      engine_config={"backend": "endpoint", "url": CANDIDATE, "served_model": "llama-candidate",
                                     "pattern": "concurrency 4"}, **extra)


def capacity_record() -> PerfRecord:
    spec = CapacitySpec(Slo(e2e_ms=800), target_goodput=0.9, search="concurrency", bounds=(1, 16))

    def point(load, met, passed, e2e_p99):
        return CapacityPoint(load, 20, met, met / 20, (max(0.0, met / 20 - 0.12), min(1.0, met / 20 + 0.04)),
                             passed, "" if passed else "clearly over", 4.0, load * 1.2, load * 1.2 * met / 20,
                             latency_ms={"e2e_ms_p99": e2e_p99, "ttft_ms_p99": e2e_p99 / 4})

    points = [point(1, 20, True, 210.0), point(2, 20, True, 390.0), point(4, 19, True, 760.0),
              point(8, 6, False, 1510.0), point(6, 12, False, 1100.0)]
    result = CapacityResult(spec, points, 4, 4.8, (4, 6), "bracket resolved", 41.0)
    record = endpoint_record("test_serving.py::test_capacity", {}, {})
    record.measurement = capacity_measurement(result)
    record.tags = {"experiment": "capacity", "search": "concurrency"}
    return record


def ab_record() -> PerfRecord:
    engine = {"server_metrics": scraped(CANDIDATE, preemptions=3.0, prompt_tokens=1300.0, generation_tokens=650.0),
              "reference": {"url": REFERENCE, "served_model": "llama-reference", "errors": {},
                            "server_metrics": scraped(REFERENCE, preemptions=1.0, prompt_tokens=1100.0)}}
    record = endpoint_record("test_serving.py::test_ab", engine, {"kv_usage": [0.42], "preemptions": [3.0]},
                             tags={"experiment": "ab", "baseline_precision": "reference-endpoint"},
                             baseline_summary={"ttft_ms_p50": 35.0, "tokens_per_s": 140.0, "success_rate": 1.0})
    record.engine_config.update(reference_url=REFERENCE, reference_served_model="llama-reference")
    record.outcome.verdicts = [Verdict("tokens_per_s", Status.PASS, 0.86, 0.8, 0.93, 1.1, None, 120.0, 140.0, [4, 4],
                                       True)]
    return record


def sample(id_: str, verdict: str, margin: float, reason: str) -> SampleQuality:
    return SampleQuality(id_, "qa", "accepted answer", "new answer", [1, 2, 3], [1, 2, 4], 0.8, 0.7, 0.8, False, 2,
                         9, 1.0, mean_kl=0.0042, regression=verdict, regression_reason=reason,
                         divergence_margin=margin)


def golden_record() -> GoldenRecord:
    return GoldenRecord("test_quality.py::test_golden[nf4]", Status.FAIL, "nf4", "golden/accepted/nf4.json",
                        compared=12, changed=[sample("qa-3", "near-tie", 0.031, "margin 0.031 nats < 0.1"),
                                              sample("qa-7", "drift", 2.75, "margin 2.75 nats ≥ 0.1")],
                        policy={"max_drift": 0, "near_tie_margin": 0.1}, problems=["1 sample drifted (qa-7)"])


def batch_invariance_record(precision: str, changed: bool) -> BatchInvarianceRecord:
    divergences = [Divergence("sum-2", 5, 0.0123, " the tide rises twice", " the tide rises once")] if changed else []
    result = BatchInvariance(precision, ["sum-1", "sum-2", "qa-1", "qa-2"], [
        VariantResult("batch", "the fixed-composition run", divergences, 4, 0.0031, 0.012),
        VariantResult("rotated", "rotated by half, at most 2 at a time", [], 4, 0.0017, 0.004)])
    return BatchInvarianceRecord(f"test_quality.py::test_batch[{precision}]", Status.PASS, result)


def local_sessions_record() -> PerfRecord:
    measurement = Measurement(samples={"ttft_ms": [8.0], "tokens_per_s": [300.0], "prefix_cache_hit_rate": [0.61]},
                              repetitions=1, num_requests=6,
                              engine={PREFIX_CACHE_KEY: PrefixCacheUse(6, 1200, 732, 4, sessions=2).to_dict()})
    return PerfRecord("test_chat.py::test_sessions", "", "fp32", measurement,
                      engine_config={"batching": "continuous", "cache_mode": "paged", "prefix_caching": True})


@pytest.fixture(scope="module")
def html() -> str:
    no_metrics = endpoint_record("test_serving.py::test_no_metrics", {}, {})
    with_metrics = endpoint_record("test_serving.py::test_load", {"server_metrics": scraped(CANDIDATE)},
                                   {"kv_usage": [0.42], "preemptions": [0.0], "running_requests": [6.0]})
    results = RunResults(records=[no_metrics, with_metrics, ab_record(), capacity_record(), golden_record(),
                                  batch_invariance_record("int8", True), batch_invariance_record("fp32", False),
                                  local_sessions_record()], outcomes={"test_serving.py::test_load": "passed"})
    return render(RunResults.from_dict(results.to_dict()))  # as a report reads a results file back


def section(html: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}">(.*?)</section>', html, re.S)
    assert match, f"no section {section_id}"
    return match.group(1)


def cells(row_html: str) -> list[str]:
    return [re.sub(r"<[^>]+>", " ", c).split() for c in re.findall(r"<td[^>]*>(.*?)</td>", row_html, re.S)]


def test_server_metrics_sit_beside_each_load_run_with_a_note_where_absent(html):
    servers = section(html, "server-metrics")
    assert "KV cache usage (peak)" in servers and "prefix-cache hits" in servers
    rows = re.findall(r"<tr>(.*?)</tr>", servers, re.S)[1:]
    load = next(r for r in rows if "test_load" in r)
    # KV 42%, no prefix-cache figure, 0 preemptions, queue 2, batch 6, tokens as counted by the server
    assert [c[0] if c else "" for c in cells(load)[-7:]] == ["42%", "–", "0", "2", "6", "0", "0"]
    assert "vLLM exposes no prefix_cache_hit_rate: not measured, not gated" in load
    missing = next(r for r in rows if "test_no_metrics" in r)
    assert "no server metrics for this run" in missing and "Traceback" not in html


def test_an_ab_of_two_deployments_names_both_servers(html):
    ab = section(html, "ab")
    assert "A (baseline)" in ab and "B (candidate)" in ab
    assert ab.index("llama-reference") < ab.index(REFERENCE) < ab.index("llama-candidate") < ab.index(CANDIDATE)
    assert "140 tok/s" in ab and "120 tok/s" in ab  # each side's own client figures
    assert "paired by round" in ab
    servers = section(html, "server-metrics")  # both servers' own /metrics, A first
    ab_rows = servers[servers.index("test_ab"):]
    assert ab_rows.index(REFERENCE) < ab_rows.index(CANDIDATE)
    assert ">1,000<" in ab_rows and ">1,200<" in ab_rows  # prompt tokens each server counted


def test_capacity_is_drawn_with_the_slo_and_the_knee(html):
    capacity = section(html, "capacity")
    assert capacity.count("<svg") == 2  # goodput vs load, latency p99 vs load
    assert "Goodput vs load" in capacity and "Latency p99 vs load" in capacity
    assert "SLO e2e ≤ 800 ms" in capacity  # the SLO line
    assert "capacity 4: 95% in SLO (95% CI 83%–99%)" in capacity  # the knee, with its CI, as describe() names it
    assert "the knee lies in here" in capacity  # the band between 4 (pass) and 6 (fail)
    rows = re.findall(r"<tr>(.*?)</tr>", capacity, re.S)[1:]
    assert [cells(r)[0][0] for r in rows] == ["1", "2", "4", "6", "8"]  # by load, not in search order
    assert [cells(r)[3][0] for r in rows] == ["pass", "pass", "pass", "fail", "fail"]
    assert "1,510 ms" in capacity and "requests in flight" in capacity


def test_golden_regression_shows_near_ties_and_drift_with_their_margins(html):
    golden = section(html, "golden")
    summary = cells(re.findall(r"<tr>(.*?)</tr>", golden, re.S)[1])
    assert summary[1:5] == [["fail"], ["2", "/", "12"], ["1"], ["1"]]  # verdict, changed, near-ties, drift
    assert golden.index("qa-7") < golden.index("qa-3")  # drift first
    assert "2.75 nats" in golden and "0.031 nats" in golden and "0.0042 nats" in golden
    assert "margin 0.031 nats &lt; 0.1" in golden and "1 sample drifted (qa-7)" in golden
    assert "<b>near-tie</b> (margin 0.031 nats)" in section(html, "samples")


def test_batch_invariance_says_which_precisions_are_batch_variant_with_a_sample(html):
    bi = section(html, "batch-invariance")
    int8, fp32 = re.findall(r"<tr><td(.*?)</tr>", bi, re.S)
    assert "batch-variant" in int8 and "1 / 4" in int8 and "25%" in int8
    assert "sum-2" in int8 and "margin 0.0123 nats" in int8 and "token 5" in int8
    assert "alone:  the tide rises twice" in int8 and "batch:  the tide rises once" in int8
    assert "batch-invariant" in fp32 and "0 / 4" in fp32
    assert "0.0031 nats (0.012 nats)" in int8


def test_a_local_run_on_sessions_shows_its_prefix_cache_reuse(html):
    assert "prefix cache: 732 of 1,200 prompt tokens reused (61%), 4 of 6 requests hit over 2 multi-turn sessions" \
        in section(html, "perf")


def test_no_e_notation_infinity_or_nan_in_the_new_sections(html):
    for section_id in ("server-metrics", "ab", "capacity", "golden", "batch-invariance"):
        text = re.sub(r"<[^>]+>", " ", section(html, section_id))
        assert not re.search(r"\d[eE][+-]?\d|\binf\b|\bnan\b|None", text), section_id


@needs_chromium
def test_the_serving_sections_fit_1400_px_in_headless_chromium(html, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(html)
    check = open_page(page, width=1400)
    assert check.errors == [] and check.page_overflow == 0 and check.wide_tables == []
    assert "Capacity under the SLO" in check.text and "Batch invariance" in check.text

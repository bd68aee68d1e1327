"""Multi-turn sessions on the local bench (`infergate_bench`): each turn is sent once the previous one is answered,
with that answer in its prompt, and the prefix cache is measured on the conversation's reuse."""

import pytest

from pytest_infergate.context import TestContext
from pytest_infergate.engine import EngineConfig
from pytest_infergate.gates.perf import PerfBench
from pytest_infergate.measurement import Measurement
from pytest_infergate.options import Options
from pytest_infergate.perf.conversations import PrefixCacheUse, prefix_cache_use
from pytest_infergate.perf.local_bench import Bench
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.workloads.traffic import Session, Turn

QUESTIONS = ("Tell me about the tides and the moon.", "And the waves?", "And the rivers that reach the sea?")


def two_conversations() -> list[Session]:
    return [Session([Turn(f"{question} ({name})", 6) for question in QUESTIONS],
                    system="You answer questions about the sea. " * 4, session_id=name) for name in ("a", "b")]


def engine_config(prefix_caching: bool) -> EngineConfig:
    return EngineConfig(prefix_caching=prefix_caching, max_model_len=1024, kv_budget_bytes=16 << 20)


@pytest.fixture
def bench(tiny_fp32):
    bench = Bench(tiny_fp32, calibrate=False)
    yield bench
    bench.close()


def test_each_turn_carries_the_answers_before_it(bench, tiny_fp32):
    measurement = Measurement()
    results = bench.run_once(two_conversations(), engine_config(True), warmup=1, into=measurement)
    assert sorted(r.request_id for r in results) == sorted(f"{s}.0-t{t}" for s in "ab" for t in range(3))
    assert measurement.num_requests == 6 and measurement.num_failed == 0
    assert len(measurement.samples["e2e_ms"]) == 6
    by_id = {r.request_id: r for r in results}
    for session in "ab":
        turns = [by_id[f"{session}.0-t{t}"] for t in range(3)]
        for earlier, later in zip(turns, turns[1:]):
            prompt = tiny_fp32.tokenizer.decode(later.prompt_token_ids, skip_special_tokens=True)
            assert earlier.text.strip() and earlier.text.strip() in prompt  # the answer actually given
            assert later.prompt_token_ids[:len(earlier.prompt_token_ids)] == earlier.prompt_token_ids
            assert later.timings.arrival >= earlier.timings.finished  # sent once the answer was known


def test_a_second_repetition_names_its_turns_apart(bench):
    measurement = Measurement()
    for _ in range(2):
        results = bench.run_once(two_conversations(), engine_config(True), warmup=0, into=measurement)
    assert {r.request_id for r in results} == {f"{s}.1-t{t}" for s in "ab" for t in range(3)}
    assert measurement.repetitions == 2 and measurement.num_requests == 12


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_cache_hits_are_counted_on_conversation_reuse(bench, prefix_caching):
    measurement = bench.measure(two_conversations(), engine_config(prefix_caching), warmup=1, repeats=2)
    reuse = prefix_cache_use(measurement.engine)
    assert reuse.requests == 6 and reuse.sessions == 2 and reuse.prompt_tokens > 0
    if prefix_caching:  # the 4 later turns reuse their conversation; the shared system prompt may hit too
        assert reuse.cached_tokens > 0 and reuse.requests_with_hits >= 4
        assert measurement.samples["prefix_cache_hit_rate"] == [pytest.approx(reuse.hit_rate)] * 2
        assert 0 < reuse.hit_rate < 1
    else:
        assert reuse.cached_tokens == 0 and reuse.requests_with_hits == 0
        assert "prefix_cache_hit_rate" not in measurement.samples
    assert PrefixCacheUse.from_dict(reuse.to_dict()) == reuse


def test_the_fixture_records_sessions_and_their_prefix_cache_use(tiny_fp32, tmp_path):
    records: list[PerfRecord] = []

    def fail(message):
        raise AssertionError(message)

    ctx = TestContext("test_chat.py::test_sessions", Options(cache_dir=tmp_path), records.append,
                      say=lambda finding: None, fail=fail, skip=fail)
    bench = PerfBench(ctx, tiny_fp32, compare_side=lambda: tiny_fp32)
    try:
        bench(two_conversations(), engine_config(True), warmup=0, repeats=1, label="chat")
    finally:
        bench.close()
    (record,) = records
    stored = PerfRecord.from_dict(record.to_dict())  # as the report reads it back
    reuse = prefix_cache_use(stored.measurement.engine)
    assert stored.measurement.num_requests == 6 and reuse.sessions == 2 and reuse.cached_tokens > 0
    assert stored.summary["prefix_cache_hit_rate"] == pytest.approx(reuse.hit_rate)

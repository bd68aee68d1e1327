"""Speed experiments decided on intervals (perf.lockstep): pass, inconclusive and fail on made-up rounds, and the
bench's speedup() and conclude() on the tiny model."""

import pytest

from pytest_infergate.context import TestContext
from pytest_infergate.engine import EngineConfig, Request
from pytest_infergate.gates.perf import PerfBench
from pytest_infergate.options import Options
from pytest_infergate.perf.lockstep import Speedup, conclusion, faster, grows, speedup
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.status import Status


def test_speedup_is_the_median_of_per_round_ratios_with_its_interval():
    # round 2 ran on a machine twice as slow: both sides alike, so its ratio is the same
    s = speedup("paged over none", fast=[40.0, 20.0, 41.0], slow=[10.0, 5.0, 10.0])
    assert s.ratio == pytest.approx(4.0) and 4.0 <= s.high <= 4.1 and s.low == pytest.approx(4.0)
    times = speedup("t", fast=[1.0, 2.0], slow=[3.0, 6.0], higher_is_better=False)  # seconds: slow/fast
    assert times.ratio == pytest.approx(3.0)
    with pytest.raises(ValueError, match="one value per round on each side"):
        speedup("x", [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="must be positive"):
        speedup("x", [1.0, 0.0], [1.0, 2.0])


def test_faster_passes_fails_or_is_inconclusive_on_the_interval():
    clear = speedup("a", [3.0, 3.1, 2.9, 3.2], [1.0] * 4)
    slower = speedup("b", [0.7, 0.8, 0.75, 0.72], [1.0] * 4)
    noisy = speedup("c", [0.8, 1.6, 1.2, 0.9], [1.0] * 4)  # one value per round alternately above and below 1
    assert [faster(s).status for s in (clear, slower, noisy)] == [Status.PASS, Status.FAIL, Status.INCONCLUSIVE]
    assert "95% CI" in faster(noisy).evidence


def test_grows_needs_the_intervals_apart():
    short = Speedup("p32", 1.5, 1.4, 1.6, 3)
    assert grows(short, Speedup("p256", 4.0, 3.5, 4.5, 3)).status is Status.PASS
    assert grows(short, Speedup("p256", 1.7, 1.55, 2.0, 3)).status is Status.INCONCLUSIVE  # overlapping
    assert grows(short, Speedup("p256", 1.2, 1.1, 1.4, 3)).status is Status.FAIL  # wholly at or below
    with pytest.raises(ValueError, match="0 < low <= high"):
        Speedup("bad", 1.0, 2.0, 1.0, 3)


def test_a_loaded_machine_gives_an_inconclusive_conclusion_not_a_failure():
    # the single-timing speedups seen on a loaded VM were 10.5, 7.7, 1.5 for prompts of 32, 128, 256 tokens; with
    # rounds the noise shows as wide intervals and the claim stays undecided
    short = speedup("p32", [10.5, 2.0, 3.0], [1.0] * 3)
    long = speedup("p256", [1.5, 6.0, 9.0], [1.0] * 3)
    status, message = conclusion("KV cache over the prompt length", [faster(long), grows(short, long)])
    assert status is Status.INCONCLUSIVE
    assert "p32 ×3.00 (95% CI 2.00-10.50, 3 rounds)" in message and "rerun the job" in message
    status, message = conclusion("x", [faster(speedup("slow", [0.5, 0.6], [1.0, 1.0]))])
    assert status is Status.FAIL and "FAIL: slow is faster" in message


def _context(tmp_path, records, warnings):
    def fail(message):
        raise AssertionError(message)

    return TestContext("test_kv.py::test_cache", Options(cache_dir=tmp_path), records.append,
                       warnings.append, fail, fail)


def test_the_bench_measures_a_speedup_step_locked_and_records_both_sides(tiny_fp32, tmp_path):
    records: list[PerfRecord] = []
    bench = PerfBench(_context(tmp_path, records, []), tiny_fp32, compare_side=lambda: tiny_fp32)
    config = dict(max_model_len=256, kv_budget_bytes=4 << 20, batching="sequential")
    requests = [Request(prompt_token_ids=[7] * 40, max_new_tokens=6, ignore_eos=True)]
    try:
        s = bench.speedup(requests, EngineConfig(**config, cache_mode="paged"),
                          EngineConfig(**config, cache_mode="none"), labels=("paged", "none"), rounds=2,
                          tags={"experiment": "kv"})
    finally:
        bench.close()
    assert s.rounds == 2 and s.name == "paged over none" and 0 < s.low <= s.ratio <= s.high
    assert [(r.label, r.engine_config["cache_mode"], r.measurement.repetitions) for r in records] == [
        ("paged", "paged", 2), ("none", "none", 2)]
    assert all(r.status is Status.PASS and "step-locked" in r.notes[0] and r.tags == {"experiment": "kv"}
               for r in records)


def test_conclude_warns_when_undecided_and_fails_when_wrong(tiny_fp32, tmp_path):
    undecided = [faster(speedup("c", [0.8, 1.6, 1.2, 0.9], [1.0] * 4))]
    wrong = [faster(speedup("b", [0.7, 0.8], [1.0, 1.0]))]
    warnings: list = []  # status.Finding
    bench = PerfBench(_context(tmp_path, [], warnings), tiny_fp32, compare_side=lambda: tiny_fp32)
    try:
        assert bench.conclude("exp", undecided) is Status.INCONCLUSIVE
        assert len(warnings) == 1 and warnings[0].check == "speed experiment"
        assert "test_kv.py::test_cache: exp: INCONCLUSIVE" in warnings[0].text()
        with pytest.raises(AssertionError, match="exp: FAIL"):
            bench.conclude("exp", wrong)
        assert bench.conclude("exp", [faster(speedup("a", [2.0, 2.1], [1.0, 1.0]))]) is Status.PASS
    finally:
        bench.close()

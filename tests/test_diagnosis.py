"""Diagnosis notes fire only on evidence beyond noise (an interval wholly past the threshold), and say it."""

import random

from pytest_infergate.measurement import Measurement
from pytest_infergate.report.diagnosis import quantized_slower, slowdown
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults


def measured(tokens_per_s: float, reps: int = 5, spread: float = 0.10, seed: int = 0) -> Measurement:
    rng = random.Random(seed)
    m = Measurement()
    for _ in range(reps):
        m.samples.setdefault("tokens_per_s", []).append(tokens_per_s * (1 + rng.uniform(-spread, spread)))
        m.samples.setdefault("tpot_ms", []).extend(1000 / tokens_per_s * (1 + rng.uniform(-spread, spread))
                                                   for _ in range(4))
        m.end_repetition()
    return m


def record(precision: str, m: Measurement) -> PerfRecord:
    return PerfRecord(test=f"suites/test_speed.py::test_chat[{precision}]", label="", precision=precision,
                      measurement=m)


def test_an_unchanged_quantized_run_raises_no_pitfall_note():
    # pitfall 2 fired on noise: int8 a few percent under fp32 by chance
    for seed in range(20):
        for int8 in (40.0, 38.5):
            results = RunResults(records=[record("fp32", measured(40.0, seed=seed)),
                                          record("int8", measured(int8, seed=seed + 100))])
            assert quantized_slower(results, "fp32") == [], (seed, int8)


def test_a_quantized_precision_slower_beyond_noise_is_noted_with_its_interval():
    results = RunResults(records=[record("fp32", measured(40.0, seed=1)), record("int8", measured(20.0, seed=2))])
    (found,) = quantized_slower(results, "fp32")
    assert found.pitfall.startswith("Pitfall 2")
    assert "int8 was more than 10% slower than fp32 in 1 of 1 comparable tests" in found.text
    assert "(95% CI " in found.text and "tokens/s of 5 and 5 repetitions" in found.text


def test_one_repetition_a_side_decides_on_per_request_tpot_and_too_little_decides_nothing():
    one, other = measured(20.0, reps=2, seed=3), measured(40.0, reps=2, seed=4)
    found = slowdown(one, other)
    assert found is not None and found.low > 1.5 and "median TPOT of 8 and 8 requests" in found.evidence
    assert slowdown(measured(20.0, reps=1), measured(40.0, reps=1)) is None  # 4 requests a side: no evidence


def test_a_failure_whose_change_is_named_is_diagnosed_by_that_change_alone():
    """Issue #56 trial: a ×2 regression named `engine_config.max_batch_size 8 → 1` got the pitfalls' advice (KV
    cache, quantization, larger batches) instead: with the change named, the note is about the change, nothing
    generic."""
    from pytest_infergate.perf.outcome import PerfOutcome
    from pytest_infergate.perf.verdict import Verdict
    from pytest_infergate.report.diagnosis import diagnose
    from pytest_infergate.status import Status

    change = "engine_config.max_batch_size 8 → 1"
    records = []
    for precision, speed in (("fp32", 40.0), ("int8", 20.0)):
        m = measured(speed, seed=len(records))
        m.samples["ttft_ms"], m.samples["e2e_ms"] = [100.0] * 20, [1000.0] * 20  # decode dominates: a pitfall note
        failed = Verdict("tokens_per_s", Status.FAIL, 2.9, 2.8, 3.0, 1.1, None, speed, speed * 2.9, (5, 5))
        r = record(precision, m)
        r.outcome = PerfOutcome(verdicts=[failed], route="stored", changes=[change])
        records.append(r)
    results = RunResults(records=records)
    generic = diagnose(RunResults(records=[record(r.precision, r.measurement) for r in records]), "fp32")
    assert {n.pitfall for n in generic} >= {"Pitfall 2: quantized slower than the reference", "prefill or decode?"}

    (note,) = diagnose(results, "fp32")
    assert note.severity == "warn" and note.pitfall == "what changed since the baseline"
    assert note.text.startswith(f"2 perf gates failed since {change} (e.g. suites/test_speed.py::test_chat[fp32]: "
                                "tokens/s 65.5% lower (time per token ×2.9 [2.8–3], limit ×1.1)). Look at that change "
                                "first")
    assert not any(word in note.text for word in ("KV cache", "quantiz", "batches"))

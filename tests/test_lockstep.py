"""Step-locked A/B (perf.lockstep): the two sides' engine steps take turns and each side is timed on its own steps."""

import sys
import time
from contextlib import contextmanager

import pytest

from pytest_infergate.engine import Engine, EngineConfig, Request
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf import lockstep
from pytest_infergate.perf.baseline_env import BaselineEnv, BaselineEnvError, Workload
from pytest_infergate.perf.budget import parse_budget
from pytest_infergate.perf.gate import compare_measurements
from pytest_infergate.perf.interleaved import AB_ROUNDS, evaluate_ab
from pytest_infergate.perf.local_bench import Bench
from pytest_infergate.perf.verdict import compare_samples
from pytest_infergate.status import Status
from pytest_infergate.workloads.traffic import Session, Turn

CFG = EngineConfig(max_model_len=128, kv_budget_bytes=4 << 20)


def requests(count=3, new=6):
    return [Request(prompt_token_ids=[7 + i] * 12, max_new_tokens=new, ignore_eos=True) for i in range(count)]


def test_side_clock_runs_only_inside_running():
    clock = lockstep.SideClock()
    time.sleep(0.02)
    assert clock() == 0.0
    with clock.running():
        time.sleep(0.02)
    ran = clock()
    time.sleep(0.02)
    # no upper bound on `ran`: a sleep can overshoot by any amount on a loaded machine; the equalities are the test
    assert clock() == ran and ran >= 0.015


def test_engine_times_its_requests_on_the_clock_it_is_given(tiny_fp32):
    engine = Engine(tiny_fp32.model, tiny_fp32.tokenizer, CFG)
    try:
        ticks = iter(range(1000))
        with engine.use_clock(lambda: float(next(ticks))):
            result = engine.generate(requests(1))[0]
        # every reading of the clock is one tick: timings come from it alone, not from the wall clock
        assert result.timings.ttft_s == int(result.timings.ttft_s) > 0
        assert all(gap == int(gap) for gap in result.timings.itl_s)
        after = engine.generate(requests(1))[0]  # the wall clock is back: fractions of a second, not ticks
        assert 0 < after.timings.e2e_s and after.timings.e2e_s != int(after.timings.e2e_s)
        engine.submit(requests(1)[0])
        with pytest.raises(RuntimeError, match="switch clocks between workloads"):
            with engine.use_clock(time.perf_counter):
                pass
        engine.run_until_done()
    finally:
        engine.close()


def test_what_cannot_run_step_locked_is_named():
    assert lockstep.refusal(requests(), {"A": "engine", "B": "engine"}) == ""
    assert "multi-turn sessions" in lockstep.refusal([Session([Turn("a", 4)])], {"A": "engine", "B": "engine"})
    late = [Request(prompt_token_ids=[1] * 4, max_new_tokens=2, arrival_s=0.5)]
    assert "arrive over time" in lockstep.refusal(late, {"A": "engine", "B": "engine"})
    due = [Request(prompt_token_ids=[1] * 4, max_new_tokens=2, deadline_s=3.0)]
    assert "deadlines" in lockstep.refusal(due, {"A": "engine", "B": "engine"})
    assert lockstep.refusal(requests(), {"A": "hf-generate", "B": "engine"}) == (
        "side A runs on hf-generate, which has no steps to take in turn")
    assert "not step-locked: the workload has" in lockstep.how("the workload has multi-turn sessions")


@contextmanager
def tracing(log, name):
    log.append(name)
    yield


def test_steps_take_turns_and_each_side_is_timed_on_its_own_steps(tiny_fp32):
    from pytest_infergate.perf.injections import injected_slowdown

    bench = Bench(tiny_fp32, calibrate=False)
    log = []

    @contextmanager
    def b_slower():  # B's forwards take 10x as long (inside its clock), then 30 ms pass outside every clock
        log.append("B")
        with injected_slowdown(tiny_fp32.model, 9.0):
            yield
        time.sleep(0.03)

    try:
        a_side = lockstep.LocalSide(bench, requests(), CFG, 1, instance=1, around_step=lambda: tracing(log, "A"))
        b_side = lockstep.LocalSide(bench, requests(), CFG, 1, around_step=b_slower)
        a, b = Measurement(label="A"), Measurement(label="B")
        started = time.perf_counter()
        lockstep.lockstep_round(a_side, b_side, a, b, a_first=True)
        wall = time.perf_counter() - started
        assert bench.engine(CFG, 1) is not bench.engine(CFG)  # the same model, an engine per side
        assert a.repetitions == b.repetitions == 1 and a.num_requests == b.num_requests == 3
        assert len(a.samples["itl_ms"]) == len(b.samples["itl_ms"]) == 3 * 5
        # A B, then B A, ...: the order flips after every step
        assert log[:6] == ["A", "B", "B", "A", "A", "B"] and log.count("A") == log.count("B") == len(a.steps)
        # what B's steps took is not on A's clock, what happened between steps on nobody's: the two clocks (each
        # side's longest request spans its clock) and the sleeps outside both fit in the round's wall time, which
        # any double counting would exceed. No bound on A's own time: A's 6 steps of the tiny model took up to
        # 1.6 s on a loaded 2-core VM
        assert (max(a.samples["e2e_ms"]) + max(b.samples["e2e_ms"])) / 1000 + 0.03 * log.count("B") <= wall
        # B's forwards take 10x as long (4x read only x1.23 in TTFT on a VM running two CPU hogs, a suites run
        # and the tests), its scheduling does not. The first token (a prefill: mostly forward) shows
        # it in full (x3.4 where tokens/s, diluted by the tiny model's per-step overhead, read only x1.3 within a
        # full test run; x2.6 to x4.3 on a loaded VM), so B's clock holds B's forwards and A's does not
        # (tokens/s is not asserted: the tiny model's decode step is mostly per-step overhead, which a loaded
        # runner swings by more than the injected forward time: B at x10 read 95.6 tok/s against A's 87.3 once)
        assert b.value("ttft_ms") > 1.5 * a.value("ttft_ms")
        assert a.memory["method"].endswith("own steps")
        log.clear()
        lockstep.lockstep_round(a_side, b_side, a, b, a_first=False)  # the next round begins with B
        assert log[:2] == ["B", "A"] and a.repetitions == 2 and len(a.samples["itl_ms"]) == 30
    finally:
        bench.close()


def test_a_failed_step_leaves_no_request_behind(tiny_fp32):
    bench = Bench(tiny_fp32, calibrate=False)

    @contextmanager
    def breaks():
        yield
        raise RuntimeError("injected")

    try:
        a_side = lockstep.LocalSide(bench, requests(), CFG, 0, instance=1)
        b_side = lockstep.LocalSide(bench, requests(), CFG, 0, around_step=breaks)
        with pytest.raises(RuntimeError, match="injected"):
            lockstep.lockstep_round(a_side, b_side, Measurement(), Measurement(), a_first=True)
        for engine in (bench.engine(CFG), bench.engine(CFG, 1)):
            assert not engine.has_unfinished
        again = Measurement()
        bench.run_once(requests(), CFG, 0, again, probe=False)  # the engine serves the next repetition as usual
        assert again.num_failed == 0 and again.repetitions == 1
    finally:
        bench.close()


def test_the_ab_gate_runs_step_locked_rounds_and_pairs_every_metric_by_round(tiny_fp32):
    bench = Bench(tiny_fp32, calibrate=False)
    try:
        run_round = lockstep.rounds(lockstep.LocalSide(bench, requests(4, 8), CFG, 1, instance=1),
                                    lockstep.LocalSide(bench, requests(4, 8), CFG, 1))
        budget = parse_budget({"max_regression": 5.0, "itl_ms": 1e12, "tokens_per_s": 1e-9})
        # 3 rounds cannot bound a median: the gate measures more, one round at a time, up to AB_ROUNDS here
        b, outcome = evaluate_ab(run_round, budget, rounds=3)
        assert outcome.baseline.repetitions == b.repetitions == AB_ROUNDS == 6
        # per round, each side's load-free share over its own steps, and how busy the machine was (Linux; a round
        # shorter than a few clock ticks cannot tell, and then no round says: as perf.local_bench does)
        for side in (outcome.baseline, b):
            assert len(side.load_free_share) == 6 and all(0 < share <= 1 for share in side.load_free_share)
            assert len(side.others_share) in (0, 6)
        verdicts = {v.metric: v for v in outcome.verdicts}
        assert set(verdicts) == {"itl_ms", "tokens_per_s"} and all(v.paired for v in verdicts.values())
        assert verdicts["itl_ms"].percentile == 50 and verdicts["itl_ms"].samples == (6, 6)  # one value per round
        # the same model against itself never fails; six rounds of millisecond work beside a CPU hog may leave it
        # undecided (×1.12 [1.02–18.1] seen beside two busy loops, 9 runs in 25), which is the honest verdict there
        assert outcome.status != Status.FAIL, outcome.message()
    finally:
        bench.close()


def test_per_request_metrics_of_an_ab_compare_round_by_round():
    """A spell of interference over one side's repetition moves all its requests at once: pooled, the requests
    look like hundreds of independent samples and the gate fails unchanged code; by round, it is one round of
    six, and the median ratio stays near 1."""
    def side(rounds):
        m = Measurement()
        for scale in rounds:
            m.samples.setdefault("itl_ms", []).extend(10.0 * scale * (1 + 0.001 * i) for i in range(100))
            m.end_repetition()
        return m

    baseline, candidate = side([1.0] * 6), side([1.0, 1.3, 1.0, 1.01, 0.99, 1.0])
    budget = parse_budget({"max_regression": 0.10, "itl_ms": 1e12})
    pooled = compare_samples("itl_ms", candidate.samples["itl_ms"], baseline.samples["itl_ms"], 0.10)
    (paired,) = compare_measurements(candidate, baseline, budget, paired=True)
    assert paired.paired and paired.samples == (6, 6) and paired.status != Status.FAIL
    assert paired.ratio == pytest.approx(1.0, abs=0.02)
    slower = side([1.3] * 6)
    (failed,) = compare_measurements(slower, baseline, budget, paired=True)
    assert failed.status == Status.FAIL and failed.ratio == pytest.approx(1.3, abs=0.01)
    # the pooled comparison of the same data reads the spell as a regression of the whole distribution's tail
    assert pooled.samples == (600, 600)
    (tail,) = compare_measurements(candidate, baseline, parse_budget({"max_regression": 0.10, "itl_ms_p90": 1e12}),
                                   paired=True)
    assert tail.percentile == 90 and tail.paired
    assert compare_samples("itl_ms", candidate.samples["itl_ms"], baseline.samples["itl_ms"], 0.10,
                           pct=90).status == Status.FAIL and tail.status != Status.FAIL


def test_the_baseline_environment_steps_when_asked(tiny_source, cache_dir):
    env = BaselineEnv(sys.executable)
    try:
        workload = Workload("tiny-random-llama", "fp32", "cpu", "fp32", "auto", str(cache_dir), 1, CFG, requests(),
                            1)
        assert env.prepare(workload) == "engine" and env.model_records["fp32"]["model"] == "tiny-random-llama"
        side = env.side("m1", workload)
        with pytest.raises(BaselineEnvError, match="no repetition begun under 'm1': send begin first"):
            side.step()
        into = Measurement(label="A")
        for _ in range(2):
            side.begin()
            steps = 1
            while side.step():
                steps += 1
            side.finish(into)
        assert into.label == "A" and into.repetitions == 2 and into.num_requests == 6 and into.num_failed == 0
        assert len(into.steps) == steps and into.memory["method"].endswith("own steps")
        side.abort()  # forgets the measurement
        fresh = Measurement()
        env.repetition("m1", workload, fresh)
        assert fresh.repetitions == 1
    finally:
        env.close()


def _busy_rounds(itl_ms: list[float], load_free: list[float], others: float = 0.5) -> Measurement:
    """An A/B side on a busy runner: per round, 50 ITLs around the given level, its load-free share, and the
    share of the machine other processes took."""
    m = Measurement()
    for level, share in zip(itl_ms, load_free):
        m.samples.setdefault("itl_ms", []).extend(level * (1 + 0.001 * i) for i in range(50))
        m.load_free_share.append(share)
        m.others_share.append(others)
        m.end_repetition()
    return m


def test_an_ab_on_a_busy_runner_decides_on_each_sides_load_corrected_steps():
    """Under a CPU hog a forward that sleeps twice as long reads only ×1.33 as measured and one that sleeps 25%
    longer ×1.08 (the load stretches what computes, not what waits): as measured, the rounds would pass the
    second. Each side's steps with the load taken out (their load-free share) show the ×2 and fail it, saying
    which evidence decided; the 25% fails only beyond the estimate's error (×1.6 on the threshold), so it is
    inconclusive, not passed; unchanged code does not fail; quiet, nothing changes."""
    budget = parse_budget({"max_regression": 0.10, "itl_ms": 1e12})
    rounds = 6
    # A: 100 ms of compute stretched to 300 ms (load-free share 1/3); B: the same plus time asleep (kept whole)
    a = _busy_rounds([300.0 * (1 + 0.01 * (i % 3)) for i in range(rounds)], [1 / 3] * rounds)

    def asleep_longer(extra_ms):
        levels = [(300.0 + extra_ms) * (1 + 0.01 * ((i + 1) % 3)) for i in range(rounds)]
        return _busy_rounds(levels, [(100.0 + extra_ms) / level for level in levels])

    (slower,) = compare_measurements(asleep_longer(100.0), a, budget, paired=True)
    assert slower.status == Status.FAIL and slower.load_corrected and slower.ratio == pytest.approx(2.0, abs=0.05)
    assert slower.evidence() == "load-corrected by run-queue delay, paired by round"
    assert "as measured" in slower.note and "other processes took 50%" in slower.note
    (quarter,) = compare_measurements(asleep_longer(25.0), a, budget, paired=True)
    assert quarter.status == Status.INCONCLUSIVE and quarter.ratio == pytest.approx(1.25, abs=0.03)
    assert "not beyond ×1.76 (the limit ×1.1 × the load correction's own error)" in quarter.note
    assert "a pass as measured (×1.0" in quarter.note, quarter.note
    b_levels = [325.0 * (1 + 0.01 * ((i + 1) % 3)) for i in range(rounds)]
    # unchanged code, the shares noisy round by round: never a failure
    same = _busy_rounds([300.0 * (1 + 0.02 * (i % 3)) for i in range(rounds)],
                        [1 / 3 * (1 + 0.05 * ((-1) ** i)) for i in range(rounds)])
    (unchanged,) = compare_measurements(same, a, budget, paired=True)
    assert unchanged.status != Status.FAIL
    # load-corrected too noisy to tell, as measured a pass: inconclusive on a busy runner, the reason said
    noisy = _busy_rounds([300.0] * rounds, [1 / 3 * (0.6 if i % 2 else 1.5) for i in range(rounds)])
    (straddling,) = compare_measurements(noisy, a, budget, paired=True)
    assert straddling.status == Status.INCONCLUSIVE and "a pass as measured" in straddling.note
    # the same rounds on a quiet runner: as measured, as before
    quiet_a, quiet_b = (_busy_rounds(m_levels, [1.0] * rounds, others=0.02) for m_levels in
                        ([300.0] * rounds, b_levels))
    (as_measured,) = compare_measurements(quiet_b, quiet_a, budget, paired=True)
    assert not as_measured.load_corrected and as_measured.evidence() == "as measured, paired by round"


def test_an_ab_on_one_cpu_thread_fails_a_quarter_slowdown_on_a_busy_runner():
    """Both sides on one CPU thread (the default): each round's load-corrected ratio is exact up to the noise the
    interval over the rounds bounds, so a 25% slowdown that sleeps fails load-corrected under a hog (a team's
    ×1.6 margin left it inconclusive), and unchanged code with noisy shares still does not fail."""
    budget = parse_budget({"max_regression": 0.10, "itl_ms": 1e12})
    rounds = 6

    def one_thread(m: Measurement) -> Measurement:
        m.cpu_threads = 1
        return m

    a = one_thread(_busy_rounds([300.0 * (1 + 0.01 * (i % 3)) for i in range(rounds)], [1 / 3] * rounds))
    levels = [325.0 * (1 + 0.01 * ((i + 1) % 3)) for i in range(rounds)]
    quarter_b = one_thread(_busy_rounds(levels, [125.0 / level for level in levels]))
    (quarter,) = compare_measurements(quarter_b, a, budget, paired=True)
    assert quarter.status == Status.FAIL and quarter.load_corrected, quarter.describe()
    assert quarter.ratio == pytest.approx(1.25, abs=0.03)
    same = one_thread(_busy_rounds([300.0 * (1 + 0.02 * (i % 3)) for i in range(rounds)],
                                   [1 / 3 * (1 + 0.05 * ((-1) ** i)) for i in range(rounds)]))
    (unchanged,) = compare_measurements(same, a, budget, paired=True)
    assert unchanged.status != Status.FAIL

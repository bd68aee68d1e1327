"""The perf gate as a user meets it: markers, the infergate_bench fixture, baselines, JSON, xdist."""

import json

import pytest
from baseline_files import older_baseline_of, perf_records

BENCH_TEST = """
import pytest
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(prompt_token_ids=[5 + i] * (8 + i), max_new_tokens=6, ignore_eos=True) for i in range(4)]

@pytest.mark.infergate_budget({budget})
def test_speed(infergate_bench):
    m = infergate_bench(REQS, EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=2, warmup=1)
    assert m.repetitions >= 2 and len(m.samples["ttft_ms"]) >= 8
"""


def test_unknown_budget_key_fails_collection(pytester, run):
    pytester.makepyfile(BENCH_TEST.format(budget="ttft_msec=5"))
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid infergate markers*",
                                 "*unknown budget key 'ttft_msec' (did you mean 'ttft_ms'?); allowed: ttft_ms*"])


def test_a_misspelt_infergate_marker_fails_collection_with_the_closest_name(pytester, run):
    # issue #45: @pytest.mark.infergate_budgets ran ungated behind pytest's generic warning, and the run said PASS
    pytester.makepyfile(BENCH_TEST.format(budget="tokens_per_s=1e9").replace("infergate_budget(", "infergate_budgets("))
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid infergate markers*", "*test_speed*: unknown marker 'infergate_budgets' (did "
                                 "you mean 'infergate_budget'?); the infergate markers are infergate_budget, *"])


def test_budget_violation_lists_every_metric(pytester, run):
    pytester.makepyfile(BENCH_TEST.format(budget="ttft_ms_p95=0.001, tokens_per_s=1e9, peak_mem_mb=1e6"))
    result = run("--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    # the CI's test tab (JUnit XML) names the gate's verdict and why
    junit = (pytester.path / "out.xml").read_text()
    assert 'name="infergate.perf.verdict" value="fail"' in junit
    assert 'name="infergate.perf.reason" value="ttft_ms_p95 ' in junit and "of the budget" in junit
    result.stdout.fnmatch_lines(["*infergate perf gate failed*", "*2 budget(s) exceeded:*",
                                 "*ttft_ms_p95 * ms > budget 0.001 ms (*",
                                 "*tokens_per_s * tok/s < budget 1,000,000,000 tok/s (×* of the budget)*"])


def test_generous_budget_passes_and_reports_figures(pytester, run):
    pytester.makepyfile(BENCH_TEST.format(budget="ttft_ms_p95=60000, tokens_per_s=0.01"))
    result = run("--junitxml=out.xml", "--infergate-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*infergate*", "*perf PASS*test_speed*ttft_ms_p50*tokens_per_s*"])
    junit = (pytester.path / "out.xml").read_text()
    assert 'name="infergate.tokens_per_s"' in junit and "infergate_result" not in junit
    # no stored baseline saved or compared: the calibration probe, which only such a comparison reads, did not run
    (record,) = json.loads((pytester.path / "out.json").read_text())["records"]
    assert record["measurement"]["probe_s"] == [] and record["measurement"]["probe"] == ""


def test_ini_budgets_apply_per_precision(pytester, run):
    pytester.makeini("[pytest]\ninfergate_budgets =\n    fp32: tokens_per_s=1e9\n")
    pytester.makepyfile(BENCH_TEST.format(budget=""))
    run().assert_outcomes(failed=1)


def test_baseline_round_trip_mismatch_and_regression(pytester, run):
    pytester.makepyfile(BENCH_TEST.format(budget="max_regression=0.5"))
    saving = run("--infergate-save-baseline=base.json")
    saving.assert_outcomes(passed=1)
    saving.stdout.fnmatch_lines(["baseline: this run saved to base.json, 1 perf measurement to compare with (later "
                                 "runs compare with --infergate-baseline base.json)"])
    saved = json.loads((pytester.path / "base.json").read_text())
    # a baseline is a saved run (issue #42): the results file --infergate-json writes
    assert saved["kind"] == "results" and saved["verdict"] == "pass" and saved["outcomes"]
    (entry,) = perf_records(saved)
    assert entry["fingerprint"]["precision"] == "fp32" and entry["fingerprint"]["device"] == "cpu"
    assert entry["measurement"]["samples"]["ttft_ms"]
    # a baseline takes 5-12 repetitions whatever the test asked (2), until its spread is tight enough, each with
    # its calibration probe
    assert len(entry["measurement"]["probe_s"]) == entry["measurement"]["repetitions"]
    assert 5 <= entry["measurement"]["repetitions"] <= 12

    # same environment, much faster baseline: the candidate is a clear regression
    for values in entry["measurement"]["samples"].values():
        values[:] = [v / 100 if v else v for v in values]
    entry["measurement"]["samples"]["tokens_per_s"] = [v * 1e4 for v in entry["measurement"]["samples"]["tokens_per_s"]]
    (pytester.path / "fast.json").write_text(json.dumps(saved))
    result = run("--infergate-baseline=fast.json")
    result.assert_outcomes(failed=1)
    # the probe is named with its move; what it adds depends on the machine's move since the save (a hog during
    # the save reads the machine faster now), which a test must not assert
    result.stdout.fnmatch_lines(["*regression against the baseline*", "*limit ×*): FAIL*",
                                 "*calibration probe (numpy-prefill-decode-copy/1) ×* its time at the baseline*"])

    # another library version: compared (that is what a baseline gates), and the failure names the change
    entry["fingerprint"]["torch"] = "0.0.1"
    (pytester.path / "other.json").write_text(json.dumps(saved))
    result = run("--infergate-baseline=other.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*regression against the baseline*",
                                 "*torch 0.0.1 → *: tokens/s * lower*(time per token ×*"])

    # a gate without max_regression does not compare: with a baseline given, that is said, and the run is not a
    # plain PASS (issue #45: tokens/s had fallen from 5.15 to 3.34, and the run passed saying nothing)
    pytester.makepyfile(BENCH_TEST.format(budget="tokens_per_s=0.001"))
    result = run("--infergate-baseline=fast.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*--infergate-baseline *fast.json was given but not compared with: this measurement's "
                                 "budget has no max_regression; add max_regression=0.1*",
                                 "*infergate verdict: INCONCLUSIVE*"])


def test_malformed_baseline_is_a_usage_error(pytester, run):
    (pytester.path / "bad.json").write_text("[1, 2")
    pytester.makepyfile("def test_x(): pass")
    result = run("--infergate-baseline=bad.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baseline file bad.json is not valid JSON*"])


def test_json_results_cover_every_xdist_worker(pytester, run):
    pytester.makepyfile(BENCH_TEST.format(budget="tokens_per_s=0.01") + """
@pytest.mark.parametrize("i", range(3))
def test_more(infergate_bench, i):
    infergate_bench(REQS[:2], EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=1, warmup=0,
                    label=f"n{i}")
""")
    result = run("-n", "2", "--infergate-json=results.json")
    result.assert_outcomes(passed=4)
    data = json.loads((pytester.path / "results.json").read_text())
    tests = sorted(r["test"] for r in data["records"])
    assert len(tests) == 4 and len(set(tests)) == 4
    assert data["gate_counts"]["perf"]["pass"] == 4


def test_each_xdist_worker_knows_how_many_workers_share_the_machine(pytester, run, monkeypatch):
    """What a busy verdict under -n names (gates.gating.beside_workers): each worker's options count the run's
    workers; without -n, one."""
    pytester.makepyfile("""
import os

from pytest_infergate.session import session_of


def test_workers(request):
    assert session_of(request.config).options.xdist_workers == int(os.environ["EXPECTED_WORKERS"])
""")
    monkeypatch.setenv("EXPECTED_WORKERS", "1")
    run().assert_outcomes(passed=1)
    monkeypatch.setenv("EXPECTED_WORKERS", "2")
    run("-n", "2").assert_outcomes(passed=1)


def test_interleaved_ab(pytester, run):
    pytester.makepyfile("""
        import pytest
        from pytest_infergate.engine import EngineConfig, Request

        REQS = [Request(prompt_token_ids=[5 + i] * 40, max_new_tokens=24, ignore_eos=True) for i in range(16)]
        CFG = EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20)

        @pytest.mark.infergate_budget(max_regression=0.5, tokens_per_s=1e-9)
        def test_same(infergate_bench):
            a, b = infergate_bench.ab(REQS, CFG, rounds=4)
            assert a.repetitions == b.repetitions >= 4  # more rounds while inconclusive

        @pytest.mark.infergate_budget(max_regression=0.5, tokens_per_s=1e-9)
        def test_one_at_a_time_is_slower(infergate_bench):
            infergate_bench.ab(REQS, EngineConfig(batching="sequential", max_model_len=256, kv_budget_bytes=8 << 20),
                               baseline_config=CFG, rounds=3)
    """)
    result = run()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*infergate A/B gate failed*test_one_at_a_time_is_slower*fp32 vs fp32*",
                                 "*tokens/s * lower*(time per token ×*): FAIL*",
                                 "*tokens_per_s baseline*paired by round*"])


class SteadySampler:
    pid = None  # no process of its own

    def __init__(self, threads=None):
        pass

    def probe_now(self):
        return 1.0

    def between(self, first, last):
        return [0.010]

    def close(self):
        pass


@pytest.fixture
def steady_probe(monkeypatch):
    """The calibration probe reads 10 ms: what a baseline's probe times say is then set by the test alone."""
    from pytest_infergate.perf import calibration

    monkeypatch.setattr(calibration, "Sampler", SteadySampler)


CONFIG_TEST = """
import os
import pytest
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(prompt_token_ids=[5 + i] * 24, max_new_tokens=12, ignore_eos=True) for i in range(12)]

@pytest.mark.infergate_budget(max_regression=0.25, tokens_per_s=1e-9)
def test_chat(infergate_bench):
    batching = os.environ.get("CHANGE_UNDER_TEST_BATCHING", "continuous")
    infergate_bench(REQS, EngineConfig(batching=batching, max_model_len=256, kv_budget_bytes=8 << 20), repeats=2)
"""


def test_a_stored_baseline_gates_an_engine_config_change_and_names_it(pytester, run, steady_probe, monkeypatch):
    pytester.makepyfile(CONFIG_TEST)
    run("--infergate-save-baseline=base.json").assert_outcomes(passed=1)
    # the same test id, a config that runs one request at a time: compared with the accepted release, and failed
    monkeypatch.setenv("CHANGE_UNDER_TEST_BATCHING", "sequential")
    result = run("--infergate-baseline=base.json", "--infergate-json=out.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*regression against the baseline*",
                                 "*engine_config.batching continuous → sequential*: tokens/s * lower*(time per token "
                                 "×*): FAIL*"])
    (record,) = json.loads((pytester.path / "out.json").read_text())["records"]
    assert "engine_config.batching continuous → sequential" in record["changes"] and record["status"] == "fail"
    # the evidence is printed once: with the failure; the infergate section names the check and points there
    # (the section ends where pytest's short summary begins: under CI=true it prints each failure's whole message)
    section = result.stdout.str().split("= infergate =")[1].split("short test summary info")[0]
    assert "tokens_per_s baseline" not in section and "      baseline: " not in section, section
    result.stdout.fnmatch_lines(["*tokens/s * lower*: FAIL -- its evidence in the test's failure above"])
    # --tb=no prints no failure above: the section keeps the evidence
    quiet = run("--infergate-baseline=base.json", "--tb=no")
    quiet.assert_outcomes(failed=1)
    section = quiet.stdout.str().split("= infergate =")[1].split("short test summary info")[0]
    assert "FAIL -- tokens_per_s baseline" in section and "      baseline: " in section and "above" not in section


WORKLOAD_TEST = """
import os
import pytest
from pytest_infergate.engine import EngineConfig, Request

LENGTH = int(os.environ.get("PROMPT_LENGTH", "24"))
REQS = [Request(prompt_token_ids=[5 + i] * LENGTH, max_new_tokens=4, ignore_eos=True) for i in range(6)]

@pytest.mark.infergate_budget(max_regression=0.25)
def test_chat(infergate_bench):
    infergate_bench(REQS, EngineConfig(max_model_len=512, kv_budget_bytes=8 << 20), repeats=2)
"""


def test_a_workload_changed_since_the_baseline_is_named_not_nothing_changed(pytester, run, steady_probe,
                                                                              monkeypatch):
    """A new user doubled the starter's prompts and read "nothing under test changed ... look at your own code":
    the workload a baseline's timings were measured on is part of its fingerprint, and its change is named in the
    verdict like an engine config key's."""
    pytester.makepyfile(WORKLOAD_TEST)
    run("--infergate-save-baseline=base.json").assert_outcomes(passed=1)
    (entry,) = perf_records(json.loads((pytester.path / "base.json").read_text()))
    assert entry["fingerprint"]["workload"]["prompt_tokens"] == 6 * 24
    monkeypatch.setenv("PROMPT_LENGTH", "192")
    result = run("--infergate-baseline=base.json", "--infergate-json=out.json")
    (record,) = json.loads((pytester.path / "out.json").read_text())["records"]
    assert record["changes"] == ["workload.prompt_tokens 144 → 1152"], record["changes"]
    assert record["status"] != "pass", record  # eight times the prefill, beside a ×1.25 limit
    out = result.stdout.str()
    assert "since workload.prompt_tokens 144 → 1152" in out and "nothing under test changed" not in out
    assert "Nothing the baseline records changed" not in out


def test_a_baseline_from_another_machine_is_inconclusive_with_the_reason(pytester, run, steady_probe, monkeypatch):
    from pytest_infergate import environment

    pytester.makepyfile(CONFIG_TEST)
    run("--infergate-save-baseline=base.json").assert_outcomes(passed=1)
    saved_cpu = json.loads((pytester.path / "base.json").read_text())
    (entry,) = perf_records(saved_cpu)
    monkeypatch.setattr(environment, "cpu_model", lambda: "Faked CPU 9000")
    result = run("--infergate-baseline=base.json", "--infergate-json=out.json")
    result.assert_outcomes(passed=1)
    saved_on = entry["fingerprint"]["cpu"]
    # the warning names the gate and its undecided checks in one line and points to the verdict, whose reason says
    # what to do, once; the evidence is said once, in the infergate section (the warning said the whole block too)
    result.stdout.fnmatch_lines(["*InfergateWarning*perf gate inconclusive: *(why and what to do: the infergate "
                                 "verdict below)",
                                 "*warnings.warn(*",
                                 f"*measured on another machine (cpu {saved_on} → Faked CPU 9000)*",
                                 "*INCONCLUSIVE perf gate *The baseline is from another machine: re-save it on this "
                                 "runner class.*"])
    assert result.stdout.str().count("re-save it on this runner class") == 1
    assert result.stdout.str().count(f"baseline measured on another machine: cpu {saved_on}") == 1
    data = json.loads((pytester.path / "out.json").read_text())
    (record,) = data["records"]
    assert record["status"] == "inconclusive" and record["machine_mismatch"] == [f"cpu {saved_on} → Faked CPU 9000"]
    # the terminal's warning restates the gate the verdict lists: one reason for one thing, not a second one
    assert not any("perf gate inconclusive" in warning for warning in data["warnings"])
    assert [(r["status"], r["what"]) for r in data["reasons"]] == [("inconclusive", "perf gate")]
    run("--infergate-baseline=base.json", "--infergate-strict").assert_outcomes(failed=1)


def test_a_baseline_saved_on_a_much_faster_machine_is_inconclusive_not_normalized(pytester, run, steady_probe):
    pytester.makepyfile(BENCH_TEST.format(budget="max_regression=3.0"))
    run("--infergate-save-baseline=base.json").assert_outcomes(passed=1)
    saved = json.loads((pytester.path / "base.json").read_text())
    (entry,) = perf_records(saved)
    measurement = entry["measurement"]
    assert measurement["probe_s"] == pytest.approx([0.010] * measurement["repetitions"])
    assert measurement["probe_quiet_s"] == pytest.approx([0.010] * measurement["repetitions"])
    assert measurement["repetition_ends"]["ttft_ms"][-1] == len(measurement["samples"]["ttft_ms"])
    # as if saved on a machine 100x faster: every figure, and the probe, 100x faster
    for metric, values in measurement["samples"].items():
        factor = 100 if metric in ("tokens_per_s", "requests_per_s") else 0.01 if metric.endswith("_ms") else 1
        values[:] = [v * factor for v in values]
    measurement["probe_s"] = measurement["probe_quiet_s"] = [0.0001] * measurement["repetitions"]
    (pytester.path / "fast_machine.json").write_text(json.dumps(saved))
    result = run("--infergate-baseline=fast_machine.json", "--infergate-json=out.json")
    result.assert_outcomes(passed=1)  # 100x slower figures on a 100x slower machine: not a failure ...
    (record,) = json.loads((pytester.path / "out.json").read_text())["records"]
    assert record["status"] == "inconclusive"  # ... nor a pass: the probe cannot vouch for the engine's speed
    note = "calibration probe (numpy-prefill-decode-copy/1) ×100.000 its time at the baseline"
    assert any(note in n and "a pass as measured stands, a failure only beyond" in n for n in record["notes"])
    timed = [v for v in record["verdicts"] if v["metric"] != "peak_mem_mb"]  # memory is no timing: compared as is
    assert timed and all(v["machine_slowdown"] == pytest.approx(100.0) for v in timed)
    assert all("the runner was busy" in v["note"] for v in timed)

    # the same file without the probe, as a version-2 baseline: read, compared as measured, and said so
    del measurement["probe"], measurement["probe_s"], measurement["probe_quiet_s"], measurement["repetition_ends"]
    (pytester.path / "v2.json").write_text(json.dumps(older_baseline_of(saved, version=2)))
    result = run("--infergate-baseline=v2.json", "--infergate-json=out2.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*limit ×*): FAIL*",
                                 "*machine speed not checked: neither side took the calibration probe (the baseline*"])


def test_long_work_shows_progress_on_the_terminal_and_is_quiet_under_q(pytester, run, monkeypatch):
    # issue #34 point 5: repetitions of a measurement (a baseline save takes 8 a test) with what is left; work
    # shorter than context.EVERY_S prints nothing (here every step counts as long)

    pytester.makepyfile(BENCH_TEST.format(budget="tokens_per_s=0.01"))
    quick = run()
    assert "infergate: measuring" not in quick.stdout.str()
    from pytest_infergate import context

    monkeypatch.setattr(context, "EVERY_S", 0.0)
    shown = run()
    shown.assert_outcomes(passed=1)
    shown.stdout.fnmatch_lines(["infergate: measuring *.py::test_speed[[]fp32], repetition: 2 of 2, * s"])
    quiet = run("-q")
    quiet.assert_outcomes(passed=1)
    assert "infergate: measuring" not in quiet.stdout.str()
    # a save repeats until the spread is tight enough: the line names the test, gives the range its plan states,
    # and ends with the time
    pytester.makepyfile(BENCH_TEST.format(budget="max_regression=0.10"))
    saved = run("--infergate-save-baseline=b.json")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["infergate: measuring *.py::test_speed[[]fp32]: 5–12 repetitions of about *",
                                "infergate: measuring *.py::test_speed[[]fp32], repetition: 1 of 5–12, about * s left",
                                "infergate: measuring *.py::test_speed[[]fp32], repetition: * of 5–12, * s"])


@pytest.mark.parametrize("args, threads", [((), 1), (("--infergate-cpu-threads=2",), 2)])
def test_models_on_the_cpu_run_on_one_torch_thread_unless_told(pytester, run, args, threads):
    """One computing thread is what a busy runner's load can be taken out of exactly (Options.torch_threads); the
    option gives torch more, and every measurement records the count it ran with."""
    import torch

    pytester.makepyfile("""
        import torch
        from pytest_infergate.engine import EngineConfig, Request

        def test_threads(infergate_bench):
            m = infergate_bench([Request(prompt_token_ids=[5] * 8, max_new_tokens=2, ignore_eos=True)],
                                EngineConfig(max_model_len=64, kv_budget_bytes=1 << 20), repeats=1, warmup=0)
            print(f"THREADS {torch.get_num_threads()} RECORDED {m.cpu_threads}")
    """)
    before = torch.get_num_threads()
    try:
        result = run("-s", *args)
    finally:
        torch.set_num_threads(before)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*THREADS {threads} RECORDED {threads}*"])


def test_a_save_that_no_gate_will_compare_with_says_so_and_how(pytester, run):
    """A new user saved a baseline from the README's first gate (budgets, no max_regression), read "1 perf
    measurement to compare with", and the later run compared nothing: the save says it at once."""
    pytester.makepyfile(BENCH_TEST.format(budget="tokens_per_s=1e-9"))
    result = run("--infergate-save-baseline=base.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["baseline: this run saved to base.json, 1 perf measurement, but no gate asks for a "
                                 "comparison: add max_regression=0.1 to an infergate_budget marker*"])
    assert "to compare with" not in result.stdout.str()

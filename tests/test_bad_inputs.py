"""No gate is ever silently off: every input that disables, weakens or breaks a check is a clear error, or a run
that does exactly what was asked, or a loud warning (a failure under --infergate-strict). Never a silent pass,
never a traceback. One row per case; the engine's own boundary (Request / EngineConfig) is tabled in
tests/test_engine.py."""

import json
import os

import pytest
from baseline_files import older_baseline_of, perf_records, saved_run

from pytest_infergate.perf.repetitions import LEAST_REPETITIONS

BENCH = """
import pytest
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(prompt_token_ids=[5 + i] * (8 + i), max_new_tokens=4, ignore_eos=True) for i in range(2)]

@pytest.mark.infergate_budget({budget})
def test_speed(infergate_bench):
    infergate_bench(REQS, EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=1, warmup=0)
"""
QUALITY = """
def test_regression(infergate_golden):
    infergate_golden.check_regression()
"""


def _baseline(pytester, run, budget="max_regression=0.5"):
    pytester.makepyfile(BENCH.format(budget=budget))
    run("--infergate-save-baseline=base.json").assert_outcomes(passed=1)
    return json.loads((pytester.path / "base.json").read_text())


# ---- usage errors at configure time: the run stops before any model loads, naming the input and the fix ---------
USAGE_ERRORS = [
    # (id, ini lines, extra args, message)
    ("nan-budget-in-ini", ["infergate_budgets =", "    fp32: tokens_per_s=nan"], [],
     "*infergate_budgets line 1*tokens_per_s=nan is not a finite number*"),
    ("inf-policy-in-ini", ["infergate_quality_policy =", "    int8: max_mean_kl=inf"], [],
     "*infergate_quality_policy line 1*max_mean_kl=inf is not a finite number*"),
    ("same-scope-twice-conflicting", ["infergate_budgets =", "    fp32: tokens_per_s=5", "    fp32: tokens_per_s=7"],
     [], "*infergate_budgets line 2 sets tokens_per_s=7 for scope 'fp32', but infergate_budgets line 1*"),
    # a fraction's threshold above 1 can never be met: every run would fail at the gate (issue #32 row 8)
    ("policy-top1-over-one", ["infergate_quality_policy =", "    int8: min_top1=2"], [],
     "*infergate_quality_policy line 1*min_top1=2* can never be met: top1 is a fraction, at most 1*"),
    ("bool-ini-typo", ["infergate_strict = maybe"], [], "*infergate_strict = 'maybe' is not a boolean*"),
    ("endpoint-timeout-nan", [], ["--infergate-endpoint=http://127.0.0.1:9/v1", "--infergate-endpoint-timeout=nan"],
     "*--infergate-endpoint-timeout must be positive (a finite number of seconds), got nan*"),
    ("report-under-a-file", [], ["--infergate-report=afile/report.html"],
     "*--infergate-report afile/report.html: afile is a file*"),
    ("json-under-a-file", [], ["--infergate-json=afile/r.json"], "*--infergate-json afile/r.json: afile is a file*"),
    ("baseline-out-under-a-file", [], ["--infergate-save-baseline=afile/b.json"],
     "*--infergate-save-baseline afile/b.json: afile is a file*"),
    ("cache-dir-under-a-file", [], ["--infergate-cache-dir=afile/cache"], "*--infergate-cache-dir afile/cache*file*"),
    ("golden-max-len-too-small", [], ["--infergate-golden-max-len=4"], "*--infergate-golden-max-len must be at least*"),
    ("min-time-negative", [], ["--infergate-min-time=-1"], "*--infergate-min-time must be 0 or a finite number of "
     "seconds, got -1.0*"),
    # two outputs on one path: only the one written last would survive (issue #32 rows 2 and 3)
    ("json-and-report-one-path", [], ["--infergate-json=out", "--infergate-report=out"],
     "*--infergate-report and --infergate-json both write out: one would overwrite the other*"),
    ("baseline-and-json-one-path", [], ["--infergate-save-baseline=b.json", "--infergate-json=./b.json"],
     "*--infergate-save-baseline and --infergate-json both write b.json*"),
    ("history-and-report-one-path", [], ["--infergate-history=h", "--infergate-report=h"],
     "*--infergate-report and --infergate-history both write h*"),
]


TABLED = ("json-and-report-one-path", "baseline-and-json-one-path", "policy-top1-over-one")  # rows 2, 3, 8 of #32


@pytest.mark.parametrize("ini,args,message", [row[1:] for row in USAGE_ERRORS if row[0] not in TABLED],
                         ids=[row[0] for row in USAGE_ERRORS if row[0] not in TABLED])
def test_usage_errors_name_the_input(pytester, run, ini, args, message):
    (pytester.path / "afile").write_text("a regular file in the way")
    if ini:
        pytester.makeini("[pytest]\n" + "\n".join(ini) + "\n")
    pytester.makepyfile("def test_x(): pass")
    result = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() and "INTERNALERROR" not in result.stdout.str()


def check_a_usage_error_names_the_input(pytester, run, case):
    """One of USAGE_ERRORS, by id (the rows of issue #32's table among them run in tests/test_reliability.py)."""
    (_, ini, args, message), = [row for row in USAGE_ERRORS if row[0] == case]
    test_usage_errors_name_the_input(pytester, run, ini, args, message)


def test_nan_in_a_marker_is_a_usage_error(pytester, run):
    pytester.makepyfile(BENCH.format(budget="tokens_per_s=float('nan')"))
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tokens_per_s=nan must be a positive number*nan or inf would never be checked*"])


def test_same_scope_on_two_lines_merges(pytester, run):
    pytester.makeini("[pytest]\ninfergate_budgets =\n    fp32: tokens_per_s=0.001\n    fp32: ttft_ms=0.0001\n")
    pytester.makepyfile(BENCH.format(budget=""))
    result = run()
    result.assert_outcomes(failed=1)  # the second line's key was kept, not dropped
    result.stdout.fnmatch_lines(["*ttft_ms * ms > budget 0.0001 ms*"])


# ---- baselines: a relative check that cannot run is never silent ------------------------------------------------
INTERRUPTS = {"Ctrl-C": "raise KeyboardInterrupt",
              "SIGTERM": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"}  # a CI job cancelled


def check_an_interrupted_save_leaves_the_accepted_baseline_untouched(pytester, run, cache_dir, interrupt="Ctrl-C"):
    _baseline(pytester, run)
    accepted = (pytester.path / "base.json").read_text()
    pytester.makepyfile(BENCH.format(budget="max_regression=0.5") + f"""
def test_zz_interrupted():
    {INTERRUPTS[interrupt]}
""")
    # in a subprocess: in-process, the interrupt would reach this test session too; without the save's time floor,
    # as the `run` fixture's runs: the interrupt is what this checks, not how long the save measured
    result = pytester.runpytest_subprocess("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                           "--infergate-precisions=fp32", "--infergate-min-time=0", "-p",
                                           "no:cacheprovider", "--infergate-save-baseline=base.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*--infergate-save-baseline base.json was not written: the run was interrupted*"])
    assert (pytester.path / "base.json").read_text() == accepted


def _older(damage):
    """`damage` done to the same baseline written in the older format (kind "baseline"), which is still read."""
    def damaged(saved):
        older = older_baseline_of(saved)
        damage(older)
        saved.clear()
        saved.update(older)
    return damaged


def _samples(saved) -> list[dict]:
    """The samples of each measurement of a saved baseline, by metric (a results file, or the older format)."""
    return [entry["measurement"]["samples"] for entry in (saved["entries"].values() if "entries" in saved
                                                          else perf_records(saved))]


DAMAGES = {  # issue #32 rows 6 and 5: (damage to a saved baseline, what the error says)
    "records-a-mapping": (lambda saved: saved.update(records={r["test"]: r for r in saved["records"]}),
                          "*`records` must be a list of records, found dict*"),
    "empty-samples": (lambda saved: [values.clear() for samples in _samples(saved) for values in samples.values()],
                      "*this results file holds no perf measurement to compare with*1 without samples*"),
    # issue #44: a NaN compared silently (every interval NaN, the verdict inconclusive, nothing said)
    "nan-sample": (lambda saved: [samples["ttft_ms"].__setitem__(0, float("nan")) for samples in _samples(saved)],
                   "*entry '*::test_speed[[]fp32[]]' has ttft_ms[[]0[]] = nan (not a finite number)*"
                   "--infergate-save-baseline*"),
    "null-sample": (lambda saved: [samples["ttft_ms"].__setitem__(1, None) for samples in _samples(saved)],
                    "*has ttft_ms[[]1[]] = None (not a finite*"),
    # the older format (kind "baseline") is read with the checks it always had
    "older-entries-a-list": (_older(lambda saved: saved.update(entries=list(saved["entries"].values()))),
                             "*`entries` must be a mapping*list*"),
    "older-empty-samples": (_older(lambda saved: [values.clear() for samples in _samples(saved)
                                                  for values in samples.values()]), "*entry*has no samples*"),
    "older-nan-sample": (_older(lambda saved: [samples["ttft_ms"].__setitem__(0, float("nan"))
                                               for samples in _samples(saved)]),
                         "*entry '*::test_speed[[]fp32[]]' has ttft_ms[[]0[]] = nan (not a finite number)*"),
}


def check_a_damaged_baseline_says_what_is_wrong(pytester, run, case):
    damage, message = DAMAGES[case]
    saved = _baseline(pytester, run)
    damage(saved)
    (pytester.path / "damaged.json").write_text(json.dumps(saved))
    result = run("--infergate-baseline=damaged.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def check_a_measurement_without_samples_is_not_saved_as_a_baseline(tmp_path):
    from pytest_infergate.measurement import Measurement
    from pytest_infergate.outputs import save_run_as_baseline
    from pytest_infergate.perf.baseline import BaselineEntry, BaselineError

    run = saved_run({"t::all_failed": BaselineEntry({}, Measurement(samples={"ttft_ms": []}))})
    with pytest.raises(BaselineError, match=r"have no samples .*: t::all_failed; fix them or deselect them"):
        save_run_as_baseline(tmp_path / "b.json", run)
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("older", [False, True], ids=["saved-run", "older-format"])
def test_missing_baseline_entry_warns_and_fails_under_strict(pytester, run, older):
    saved = _baseline(pytester, run)
    for record in perf_records(saved):
        record["test"] = "some_other_test.py::test"
    (pytester.path / "other.json").write_text(json.dumps(older_baseline_of(saved) if older else saved))
    lenient = run("--infergate-baseline=other.json")
    lenient.assert_outcomes(passed=1)
    lenient.stdout.fnmatch_lines(["*INCONCLUSIVE not run as asked*relative check not run: the baseline file has no "
                                  "entry*"])
    strict = run("--infergate-baseline=other.json", "--infergate-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*under --infergate-strict what did not decide fails*",
                                 "*relative check not run*no entry*"])


def test_baseline_path_with_a_space_outside_the_project_is_a_usage_error(pytester, run, tmp_path_factory):
    saved = _baseline(pytester, run)
    outside = tmp_path_factory.mktemp("elsewhere") / "b.json"
    outside.write_text(json.dumps(saved))
    pytester.makeini("[pytest]\ninfergate_precisions = fp32\n")
    result = run("--infergate-baseline", str(outside))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--infergate-baseline *b.json: pytest read the path as a test path*"
                                 "write the option with '=' instead*"])
    # With '=' the baseline is read and compared (pass or fail is timing, not what this test is about).
    compared = run(f"--infergate-baseline={outside}", "--infergate-json=r.json")
    assert compared.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    record = json.loads((pytester.path / "r.json").read_text())["records"][0]
    assert record["verdicts"] and not record["relative_check_missing"]


def test_a_results_file_is_a_baseline_the_accepted_run(pytester, run):
    # issue #42: a baseline is a saved run; --infergate-save-baseline is a convenience writing the same
    pytester.makepyfile(BENCH.format(budget="max_regression=0.5"))
    run("--infergate-json=r.json").assert_outcomes(passed=1)
    run("--infergate-baseline=r.json", "--infergate-json=again.json")
    (record,) = [r for r in json.loads((pytester.path / "again.json").read_text())["records"] if r["kind"] == "perf"]
    assert record["route"] == "stored" and record["verdicts"] and "recorded" in record["baseline_provenance"]
    # measured as the accepted run was: without the calibration probe it did not take
    assert record["measurement"]["probe_s"] == [] and record["measurement"]["repetitions"] >= LEAST_REPETITIONS
    # a results file without a perf measurement is no baseline, said
    (pytester.path / "empty.json").write_text(json.dumps({"kind": "results", "schema_version": 4, "records": []}))
    result = run("--infergate-baseline=empty.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--infergate-baseline empty.json: this results file holds no perf measurement*"])


def test_a_history_run_is_a_baseline_by_its_run_id_or_latest(pytester, run):
    # issue #42: a baseline is a saved run, and a history keeps the saved runs
    from pytest_infergate.history.store import RUN_FILE

    pytester.makepyfile(BENCH.format(budget="max_regression=0.5"))
    run("--infergate-history=h").assert_outcomes(passed=1)
    (first,) = [p for p in (pytester.path / "h").iterdir() if RUN_FILE.match(p.name)]
    for name in ("latest", first.stem):
        run(f"--infergate-baseline={name}", "--infergate-history=h", "--infergate-json=again.json")
        (record,) = [r for r in json.loads((pytester.path / "again.json").read_text())["records"]
                     if r["kind"] == "perf"]
        assert record["route"] == "stored" and record["verdicts"], name
    # a run id without its history, and one the history does not hold, are usage errors that say what to give
    alone = run(f"--infergate-baseline={first.stem}")
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    alone.stderr.fnmatch_lines([f"*--infergate-baseline {first.stem} names a run of a history: give its folder with "
                                "--infergate-history DIR*"])
    missing = run("--infergate-baseline=20200101T000000Z-abcdef", "--infergate-history=h")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines([f"*no such run in the history h (its newest: *{first.stem}*)*`latest`*"])


def test_cli_reads_a_saved_baseline_and_refuses_older_baselines_and_incomplete_results(pytester, run, capsys):
    from pytest_infergate.cli import main

    saved = _baseline(pytester, run)
    base = str(pytester.path / "base.json")
    # a saved baseline is a run's results file: what the CLI reads
    assert main(["compare", base, base]) == 0
    assert main(["report", base, "-o", str(pytester.path / "x.html")]) == 0
    capsys.readouterr()
    (pytester.path / "older.json").write_text(json.dumps(older_baseline_of(saved)))
    older = str(pytester.path / "older.json")
    assert main(["compare", older, older]) == 2
    assert "is a baseline file, not a results file" in capsys.readouterr().err
    assert main(["report", older, "-o", str(pytester.path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "is a baseline file" in err and "infergate migrate" in err
    run("--infergate-json=r.json")
    data = json.loads((pytester.path / "r.json").read_text())
    del data["records"][0]["measurement"]
    (pytester.path / "cut.json").write_text(json.dumps(data))
    assert main(["report", str(pytester.path / "cut.json"), "-o", str(pytester.path / "x.html")]) == 2
    assert "a record is incomplete" in capsys.readouterr().err
    (pytester.path / "afile").write_text("x")
    assert main(["report", str(pytester.path / "r.json"), "-o", str(pytester.path / "afile" / "x.html")]) == 2
    assert "is a file" in capsys.readouterr().err


# ---- scopes that match nothing --------------------------------------------------------------------------------
def test_scope_matching_no_test_warns_and_fails_under_strict(pytester, run):
    pytester.makeini("[pytest]\ninfergate_budgets =\n    fp23: tokens_per_s=1e9\n    int8: tokens_per_s=1e9\n")
    pytester.makepyfile(BENCH.format(budget=""))
    lenient = run()
    lenient.assert_outcomes(passed=1)
    lenient.stdout.fnmatch_lines(["*INCONCLUSIVE not run as asked: infergate_budgets: scope 'fp23' (infergate_budgets "
                                  "line 1) matched no test*"])
    assert "scope 'int8'" not in lenient.stdout.str()  # a precision merely not run this time is fine
    strict = run("--infergate-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED


def check_policy_scope_matching_no_golden_gate_warns_and_fails_under_strict(pytester, run):
    # only golden regression checks ran: a typo'd scope of the quality policy still warns (issue #32 row 7)
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    fp23: max_drift_share=0.5\n")
    pytester.mkdir("golden")
    (pytester.path / "golden" / "mine.jsonl").write_text(
        json.dumps({"id": "s1", "category": "chat", "prompt": "Name a colour.", "max_new_tokens": 4}) + "\n")
    pytester.makepyfile(QUALITY)
    run("--infergate-update-golden").assert_outcomes(passed=1)
    lenient = run()
    lenient.assert_outcomes(passed=1)
    lenient.stdout.fnmatch_lines(["*INCONCLUSIVE not run as asked: infergate_quality_policy: scope 'fp23' "
                                  "(infergate_quality_policy line 1) matched no test*"])
    assert run("--infergate-strict").ret == pytest.ExitCode.TESTS_FAILED


# ---- outputs: written independently, failures reported --------------------------------------------------------
def test_one_output_failing_does_not_stop_the_others(pytester, run, monkeypatch):
    from pytest_infergate import report

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(report, "write_report", broken)
    pytester.makepyfile(BENCH.format(budget=""))
    result = run("--infergate-report=r.html", "--infergate-json=r.json")
    result.stdout.fnmatch_lines(["*perf PASS*", "*ERROR --infergate-report r.html was not written: disk full*"])
    assert (pytester.path / "r.json").exists() and result.ret == pytest.ExitCode.TESTS_FAILED


# ---- golden sets and models -------------------------------------------------------------------------------------
@pytest.mark.parametrize("sample,message", [
    ({"id": "long", "category": "c", "prompt": "word " * 300, "max_new_tokens": 4},
     "*default.jsonl:1: sample 'long' has a *-token prompt, over the golden engine's context of 64 tokens*"
     "--infergate-golden-max-len*"),
    ({"id": "empty", "category": "c", "prompt": "  ", "max_new_tokens": 4},
     "*default.jsonl:1: 'prompt' must be non-empty text*"),
], ids=["too-long-for-the-context", "empty-prompt"])
def test_golden_sample_errors_name_file_and_line(pytester, run, sample, message):
    (pytester.path / "golden").mkdir()
    (pytester.path / "golden" / "default.jsonl").write_text(json.dumps(sample) + "\n")
    pytester.makepyfile(QUALITY)
    result = run("--infergate-update-golden", "--infergate-golden-max-len=64")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([message])


def test_load_errors_print_once_without_a_chain(pytester, cache_dir):
    pytester.makepyfile("def test_a(infergate_model): pass\ndef test_b(infergate_model): pass")
    # -rN: no short summary, which repeats each message in full where CI is set (and cut elsewhere)
    result = pytester.runpytest("--infergate-model=/nowhere/m.gguf", f"--infergate-cache-dir={cache_dir}",
                                "--infergate-precisions=fp32", "-rN")
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert out.count("GGUF file /nowhere/m.gguf does not exist") == 2  # once per error
    assert "During handling of the above exception" not in out


def test_hub_id_without_network_fails_fast_with_the_fix(pytester, cache_dir, monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytester.makepyfile("def test_a(infergate_model): pass")
    start = time.perf_counter()
    result = pytester.runpytest("--infergate-model=no-such-org/no-such-model", f"--infergate-cache-dir={cache_dir}",
                                "--infergate-precisions=fp32")
    # no retry loop: the whole inner run took 6.4 s on a loaded 2-core VM, so 60 s holds on a machine 3x slower
    # still, and a hub client retrying with backoff would pass it
    assert time.perf_counter() - start < 60
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*'no-such-org/no-such-model' is not in the local Hugging Face cache*"
                                 "pass its directory or a .gguf file*"])


@pytest.mark.slow  # builds a model, starts processes or runs many bootstraps
def test_cache_file_changed_in_place_is_rebuilt_not_loaded(tmp_path):
    from pytest_infergate.models import load_model, resolve_model
    from pytest_infergate.models.load import model_fingerprint

    source = resolve_model("tiny-random-llama", tmp_path)
    fingerprint = model_fingerprint(source)
    weights = os.path.join(source.path, "model.safetensors")
    size = os.path.getsize(weights)
    with open(weights, "r+b") as handle:  # same size, different bytes
        handle.seek(size - 64)
        handle.write(b"\x7f" * 64)
    again = resolve_model("tiny-random-llama", tmp_path)
    assert model_fingerprint(again) == fingerprint
    assert os.path.getsize(weights) == size
    load_model(again, "fp32")  # the rebuilt entry loads


def check_cache_file_rotted_with_its_size_and_time_kept_is_rebuilt(tmp_path, monkeypatch):
    # issue #32 row 19: bit rot, or `cp -p` over it: same size and mtime, so only the contents can tell
    from pytest_infergate.models import cache, resolve_model
    from pytest_infergate.models.load import model_fingerprint

    source = resolve_model("tiny-random-llama", tmp_path)
    weights = os.path.join(source.path, "model.safetensors")
    good, stat = open(weights, "rb").read(), os.stat(weights)
    with open(weights, "r+b") as handle:
        handle.seek(stat.st_size // 2)
        handle.write(b"\x00\x7f" * 8)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setattr(cache, "_VERIFIED", set())  # a new process: nothing verified yet
    again = resolve_model("tiny-random-llama", tmp_path)
    assert open(os.path.join(again.path, "model.safetensors"), "rb").read() == good
    assert model_fingerprint(again) == model_fingerprint(source)


# ---- xdist: the controller gets everything a serial run has ------------------------------------------------------
def test_xdist_results_equal_a_serial_run_but_timings(pytester, run):
    pytester.makepyfile(BENCH.format(budget="tokens_per_s=0.01") + """
@pytest.mark.parametrize("i", range(2))
def test_more(infergate_bench, i):
    infergate_bench(REQS, EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=1, warmup=0,
                    label=f"n{i}")
""")
    run("--infergate-json=serial.json").assert_outcomes(passed=3)
    run("-n", "2", "--infergate-json=xdist.json").assert_outcomes(passed=3)
    serial, xdist = (json.loads((pytester.path / name).read_text()) for name in ("serial.json", "xdist.json"))
    timing = {"load_s", "peak_mem_bytes", "load_mem_delta_bytes", "peak_mem_method", "self_check_s"}

    def stable(models):
        return {p: {k: v for k, v in m.items() if k not in timing} for p, m in models.items()}

    assert stable(xdist["models"]) == stable(serial["models"]) and xdist["models"]
    threads = "torch_threads"  # xdist workers split the cores between them, by design
    assert {k: v for k, v in xdist["environment"]["machine"].items() if k != threads} == {
        k: v for k, v in serial["environment"]["machine"].items() if k != threads}
    assert {k: v for k, v in xdist["environment"].items() if k != "machine"} == {
        k: v for k, v in serial["environment"].items() if k != "machine"}

    def records(data):
        return sorted((r["test"], r["status"], r["precision"], json.dumps(r["engine_config"], sort_keys=True),
                        json.dumps(r["budget"], sort_keys=True), sorted(r["summary"])) for r in data["records"])

    assert records(xdist) == records(serial)
    assert xdist["outcomes"] == serial["outcomes"] and xdist["gate_counts"] == serial["gate_counts"]


# ---- issue #32 rows 13, 14, 16: the input named, never a raw library error or a silent pass ----------------------
def check_a_binary_workload_file_names_the_file_and_line(tmp_path):
    from pytest_infergate.workloads.traffic import WorkloadError, from_file

    path = tmp_path / "w.jsonl"
    path.write_bytes(b'{"prompt": "hello"}\n\xff\xfe\x00binary')
    with pytest.raises(WorkloadError, match=r"workload file .*w.jsonl line 2 is not UTF-8 text"):
        from_file(path)


def check_a_chat_message_without_content_is_refused_at_the_request():
    from pytest_infergate.engine import Request
    from pytest_infergate.workloads.request import RequestError

    with pytest.raises(RequestError, match=r"messages\[1\]\['content'\] is None"):
        Request(messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": None}])


def check_zero_repeats_is_an_error_not_a_pass(pytester, run):
    pytester.makepyfile(BENCH.format(budget="tokens_per_s=1").replace("repeats=1", "repeats=0"))
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*infergate_bench(repeats=0): take at least one repetition*"])


def check_every_request_rejected_fails_the_budget_saying_why(pytester, run):
    # prompts longer than the engine takes: nothing measured, so a latency budget must not pass (issue #32 row 17)
    pytester.makepyfile("""
import pytest
from pytest_infergate.engine import EngineConfig, Request

@pytest.mark.infergate_budget(ttft_ms_p95=60000)
def test_speed(infergate_bench):
    reqs = [Request(prompt_token_ids=[5] * 40, max_new_tokens=4) for _ in range(2)]
    infergate_bench(reqs, EngineConfig(max_model_len=256, max_input_tokens=16, kv_budget_bytes=8 << 20),
                    repeats=1, warmup=0)
""")
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*every one of the 2 requests failed (rejected: 2), so no budget can be checked*"])


def check_a_prompt_over_the_context_in_a_workload_is_the_message_alone(pytester, run):
    # issue #32 row 18: the right message came under seven frames of the plugin's traceback
    pytester.makepyfile("""
from pytest_infergate.engine import EngineConfig, Request

def test_speed(infergate_bench):
    reqs = [Request(prompt_token_ids=[5] * 300, max_new_tokens=4)]
    infergate_bench(reqs, EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=1, warmup=0)
""")
    result = run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*infergate_bench for test_*: request 0: prompt has 300 tokens, over the context "
                                 "window of 256*"])
    assert "perf/local_bench.py" not in result.stdout.str() and "engine/sequence.py" not in result.stdout.str()


def check_a_model_directory_without_tokenizer_files_names_them(tmp_path, tiny_source):
    # issue #32 row 20: transformers built a one-token tokenizer from a directory without one, every output garbage
    import shutil
    from pathlib import Path

    from pytest_infergate.errors import ModelLoadError
    from pytest_infergate.models import resolve_model

    own = tmp_path / "my-model"
    own.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(tiny_source.path) / name, own / name)
    with pytest.raises(ModelLoadError, match=r"my-model has no tokenizer files \(one of tokenizer.json, "
                                             r"tokenizer.model.*tokenizer.save_pretrained"):
        resolve_model(str(own), tmp_path / "cache")
    shutil.copy(Path(tiny_source.path) / "tokenizer.json", own / "tokenizer.json")
    assert resolve_model(str(own), tmp_path / "cache").kind == "directory"


def check_a_model_directory_whose_config_is_not_json_names_the_config(tmp_path):
    # issue #44: the error blamed missing tokenizer files; the cause was the config
    from pytest_infergate.errors import ModelLoadError
    from pytest_infergate.models import resolve_model

    own = tmp_path / "my-model"
    own.mkdir()
    (own / "config.json").write_text('{"model_type": "llama",')  # cut short
    with pytest.raises(ModelLoadError, match=r"my-model/config.json is not valid JSON \(Expecting .*line 1 column "
                                             r"\d+.*\): repair it or save the model again"):
        resolve_model(str(own), tmp_path / "cache")
    (own / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match=r"config.json holds a JSON list, not the object of a model's config"):
        resolve_model(str(own), tmp_path / "cache")


def test_an_empty_or_unknown_json_file_is_said_as_it_is(tmp_path, capsys):
    """An empty results file read 'not a JSON results file (Expecting value: line 1 column 1 (char 0))', and a JSON
    file of no kind 'a unknown file': said as they are, by every reader (compare, migrate)."""
    from pytest_infergate.errors import InfergateError
    from pytest_infergate.history.store import load_run, migrate_baseline

    empty, unknown = tmp_path / "empty.json", tmp_path / "unknown.json"
    empty.write_text("")
    unknown.write_text("{}")
    with pytest.raises(InfergateError, match=r"empty.json is empty: not a results file"):
        load_run(empty)
    with pytest.raises(InfergateError, match=r"empty.json is empty$"):
        migrate_baseline(empty, quiet=False)
    assert migrate_baseline(unknown, quiet=False) == [
        f"{unknown}: an unknown file: nothing to migrate (every version is read)"]

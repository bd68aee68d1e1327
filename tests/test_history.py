"""Run history: synthetic runs with an injected step, a slow creep and unchanged series; the folder that
--infergate-history keeps; `infergate history`; the page in headless Chromium."""

import json
import math
import random
import re

import pytest
from browser import needs_chromium, open_page

from pytest_infergate.cli import main as cli_main
from pytest_infergate.history import build_history, findings, load_runs
from pytest_infergate.history.changepoint import change_points, creep
from pytest_infergate.history.store import append_run
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.outcome import PerfOutcome, Violation
from pytest_infergate.report import render as render_report
from pytest_infergate.report.history_page import record_run, render_history, text_table
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults

STEP_AT = 7  # run number (1-based) of the first run at the new level
RUNS = 12
ENV = {"machine": {"cpu": "synthetic", "cpu_count": 2}, "versions": {"torch": "2.5.0"}, "model": "tiny",
       "device": "cpu"}


def _samples(rng, level, n, run_noise=0.02, request_noise=0.05):
    """One run's samples: a level, a run-to-run factor (the CI machine's mood) and per-request noise."""
    factor = math.exp(rng.gauss(0, run_noise))
    return [level * factor * math.exp(rng.gauss(0, request_noise)) for _ in range(n)]


def _record(test, samples, fingerprint=None, violations=()):
    return PerfRecord(test=test, label="", precision="fp32", outcome=PerfOutcome(violations=list(violations)),
                      measurement=Measurement(samples=samples, repetitions=3, num_requests=30),
                      budget={"ttft_ms": 1000.0}, fingerprint=fingerprint or {"torch": "2.5.0", "cpu": "synthetic"})


def synthetic_runs(seed=0, runs=RUNS, step=True, creep_per_run=0.015, env_change_at=None, step_at=STEP_AT):
    """Per run: a TTFT step (+30% from run STEP_AT), a throughput creep (-1.5% a run), and an unchanged TPOT;
    with `env_change_at`, TPOT's environment changes there together with a level shift."""
    rng = random.Random(seed)
    out = []
    for i in range(1, runs + 1):
        ttft = 100.0 * (1.3 if step and i >= step_at else 1.0)
        tps = 50.0 * (1 - creep_per_run) ** (i - 1)
        tpot_env = {"torch": "2.6.0" if env_change_at and i >= env_change_at else "2.5.0", "cpu": "synthetic"}
        tpot = 20.0 * (1.5 if env_change_at and i >= env_change_at else 1.0)
        run = RunResults(started=1_700_000_000 + 3600 * i, environment=ENV, run_id=f"run{i:02d}", commit=f"c{i:02d}")
        run.records.append(_record("suites/test_a.py::test_latency[fp32]", {
            "ttft_ms": _samples(rng, ttft, 30), "tokens_per_s": _samples(rng, tps, 3, 0.005, 0.01)}))
        run.records.append(_record("suites/test_b.py::test_decode[fp32]", {"tpot_ms": _samples(rng, tpot, 30)},
                                   tpot_env))
        out.append(run)
    return out


def _findings(runs, **kwargs):
    return {(f.series.test.split("::")[1], f.series.metric, f.kind): f for f in findings(build_history(runs, **kwargs))}


def test_step_is_found_at_the_right_run_with_its_change_and_ci():
    found = _findings(synthetic_runs())
    step = found[("test_latency[fp32]", "ttft_ms", "step")]
    assert step.run.index == STEP_AT and step.run.commit == f"c{STEP_AT:02d}"
    assert step.worse and step.low < 0.30 < step.high and 0.2 < step.change < 0.4
    assert [k for k in found if k[1] == "ttft_ms"] == [("test_latency[fp32]", "ttft_ms", "step")]


def test_slow_creep_is_flagged_while_every_gate_passed():
    found = _findings(synthetic_runs())
    c = found[("test_latency[fp32]", "tokens_per_s", "creep")]
    assert c.worse and c.passed and c.change < -0.05
    assert ("test_latency[fp32]", "tokens_per_s", "step") not in found  # a trend is not reported as a step


@pytest.mark.slow  # builds a model, starts processes or runs many bootstraps
def test_unchanged_series_have_no_change_point():
    for seed in range(10):
        found = _findings(synthetic_runs(seed=seed, step=False, creep_per_run=0.0))
        assert found == {}, (seed, list(found))


@pytest.mark.parametrize("seed", range(5))
def test_eight_runs_are_enough_to_find_a_step(seed):
    found = _findings(synthetic_runs(seed=seed, runs=8, step_at=5, creep_per_run=0.0))
    assert {(k[1], k[2], f.run.index) for k, f in found.items()} == {("ttft_ms", "step", 5)}
    assert _findings(synthetic_runs(seed=seed, runs=8, step=False, creep_per_run=0.0)) == {}


@pytest.mark.slow  # builds a model, starts processes or runs many bootstraps
def test_a_library_change_is_a_marked_point_of_the_series_and_a_machine_change_splits_it():
    history = build_history(synthetic_runs(env_change_at=5))
    tpot = next(s for s in history.series if s.metric == "tpot_ms")
    assert [len(s.points) for s in tpot.segments] == [12]  # torch 2.5.0 → 2.6.0 is what a history is read for
    assert tpot.points[4].changes == "torch 2.5.0 → 2.6.0" and not tpot.points[5].changes
    (step,) = [f for f in findings(history) if f.series is tpot]
    assert step.run.index == 5 and step.worse and step.changes == "torch 2.5.0 → 2.6.0"
    table = text_table(history)
    assert "tpot_ms: regressed at run #5 (commit c05): +" in table and "%), with torch 2.5.0 → 2.6.0" in table
    assert "changed under test at run #5: torch 2.5.0 → 2.6.0" in table
    # the same runs with the CPU model changing at run 5: timings of two machines are two series
    moved = synthetic_runs(env_change_at=5)
    for run in moved[4:]:
        for record in run.perf:
            record.fingerprint = {**record.fingerprint, "cpu": "another", "torch": "2.5.0"}
    for run in moved[:4]:
        for record in run.perf:
            record.fingerprint = {**record.fingerprint, "cpu": "synthetic", "torch": "2.5.0"}
    history = build_history(moved)
    tpot = next(s for s in history.series if s.metric == "tpot_ms")
    assert [len(s.points) for s in tpot.segments] == [4, 8]
    assert tpot.segments[1].change_from_previous == "cpu synthetic → another"
    assert not any(f.series is tpot for f in findings(history))
    assert "machine changed at run #5: cpu synthetic → another (a new series)" in text_table(history)


def test_change_point_statistics_directly():
    rng = random.Random(3)
    flat = [_samples(rng, 10.0, 20) for _ in range(15)]
    assert change_points(flat) == [] and creep(flat) is None
    two_steps = [_samples(rng, 10.0 * (1.25 if i >= 5 else 1) * (1.25 if i >= 10 else 1), 20) for i in range(15)]
    assert [cp.index for cp in change_points(two_steps)] == [5, 10]
    constant = [[7.0] * 5 for _ in range(6)] + [[9.0] * 5 for _ in range(6)]  # e.g. memory: exactly repeatable
    [cp] = change_points(constant)
    assert cp.index == 6 and cp.low == cp.high == pytest.approx(2 / 7)


def test_history_folder_keeps_the_latest_runs_atomically(tmp_path):
    (tmp_path / "notes.json").write_text("{}")  # not a run: never pruned, skipped when read
    runs = synthetic_runs(runs=8)
    for run in runs:
        run.run_id = ""  # as a pytest run has: the id is made when the results are written
        append_run(tmp_path, run, keep=5)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 6 and "notes.json" in names and not any(n.endswith(".tmp") for n in names)
    loaded, skipped = load_runs([tmp_path])
    assert [r.commit for r in loaded] == ["c04", "c05", "c06", "c07", "c08"]
    assert len(skipped) == 1 and skipped[0].startswith("notes.json")
    assert all(json.loads(p.read_text())["schema_version"] == 4 for p in tmp_path.glob("2*.json"))


@pytest.mark.slow  # builds a model, starts processes or runs many bootstraps
def test_cli_history_prints_the_table_and_writes_the_page(tmp_path, capsys):
    for run in synthetic_runs():
        append_run(tmp_path / "h", run)
    out_html = tmp_path / "history.html"
    assert cli_main(["history", str(tmp_path / "h"), "-o", str(out_html)]) == 0
    out = capsys.readouterr().out
    assert f"test_latency[fp32] ttft_ms: regressed at run #{STEP_AT} (commit c{STEP_AT:02d}): +" in out
    assert "tokens_per_s: creeping worse since run #" in out and "every gate passed" in out
    html = out_html.read_text()
    assert html.count("<svg") >= 4 and "e+0" not in html and "inf" not in html.lower().replace("infergate", "")
    assert cli_main(["history", str(tmp_path / "h"), "--metric", "ttft_ms", "-o", str(out_html)]) == 0
    assert "tokens_per_s" not in capsys.readouterr().out
    assert cli_main(["history", str(tmp_path / "h"), "--metric", "ttfb"]) == 2
    assert "not a perf metric" in capsys.readouterr().err
    assert cli_main(["history", str(tmp_path / "missing")]) == 2
    (tmp_path / "h" / "history.html").write_text(html)
    latest = sorted((tmp_path / "h").glob("run*.json"))[-1]
    assert cli_main(["report", str(latest), "--history", str(tmp_path / "h"), "-o", str(tmp_path / "r.html")]) == 0
    report = (tmp_path / "r.html").read_text()
    assert 'href="h/history.html"' in report and "slow creep across runs" in report


def test_report_notes_the_creep_and_links_the_history(tmp_path):
    runs = synthetic_runs()
    for run in runs[:-1]:
        append_run(tmp_path, run)
    history = record_run(tmp_path, runs[-1], keep=100, report=tmp_path / "report.html")
    html = render_report(runs[-1], history=history, history_href="history.html")
    assert 'href="history.html"' in html and "slow creep across runs" in html
    assert "tokens_per_s: −" in html and "every run passed its gate" in html.lower()
    assert 'href="report.html"' in (tmp_path / "history.html").read_text()


def test_failing_runs_are_coloured_and_explained():
    runs = synthetic_runs(runs=8)
    violation = Violation("ttft_ms", 1300.0, 1000.0, "ms", 50, 30, False)
    runs[3].records[0] = _record(runs[3].records[0].test, runs[3].records[0].measurement.samples,
                                 violations=[violation])
    history = build_history(runs)
    point = next(s for s in history.series if s.metric == "ttft_ms").points[3]
    assert point.status == "fail" and point.why == "ttft_ms 1,300 ms > budget 1,000 ms (30% over budget)"
    assert "ttft_ms 1,300 ms &gt; budget 1,000 ms" in render_history(history)


@needs_chromium
def test_history_page_in_headless_chromium(tmp_path):
    runs = synthetic_runs(env_change_at=9)
    hostile = 'suites/test_x.py::test_y[<script>document.title="pwned"</script>]'
    for run in runs:
        run.records.append(_record(hostile, {"ttft_ms": [5.0, 6.0]}))
    page = tmp_path / "history.html"
    page.write_text(render_history(build_history(runs)))
    check = open_page(page)
    assert check.errors == [] and check.page_overflow == 0 and check.wide_tables == []
    assert check.title.startswith("infergate history") and "pwned" not in check.title
    assert "regressed at run #7" in check.text


@pytest.mark.parametrize("args, message", [
    (["--infergate-history=afile/h"], "*--infergate-history afile/h: afile is a file*"),
    (["--infergate-history=h", "--infergate-history-keep=1"], "*--infergate-history-keep must keep at least 2 runs*"),
])
def test_history_options_are_checked_before_any_test_runs(pytester, args, message):
    (pytester.path / "afile").write_text("a regular file in the way")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def _slowed_runs(slowdown_from: int | None, runs: int = 10, seed: int = 5):
    """Ten runs of one TTFT series, each with its report kept beside it; from `slowdown_from` on, 20% slower."""
    rng = random.Random(seed)
    out = []
    for i in range(1, runs + 1):
        level = 100.0 * (1.2 if slowdown_from and i >= slowdown_from else 1.0)
        run = RunResults(started=1_700_000_000 + 3600 * i, environment=ENV, run_id=f"run{i:02d}", commit=f"c{i:02d}")
        run.records.append(_record("suites/test_a.py::test_latency[fp32]", {"ttft_ms": _samples(rng, level, 30)}))
        out.append(run)
    return out


@pytest.mark.parametrize("slowdown_from", [6, None], ids=["20%-slower-from-run-6", "unchanged"])
def test_cli_history_marks_an_injected_slowdown_and_links_its_report(tmp_path, capsys, slowdown_from):
    folder = tmp_path / "h"
    for run in _slowed_runs(slowdown_from):
        path = append_run(folder, run)
        path.with_suffix(".html").write_text(f"<title>report of {run.run_id}</title>")
    assert cli_main(["history", str(folder), "-o", str(folder / "history.html")]) == 0
    out = capsys.readouterr().out
    html = (folder / "history.html").read_text()
    # every run links to its report, kept beside its results: from its point and from the runs table
    assert all(html.count(f'href="run{i:02d}.html"') >= 2 for i in range(1, 11))
    if slowdown_from is None:
        assert "regressed" not in out and "No change point and no creep in any series." in html
        return
    assert f"ttft_ms: regressed at run #{slowdown_from} (commit c{slowdown_from:02d}): +" in out
    finding = html[html.index('<table id="findings">'):html.index("</table>")]
    assert f"regressed at run #{slowdown_from}" in finding and f'href="run{slowdown_from:02d}.html"' in finding


def test_history_marks_a_failed_gate_apart_from_the_series_colour_and_memory_from_zero():
    runs = synthetic_runs(runs=8)
    violation = Violation("ttft_ms", 1300.0, 1000.0, "ms", 50, 30, False)
    runs[3].records[0] = _record(runs[3].records[0].test, runs[3].records[0].measurement.samples,
                                 violations=[violation])
    for run in runs:
        run.records.append(_record("suites/test_m.py::test_memory[fp32]", {"peak_mem_mb": [500.0 + run.started % 7]}))
    html = render_history(build_history(runs, metrics=("ttft_ms", "peak_mem_mb")))
    ttft = html[html.index("ttft_ms · test_latency"):]
    ttft = ttft[:ttft.index("</svg>")]
    assert ttft.count('class="gate-fail"') == 1  # the failed run, marked apart from its dot
    assert len(set(re.findall(r'<circle cx="[\d.]+" cy="[\d.]+" r="3.5" fill="([^"]+)"', ttft))) == 1  # one colour
    memory = html[html.index("peak_mem_mb · test_memory"):]
    memory = memory[:memory.index("</svg>")]
    assert re.search(r'class="tk">0</text>', memory)  # the axis starts at zero: 500-506 MiB is no cliff


def test_a_run_with_history_and_report_keeps_its_report_in_the_history(pytester, run):
    pytester.makepyfile("def test_ok():\n    assert True\n")
    for _ in range(2):
        run("--infergate-history=h", "--infergate-report=report.html").assert_outcomes(passed=1)
    kept = sorted(p.name for p in (pytester.path / "h").iterdir())
    reports = [name for name in kept if name.endswith(".html") and name != "history.html"]
    assert len(reports) == 2 and all(name[:-5] + ".json" in kept for name in reports)
    page = (pytester.path / "h" / "history.html").read_text()
    assert all(f'href="{name}"' in page for name in reports)
    assert 'href="history.html"' in (pytester.path / "h" / reports[-1]).read_text()  # its link works from there

"""One decision against a stored baseline: the in-run gate, `infergate compare`, the report and the history give
the same verdict on the same recorded pair of runs."""

import re
from html import unescape
from types import SimpleNamespace

import pytest
from browser import needs_chromium, open_page
from test_perf import BASELINE_SPEEDS, GATE, SLOW_SPEEDS, machine

from pytest_infergate.cli import compare_runs
from pytest_infergate.gates.bench import record_outcome
from pytest_infergate.history.series import build_history
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.gate import evaluate_perf
from pytest_infergate.report import render as render_report
from pytest_infergate.results import RunResults
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.summary import summary_lines, verdict_reasons
from pytest_infergate.status import Status

TEST = "suites/test_speed.py::test_chat[fp32]"
FINGERPRINT = {"cpu": "synthetic", "cpu_count": 2, "torch": "2.13.0", "engine_config": {"max_batch_size": 8}}
BUDGET = {"itl_ms": 1e12, "tokens_per_s": 1e-9, "peak_mem_mb": 1e9, "max_regression": 0.10}


def recorded_run(measurement, fingerprint, started, gate_against=None) -> RunResults:
    """A run's results as the session writes them; with `gate_against` (the accepted run), its record carries the
    in-run gate's outcome against that run's measurement saved as the baseline."""
    record = PerfRecord(test=TEST, label="", precision="fp32", status=Status.PASS, measurement=measurement,
                        budget=dict(BUDGET), fingerprint=fingerprint)
    if gate_against is not None:
        accepted = gate_against.perf[0]
        outcome = evaluate_perf(measurement, GATE, fingerprint, BaselineEntry(accepted.fingerprint,
                                                                             accepted.measurement))
        record_outcome(SimpleNamespace(record=lambda r: None, add_property=lambda name, value: None), record, outcome)
    run = RunResults(started=started, run_id=f"run{started}")
    run.add(record)
    return run


PAIRS = {
    "unchanged": (BASELINE_SPEEDS, 1.0, FINGERPRINT, Status.PASS),
    "25% slower with a torch upgrade": (BASELINE_SPEEDS, 1.25, {**FINGERPRINT, "torch": "2.14.0"}, Status.FAIL),
    "unchanged on a busy runner": (SLOW_SPEEDS, 1.0, FINGERPRINT, Status.INCONCLUSIVE),
}


@pytest.mark.parametrize("name", PAIRS)
def test_gate_compare_report_and_history_agree_on_a_recorded_pair(name):
    speeds, regression, fingerprint, expected = PAIRS[name]
    accepted = recorded_run(machine(BASELINE_SPEEDS, seed=1), FINGERPRINT, 1_700_000_000)
    candidate = recorded_run(machine(speeds, regression=regression, seed=2), fingerprint, 1_700_003_600,
                             gate_against=accepted)
    gated = candidate.perf[0]
    assert gated.status == expected, gated.verdicts
    timed = {v.metric: v.status for v in gated.verdicts if v.metric != "peak_mem_mb"}

    # infergate compare A B
    rows, verdict, notes = compare_runs(accepted, candidate)
    assert verdict == expected
    assert {row[1]: row[5].split(" ")[0] for row in rows if row[1] in timed} == {m: s.value for m, s in timed.items()}
    if fingerprint["torch"] != FINGERPRINT["torch"]:
        assert f"{TEST}: changed since A: torch 2.13.0 → 2.14.0" in notes

    # the report: the terminal summary and the HTML show the gate's verdict and its reasons
    text = "\n".join(line.text for line in summary_lines(candidate))
    assert f"perf {expected.value.upper()}" in text and TEST in text
    shown = " ".join(unescape(re.sub(r"<[^>]+>", " ", render_report(candidate))).split())
    assert expected.value in shown
    assert all(" ".join(reason.split()) in shown for reason in verdict_reasons(gated))

    # the history: the candidate's point against the accepted run's, per metric
    history = build_history([accepted, candidate], metrics=tuple(timed))
    for series in history.series:
        (first, second) = series.points
        assert first.against_previous == ""
        assert second.against_previous.split(" ")[0] == timed[series.metric].value.upper()


def _five_reason_run() -> RunResults:
    """One failing plain test, one failing perf gate (25% slower than its stored baseline), one inconclusive perf
    gate (a busy runner), one golden drift and one skipped golden check."""
    from pytest_infergate.results.records import GoldenRecord

    accepted = recorded_run(machine(BASELINE_SPEEDS, seed=1), FINGERPRINT, 1_700_000_000)
    run = recorded_run(machine(BASELINE_SPEEDS, regression=1.25, seed=2), FINGERPRINT, 1_700_003_600,
                       gate_against=accepted)
    busy = recorded_run(machine(SLOW_SPEEDS, seed=3), FINGERPRINT, 1_700_003_600, gate_against=accepted).perf[0]
    busy.test = "suites/test_speed.py::test_busy[fp32]"
    run.add(busy)
    run.add(GoldenRecord("suites/test_golden.py::test_regression[int8]", Status.FAIL, "int8", "golden/x.jsonl",
                         problems=["drift in 3 of 48 outputs (6.2%), policy max_drift_share 0"]))
    run.outcomes = {"suites/test_a.py::test_plain": "failed", "suites/test_speed.py::test_chat[fp32]": "failed"}
    run.failures = {"suites/test_a.py::test_plain": "AssertionError: assert 3 == 4 (suites/test_a.py:7)"}
    run.warnings = ["suites/test_golden.py::test_regression[nf4]: skipped: no accepted golden outputs at x"]
    return run


def test_the_run_verdict_names_every_reason_in_terminal_html_and_json():
    """One failing plain test, one failing perf gate, one inconclusive perf gate, one golden drift and one skipped
    golden check (a warning): FAIL, with all five named, in each of the three faces."""
    run = _five_reason_run()
    verdict = run.verdict()
    assert verdict.status == Status.FAIL
    expected = ["AssertionError: assert 3 == 4 (suites/test_a.py:7)", "suites/test_speed.py::test_chat[fp32]",
                "suites/test_speed.py::test_busy[fp32]", "drift in 3 of 48 outputs",
                "no accepted golden outputs at x"]
    terminal = [line.text for line in summary_lines(run)]
    assert terminal[-1].startswith("infergate verdict: FAIL")
    shown = " ".join(unescape(re.sub(r"<[^>]+>", " ", render_report(run))).split())
    assert shown.index("Verdict: FAIL") < shown.index("Summary")
    data = run.to_dict()
    assert list(data)[2:4] == ["verdict", "reasons"] and data["verdict"] == "fail"
    for text in expected:
        assert any(text in line for line in terminal), text
        assert text in shown, text
        assert any(text in r["message"] or text in r["name"] for r in data["reasons"]), text
    assert [r["status"] for r in data["reasons"]].count("inconclusive") == 2  # the busy gate and the skipped check
    # strict: the inconclusive ones fail too; a run with nothing wrong passes
    run.strict = True
    assert run.verdict().status == Status.FAIL
    assert recorded_run(machine(BASELINE_SPEEDS, seed=2), FINGERPRINT, 0).verdict().status == Status.PASS


def test_a_warning_that_restates_a_listed_gate_is_not_a_second_reason():
    """The terminal warns "<key>: perf gate inconclusive: ..." for the gate the verdict already lists: one reason
    per thing (a suites run under a CPU hog listed each busy profile twice, 15 reasons for 11 things)."""
    run = _five_reason_run()
    busy = "suites/test_speed.py::test_busy[fp32]"
    run.warnings += [f"{busy}: perf gate inconclusive:\n  ttft_ms ...", f"{busy}: relative check not run: x"]
    reasons = run.verdict().reasons
    assert sum(busy in r.name or busy in r.message for r in reasons) == 2  # the gate, and the other warning
    assert [r.message for r in reasons if r.what == "not as asked"] == [
        "suites/test_golden.py::test_regression[nf4]: skipped: no accepted golden outputs at x",
        f"{busy}: relative check not run: x"]


@needs_chromium
def test_a_reviewer_reads_the_verdict_every_reason_and_the_baseline_in_the_browser(tmp_path):
    """The done-when of issue #31, read as a reviewer reads it: the report in headless Chromium, its visible text
    (innerText: nothing collapsed or hidden counts), in the order a reader meets it."""
    from pytest_infergate.report import write_report
    run = _five_reason_run()
    page = tmp_path / "report.html"
    write_report(run, page)
    seen = open_page(page)
    assert seen.errors == [] and seen.page_overflow == 0
    text = " ".join(seen.text.split())
    verdict = text[text.index("Verdict: FAIL"):text.index("Summary")]  # the first screen, above the summary
    for reason in ["AssertionError: assert 3 == 4 (suites/test_a.py:7)", "test_chat[fp32]", "test_busy[fp32]",
                   "drift in 3 of 48 outputs", "no accepted golden outputs at x"]:
        assert reason in verdict, reason
    # the failing gate's baseline beside the candidate, in the verdict's own line
    assert re.search(r"baseline [\d.,]+ (tok/s|ms) → now [\d.,]+ (tok/s|ms), [\d.]+% slower", verdict), verdict

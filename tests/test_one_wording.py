"""One check, worded once (issue #57 point 1): each kind of check rendered once, its one sentence (made where the
check was decided) printed as it is by the terminal summary, the HTML report, the results JSON, JUnit XML and the
CLI (`infergate summary`, `infergate compare`, the history); and a Finding said on an xdist worker arrives in the
results JSON as a record with its fields (point 2)."""

import copy
import json
import re
import xml.etree.ElementTree as ET
from html import unescape

from test_one_decision import FINGERPRINT, recorded_run
from test_perf import BASELINE_SPEEDS, SLOW_SPEEDS, machine

from pytest_infergate.cli import main as cli_main
from pytest_infergate.history.series import build_history
from pytest_infergate.perf.budget import parse_budget
from pytest_infergate.perf.gate import NoReference, PerfGate
from pytest_infergate.quality.metrics import QualityResult
from pytest_infergate.quality.policy import ResolvedPolicy, decide_quality
from pytest_infergate.results import RunResults
from pytest_infergate.results.records import GoldenRecord, PerfRecord, QualityRecord
from pytest_infergate.status import RELATIVE_CHECK, Finding, Status

NODE = "test_checks.py::test_check[{}]"
# each test of the inner run records the checks of its name, and says its findings, through the test's context
INNER = """
import json

import pytest

from pytest_infergate.results.records import record_from_dict
from pytest_infergate.session import session_of
from pytest_infergate.status import Finding

CHECKS = json.loads(open({path!r}).read())


@pytest.mark.parametrize("name", list(CHECKS))
def test_check(request, name):
    ctx = session_of(request.config).context(request.node)
    for data in CHECKS[name]["records"]:
        ctx.record(record_from_dict(data))
    for data in CHECKS[name]["findings"]:
        ctx.say(Finding.from_dict(data))
"""


def _perf(name: str, measurement, fingerprint, accepted) -> PerfRecord:
    record = recorded_run(measurement, fingerprint, 1_700_003_600, gate_against=accepted).perf[0]
    record.test = NODE.format(name)
    return record


def _quality(name: str, precision: str, top1: float) -> QualityRecord:
    result = QualityResult(precision, "fp32", [], {"samples": 48, "top1": top1}, {}, 1.0)
    policy = ResolvedPolicy.given({"min_top1": 0.9})
    decision = decide_quality(result, policy)
    return QualityRecord(NODE.format(name), decision.status, result, policy.rules, decision.problems,
                         undecided=decision.undecided, decided_by=policy.decided_by())


def _checks():
    """Every kind of check once, by the name of the inner test that records it; and the accepted run (the stored
    baseline's, and what `infergate compare` takes as A)."""
    accepted = recorded_run(machine(BASELINE_SPEEDS, seed=1), FINGERPRINT, 1_700_000_000)
    budget_only = PerfRecord(test=NODE.format("perf-budget"), label="", precision="fp32",
                             measurement=machine(BASELINE_SPEEDS, seed=4), budget={"itl_ms": 1.0})
    budget_only.outcome = PerfGate(parse_budget({"itl_ms": 1.0}), NoReference()).check(budget_only.measurement)
    records = {
        "perf-fail": _perf("perf-fail", machine(BASELINE_SPEEDS, regression=1.25, seed=2),
                           {**FINGERPRINT, "torch": "2.14.0"}, accepted),
        "perf-pass": _perf("perf-pass", machine(BASELINE_SPEEDS, seed=2), FINGERPRINT, accepted),
        "perf-inconclusive": _perf("perf-inconclusive", machine(SLOW_SPEEDS, seed=3), FINGERPRINT, accepted),
        "perf-budget": budget_only,
        "quality-pass": _quality("quality-pass", "int8", 0.95),
        "quality-fail": _quality("quality-fail", "nf4", 0.5),
        "golden-fail": GoldenRecord(NODE.format("golden-fail"), Status.FAIL, "int8", "golden/x.jsonl",
                                    problems=["drift in 3 of 48 outputs (6.2%), policy max_drift_share 0"]),
        "golden-inconclusive": GoldenRecord(NODE.format("golden-inconclusive"), Status.INCONCLUSIVE, "nf4",
                                            "golden/y.jsonl", undecided=["a near tie at sample q3: accept it or not"]),
    }
    assert [records[name].status for name in ("perf-fail", "perf-pass", "perf-inconclusive", "perf-budget")] == [
        Status.FAIL, Status.PASS, Status.INCONCLUSIVE, Status.FAIL]
    assert records["perf-fail"].changes == ["torch 2.13.0 → 2.14.0"]
    assert [records[name].status for name in ("quality-pass", "quality-fail")] == [Status.PASS, Status.FAIL]
    finding = Finding(RELATIVE_CHECK, NODE.format("not-run"), "relative check not run: the baseline file has no "
                      "entry for this measurement", "record one with --infergate-save-baseline")
    return records, finding, accepted


def _sentences(record) -> list[tuple[Status, str]]:
    """A record's checks, each with its status and its one sentence, as the check made it."""
    if isinstance(record, PerfRecord):
        return [(v.status, v.sentence()) for v in record.violations + record.verdicts]
    decision = record.decision()
    return [(Status.FAIL, s) for s in decision.problems] + [(Status.INCONCLUSIVE, s) for s in decision.undecided]


def _words(text: str) -> str:
    return " ".join(text.split())


def test_each_check_is_worded_once_in_terminal_report_json_junit_and_cli(pytester, tmp_path, capsys):
    records, finding, accepted = _checks()
    checks = {name: {"records": [record.to_dict()], "findings": []} for name, record in records.items()}
    checks["not-run"] = {"records": [], "findings": [finding.to_dict()]}
    (tmp_path / "checks.json").write_text(json.dumps(checks))
    pytester.makepyfile(test_checks=INNER.format(path=str(tmp_path / "checks.json")))
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2", "--infergate-json=out.json",
                                "--infergate-report=report.html", "--junitxml=junit.xml")
    result.assert_outcomes(passed=len(checks))
    terminal = _words(result.stdout.str())
    html = _words(unescape(re.sub(r"<[^>]+>", " ", (pytester.path / "report.html").read_text())))
    data = json.loads((pytester.path / "out.json").read_text())
    by_test = {r["test"]: r for r in data["records"]}
    junit = {case.get("name"): [(p.get("name"), p.get("value")) for p in case.iter("property")]
             for case in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    assert cli_main(["summary", str(pytester.path / "out.json")]) == 0
    summary = _words(capsys.readouterr().out)

    said = 0
    for name, record in records.items():
        written = by_test[record.test]
        for status, sentence in _sentences(record):
            said += 1
            words = _words(sentence)
            assert words in terminal and words in summary and words in html, (name, sentence)
            # the JSON: the check's own record says it; a check that made its gate's status (fail, inconclusive) is
            # in the verdict's reasons too
            kept = [v["sentence"] for v in written.get("violations", []) + written.get("verdicts", [])] \
                + written.get("problems", []) + written.get("undecided", [])
            assert sentence in kept, (name, sentence, kept)
            if status == record.status != Status.PASS:
                assert any(sentence in r["message"] for r in data["reasons"]), (name, sentence)
            if status != Status.PASS:  # JUnit: one property per check that did not pass, its sentence as it is
                assert (f"infergate.{record.kind}.{status.value}", sentence) in junit[f"test_check[{name}]"], name
    assert said >= 10
    # what each check used to be re-worded as is gone from every output
    for old in ("candidate/baseline slowdown", "slowdown ×", "(threshold ×", ": measured", "(CI "):
        assert old not in terminal and old not in html and old not in summary, old

    # a check not run as asked: its finding, typed, in the JSON (from an xdist worker, inside the test's report);
    # its line in the terminal, the report, the verdict's reasons and JUnit
    assert data["findings"] == [finding.to_dict()]
    assert Finding.from_dict(data["findings"][0]) == finding
    assert _words(finding.text()) in terminal and _words(finding.text()) in html
    assert ("infergate.not_run", finding.text()) in junit["test_check[not-run]"]
    assert any(r["what"] == "not as asked" and r["message"] == finding.text() for r in data["reasons"])

    # `infergate compare` and the history decide B against A by the same check, worded by it
    a = copy.deepcopy(accepted)
    for name in ("perf-fail", "perf-pass", "perf-inconclusive"):
        mine = copy.deepcopy(accepted.perf[0])
        mine.test = NODE.format(name)
        a.records.append(mine)
    a.records = a.records[1:] + [records["quality-pass"], records["quality-fail"]]
    (tmp_path / "a.json").write_text(json.dumps(a.to_dict()))
    cli_main(["compare", str(tmp_path / "a.json"), str(pytester.path / "out.json")])
    compared = _words(capsys.readouterr().out)
    candidate = RunResults.from_dict(data)
    for name in ("perf-fail", "perf-pass", "perf-inconclusive"):
        record = next(r for r in candidate.perf if r.test == NODE.format(name))
        history = build_history([a, candidate], metrics=("itl_ms", "tokens_per_s"))
        for series in (s for s in history.series if s.test == record.test):
            verdict = next(v for v in record.verdicts if v.metric == series.metric)
            assert series.points[1].against_previous == f"{verdict.status.upper()} {verdict.sentence()}"
            assert f"{verdict.status} {_words(verdict.sentence())}" in compared, (name, compared)
    assert f"{NODE.format('quality-fail')}: {records['quality-fail'].problems[0]}" in compared

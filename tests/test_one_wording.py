"""One check, worded once (issue #57 point 1): each kind of check rendered once, its one sentence (made where the
check was decided) printed as it is by the terminal summary, the HTML report, the results JSON, JUnit XML and the
CLI (`infergate summary`, `infergate compare`, the history); and a Finding said on an xdist worker arrives in the
results JSON as a record with its fields (point 2)."""

import copy
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from html import unescape

from test_one_decision import FINGERPRINT, recorded_run
from test_perf import BASELINE_SPEEDS, SLOW_SPEEDS, machine

from pytest_infergate.cli import main as cli_main
from pytest_infergate.endpoint.capacity_records import CapacityPoint, CapacityResult, CapacitySpec, capacity_measurement
from pytest_infergate.endpoint.load_run import Slo
from pytest_infergate.gates.target import NEEDS_A_SERVER
from pytest_infergate.history.series import build_history
from pytest_infergate.perf.budget import parse_budget
from pytest_infergate.perf.gate import NoReference, PerfGate
from pytest_infergate.perf.lockstep import Speedup, conclusion, faster
from pytest_infergate.quality.batch_invariance import BatchInvariance, Divergence, VariantResult
from pytest_infergate.quality.corpus_figures import CorpusResult, decide_corpus
from pytest_infergate.quality.golden_files import BUILTIN_NOTICE
from pytest_infergate.quality.metrics import QualityResult
from pytest_infergate.quality.policy import (
    CORPUS_KEYS,
    ResolvedPolicy,
    decide_batch_invariance,
    decide_quality,
    parse_policy,
)
from pytest_infergate.results import RunResults
from pytest_infergate.results.records import (
    BatchInvarianceRecord,
    CorpusRecord,
    GoldenRecord,
    PerfRecord,
    QualityRecord,
)
from pytest_infergate.status import (
    BUDGET_KEY_CHECK,
    ENDPOINT_CHECK,
    ENGINE_CHECK,
    GOLDEN_CHECK,
    INI_SCOPE_CHECK,
    OTHER_CHECK,
    QUALITY_CHECK,
    RELATIVE_CHECK,
    SPEED_EXPERIMENT_CHECK,
    Finding,
    Status,
)

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
    if CHECKS[name]["skip"]:
        ctx.skip(Finding.from_dict(CHECKS[name]["skip"]))
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


def _batch(name: str, changed: int) -> BatchInvarianceRecord:
    """Eight int8 samples, `changed` of them answering otherwise in the fixed-composition batch, under a policy
    that allows none."""
    samples = [f"q{i}" for i in range(8)]
    diverged = [Divergence(sample, 3, 0.02, "Paris is the", "Paris was the") for sample in samples[:changed]]
    result = BatchInvariance("int8", samples, [VariantResult("batch", "the fixed composition", diverged, 8, 1e-4)])
    rules = {"max_batch_variant_share": 0.0}
    decision = decide_batch_invariance(result, rules)
    return BatchInvarianceRecord(NODE.format(name), decision.status, result, rules, decision.problems)


# int8 and nf4 of the embedded model over the built-in corpus as measured (tests/test_corpus.py INT8, NF4)
CORPUS_INT8 = {"chunks": 21, "tokens": 10109, "mean_kl": 0.03945, "mean_kl_ci": [0.02964, 0.0506], "top1": 0.9,
               "top1_ci": [0.8915, 0.9082], "delta_ppl_rel": 0.032, "delta_ppl_rel_ci": [0.024, 0.039],
               "p99_kl": 0.348, "p999_kl": 0.675}
CORPUS_NF4 = {"chunks": 21, "tokens": 10109, "mean_kl": 0.5802, "mean_kl_ci": [0.4389, 0.7329], "top1": 0.6514,
              "top1_ci": [0.6281, 0.672], "delta_ppl_rel": 0.647, "delta_ppl_rel_ci": [0.44, 0.89], "p99_kl": 3.93,
              "p999_kl": 6.11}


def _corpus(name: str, precision: str, summary: dict, policy: dict | None) -> CorpusRecord:
    """Decided as check_corpus decides (gates/corpus.py): under `policy`, else the precision's default."""
    result = CorpusResult(precision, "fp32", "built-in", "d1g35t", 512, [], dict(summary), 28.0).with_accepted(
        None, f"no corpus figures accepted at golden/cpu-{precision}.corpus.json: accept them with "
              "--infergate-update-golden")
    resolved = (ResolvedPolicy.given(parse_policy(policy)) if policy else ResolvedPolicy()).for_corpus(precision)
    decision = decide_corpus(result, resolved)
    rules = {key: value for key, value in resolved.rules.items() if key in CORPUS_KEYS}
    return CorpusRecord(NODE.format(name), decision.status, result, rules, decision.problems,
                        undecided=decision.undecided, decided_by=resolved.decided_by(tuple(CORPUS_KEYS)))


def _capacity(name: str) -> PerfRecord:
    """A concurrency capacity search that found 4 in flight (4.8 req/s), gated as gates.served_loads.capacity gates
    it (its description a note) under min_capacity_rps=12: no server, the search's points as measured."""
    points = [CapacityPoint(load, 20, met, met / 20, (max(0.0, met / 20 - 0.12), min(1.0, met / 20 + 0.04)), passed,
                            "" if passed else "clearly over", 4.0, load * 1.2, load * 1.2 * met / 20)
              for load, met, passed in ((1, 20, True), (2, 20, True), (4, 19, True), (8, 6, False), (6, 12, False))]
    result = CapacityResult(CapacitySpec(Slo(e2e_ms=800), target_goodput=0.9, search="concurrency", bounds=(1, 16)),
                            points, 4, 4.8, (4, 6), "bracket resolved", 41.0)
    record = PerfRecord(test=NODE.format(name), label="capacity", precision="endpoint",
                        measurement=capacity_measurement(result), backend="endpoint",
                        tags={"experiment": "capacity", "search": "concurrency"}, budget={"min_capacity_rps": 12.0})
    record.outcome = PerfGate(parse_budget(record.budget), NoReference()).check(record.measurement)
    record.outcome.notes.append(result.describe())
    return record


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
        "batch-fail": _batch("batch-fail", changed=2),
        "batch-pass": _batch("batch-pass", changed=0),
        "corpus-fail": _corpus("corpus-fail", "nf4", CORPUS_NF4, None),
        "corpus-inconclusive": _corpus("corpus-inconclusive", "int8", CORPUS_INT8,
                                       {"min_corpus_top1": 0.9, "max_corpus_kl_rise": 0.5}),
        "corpus-pass": _corpus("corpus-pass", "int8", CORPUS_INT8, None),
        "capacity-fail": _capacity("capacity-fail"),
    }
    assert [records[name].status for name in ("perf-fail", "perf-pass", "perf-inconclusive", "perf-budget")] == [
        Status.FAIL, Status.PASS, Status.INCONCLUSIVE, Status.FAIL]
    assert records["perf-fail"].changes == ["torch 2.13.0 → 2.14.0"]
    assert [records[name].status for name in ("quality-pass", "quality-fail")] == [Status.PASS, Status.FAIL]
    assert [records[name].status for name in ("batch-fail", "batch-pass")] == [Status.FAIL, Status.PASS]
    assert [records[name].status for name in ("corpus-fail", "corpus-inconclusive", "corpus-pass")] == [
        Status.FAIL, Status.INCONCLUSIVE, Status.PASS]
    assert records["capacity-fail"].status == Status.FAIL and len(records["capacity-fail"].violations) == 1
    assert len(records["corpus-inconclusive"].undecided) == 2  # a straddling interval, a rise with nothing accepted
    return records, accepted


def _findings() -> tuple[dict[str, Finding], dict[str, Finding], dict[str, Finding]]:
    """Every kind of finding once, worded as the check that says it words it (status.py's kinds; gates/gating.py,
    gates/perf.py, gates/golden.py, gates/endpoint.py, gates/served_loads.py), by the inner test that says it:
    (said: a check not run or not decided as asked; skipped with: what would make the test run; notes: said of a
    check that ran and decided). The ini scope's is the session's own, said by the inner run itself."""
    golden_missing = Finding(GOLDEN_CHECK, NODE.format("golden-missing"), "golden regression check not run: no "
                             "accepted golden outputs at golden/m/cpu-int8.jsonl", "review a run with "
                             "--infergate-update-golden and commit the file")
    said = {
        "not-run": Finding(RELATIVE_CHECK, NODE.format("not-run"), "relative check not run: the baseline file has no "
                           "entry for this measurement", "record one with --infergate-save-baseline"),
        "budget-key": Finding(BUDGET_KEY_CHECK, NODE.format("budget-key"), "budget key(s) peak_mem_mb not checked: "
                              "this endpoint measurement has no such figure"),
        "speed-experiment": Finding(SPEED_EXPERIMENT_CHECK, NODE.format("speed-experiment"), conclusion(
            "prefix caching", [faster(Speedup("cached", 1.04, 0.97, 1.12, 8))])[1]),
        "golden-missing": golden_missing,  # said, then skipped with: one row, one JUnit line
    }
    skipped = {
        "golden-missing": golden_missing,
        "engine-refused": Finding(ENGINE_CHECK, NODE.format("engine-refused"), "engine experiment (batching=static, "
                                  "cache_mode=contiguous): a server's batching and KV cache are its own",
                                  "run it without --infergate-endpoint"),
        "no-reference": Finding(ENDPOINT_CHECK, NODE.format("no-reference"), "an A/B against an endpoint needs the "
                                "other deployment", "pass --infergate-reference-endpoint URL (or compare runs with "
                                "--infergate-baseline)"),
        "no-server": NEEDS_A_SERVER,  # made once, for no test: the session names the test it skipped
    }
    notes = {
        "quality-note": Finding(QUALITY_CHECK, NODE.format("quality-note"), "int8 vs fp32: min_exact_match: "
                                "exact_match = 1 >= 0.5 (check(policy=...)), decided on the point (every sample "
                                "agreed)", status=Status.PASS),
        "golden-note": Finding(GOLDEN_CHECK, "", BUILTIN_NOTICE.format(folder="golden"), status=Status.PASS),
        "endpoint-note": Finding(ENDPOINT_CHECK, NODE.format("endpoint-note"), "loads sized from the server's "
                                 "synchronous rate, 3.1 req/s (8 requests one at a time)", status=Status.PASS),
    }
    return said, skipped, notes


def _sentences(record) -> list[tuple[Status, str]]:
    """A record's checks, each with its status and its one sentence, as the check made it."""
    if isinstance(record, PerfRecord):
        return [(v.status, v.sentence()) for v in record.violations + record.verdicts]
    decision = record.decision()
    return [(Status.FAIL, s) for s in decision.problems] + [(Status.INCONCLUSIVE, s) for s in decision.undecided]


def _words(text: str) -> str:
    return " ".join(text.split())


def _row(finding: Finding) -> str:
    """The finding's row of the report's not-run table, its parts as made (check, test, why and evidence, fix)."""
    why = finding.why + (f" ({finding.evidence})" if finding.evidence else "")
    return _words(f"{finding.check} {finding.test or 'the run'} {why} {finding.fix or '–'}")


@dataclass
class Outputs:
    """What the inner run printed and wrote, each text whitespace-normalized: the terminal, the HTML report's text,
    `infergate summary` (text, Markdown), the results JSON and JUnit XML's properties by test."""

    terminal: str
    html: str
    summary: str
    markdown: str
    data: dict
    junit: dict[str, list[tuple[str, str]]]

    @property
    def reasons(self) -> list[str]:
        """The verdict's reasons' messages."""
        return [reason["message"] for reason in self.data["reasons"]]

    def not_run(self, name: str) -> list[tuple[str, str]]:
        """The inner test's JUnit lines of its checks not run as asked."""
        return [p for p in self.junit[f"test_check[{name}]"] if p[0] == "infergate.not_run"]


def _run(pytester, capsys, checks_file) -> Outputs:
    pytester.makepyfile(test_checks=INNER.format(path=str(checks_file)))
    # a scope of the ini that matches no test: the session's own finding, said once the run is over
    pytester.makeini("[pytest]\ninfergate_budgets =\n    fp23: tokens_per_s=1e9\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2", "--infergate-json=out.json",
                                "--infergate-report=report.html", "--junitxml=junit.xml")
    checks = json.loads(checks_file.read_text())
    skipping = sum(1 for check in checks.values() if check["skip"])
    result.assert_outcomes(passed=len(checks) - skipping, skipped=skipping)
    html = _words(unescape(re.sub(r"<[^>]+>", " ", (pytester.path / "report.html").read_text())))
    junit = {case.get("name"): [(p.get("name"), p.get("value")) for p in case.iter("property")]
             for case in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    assert cli_main(["summary", str(pytester.path / "out.json")]) == 0
    summary = _words(capsys.readouterr().out)
    assert cli_main(["summary", "--markdown", str(pytester.path / "out.json")]) == 0
    markdown = _words(capsys.readouterr().out)  # a CI step summary: the verdict's reasons, the not-run lines
    return Outputs(_words(result.stdout.str()), html, summary, markdown,
                   json.loads((pytester.path / "out.json").read_text()), junit)


def _assert_records_worded(out: Outputs, records: dict) -> None:
    """Each record's checks, each in its one sentence, in every output (module docstring)."""
    by_test = {r["test"]: r for r in out.data["records"]}
    worded = 0
    for name, record in records.items():
        written = by_test[record.test]
        for status, sentence in _sentences(record):
            worded += 1
            words = _words(sentence)
            assert words in out.terminal and words in out.summary and words in out.html, (name, sentence)
            # the JSON: the check's own record says it; a check that made its gate's status (fail, inconclusive) is
            # in the verdict's reasons too, and so in the CI step summary
            kept = [v["sentence"] for v in written.get("violations", []) + written.get("verdicts", [])] \
                + written.get("problems", []) + written.get("undecided", [])
            assert sentence in kept, (name, sentence, kept)
            if status == record.status != Status.PASS:
                assert any(sentence in message for message in out.reasons), (name, sentence)
                assert words in out.markdown, (name, sentence)
            if status != Status.PASS:  # JUnit: one property per check that did not pass, its sentence as it is
                assert (f"infergate.{record.kind}.{status.value}", sentence) in out.junit[f"test_check[{name}]"], name
    assert worded >= 16
    # every kind of record was worded at least once, by a check that did not pass
    assert {record.kind for record in records.values() if record.status != Status.PASS} == {
        "perf", "quality", "golden", "batch_invariance", "corpus"}
    # the capacity search's description, a note beside its gate: as it is in the JSON and the report (the terminal
    # shows a perf gate's figures and checks, not its notes: the load the search found among its figures)
    described = records["capacity-fail"].notes[-1]
    assert described in by_test[records["capacity-fail"].test]["notes"] and _words(described) in out.html
    for text in (out.terminal, out.summary):
        assert "capacity_concurrency 4 requests, capacity_rps 4.8 req/s" in text
    assert "| capacity (in flight) | capacity (req/s) |" in out.markdown
    assert "| 4 requests | 4.8 req/s |" in out.markdown
    # what each check used to be re-worded as is gone from every output
    for old in ("candidate/baseline slowdown", "slowdown ×", "(threshold ×", ": measured", "(CI "):
        for where, text in (("terminal", out.terminal), ("html", out.html), ("summary", out.summary),
                            ("markdown", out.markdown)):
            assert old not in text, (old, where, text[max(0, text.index(old) - 300):text.index(old) + 100])


def _assert_findings_said(out: Outputs, said: dict, skipped: dict, notes: dict) -> None:
    """Each finding's one line (Finding.text) where its kind of finding goes (status.Finding)."""
    # each check not run (or not decided) as asked: its finding, typed, in the JSON (from an xdist worker, inside the
    # test's report; the ini scope's from the controller); its line in the terminal, the report (and its row of the
    # not-run table), `infergate summary`, the verdict's reasons and (a test's) JUnit
    scope = Finding(INI_SCOPE_CHECK, "", "infergate_budgets: scope 'fp23' (infergate_budgets line 1) matched no test "
                    "in this run, so its limits were never checked", "fix the scope (a precision, *, or part of a test "
                    "id)")
    warned = [*said.values(), scope]
    assert sorted(out.data["findings"], key=str) == sorted((f.to_dict() for f in warned), key=str)
    assert sorted(map(repr, map(Finding.from_dict, out.data["findings"]))) == sorted(map(repr, warned))
    assert {f.check for f in warned} == {RELATIVE_CHECK, BUDGET_KEY_CHECK, SPEED_EXPERIMENT_CHECK,
                                         GOLDEN_CHECK, INI_SCOPE_CHECK}
    for finding in warned:
        text = finding.text()
        assert all(_words(text) in output for output in (out.terminal, out.html, out.summary, out.markdown)), text
        assert _row(finding) in out.html, finding
        # said whole once in the terminal, as the verdict's reason; its pytest warning names it and points there
        assert out.terminal.count(_words(text)) == 1 or not finding.fix, text
        assert _words(f"{finding.lead()} (what to do: the infergate verdict below)") in out.terminal or \
            not finding.test or not finding.fix, finding
        assert [r["message"] for r in out.data["reasons"] if r["what"] == "not run as asked"].count(text) == 1, text
    for name, finding in said.items():
        assert out.not_run(name) == [("infergate.not_run", finding.text())], name

    # a test skipped with what would make it run: its finding, typed, in the JSON by test; its line in the terminal
    # and `infergate summary`, its row in the report's not-run table, and JUnit (said too, as the golden check's: one
    # row, one line); not the verdict's (a skip is the test's own outcome)
    assert out.data["skipped_findings"] == {f.test: f.to_dict() for f in skipped.values()}
    assert {t: Finding.from_dict(f) for t, f in out.data["skipped_findings"].items()} == {
        f.test: f for f in skipped.values()}
    assert {f.check for f in skipped.values()} == {GOLDEN_CHECK, ENGINE_CHECK, ENDPOINT_CHECK}
    for name, finding in skipped.items():
        text = finding.text()
        assert _words(text) in out.terminal and _words(text) in out.summary and _words(text) in out.markdown, text
        assert out.html.count(_row(finding)) == 1, finding
        assert (text in out.reasons) == (name in said), name  # said too: a warning of the run
        assert out.not_run(name) == [("infergate.not_run", text)], name

    # a note of a check that ran and decided: said in the terminal as it is; its record carries the decision, so it
    # is no finding of the JSON, no JUnit line and no reason of the verdict
    assert {f.check for f in notes.values()} == {QUALITY_CHECK, GOLDEN_CHECK, ENDPOINT_CHECK}
    for name, finding in notes.items():
        assert _words(finding.text()) in out.terminal, finding
        assert finding.to_dict() not in out.data["findings"] and finding.text() not in out.reasons
        assert not out.not_run(name), name


def test_each_check_is_worded_once_in_terminal_report_json_junit_and_cli(pytester, tmp_path, capsys):
    records, accepted = _checks()
    said, skipped, notes = _findings()
    checks = {name: {"records": [record.to_dict()], "findings": [], "skip": None} for name, record in records.items()}
    for name in {**said, **skipped, **notes}:
        checks[name] = {"records": [], "skip": skipped[name].to_dict() if name in skipped else None,
                        "findings": [f.to_dict() for f in (said.get(name), notes.get(name)) if f is not None]}
    (tmp_path / "checks.json").write_text(json.dumps(checks))
    out = _run(pytester, capsys, tmp_path / "checks.json")
    data = out.data
    _assert_records_worded(out, records)
    # a finding made for no test names the test the session skipped (NEEDS_A_SERVER)
    _assert_findings_said(out, said, {name: f if f.test else replace(f, test=NODE.format(name))
                                      for name, f in skipped.items()}, notes)

    # a line of a file written before findings were typed: read whole as a finding of its own kind, said as written
    line = "suites/test_speed.py::test_chat[fp32]: relative check not run: no entry; save a baseline"
    older = {key: value for key, value in data.items() if key != "findings"} | {"warnings": [line]}
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert RunResults.from_dict(older).findings == [Finding(OTHER_CHECK, "", line)]
    assert cli_main(["summary", str(tmp_path / "older.json")]) == 0
    assert f"INCONCLUSIVE not run as asked: {line}" in capsys.readouterr().out

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


def test_a_run_whose_only_news_is_a_skip_with_a_finding_still_says_it(pytester):
    """A run that loads no model and records nothing, whose one test skips saying what would make it run (no server
    given): its infergate section still prints the SKIPPED line (docs/reference/options.md)."""
    pytester.makepyfile(test_served="""
from pytest_infergate.session import session_of
from pytest_infergate.status import ENDPOINT_CHECK, Finding


def test_served(request):
    ctx = session_of(request.config).context(request.node)
    ctx.skip(Finding(ENDPOINT_CHECK, request.node.nodeid, "needs a live server", "pass --infergate-endpoint URL"))
""")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*infergate*", "*SKIPPED*needs a live server*--infergate-endpoint URL*"])


def test_a_ratio_reads_with_its_words():
    """A new user read "tokens/s 19.4% higher (×0.838 …)" and "926% slower" against their words: a throughput's ratio
    is its cost (baseline ÷ now, above 1 worse), named as such; a figure grown ×2 or more is said as a factor."""
    from pytest_infergate.perf.verdict import Verdict
    from pytest_infergate.status import Status

    def sentence(metric: str, ratio: float, pct: int | None = None) -> str:
        return Verdict(metric, Status.FAIL, ratio, ratio * 0.98, ratio * 1.02, 1.1, pct, 1.0, 1.0, (5, 5)).sentence()

    assert sentence("tokens_per_s", 0.838).startswith("tokens/s 19.3% higher (time per token ×0.838 [")
    assert sentence("tokens_per_s", 3.2).startswith("tokens/s 68.8% lower (time per token ×3.2 [")
    assert sentence("requests_per_s", 1.25).startswith("requests/s 20% lower (time per request ×1.25 [")
    assert sentence("ttft_ms", 10.26, 50).startswith("TTFT p50 ×10.3 slower (×10.3 [")
    assert sentence("ttft_ms", 1.5, 50).startswith("TTFT p50 50% slower (×1.5 [")
    assert sentence("peak_mem_mb", 2.5).startswith("peak memory ×2.5 higher (×2.5 [")
    assert sentence("ttft_ms", 0.3, 95).startswith("TTFT p95 70% faster (×0.3 [")
    assert sentence("tokens_per_s", 0.286).startswith("tokens/s ×3.5 higher (time per token ×0.286 [")
    # an interval's end that rounds to the limit shows the digits that place it
    assert "[1.05–1.1004], limit ×1.1" in Verdict("ttft_ms", Status.INCONCLUSIVE, 1.08, 1.05, 1.10041, 1.1, 50, 1.0,
                                                     1.0, (5, 5)).sentence()
    # a throughput's fastest repetitions are its high quantile
    fastest = Verdict("tokens_per_s", Status.PASS, 1.0, 0.9, 1.05, 1.1, None, 1.0, 1.0, (5, 5), repetitions=True)
    assert fastest.statistic() == "fastest repetitions: p90 of per-repetition values"


def test_the_reference_against_itself_is_no_quality_pass_counted_bare():
    """A new user's starter (fp32 alone, on the random model) counted "quality gate 1 pass" for fp32 vs fp32, a
    check that cannot fail: the verdict says it gated nothing and how to gate something, and the count says why.
    Beside a quantized precision that gated, the count still says it, but it is no reason of the verdict (it took
    the place of the real ones in the report, and advised adding int8 to a run that had it)."""
    from pytest_infergate.quality.metrics import QualityResult
    from pytest_infergate.results.summary import gate_counts_line

    itself = QualityResult("fp32", "fp32", [], {"samples": 8, "top1": 1.0, "mean_kl": 0.0}, {}, 1.0)
    other = QualityResult("int8", "fp32", [], {"samples": 8, "top1": 0.95, "mean_kl": 0.01}, {}, 1.0)
    alone = RunResults(records=[QualityRecord("t.py::q[fp32]", Status.PASS, itself)])
    (reason,) = alone.verdict().reasons
    assert (reason.status, reason.what, reason.name) == (Status.PASS, "reference itself", "t.py::q[fp32]")
    assert "nothing was gated" in reason.message and "int8, nf4" in reason.message
    assert gate_counts_line(alone).text == "gates: quality: 1 pass (1 the reference against itself: nothing gated)"
    results = RunResults(records=[QualityRecord("t.py::q[fp32]", Status.PASS, itself),
                                  QualityRecord("t.py::q[int8]", Status.PASS, other)])
    assert results.verdict().reasons == []
    assert gate_counts_line(results).text == "gates: quality: 2 pass (1 the reference against itself: nothing gated)"
    from pytest_infergate.report import render

    page = unescape(re.sub(r"<[^>]+>", "", render(RunResults.from_dict(results.to_dict()))))
    assert "2 pass 0 fail (1 the reference against itself: nothing gated)" in " ".join(page.split())


def test_the_probe_note_does_not_claim_a_route_the_load_evidence_took():
    """A new user read "calibration probe ×1.3 …: the machine is slower now by more than the threshold: only a pass
    as measured stands" beside a load-corrected FAIL: where the kernel's load evidence decided, the note says so."""
    from pytest_infergate.measurement import Measurement
    from pytest_infergate.perf.gate import calibration_note
    from pytest_infergate.perf.verdict import Verdict

    sides = [Measurement(probe="probe/1", repetitions=5), Measurement(probe="probe/1", repetitions=5)]
    corrected = Verdict("tokens_per_s", Status.FAIL, 3.4, 3.3, 3.5, 1.1, None, 1.0, 1.0, (5, 5), machine_slowdown=1.3,
                        load_corrected=True)
    note = calibration_note(*sides, [corrected])
    assert "a pass as measured stands" not in note and "the kernel saw the runner busy" in note, note
    as_measured = replace(corrected, load_corrected=False)
    assert "a pass as measured stands, a failure only beyond what that move can explain" in calibration_note(
        *sides, [as_measured])


def test_the_pooled_count_says_which_repetitions_a_failures_fresh_block_added():
    """A new user's progress stopped at "repetition: 13 (planned 5–12)" and the summary said "all 21 repetitions
    pooled": the fresh block that confirmed the failure is named in the count."""
    from pytest_infergate.measurement import Measurement
    from pytest_infergate.perf.outcome import PerfOutcome
    from pytest_infergate.results.summary import perf_lines

    record = PerfRecord(test="t.py::test_x[fp32]", label="", precision="fp32",
                        measurement=Measurement(samples={"tokens_per_s": [100.0] * 12}, repetitions=12),
                        outcome=PerfOutcome(confirmed=2))
    assert "(all 12 repetitions pooled, the last 2 a failure's fresh block)" in perf_lines(record)[0].text
    record.outcome = PerfOutcome()
    assert "(all 12 repetitions pooled)" in perf_lines(record)[0].text


def test_the_save_names_the_figures_its_budget_compares_at_the_percentile_it_gates():
    """A new user's first gate budgets TTFT p95; the save said "ttft_ms_p50 746 ms" and the comparison then read
    "ttft_ms p95 baseline 746 ms": the save names what later runs compare."""
    from test_every_figure import served

    from pytest_infergate import units
    from pytest_infergate.perf.stored import compared_figure
    from pytest_infergate.results.summary import saved_figures

    measurement = served(seed=1)
    record = PerfRecord(test="t.py::test_x[fp32]", label="", precision="fp32", measurement=measurement,
                        budget={"ttft_ms_p95": 30_000, "tokens_per_s": 2, "max_regression": 0.1})
    p95 = units.metric_value("ttft_ms", compared_figure(measurement, "ttft_ms", 95))
    assert saved_figures(record).startswith(f"later runs compare with its fastest repetitions: ttft_ms_p95 {p95}, "
                                            "tokens_per_s "), saved_figures(record)
    record.budget = {"max_regression": 0.1}  # no limit: the default figures, TTFT at the budget's p50
    assert "ttft_ms_p50 " in saved_figures(record) and "tokens_per_s " in saved_figures(record)

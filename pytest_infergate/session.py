"""InfergateSession: the state of one pytest session (options, model pool, results, baseline, shared caches) and
the session-level hooks, registered as the plugin `infergate-session` (pytest-xdist's DSession pattern).

On an xdist worker it measures and hands its records and findings (inside each test's report), models and used
scopes to the controller; on the controller (or without xdist) it collects them, writes outputs, prints the summary.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import replace
from typing import Any

import pytest

from pytest_infergate.context import ENDPOINT_ID, IniScopes, TestContext
from pytest_infergate.errors import InfergateError
from pytest_infergate.models import PRECISIONS
from pytest_infergate.options import Options
from pytest_infergate.outbox import (
    FINDING_PROPERTY,
    NOT_RUN_PROPERTY,
    SKIP_FINDING_PROPERTY,
    Outbox,
    fail,
    failure_message,
    skip,
    skip_reason,
)
from pytest_infergate.outputs import TerminateAsInterrupt, Written
from pytest_infergate.resources import SessionResources
from pytest_infergate.results.reasons import record_message, undecided_notice
from pytest_infergate.results.records import RESULT_PROPERTY, record_from_dict
from pytest_infergate.results.run import RunResults
from pytest_infergate.scopes import WILDCARD, parse_scoped_lines
from pytest_infergate.status import INI_SCOPE_CHECK, Finding, Status, under_strict

SCOPED_OPTIONS = ("infergate_budgets", "infergate_quality_policy")
_DEFAULTS = pytest.StashKey[dict]()
PLUGIN_NAME = "infergate-session"
WORKER_OUTPUT = "infergate"


_OUTBOX = pytest.StashKey[Outbox]()


class InfergateWarning(pytest.PytestWarning):
    """Something the gate could not check as asked (e.g. the baseline is from another environment)."""


def add_defaults(config: pytest.Config, budgets: list[str] = (), quality_policy: list[str] = ()) -> None:
    """Default budget / policy lines (e.g. a suite's), used for every scope the user's own ini lines do not set.
    Unlike user lines, a default that applies to no test in a run is not reported: a suite's defaults cover
    tests that a run may not select."""
    defaults = config.stash.setdefault(_DEFAULTS, {option: [] for option in SCOPED_OPTIONS})
    defaults["infergate_budgets"] += list(budgets)
    defaults["infergate_quality_policy"] += list(quality_policy)


class InfergateSession:
    def __init__(self, config: pytest.Config, options: Options):
        self.config = config
        self.options = options
        self.is_worker = hasattr(config, "workerinput")
        self.resources = SessionResources(options)  # models, endpoints, caches: what the fixtures hand tests
        self.results = RunResults(strict=options.strict)
        self.baseline = None  # measurement key -> BaselineEntry, with --infergate-baseline
        self._scopes: IniScopes | None = None  # read once the suites' conftests have added their defaults
        self.written = Written()  # what the run's end wrote (outputs.write_outputs), said in the terminal summary
        self.terminate_as_interrupt = TerminateAsInterrupt()
        if options.baseline is not None:
            from pytest_infergate.history.store import read_baseline

            self.baseline, note = read_baseline(options.baseline, options.history)
            if note:  # read as the current schema: said, not a warning that counts
                warnings.warn(InfergateWarning(note), stacklevel=1)

    # ---- scoped ini lines ---------------------------------------------------------------------------------
    def user_lines(self, option: str) -> list[str]:
        return list(self.config.getini(option))

    @property
    def scopes(self) -> IniScopes:
        """The user's lines of each scoped option, then the defaults for scopes the user does not set."""
        if self._scopes is None:
            lines = {}
            for option in SCOPED_OPTIONS:
                user = self.user_lines(option)
                user_scopes = set(parse_scoped_lines(user, option))
                defaults = self.config.stash.get(_DEFAULTS, {}).get(option, [])
                lines[option] = user + [line for line in defaults if line.split(":", 1)[0].strip() not in user_scopes]
            self._scopes = IniScopes(lines, {option: set() for option in SCOPED_OPTIONS})
        return self._scopes

    def unused_scope_warnings(self) -> list[Finding]:
        """The user's scopes that applied to no measurement of a run that measured something (typos like
        `fp23`, or a test id that no longer exists); scopes naming a precision merely not run are fine."""
        # every gate a quality policy decides: comparisons with the reference, golden regression, batch invariance,
        # the corpus check
        kinds = {"infergate_budgets": self.results.perf,
                 "infergate_quality_policy": [*self.results.quality, *self.results.golden,
                                              *self.results.batch_invariance, *self.results.corpus]}
        out = []
        for option, scoped in ((o, parse_scoped_lines(self.user_lines(o), o)) for o in SCOPED_OPTIONS):
            if not kinds[option]:
                continue
            for scope, line in scoped.items():
                known = scope == WILDCARD or scope in PRECISIONS or scope == ENDPOINT_ID  # a target id
                if not known and scope not in self.scopes.used.get(option, set()):
                    out.append(Finding(INI_SCOPE_CHECK, "", f"{option}: scope {scope!r} ({line.where}) matched no "
                                       "test in this run, so its limits were never checked",
                                       "fix the scope (a precision, *, or part of a test id)"))
        return out

    # ---- what fixtures get --------------------------------------------------------------------------------
    def context(self, item: pytest.Item) -> TestContext:
        """The test's TestContext. What it records and says waits in the item's outbox until the phase ends
        (_phase): the gate's own code runs no session code (pytest-benchmark's add_stats)."""
        outbox = item.stash.setdefault(_OUTBOX, Outbox())
        markers: dict[str, list[dict[str, Any]]] = {}
        for marker in reversed(list(item.iter_markers())):  # outermost first
            if marker.name.startswith("infergate"):
                markers.setdefault(marker.name, []).append(dict(marker.kwargs))
        ctx = TestContext(test_id=item.nodeid, options=self.options, record=outbox.records.append,
                          say=outbox.findings.append, fail=fail, skip=skip, markers=markers, scopes=self.scopes,
                          baseline=self.baseline)
        outbox.contexts.append(ctx)
        return ctx

    def _deliver(self, item: pytest.Item) -> None:
        """The outbox of `item` into its report, at the end of each phase (inside it: a warning turned into an error
        by -W error fails that test, not the session): each record and its verdict as properties, key figures, each
        finding for every output and JUnit; then each said in the terminal."""
        outbox = item.stash.get(_OUTBOX, None)
        if outbox is None:
            return
        findings, records = list(outbox.findings), list(outbox.records)
        outbox.findings.clear()  # in place: the test's contexts append to these very lists
        outbox.records.clear()
        said = []
        for finding in findings:
            said.append(finding.warning())
            if finding.not_run:  # to the run's results inside the report, as a record (pytest_runtest_logreport)
                item.user_properties.append((FINDING_PROPERTY, json.dumps(finding.to_dict())))
                outbox.undecided.append(finding.text())
        for result in records:
            item.user_properties.append((RESULT_PROPERTY, json.dumps(result.to_dict(), default=str)))
            # JUnit XML (CI test tabs) keeps the gate's verdict and, when it did not pass, why, then each check that
            # did not pass in its own sentence (infergate.perf.fail, ...): one property each
            item.user_properties.append((f"infergate.{result.kind}.verdict", result.status.value))
            if result.status != "pass":
                item.user_properties.append((f"infergate.{result.kind}.reason", record_message(result)))
            decision = result.decision()
            item.user_properties += [(f"infergate.{result.kind}.{status.value}", sentence) for status, sentences in
                                     ((Status.FAIL, decision.problems), (Status.INCONCLUSIVE, decision.undecided))
                                     for sentence in sentences]
            item.user_properties.extend((f"infergate.{name}", value) for name, value in result.key_figures())
            if result.status == Status.INCONCLUSIVE:
                notice = undecided_notice(result)
                if notice:  # said beside the test, not a run-level warning: the record carries it to the verdict
                    said.append(undecided_notice(result, whole=False))
                outbox.undecided.append(notice or f"{result.test}: {result.kind} gate inconclusive: "
                                        + "; ".join(decision.undecided))
        for ctx in outbox.contexts:
            item.user_properties.extend(ctx.properties)
            ctx.properties.clear()
        for text in said:
            warnings.warn(InfergateWarning(text), stacklevel=1)

    def _phase(self, item: pytest.Item):
        """Around setup, call and teardown: what the phase recorded and said is delivered at its end, and under
        --infergate-strict a phase whose check did not decide (an inconclusive record, a check said not to have run
        as asked, also when the test then skips) fails, saying why: the test's outcome, and the run's verdict applies
        the same rule (status.under_strict)."""
        try:
            result = yield
        except pytest.skip.Exception:
            self._deliver(item)
            self._fail_if_undecided(item)
            raise
        except BaseException:
            self._deliver(item)
            raise
        self._deliver(item)
        self._fail_if_undecided(item)
        return result

    def _fail_if_undecided(self, item: pytest.Item) -> None:
        outbox = item.stash.get(_OUTBOX, None)
        if outbox is None or not outbox.undecided:
            return
        if under_strict(Status.INCONCLUSIVE, self.options.strict) == Status.FAIL:
            undecided, outbox.undecided = outbox.undecided, []
            raise pytest.fail.Exception(f"{undecided[0]}\n(under --infergate-strict what did not decide fails"
                                        + (": also " + "; ".join(undecided[1:]) if undecided[1:] else "") + ")",
                                        pytrace=False) from None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        item.stash[_OUTBOX] = Outbox()  # a fresh one per run of the test (a rerun plugin runs it again)
        return (yield from self._phase(item))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item):
        return (yield from self._phase(item))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem):
        return (yield from self._phase(item))

    # ---- hooks --------------------------------------------------------------------------------------------
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """With --infergate-endpoint, the server must answer before any test runs: a server that is down is one
        clear usage error, not a hang or a failure per test. From here on a SIGTERM ends the run as Ctrl-C does."""
        self.terminate_as_interrupt.install()
        try:
            self.resources.connect_endpoints()
        except InfergateError as exc:
            raise pytest.UsageError(f"infergate: {exc}") from None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """A test skipped with a Finding carries it in its report (to the controller under xdist, and to JUnit)."""
        outcome = yield
        finding = getattr(call.excinfo.value, "infergate_finding", None) if call.excinfo is not None else None
        if finding is not None:
            carried = (SKIP_FINDING_PROPERTY, json.dumps(finding.to_dict()))
            outcome.get_result().user_properties.append(carried)
            # and the item's, for its teardown report: JUnit XML writes a test's properties from that one
            item.user_properties.append(carried)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """On the controller: take the records out of the report (JUnit XML keeps only the key figures)."""
        if self.is_worker:  # the records must travel to the controller inside the report
            return
        kept = []
        for name, value in report.user_properties:
            if name == SKIP_FINDING_PROPERTY:
                finding = Finding.from_dict(json.loads(value))
                finding = finding if finding.test else replace(finding, test=report.nodeid)
                self.results.skipped_findings[report.nodeid] = finding
                if (FINDING_PROPERTY, value) not in report.user_properties:  # warned too (a golden file)
                    kept.append((NOT_RUN_PROPERTY, finding.text()))  # JUnit XML: the line, not the JSON
            elif name == FINDING_PROPERTY:  # each phase's report carries the test's findings so far: taken once
                finding = Finding.from_dict(json.loads(value))
                if finding not in self.results.findings:
                    self.results.findings.append(finding)
                kept.append((NOT_RUN_PROPERTY, finding.text()))  # JUnit XML: the line, not the JSON
            elif name != RESULT_PROPERTY:
                kept.append((name, value))
            elif report.when == "call":  # the teardown report carries the same properties again
                self.results.records.append(record_from_dict(json.loads(value)))
        report.user_properties = kept
        if report.when == "call" or report.outcome != "passed":
            outcomes = self.results.outcomes
            if report.nodeid not in outcomes or report.outcome != "passed":
                outcomes[report.nodeid] = "error" if report.when != "call" and report.failed else report.outcome
            if report.failed:
                self.results.failures.setdefault(report.nodeid, failure_message(report))
            if report.skipped:
                self.results.skips.setdefault(report.nodeid, skip_reason(report))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """xdist: a worker's models, environment and used scopes join the controller's (its findings came inside
        the reports of the tests that said them)."""
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
        if not output:
            return
        data = json.loads(output)
        self.results.models.update(data["models"])
        for key, value in data["environment"].items():
            self.results.environment.setdefault(key, value)
        for option, scopes in data["used_scopes"].items():
            self.scopes.note(option, scopes)

    def _describe_run(self) -> None:
        pool, resources = self.resources.pool, self.resources
        if pool.loaded:
            from pytest_infergate.environment import library_versions, machine_fingerprint

            self.results.environment.update(
                machine=machine_fingerprint(self.options.device), versions=library_versions(),
                model=self.options.model, model_name=pool.source.name, device=self.options.device,
                reference_precision=self.options.reference_precision)
        for loaded in pool.loaded:
            self.results.models[loaded.record.requested_precision] = loaded.record.to_dict()
        if resources.endpoint is not None:
            self.results.environment["endpoint"] = resources.endpoint.fingerprint()
        if resources.reference_endpoint is not None:
            self.results.environment["reference_endpoint"] = resources.reference_endpoint.fingerprint()

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.resources.close()
        self._describe_run()
        if self.is_worker:
            self.config.workeroutput[WORKER_OUTPUT] = json.dumps({
                "models": self.results.models, "environment": self.results.environment,
                "used_scopes": {option: sorted(scopes) for option, scopes in self.scopes.used.items()}}, default=str)
            self.terminate_as_interrupt.restore()
            return
        from pytest_infergate.report import git_commit

        self.results.commit = git_commit(self.config.rootpath)
        self.results.finished = time.time()
        self.results.findings += self.unused_scope_warnings()
        undecided = Status.INCONCLUSIVE if self.results.findings else Status.PASS  # the tests' own are theirs
        if under_strict(undecided, self.options.strict) == Status.FAIL and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a check of the run that did not run as asked
        self._write_outputs(session)
        self.terminate_as_interrupt.restore()

    def _write_outputs(self, session: pytest.Session) -> None:
        from pytest_infergate.outputs import write_outputs

        interrupted = session.exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
        self.written = written = write_outputs(self.results, self.options, interrupted)
        if written.errors and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        from pytest_infergate.results.summary import summary_lines

        if not self.results.models and not self.results.records and not self.results.findings \
                and not self.results.skipped_findings and not self.written.errors and not self.written.notes:
            return
        terminalreporter.section("infergate")
        for line in summary_lines(self.results, failures_shown=config.option.tbstyle not in ("no", "line")):
            terminalreporter.write_line(line.text, **line.markup)
        if self.options.report is not None and not self.written.errors:
            terminalreporter.write_line(f"report: {self.options.report}")
        if self.written.history is not None:
            runs = len(self.written.history.runs)
            from pytest_infergate.report.history_page import HISTORY_PAGE

            terminalreporter.write_line(f"history: {self.options.history / HISTORY_PAGE} "
                                        f"({runs} run{'s' if runs != 1 else ''})")
        for line in self.written.saved:
            terminalreporter.write_line(line)
        for note in self.written.notes:
            terminalreporter.write_line(note, yellow=True)
        for error in self.written.errors:
            terminalreporter.write_line(f"ERROR {error}", red=True)


def session_of(config: pytest.Config) -> InfergateSession:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)

"""A test's side of the session: what its fixture objects recorded and said until its report is made (`Outbox`), how
they fail or skip it (TestContext.fail / .skip; `needs`: a resource, or the test fails saying why it could not be
had), and what its report says of a failure or a skip. The session (session.InfergateSession) gives each test its
outbox and reads it when the report is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from pytest_infergate.context import TestContext
from pytest_infergate.resources import ResourceError
from pytest_infergate.status import Finding

PACKAGE_DIR = Path(__file__).resolve().parent

# a report's property carrying the Finding of a test skipped with what would make it run (skip)
SKIP_FINDING_PROPERTY = "infergate.skipped_finding"
# a report's property carrying a Finding of a check that did not run or decide as asked, as its record (to_dict):
# the one route of a test's findings to the run's results, from an xdist worker too; JUnit gets its line instead
FINDING_PROPERTY = "infergate.finding"
NOT_RUN_PROPERTY = "infergate.not_run"  # JUnit XML: a check of the test that did not run or decide as asked


@dataclass
class Outbox:
    """What a test's fixture objects recorded and said, until its report is made."""

    records: list = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    contexts: list[TestContext] = field(default_factory=list)  # their key figures (TestContext.properties)
    undecided: list[str] = field(default_factory=list)  # what did not decide: a failure under --infergate-strict


def fail(message: str) -> NoReturn:
    """TestContext.fail: the test fails with `message` (`from None`: a failure raised while handling an error shows
    its message once, not the chain)."""
    raise pytest.fail.Exception(message, pytrace=False) from None


def skip(reason: str | Finding) -> NoReturn:
    """TestContext.skip: a Finding skips saying what would make the test run (the not-run table lists it; the
    skip carries it to the report: pytest_runtest_makereport), a plain reason skips by design."""
    if not isinstance(reason, Finding):
        pytest.skip(reason)
    skipped = pytest.skip.Exception(reason.reason())
    skipped.infergate_finding = reason  # a plain skip to pytest (its summary line), the finding to us
    raise skipped


def failure_message(report: pytest.TestReport) -> str:
    """A failed test's short message and where it failed: `AssertionError: ... (suites/test_x.py:42)`. A gate's
    failure is raised inside this plugin: its place is the user's test, not the plugin's line (issue #45)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        first = (crash.message or "").strip().splitlines()
        where = f"{crash.path}:{crash.lineno}"
        if Path(str(crash.path)).resolve().is_relative_to(PACKAGE_DIR):
            path, lineno, _ = report.location
            where = f"{path}:{(lineno or 0) + 1}"
        return f"{first[0] if first else 'failed'} ({where})"
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1] if text else f"failed in {report.when}"


def skip_reason(report: pytest.TestReport) -> str:
    """Why a test was skipped, as pytest -rs prints it."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "skipped")


def needs(get):
    """`get()` (a resource a test needs: resources.SessionResources), or the test fails with why it could not be had
    (raised outside the except block, so the error is not printed twice with a "During handling" chain)."""
    try:
        return get()
    except ResourceError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)

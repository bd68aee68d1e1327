"""The checks that did not run as asked, as one table a reviewer reads: check, test, why, and how to make it run.

Read from the run's findings (status.Finding: every check that could not run or decide says so where it is known,
with its test and its fix) and the tests skipped with a finding (no accepted golden outputs yet, a model the engine
refused, no server given). Other skipped tests are skipped by design (an experiment that runs on the reference
precision only): counted, not listed."""

from __future__ import annotations

from pytest_infergate.results.run import RunResults
from pytest_infergate.status import Finding


def not_run(results: RunResults) -> tuple[list[Finding], dict[str, int]]:
    """The table's rows, and the tests skipped by design: reason -> count. A test that warned and was skipped for
    the same check is one row."""
    rows = list(results.findings)
    for test, finding in results.skipped_findings.items():
        if not any(row.test == test and row.check == finding.check for row in rows):
            rows.append(finding)
    by_design: dict[str, int] = {}
    for test, reason in results.skips.items():
        if test not in results.skipped_findings:
            by_design[reason] = by_design.get(reason, 0) + 1
    return rows, by_design

"""The checks that did not run as asked, as one table a reviewer reads: check, test, why, and how to make it run.

Sources: the run's warnings (every check that could not run or could not decide says why, with its test id) and
the skipped tests whose reason names a fix (no accepted golden outputs yet, a model the engine refused). Tests
skipped by design (an experiment that runs on the reference precision only) are counted, not listed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_infergate.results.run import RunResults

# the kinds of check, by what their message says (first match wins)
CHECKS = (("golden regression", "golden regression check not run|accepted golden outputs"),
          ("relative perf check", "relative check|against the baseline|baseline was"),
          ("perf gate", "perf gate inconclusive|runner was busy"),
          ("budget key", "budget key"),
          ("ini scope", r"scope '.*' \(infergate_"),
          ("quality category", "category '"),
          ("engine experiment", "needs the engine|engine refus"))
# a clause that tells the reader what to do
FIX = re.compile(r"\b(re-?save|rerun|review|accept|set|install|give|fix|add|copy|record|raise|deselect|use|run|"
                 r"gate it|point|pass|write|choose|commit)\b", re.IGNORECASE)


@dataclass(frozen=True)
class NotRun:
    check: str
    test: str
    why: str
    fix: str


def _check_of(text: str) -> str:
    return next((name for name, pattern in CHECKS if re.search(pattern, text)), "check")


def _split_fix(text: str) -> tuple[str, str]:
    """The message's reason, and its last clause when that says what to do."""
    head, sep, last = text.rpartition("; ")
    if sep and FIX.search(last.split()[0] if last.split() else ""):
        return head, last
    head, sep, last = text.rpartition(": ")
    if sep and FIX.search(last.split()[0] if last.split() else ""):
        return head, last
    return text, ""


def _test_of(text: str) -> tuple[str, str]:
    """`path::test[id]: message` -> (the test id, the message); a warning about the whole run has no test."""
    first, sep, rest = text.partition(": ")
    if sep and ("::" in first or first.endswith(".py")) and " " not in first:
        return first, rest
    return "", text


def not_run(results: RunResults) -> tuple[list[NotRun], dict[str, int]]:
    """The table's rows, and the tests skipped by design: reason -> count."""
    rows, by_design = [], {}
    for warning in results.warnings:
        test, message = _test_of(warning.strip())
        message = " ".join(message.split())
        why, fix = _split_fix(message)
        rows.append(NotRun(_check_of(message), test, why, fix))
    for test, reason in results.skips.items():
        why, fix = _split_fix(" ".join(reason.split()))
        if fix:
            if not any(row.test == test and row.check == _check_of(reason) for row in rows):
                rows.append(NotRun(_check_of(reason), test, why, fix))
        else:
            by_design[reason] = by_design.get(reason, 0) + 1
    return rows, by_design

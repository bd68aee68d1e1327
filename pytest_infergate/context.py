"""What a fixture object knows about the test it serves, as plain values and callables.

The objects behind the fixtures (`PerfBench`, `GoldenGate`, `EndpointPerfBench`) never import pytest: the plugin
hands each one a TestContext whose callables record, fail, skip and warn for them (pytest-benchmark's pattern),
so they can be driven from a REPL or a unit test with plain functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from pytest_infergate.status import OTHER_CHECK, Finding

if TYPE_CHECKING:
    from pytest_infergate.options import Options
    from pytest_infergate.perf.baseline import BaselineEntry
    from pytest_infergate.results.records import Record

ENDPOINT_PRECISION = "endpoint"  # the precision id of tests run against --infergate-endpoint


@dataclass
class TestContext:
    test_id: str
    options: Options
    record: Callable[[Record], None]  # attach a result record to the test (it reaches the xdist controller)
    fail: Callable[[str], NoReturn]
    skip: Callable[[str | Finding], NoReturn]  # a Finding: skipped with what would make it run (the not-run table)
    warn: Callable[[Finding], None]  # a check that did not run as asked: terminal summary, report, JSON, JUnit
    add_property: Callable[[str, Any], None]  # a key figure as a JUnit property
    markers: Callable[[str], list[dict[str, Any]]]  # kwargs of the test's markers of a name, outermost first
    scoped_lines: Callable[[str], list[str]]  # ini lines of infergate_budgets / infergate_quality_policy
    note_scopes: Callable[[str, list[str]], None]  # which of those scopes applied (unused ones are reported)
    baseline: dict[str, BaselineEntry] | None = None  # --infergate-baseline entries by measurement key
    # said in the terminal, not a run-level warning: what the run's verdict already carries (a gate's own
    # undecided verdict: its record reaches the verdict, the report and JUnit) or what a reader should know but
    # need not act on (an older file read as the current schema). None: said through `warn`
    notice: Callable[[str], None] | None = None

    __test__ = False  # not a test class, whatever its name

    def notify(self, message: str) -> None:
        """Say `message` in the terminal without making it a run-level warning (see `notice`; without one, a
        finding of the test)."""
        if self.notice is not None:
            self.notice(message)
        else:
            self.warn(Finding(OTHER_CHECK, "", message))

    def measurement_key(self, label: str) -> str:
        """The test id, plus `::label` when a test measures several workloads; baselines and budgets key on it."""
        return self.test_id + (f"::{label}" if label else "")

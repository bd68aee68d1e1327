"""What the mechanics and the fixture objects tell the world outside pytest. A fixture object (`PerfBench`,
`GoldenGate`, `EndpointPerfBench`) never imports pytest: the plugin hands each one a TestContext whose callables
record, fail, skip and warn for it (pytest-benchmark's pattern), so it runs from a REPL or a unit test with plain
functions. Long work (model conversion, repetitions, golden generation, a capacity search) reports its progress
with `report(...)` to the sink the session installs (the terminal on the controller; none under -q or on a worker)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from pytest_infergate.status import OTHER_CHECK, Finding

if TYPE_CHECKING:
    from pytest_infergate.options import Options

ENDPOINT_PRECISION = "endpoint"  # the precision id of tests run against --infergate-endpoint


@dataclass
class TestContext:
    test_id: str
    options: Options
    # attach a result record (results.records: PerfRecord, QualityRecord, ...) to the test; it reaches the xdist
    # controller. Typed loosely: the records lie above this module (a fixture's context names no layer above it)
    record: Callable[[Any], None]
    fail: Callable[[str], NoReturn]
    skip: Callable[[str | Finding], NoReturn]  # a Finding: skipped with what would make it run (the not-run table)
    warn: Callable[[Finding], None]  # a check that did not run as asked: terminal summary, report, JSON, JUnit
    add_property: Callable[[str, Any], None]  # a key figure as a JUnit property
    markers: Callable[[str], list[dict[str, Any]]]  # kwargs of the test's markers of a name, outermost first
    scoped_lines: Callable[[str], list[str]]  # ini lines of infergate_budgets / infergate_quality_policy
    note_scopes: Callable[[str, list[str]], None]  # which of those scopes applied (unused ones are reported)
    baseline: dict[str, Any] | None = None  # --infergate-baseline entries (perf.baseline.BaselineEntry) by key
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


_sink: Callable[[str], None] | None = None


def current_sink() -> Callable[[str], None] | None:
    return _sink


def set_sink(sink: Callable[[str], None] | None) -> None:
    global _sink
    _sink = sink


def report(message: str) -> None:
    if _sink is not None:
        _sink(f"infergate: {message}")


EVERY_S = 5.0  # work shorter than this prints nothing; longer work a line this often, and one when it ends


class Steps:
    """`done` of `total` steps of one piece of work, the time left estimated from the ones done so far."""

    def __init__(self, what: str, total: int, most: int | None = None):
        # `most`: work that goes on past `total` steps while it needs to (a repetition plan), up to `most`
        self.what, self.total, self.most = what, total, most if most and most > total else None
        self.started = self.last = time.monotonic()

    def step(self, done: int, finished: bool = False) -> None:
        """`done` steps so far (shown as at most `total` where there is no `most`); `finished`: the work ended."""
        now = time.monotonic()
        done = done if self.most else min(done, self.total)
        ended = finished or done >= (self.most or self.total)
        if now - self.last >= EVERY_S or (ended and self.last > self.started):
            self.last = now
            of = f"{self.total}–{self.most}" if self.most else str(self.total)
            left = (now - self.started) / max(done, 1) * (self.total - done)
            report(f"{self.what}: {done} of {of}" + (f", {now - self.started:.0f} s" if ended else
                                                     f", about {left:.0f} s left" if done < self.total else ""))

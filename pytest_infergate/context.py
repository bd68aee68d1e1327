"""What the mechanics and the fixture objects tell the world outside pytest. A fixture object (`PerfBench`,
`GoldenGate`) never imports pytest: the plugin hands each one a TestContext whose callables
record, fail, skip and warn for it (pytest-benchmark's pattern), so it runs from a REPL or a unit test with plain
functions. Long work (model conversion, repetitions, golden generation, a capacity search) reports its progress
with `report(...)` to the sink the session installs (the terminal on the controller; none under -q or on a worker)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from pytest_infergate.status import Finding

if TYPE_CHECKING:
    from pytest_infergate.options import Options

ENDPOINT_ID = "endpoint"  # the target id of the served model (--infergate-endpoint): gates.targets


@dataclass
class IniScopes:
    """The scoped ini lines (infergate_budgets, infergate_quality_policy) by option: the user's, then a suite's
    defaults for the scopes the user does not set; and the scopes that applied to some measurement (the session
    reports the user's that never did: a typo, a test id that no longer exists)."""

    lines_by_option: dict[str, list[str]] = field(default_factory=dict)
    used: dict[str, set[str]] = field(default_factory=dict)

    def lines(self, option: str) -> list[str]:
        return self.lines_by_option.get(option, [])

    def note(self, option: str, scopes: list[str]) -> None:
        self.used.setdefault(option, set()).update(scopes)


@dataclass
class TestContext:
    """Four callables and plain values: `record` a result record, `say` a Finding (the one message channel: the
    session prints it, and keeps a check that did not run as asked for every output), `fail`, `skip`."""

    test_id: str
    options: Options
    # a result record (results.records: PerfRecord, QualityRecord, ...) of the test; it reaches the xdist controller.
    # Typed loosely: the records lie above this module (a fixture's context names no layer above it)
    record: Callable[[Any], None]
    say: Callable[[Finding], None]
    fail: Callable[[str], NoReturn]
    skip: Callable[[str | Finding], NoReturn]  # a Finding: skipped with what would make it run (the not-run table)
    markers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # infergate markers' kwargs, outermost first
    scopes: IniScopes = field(default_factory=IniScopes)
    baseline: dict[str, Any] | None = None  # --infergate-baseline entries (perf.baseline.BaselineEntry) by key
    properties: list[tuple[str, Any]] = field(default_factory=list)  # key figures, as JUnit properties of the test

    __test__ = False  # not a test class, whatever its name

    def marker_kwargs(self, name: str) -> list[dict[str, Any]]:
        """The kwargs of the test's markers of `name`, outermost first."""
        return self.markers.get(name, [])

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
    """`done` of `total` steps of one piece of work, the time left estimated from the ones done so far: "measuring
    t.py::test_x (its `subject`), repetition (its `unit`): 3 of 6–12, about 12 s left"."""

    def __init__(self, subject: str, unit: str, total: int, most: int | None = None):
        # `most`: work planned as a range (a repetition plan) goes on past `total` while it needs to, up to `most` as
        # estimated, and past it where the estimate fell short; it ends when its caller says so (`finished`)
        self.subject, self.unit, self.planned = subject, unit, most is not None
        self.total, self.most = total, max(total, most or total)
        self.started = self.last = time.monotonic()

    def replan(self, total: int, most: int) -> None:
        """A plan's bounds once its first steps tell what the work will take (a repetition plan's time floor)."""
        self.total, self.most = total, max(total, most)

    def step(self, done: int, finished: bool = False) -> None:
        """`done` steps so far (shown as at most `total` unless planned as a range); `finished`: the work ended."""
        now = time.monotonic()
        done = done if self.planned else min(done, self.total)
        ended = finished or (not self.planned and done >= self.total)
        if now - self.last >= EVERY_S or (ended and self.last > self.started):
            self.last = now
            of = f"{self.total}–{self.most}" if self.most > self.total else str(self.total)
            # a plan's range is its estimate from the first step: work that goes past it says so, not "13 of 6–12"
            shown = f"{done} (planned {of})" if done > self.most else f"{done} of {of}"
            left = (now - self.started) / max(done, 1) * (self.total - done)
            report(f"{self.subject}, {self.unit}: {shown}" + (f", {now - self.started:.0f} s" if ended else
                                               f", about {left:.0f} s left" if done < self.total else ""))

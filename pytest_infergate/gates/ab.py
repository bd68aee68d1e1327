"""The one interleaved A/B of every bench (`infergate_bench.ab()`, `infergate_endpoint.ab()`): the test's budget
(max_regression 0.10 where it sets none), the rounds A B A B ... until B's verdict is decided, B's record with A as
its baseline, the failure. A bench supplies only what differs, its two sides (`AbSides`): how a round runs (two
local benches step-locked, two servers a whole load run each), what B's record holds and what A was."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf import lockstep
from pytest_infergate.perf.interleaved import RoundRunner, evaluate_ab
from pytest_infergate.perf.outcome import Budget, Route
from pytest_infergate.results.records import PerfRecord


@dataclass
class AbSides:
    """What a bench's A/B differs in: `rounds()` starts the sides and gives the runner of one round; `record(a, b)`
    is B's record; `note(a, record)` says what A was; `against` names the two sides in a failure message."""

    rounds: Callable[[], RoundRunner]
    record: Callable[[Measurement, Measurement], PerfRecord]
    note: Callable[[Measurement, PerfRecord], str]
    against: str
    route: Route = Route.IN_PROCESS
    close: Callable[[], None] = lambda: None  # let go of what `rounds()` started


def run_ab(sides: AbSides, budget: Budget, rounds: int, finish: Callable[..., None]
           ) -> tuple[Measurement, Measurement]:
    """The interleaved A/B of `sides` gated on `budget` (gates.gating.ab_budget: max_regression 0.10 where the test
    sets none) on a paired bootstrap CI; B's record (A as its baseline summary) handed to `finish`
    (gates.gating.record_side: recorded, the test failed if the gate failed). Returns the (A, B) Measurements."""
    try:
        b, outcome = evaluate_ab(sides.rounds(), budget, rounds, route=sides.route)
    finally:
        sides.close()
    a = outcome.baseline
    record = sides.record(a, b)
    note = sides.note(a, record)
    record.fingerprint = {}  # compared with A, not with a stored baseline
    finish(record, outcome, budget, f"infergate A/B gate failed for {record.test} ({sides.against})", note)
    return a, b


def local_sides(other, other_bench, other_config, bench, config, requests, warmup: int,
                record: Callable[[Measurement, Measurement], PerfRecord]) -> AbSides:
    """The sides of two local benches (perf.local_bench.Bench; A: `other_bench` running the LoadedModel `other` on
    `other_config`, B: `bench` on `config`), step-locked where both can step (perf.lockstep)."""
    other_precision, refused = other.record.requested_precision, ""

    def start() -> RoundRunner:
        nonlocal refused
        run_round, refused = lockstep.interleaved(other_bench, other_config, bench, config, requests, warmup)
        return run_round

    def note(a: Measurement, record: PerfRecord) -> str:
        note = f"{lockstep.how(refused)} against {other_precision}, {a.repetitions} rounds"
        if other.backend is not None and other.backend.name != record.backend:
            note += f"; side A ran on {other.backend.name}, side B on {record.backend}"
        return note

    return AbSides(start, record, note, f"{bench.loaded.record.requested_precision} vs {other_precision}",
                   close=other_bench.close if other_bench is not bench else lambda: None)

"""What a perf measurement is compared with: the five routes of a perf gate behind one interface.

- budget only: nothing to compare with (the absolute budgets decide alone);
- stored: a baseline entry an earlier run saved (--infergate-baseline), or run A's record (`infergate compare`,
  the history's previous run); measured at another time, so the fingerprints say what changed since;
- environment: the same workload in another Python environment (--infergate-baseline-python), interleaved;
- in-process: another model, precision or engine config in this process (`infergate_bench.ab()`), interleaved;
- endpoint: a second server (--infergate-reference-endpoint, `infergate_endpoint.ab()`), interleaved.

A Reference yields the baseline's repetitions (`measurement`) and says how to measure once more (`more`); the one
decision over a candidate and its reference is `perf.decide.decide`, the loop that measures more while it cannot
decide is `perf.gate.run_gate`."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.baseline import BaselineEntry

RoundRunner = Callable[[Measurement, Measurement, int], None]  # one round into (A, B); the int: which round


class Route(str, enum.Enum):
    BUDGET = "budget"
    STORED = "stored"
    ENVIRONMENT = "environment"
    IN_PROCESS = "in-process"
    ENDPOINT = "endpoint"

    def __str__(self) -> str:
        return self.value

    @property
    def interleaved(self) -> bool:
        """Both sides measured in alternating rounds: their per-round ratios cancel the machine's drift."""
        return self in (Route.ENVIRONMENT, Route.IN_PROCESS, Route.ENDPOINT)


@dataclass
class Reference:
    route: Route
    measurement: Measurement | None = None  # the baseline's repetitions so far (side A grows with B's rounds)
    fingerprint: dict | None = None  # stored: the machine and software the baseline was measured with
    provenance: str = ""  # stored: "8 repetitions, recorded ... on ..."
    # budget only, where a relative check was asked for: why there is no reference (a failure under strict), and
    # whether a baseline was given at all (if not, the budgets alone were asked for and nothing was skipped)
    missing: str = ""
    # measure once more: an interleaved round on both sides, or a fresh repetition of the candidate against a
    # stored baseline (which cannot be measured again); None: nothing more can be measured
    more: Callable[[], None] | None = None

    @classmethod
    def nothing(cls, baseline_given: bool = False) -> Reference:
        """No reference: with `baseline_given`, the baseline file has no entry for this measurement."""
        return cls(Route.BUDGET, missing=(
            "the baseline file has no entry for this measurement (record one with --infergate-save-baseline)"
            if baseline_given else ""))

    @classmethod
    def stored(cls, entry: BaselineEntry, remeasure: Callable[[], None] | None = None) -> Reference:
        return cls(Route.STORED, entry.measurement, entry.fingerprint, entry.provenance(), more=remeasure)

    @classmethod
    def interleaved(cls, route: Route, run_round: RoundRunner, rounds: int) -> tuple[Reference, Measurement]:
        """`rounds` rounds of `run_round` (each adds one repetition to A and one to B); returns the reference (A,
        whose `more` runs one more round) and the candidate (B)."""
        if not route.interleaved:
            raise ValueError(f"{route} is not an interleaved route")
        a, b = Measurement(label="A"), Measurement(label="B")
        for index in range(rounds):
            run_round(a, b, index)
        extra = [0]

        def one_more_round() -> None:
            run_round(a, b, rounds + extra[0])
            extra[0] += 1

        return cls(route, a, more=one_more_round), b

"""The run's one verdict — can this ship? — from every gate and every pytest outcome, computed once and shown
first by the terminal, the HTML report and the JSON results.

FAIL when a test failed or errored (an xfail-strict that passed is a failure too) or a gate failed; else
INCONCLUSIVE when a gate could not decide or a check did not run as asked; else PASS. Under --infergate-strict an
inconclusive run fails, as its gates do."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pytest_infergate import units
from pytest_infergate.stats import interval_status
from pytest_infergate.status import Status

if TYPE_CHECKING:
    from pytest_infergate.perf.outcome import Violation
    from pytest_infergate.perf.verdict import Verdict
    from pytest_infergate.results.records import PerfRecord
    from pytest_infergate.results.run import RunResults


@dataclass(frozen=True)
class Reason:
    """One thing that made the verdict what it is."""

    status: Status
    what: str  # "test", "perf gate", "golden gate", "quality gate", "batch invariance", "not as asked" (a warning)
    name: str  # the test id ("" for a check not run: its message names it)
    message: str

    def text(self) -> str:
        return f"{self.status.upper()} {self.what}{' ' + self.name if self.name else ''}: {self.message}"

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status.value}


@dataclass(frozen=True)
class RunVerdict:
    status: Status
    reasons: list[Reason]

    def headline(self) -> str:
        counts = {status: sum(1 for r in self.reasons if r.status == status) for status in (Status.FAIL,
                                                                                             Status.INCONCLUSIVE)}
        parts = [f"{n} {status.value}" for status, n in counts.items() if n]
        return f"infergate verdict: {self.status.upper()}" + (f" ({', '.join(parts)})" if parts else "")

    def to_dict(self) -> dict:
        return {"verdict": self.status.value, "reasons": [reason.to_dict() for reason in self.reasons]}


# what decides a comparison whose interval straddles its threshold after the re-measurements (one action each)
UNDECIDED_ACTION = ("measure more (a larger `repeats=` or `min_time_s=`), or compare in one process "
                    "(infergate_bench.ab) where the runner's speed drifts")

GATE_NAMES = {"perf": "perf gate", "quality": "quality gate", "golden": "golden gate",
              "batch_invariance": "batch invariance"}


def record_message(record) -> str:
    """Why a gate's record did not pass, in one line: its first three reasons."""
    from pytest_infergate.results.records import PerfRecord

    if isinstance(record, PerfRecord):
        bad = ([violation_line(v) for v in record.violations]
               + [verdict_line(v) for v in record.verdicts if v.status != Status.PASS])
        if record.relative_check_missing:
            bad.append(f"no baseline comparison: {record.relative_check_missing}")
        elif record.model_change:
            bad.append(f"against a baseline of another model: {record.model_change}")
        return "; ".join((bad or verdict_reasons(record))[:3]) or record.status.value
    problems = list(getattr(record, "problems", []) or []) + list(getattr(record, "undecided", []) or [])
    return "; ".join(problems[:3]) or record.status.value


def run_verdict(results: RunResults) -> RunVerdict:
    reasons = []
    # a test failed by its own gate is said once, as the gate with its reasons (not again as a failed test)
    gated = {record.test for record in results.records if record.status == Status.FAIL}
    for nodeid, outcome in results.outcomes.items():
        if outcome == "failed" and any(test == nodeid or test.startswith(nodeid + "::") for test in gated):
            continue
        if outcome in ("failed", "error"):
            message = results.failures.get(nodeid, "")
            reasons.append(Reason(Status.FAIL, "test" if outcome == "failed" else "test error", nodeid,
                                  message or outcome))
    for record in results.records:
        if record.status != Status.PASS:
            reasons.append(Reason(record.status, GATE_NAMES.get(record.kind, record.kind), record.test,
                                  record_message(record)))
        elif getattr(record, "model_change", ""):  # a pass against another model's baseline: said, not hidden
            reasons.append(Reason(Status.PASS, "model change", record.test,
                                  f"compared with a baseline of another model: {record.model_change}"))
    reasons += [Reason(Status.INCONCLUSIVE, "not as asked", "", warning) for warning in results.warnings]
    status = Status.worst(reason.status for reason in reasons)
    if results.strict and status == Status.INCONCLUSIVE:
        status = Status.FAIL
    order = {Status.FAIL: 0, Status.INCONCLUSIVE: 1}  # then what passed and is said all the same (a model change)
    return RunVerdict(status, sorted(reasons, key=lambda reason: order.get(reason.status, 2)))


def violation_line(v: Violation) -> str:
    """A budget check in one line: the key, measured against the limit, by how much (and why undecided)."""
    bound = "<" if v.higher_is_better else ">"
    return (f"{v.key} {units.metric_value(v.key, v.measured)} {bound} budget {units.metric_value(v.key, v.limit)} "
            f"({v.shortfall()})" + (f": inconclusive, {v.undecided}" if v.undecided else ""))


def verdict_line(v: Verdict) -> str:
    """A comparison in one line: the change with its interval against the threshold, the evidence that decided."""
    where = f" p{v.percentile}" if v.percentile else ""
    # from the interval, not the status: a verdict made inconclusive by a disagreement (v.note) lies on one side
    relation = {Status.FAIL: ">", Status.PASS: "≤"}.get(interval_status(v.low, v.high, v.threshold), "straddles")
    return (f"{v.metric}{where} baseline {units.metric_value(v.metric, v.baseline)} → now "
            f"{units.metric_value(v.metric, v.candidate)}, {v.change_in_words()}: "
            f"{units.ratio(v.ratio)} (CI {units.number(v.low)}–{units.number(v.high)}) {relation} "
            f"{units.ratio(v.threshold)}, {v.evidence()}"
            + (f", resolves slowdowns above {units.ratio(v.resolution)}" if v.repetitions else "")
            + (f", calibration probe {units.ratio(v.machine_slowdown)}" if v.machine_slowdown else "")
            + (f": {v.note}" if v.note and not v.note.startswith(v.evidence()) else
               f": {v.note[len(v.evidence()) + 2:]}" if v.note else "")
            + (f": {UNDECIDED_ACTION}" if v.status == Status.INCONCLUSIVE and not v.note else ""))


def verdict_reasons(record: PerfRecord) -> list[str]:
    """Why the verdict is what it is, one line per check: each broken budget, each baseline comparison (ratio,
    95% CI, threshold), each check that could not run. Each line starts with its metric or key."""
    reasons = [violation_line(v) for v in record.violations]
    reasons += [verdict_line(v) for v in sorted(record.verdicts, key=lambda v: v.status == Status.PASS)]
    if record.baseline_provenance:
        reasons.append(f"baseline: {record.baseline_provenance}")
    if record.relative_check_missing:
        reasons.append(f"no baseline comparison: {record.relative_check_missing}")
    if record.machine_mismatch:
        reasons.append("baseline measured on another machine: " + ", ".join(record.machine_mismatch))
    if record.changes:
        reasons.append("changed since the baseline: " + ", ".join(record.changes))
    return reasons

"""What a perf gate checks and what it concluded: the Budget (limits and max_regression; perf.budget parses it), the
Violations of it, and PerfOutcome (budgets broken, verdicts against its reference, why a check could not decide):
the one record every route of the gate returns and every output reads (results.records.PerfRecord holds it); and
the budgets' check on a busy runner (budget_violations: a breach made by the runner's load is undecided, or cleared
by the load-free figure)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, replace

from pytest_infergate import units
from pytest_infergate.errors import OptionError
from pytest_infergate.measurement import METRICS, Measurement, beyond_correction, busy_share, scales_with_speed
from pytest_infergate.perf import interference
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.stats import percentile
from pytest_infergate.status import Decision, Status

# what max_regression compares where no limit names a metric: what a serving team gates — throughput, time to
# first token and peak memory (a change that doubles memory must not pass a gate that says "no regression")
RELATIVE_DEFAULT = frozenset({"tokens_per_s", "ttft_ms", "peak_mem_mb"})


class BudgetError(OptionError):
    """An infergate_budget marker or ini budget that names an unknown key or has a wrong value."""


@dataclass(frozen=True)
class Limit:
    key: str  # as written, e.g. "ttft_ms_p95"
    metric: str
    percentile: float | None  # None for non-distribution metrics
    value: float

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric][1]


@dataclass(frozen=True)
class Budget:
    limits: tuple[Limit, ...] = ()
    percentile: float = 50
    max_regression: float | None = None

    @property
    def is_empty(self) -> bool:
        return not self.limits and self.max_regression is None

    def relative_metrics(self) -> list[str]:
        """The metrics a relative check (max_regression) compares: those the limits name, else RELATIVE_DEFAULT
        (the in-run gate, `infergate compare` and the history alike)."""
        return sorted({limit.metric for limit in self.limits} or RELATIVE_DEFAULT)

    def percentile_of(self, metric: str) -> float:
        """The percentile `metric`'s limit gates (the budget's default where no limit names it)."""
        return next((limit.percentile for limit in self.limits if limit.metric == metric), self.percentile)

    def measured_in(self, measurement: Measurement) -> tuple[Budget, list[str]]:
        """This budget less the limits `measurement` has no figure for (peak_mem_mb of a remote server, goodput_per_s
        of the local engine), and their keys: a limit is checked only where there is a figure (the in-run gate warns
        of those keys; `infergate compare` and the history decide alike)."""
        unmeasured = [limit.key for limit in self.limits if not measurement.samples.get(limit.metric)]
        if not unmeasured:
            return self, []
        return replace(self, limits=tuple(limit for limit in self.limits if limit.key not in unmeasured)), unmeasured


PERF_FAILURE = "infergate perf gate failed for"  # a failed perf gate's message opens so (failure_message)


@dataclass
class Violation:
    key: str
    measured: float
    limit: float
    unit: str
    percentile: float | None
    samples: int
    higher_is_better: bool
    # why this breach is no verdict on the code: a budget exceeded by time while other processes kept the runner
    # busy (perf.interference); the breach is then inconclusive, a failure only under --infergate-strict
    undecided: str = ""

    @property
    def status(self) -> Status:
        return Status.INCONCLUSIVE if self.undecided else Status.FAIL

    @property
    def margin(self) -> float:
        """How far past the limit, as a fraction of the limit (positive = violated)."""
        if self.higher_is_better:
            return (self.limit - self.measured) / self.limit
        return (self.measured - self.limit) / self.limit

    def shortfall(self) -> str:
        """How far past the budget, as a person says it: "12% over budget", "38% below budget", "x14,100 the
        budget" (a time many times over), "x0.0002 of the budget" (a throughput far below)."""
        if self.limit <= 0 or self.measured <= 0:
            return f"{'below' if self.higher_is_better else 'over'} budget"
        times = self.measured / self.limit
        if self.higher_is_better:
            if times >= 0.01:
                return f"{units.percent(1.0 - times)} below budget"
            return f"{units.ratio(times)} of the budget"
        return f"{units.percent(times - 1.0)} over budget" if times < 2 else f"{units.ratio(times)} the budget"

    def _value(self, value: float) -> str:
        """In the key's unit as every table prints it (a direction prefix such as `min_` keeps the unit)."""
        if units.metric_unit(self.key):
            return units.metric_value(self.key, value)
        return f"{units.number(value)} {self.unit}".strip()

    def sentence(self) -> str:
        """The budget check's one sentence, which every output prints as it is: 'ttft_ms_p95 1,300 ms > budget
        1,000 ms (30% over budget)'."""
        bound = "<" if self.higher_is_better else ">"
        return f"{self.key} {self._value(self.measured)} {bound} budget {self._value(self.limit)} ({self.shortfall()})"

    def line(self) -> str:
        """The sentence, and why the breach is undecided where it is."""
        return self.sentence() + (f": inconclusive, {self.undecided}" if self.undecided else "")

    def to_dict(self) -> dict:
        return {**asdict(self), "margin": self.margin, "sentence": self.sentence()}  # sentence: not read back

    @classmethod
    def from_dict(cls, data: dict) -> Violation:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def check_budget(measurement: Measurement, budget: Budget) -> list[Violation]:
    violations = []
    for limit in budget.limits:
        if limit.metric not in measurement.samples or not measurement.samples[limit.metric]:
            raise BudgetError(f"budget key {limit.key!r} cannot be checked: this measurement has no "
                              f"{limit.metric} samples")
        measured = measurement.value(limit.metric, limit.percentile)
        bad = measured < limit.value if limit.higher_is_better else measured > limit.value
        if bad:
            violations.append(Violation(limit.key, measured, limit.value, METRICS[limit.metric][0], limit.percentile,
                                        len(measurement.samples[limit.metric]), limit.higher_is_better))
    return violations


def budget_violations(measurement: Measurement, budget: Budget, notes: list[str] | None = None) -> list[Violation]:
    """The budgets `measurement` breaks (keys it has no figure for are not checked). A breach made by time while
    other processes kept the runner busy (perf.interference) is inconclusive with that reason, not a failure: the
    figure measured the machine's load as much as the code — unless it is worse than the load can explain, or the
    figure load-corrected (load_free_value: by the kernel's run-queue delays, or the device's time) meets the
    budget with room for the correction's error (interference.load_free_residual): then the breach is cleared,
    said in `notes`. The correction never makes a failure (an open-loop workload's queue grows faster than its
    service slows, which a per-repetition share does not take out). A breach of memory, counts or rates of success
    stands whatever the load (how busy: the others' share on the measurement's median repetition,
    measurement.busy_share)."""
    measured = replace(budget, limits=tuple(limit for limit in budget.limits
                                            if measurement.samples.get(limit.metric)))
    violations = check_budget(measurement, measured)
    share = busy_share(measurement.others_share)
    if share is None:
        return violations
    metric_of = {limit.key: limit.metric for limit in budget.limits}
    bound = interference.explainable_slowdown(share)
    residual = interference.load_free_residual(measurement)
    corrected_by = interference.load_corrected(measurement.load_free_source())
    out = []
    for v in violations:
        metric = metric_of.get(v.key, "")
        if not scales_with_speed(metric) or _times_worse(v.measured, v) > bound:
            out.append(v)
            continue
        corrected = load_free_value(measurement, metric, v.percentile)
        if corrected is not None and _times_worse(corrected, v) <= 1.0 / residual:
            if notes is not None:
                shown = units.metric_value(metric, corrected)
                notes.append(f"{v.key}: {units.metric_value(metric, v.measured)} as measured breaks the budget "
                             f"{units.metric_value(metric, v.limit)} on a busy runner "
                             f"({interference.describe(share)}); {corrected_by} it is {shown}, within the "
                             f"budget by more than the correction can be off (×{residual}): met")
            continue
        aside = (f"; {corrected_by} it is {units.metric_value(metric, corrected)}, too close to the budget "
                 f"to tell" if corrected is not None else "")
        out.append(replace(v, undecided=f"the runner was busy: {interference.describe(share)} during the "
                                        f"measurement, which alone can slow a time up to ×{bound:.1f}{aside}"))
    return out


def _times_worse(value: float, violation: Violation) -> float:
    """How many times worse than its budget `value` is (below 1: within it)."""
    worse, better = (violation.limit, value) if violation.higher_is_better else (value, violation.limit)
    return worse / better if better > 0 else float("inf")


def load_free_value(measurement: Measurement, metric: str, pct: float | None = 50) -> float | None:
    """`metric` with the co-tenants' load taken out: a per-request latency's percentile `pct` over each request's
    own load-free figure (Measurement.load_free_samples), a repetition's figure scaled by its load-free share
    (Measurement.load_free_share), throughputs divided by it; None for a per-request percentile not measured per
    request (the share is the repetition's, not each request's), where the shares were not measured for every
    repetition, lie below the range the correction holds in (beyond_correction), or the samples are
    not split by repetition."""
    if beyond_correction(measurement.load_free_share):
        return None
    if METRICS[metric][2] and measurement.load_free_by_repetition(metric):
        return percentile(measurement.load_free_samples[metric], pct or 50)
    shares, reps = measurement.load_free_share, measurement.by_repetition(metric)
    if METRICS[metric][2] or not reps or len(shares) != len(reps) or min(shares) <= 0:
        return None  # a per-request percentile: the repetition's share is not each request's (perf.stored.side)
    higher_is_better = METRICS[metric][1]
    scaled = [value / share if higher_is_better else value * share for values, share in zip(reps, shares)
              for value in values]
    return percentile(scaled, 50)


class Route(str, enum.Enum):
    """What a candidate is compared with (a strategy each: perf.gate, perf.interleaved)."""

    BUDGET = "budget"  # nothing: the absolute budgets decide alone
    STORED = "stored"  # a baseline an earlier run saved, or run A's record (`infergate compare`, the history)
    ENVIRONMENT = "environment"  # the same workload in another Python environment, interleaved
    IN_PROCESS = "in-process"  # another model, precision or engine config in this process, interleaved
    ENDPOINT = "endpoint"  # a second server, interleaved

    def __str__(self) -> str:
        return self.value

    @property
    def interleaved(self) -> bool:
        """Both sides measured in alternating rounds: their per-round ratios cancel the machine's drift."""
        return self in (Route.ENVIRONMENT, Route.IN_PROCESS, Route.ENDPOINT)


@dataclass
class PerfOutcome:
    violations: list[Violation] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remeasured: int = 0
    route: str = "budget"  # Route: what the candidate was compared with
    # the baseline's machine differs (timings not comparable: those verdicts are inconclusive), and what under
    # test changed since the baseline (compared, and named in every message)
    machine_mismatch: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    # the baseline is of another model (its name, architecture or served model): said in the run's verdict
    model_change: str = ""
    # a relative check was asked for (max_regression) but could not run: a check not run as asked (status.Finding)
    relative_check_missing: str = ""
    relative_check_fix: str = ""  # what makes that check run: said once, by its Finding and the gate's reason
    baseline: Measurement | None = None  # what the candidate was compared with (A of an A/B run); not written
    baseline_provenance: str = ""  # a stored baseline's repetitions, when and where it was recorded
    confirmed: int = 0  # repetitions of the fresh block a failure against a stored baseline was re-measured with
    said_in_failure: bool = False  # message() was its test's failure (failure_message): the terminal points there

    @property
    def status(self) -> Status:
        """What the checks decided (--infergate-strict is applied to it by the session, once: status.under_strict)."""
        return Status.worst([v.status for v in self.violations] + [v.status for v in self.verdicts])

    @property
    def failed(self) -> bool:
        return self.status == Status.FAIL

    def decision(self) -> Decision:
        """The shape every gate's outcome shares (status.Decision): the budgets and comparisons that failed, those
        that could not decide, the notes; its status is this outcome's."""
        checks = self.violations + self.verdicts  # a pass is not worded here: a decision keeps no pass's sentence
        return Decision([check.sentence() for check in checks if check.status == Status.FAIL],
                        [check.sentence() for check in checks if check.status == Status.INCONCLUSIVE],
                        list(self.notes))

    def message(self) -> str:
        lines = []
        if self.violations:
            undecided = sum(1 for v in self.violations if v.undecided)
            lines.append(f"{len(self.violations)} budget(s) exceeded"
                         + (f" ({undecided} inconclusive: the runner was busy)" if undecided else "") + ":")
            lines += ["  " + v.line() for v in self.violations]
        bad = [v for v in self.verdicts if v.status != Status.PASS]
        if bad:
            # against a stored baseline, what changed since it was saved (an A/B run names its sides elsewhere): each
            # figure's line opens with the changes; "nothing under test changed" is said once, in the heading
            unchanged = "; nothing under test changed" if self.baseline_provenance and not self.changes else ""
            lines.append("regression against the baseline"
                         + (f" ({self.baseline_provenance}{unchanged})" if self.baseline_provenance else "") + ":")
            what = ", ".join(self.changes) + ": " if self.baseline_provenance and self.changes else ""
            lines += [f"  {what}{v.sentence()}: {v.status.upper()}\n    {v.details()}" for v in bad]
            if self.remeasured:
                lines.append(f"  (re-measured {self.remeasured} more time(s) before deciding)")
            if self.confirmed:
                lines.append(f"  (a failure was decided again after a fresh block of {self.confirmed} repetitions)")
            # undecided by the noise alone (a verdict with a note says its own reason: a busy runner, another machine)
            undecided = [v for v in bad if v.status == Status.INCONCLUSIVE and not v.note]
            if undecided:
                spread = max((v.high - v.low) / 2 / v.ratio for v in undecided)
                lines.append(f"  inconclusive: the 95% interval spans about ±{spread:.0%} of the ratio, wider than "
                             f"the threshold allows; on this machine at this many repetitions a max_regression "
                             f"below about {spread:.2f} cannot be confirmed either way — take more repetitions "
                             "(repeats=), gate with infergate_bench.ab() on a shared machine, or set a "
                             "max_regression the noise allows")
        if self.machine_mismatch:
            lines.append("the baseline was measured on another machine: " + ", ".join(self.machine_mismatch))
        lines += self.notes
        return "\n".join(lines)

    def failure_message(self, heading: str) -> str:
        """The message its test fails with: `heading` (PERF_FAILURE and the measurement's key), then message()."""
        self.said_in_failure = True
        return f"{heading}:\n{self.message()}"

    def to_dict(self) -> dict:
        """The decision as results JSON keeps it (flat in a perf record, as schema 4 wrote it)."""
        return {"status": self.status.value, "route": self.route,
                "violations": [v.to_dict() for v in self.violations],
                "verdicts": [v.to_dict() for v in self.verdicts], "notes": list(self.notes),
                "machine_mismatch": list(self.machine_mismatch), "changes": list(self.changes),
                "model_change": self.model_change,
                "remeasured": self.remeasured, "confirmed": self.confirmed,
                "relative_check_missing": self.relative_check_missing, "relative_check_fix": self.relative_check_fix,
                "baseline_provenance": self.baseline_provenance, "said_in_failure": self.said_in_failure}

    @classmethod
    def from_dict(cls, data: dict) -> PerfOutcome:
        outcome = cls(violations=[Violation.from_dict(v) for v in data.get("violations", [])],
                      verdicts=[Verdict.from_dict(v) for v in data.get("verdicts", [])],
                      notes=list(data.get("notes", [])), remeasured=int(data.get("remeasured", 0)),
                      route=str(data.get("route") or _route_of(data)),
                      machine_mismatch=list(data.get("machine_mismatch", data.get("fingerprint_mismatch", []))),
                      changes=list(data.get("changes", [])), model_change=str(data.get("model_change") or ""),
                      relative_check_missing=str(data.get("relative_check_missing") or ""),
                      relative_check_fix=str(data.get("relative_check_fix") or ""),
                      baseline_provenance=str(data.get("baseline_provenance") or ""),
                      confirmed=int(data.get("confirmed", 0)), said_in_failure=bool(data.get("said_in_failure")))
        # a record's status is what its checks decided: an older file's failure by strict alone reads inconclusive,
        # and its run's recorded strict still fails the run's verdict
        return outcome


def _route_of(data: dict) -> str:
    """The route of a record written before it was kept, from what the record says of its baseline (an old A/B
    record does not say which side A was: a server's record was against a second endpoint, any other in-process)."""
    if data.get("baseline_provenance"):
        return "stored"
    if any(v.get("paired") for v in data.get("verdicts", [])):
        return "endpoint" if data.get("backend") == "endpoint" else "in-process"
    return "budget"

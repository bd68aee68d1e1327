"""A history: runs in time order, and for each (test, metric) the value of every run that measured it, split where
the machine changed (timings of two machines are no one series), with its change points and any creep; a change
under test (model, libraries, engine config) is a marked point of a series, not a new one. Each run is decided
against the one before it as the in-run gate decides against a stored baseline (compare_records:
perf.gate.PerfGate.check, run A's record the stored reference, run B's the candidate), so the history and
`infergate compare A.json B.json` say what `pytest --infergate-baseline` with A saved said of B."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from pytest_infergate.environment import canonical
from pytest_infergate.history import changepoint
from pytest_infergate.measurement import METRICS, percentile_suffix
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.budget import recorded_budget
from pytest_infergate.perf.fingerprint import diff_fingerprints, machine_key
from pytest_infergate.perf.gate import PerfGate, StoredReference
from pytest_infergate.perf.outcome import PerfOutcome
from pytest_infergate.results.reasons import verdict_line
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults
from pytest_infergate.results.summary import budget_metric, metric_status
from pytest_infergate.stats import percentile

DEFAULT_METRICS = ("ttft_ms", "tpot_ms", "tokens_per_s", "peak_mem_mb")


@dataclass
class RunInfo:
    index: int  # 1-based position in the history, as people count runs
    run_id: str
    commit: str | None
    started: float
    gates_passed: bool  # every gate of the run passed
    report: str | None = None  # absolute path of the run's report kept in the history folder, when there is one

    @property
    def when(self) -> str:
        return dt.datetime.fromtimestamp(self.started).strftime("%Y-%m-%d %H:%M") if self.started else "?"

    @property
    def label(self) -> str:
        return f"run #{self.index}" + (f" (commit {self.commit})" if self.commit else f" ({self.when})")


@dataclass
class Point:
    run: int  # RunInfo.index
    value: float  # the run's gated statistic: the median of its samples, or the percentile its budget names
    low: float  # interquartile range of the run's samples
    high: float
    samples: list[float]
    status: str | None  # this metric's gate verdict in that run; None when no gate checked it
    why: str  # what the gate said
    environment: dict  # the machine the value was measured on (a change splits the series)
    changes: str = ""  # what under test changed since the series' previous point ("torch 2.5.0 → 2.6.0")
    # this metric's verdict against the series' previous point, by the gate's decision (compare_records); "" when
    # not decided (the first point, or a metric the pair's budget does not compare)
    against_previous: str = ""


@dataclass
class Segment:
    """Consecutive points measured in one environment; change points and creep are searched within it."""

    points: list[Point]
    change_points: list[changepoint.ChangePoint] = field(default_factory=list)
    creep: changepoint.Creep | None = None
    change_from_previous: str = ""  # what differs from the previous segment's environment


@dataclass
class Series:
    test: str
    metric: str
    segments: list[Segment]
    statistic: float = 50  # the percentile the gate decides on (ttft_ms_p95: 95); the points and changes use it

    @property
    def name(self) -> str:
        """`ttft_ms p95`, or the metric alone where the gate reads the median or the metric is no distribution."""
        return self.metric + (f" {percentile_suffix(self.statistic)}" if self.statistic != 50 else "")

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric][1]

    @property
    def points(self) -> list[Point]:
        return [p for s in self.segments for p in s.points]

    def is_worse(self, change: float) -> bool:
        return change < 0 if self.higher_is_better else change > 0


@dataclass
class History:
    runs: list[RunInfo]
    series: list[Series]
    skipped: list[str] = field(default_factory=list)
    creep_window: int = changepoint.CREEP_WINDOW

    def run(self, index: int) -> RunInfo:
        return self.runs[index - 1]


def _environment(record: PerfRecord, run: RunResults) -> dict:
    fingerprint = machine_key(record.fingerprint)
    return fingerprint or {"run environment": run.fingerprint}


def _describe_change(old: dict, new: dict) -> str:
    changed = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            a, b = old.get(key, "–"), new.get(key, "–")
            changed.append(f"{key} changed" if isinstance(a, dict) or isinstance(b, dict) else f"{key} {a} → {b}")
    return "; ".join(changed) or "environment changed"


def gated_statistic(record: PerfRecord, metric: str) -> float:
    """The percentile a record's gate decides `metric` on: its budget's limit on the metric (the highest, if
    several: the tail it guards), else the budget's `percentile` (what a relative gate compares); 50 for a
    metric that is no distribution (tokens/s is one figure per repetition)."""
    from pytest_infergate.perf.budget import BudgetError, parse_budget

    if not METRICS[metric][2]:
        return 50
    try:
        budget = parse_budget(record.budget)
    except BudgetError:  # a record from another version: its budget is not ours to judge here
        return 50
    limits = [limit.percentile for limit in budget.limits if limit.metric == metric and limit.percentile]
    return max(limits) if limits else budget.percentile


def _point(run_index: int, run: RunResults, record: PerfRecord, metric: str, previous: PerfRecord | None,
           q: float = 50) -> Point | None:
    samples = [v for v in record.measurement.samples.get(metric) or [] if isinstance(v, (int, float)) and v > 0]
    if not samples:
        return None
    status = metric_status(record, metric)
    why = "; ".join([v.line() for v in record.violations if budget_metric(v.key) == metric]
                    + [verdict_line(v) for v in record.verdicts if v.metric == metric])
    point = Point(run_index, percentile(samples, q), percentile(samples, 25), percentile(samples, 75), samples,
                  status.value if status else None, why, _environment(record, run))
    if previous is not None:
        point.changes = diff_fingerprints(record.fingerprint, previous.fingerprint).under_test_text
        point.against_previous = _against_previous(previous, record, metric)
    return point


def _against_previous(previous: PerfRecord, record: PerfRecord, metric: str) -> str:
    outcome = compare_records([previous], [record])[0][record.test]
    verdict = next((v for v in outcome.verdicts if v.metric == metric), None)
    return "" if verdict is None else f"{verdict.status.upper()} {verdict.sentence()}"


def _segments(points: list[Point]) -> list[Segment]:
    segments: list[Segment] = []
    for point in points:
        if segments and canonical(segments[-1].points[-1].environment) == canonical(point.environment):
            segments[-1].points.append(point)
        else:
            change = _describe_change(segments[-1].points[-1].environment, point.environment) if segments else ""
            segments.append(Segment([point], change_from_previous=change))
    return segments


def analyze(segment: Segment, creep_window: int = changepoint.CREEP_WINDOW, q: float = 50) -> None:
    runs = [p.samples for p in segment.points]
    segment.change_points = changepoint.change_points(runs, q=q)
    start = segment.change_points[-1].index if segment.change_points else 0
    segment.creep = changepoint.creep(runs, start, creep_window, q=q)


def build_history(runs: list[RunResults], metrics: tuple[str, ...] = DEFAULT_METRICS,
                  creep_window: int = changepoint.CREEP_WINDOW, skipped: list[str] = ()) -> History:
    infos = [RunInfo(i, run.run_id or f"run-{i}", run.commit, run.started,
                     all(r.status.value == "pass" for r in run.records), run.report_copy)
             for i, run in enumerate(runs, start=1)]
    # each series on the statistic its latest gate decides on (a budget changed to p95 redraws the whole series)
    statistic = {(record.test, metric): gated_statistic(record, metric) for run in runs for record in run.perf
                 for metric in metrics}
    points: dict[tuple[str, str], list[Point]] = {}
    last: dict[str, tuple[PerfRecord, RunResults]] = {}  # each measurement key's latest record, with its run
    for info, run in zip(infos, runs):
        seen = set()
        for record in run.perf:
            if record.test in seen:  # one measurement key per run
                continue
            seen.add(record.test)
            previous, previous_run = last.get(record.test, (None, None))
            if previous is not None and _environment(previous, previous_run) != _environment(record, run):
                previous = None  # another machine: no verdict against it (its series starts anew)
            for metric in metrics:
                point = _point(info.index, run, record, metric, previous, statistic[(record.test, metric)])
                if point:
                    points.setdefault((record.test, metric), []).append(point)
            last[record.test] = (record, run)
    series = []
    for (test, metric), found in sorted(points.items(), key=lambda kv: (kv[0][0], metrics.index(kv[0][1]))):
        s = Series(test, metric, _segments(found), statistic[(test, metric)])
        for segment in s.segments:
            analyze(segment, creep_window, s.statistic)
        series.append(s)
    return History(infos, series, list(skipped), creep_window)


@dataclass
class SeriesChange:
    """One row of the history's table of changes."""

    series: Series
    run: RunInfo  # where the change starts (a step) or the window starts (a creep)
    kind: str  # "step" or "creep"
    change: float
    low: float | None = None
    high: float | None = None
    per_run: float | None = None
    p_value: float = 1.0
    passed: bool = True  # a creep: every gate on this metric passed in the window
    changes: str = ""  # a step: what under test changed at that run

    @property
    def worse(self) -> bool:
        return self.series.is_worse(self.change)


def findings(history: History) -> list[SeriesChange]:
    out = []
    for s in history.series:
        for segment in s.segments:
            for cp in segment.change_points:
                at = segment.points[cp.index]
                out.append(SeriesChange(s, history.run(at.run), "step", cp.change, cp.low, cp.high, p_value=cp.p_value,
                                   changes=at.changes))
            c = segment.creep
            if c:
                window = segment.points[c.start:]
                out.append(SeriesChange(s, history.run(window[0].run), "creep", c.drift, per_run=c.slope,
                                   p_value=c.p_value, passed=all(p.status in (None, "pass") for p in window)))
    return sorted(out, key=lambda f: (f.run.index, f.series.test, f.series.metric))


def compare_records(baseline: list[PerfRecord], candidate: list[PerfRecord], max_regression: float | None = None
                    ) -> tuple[dict[str, PerfOutcome], list[str], list[str]]:
    """For every measurement key in both lists, the candidate record's measurement against the baseline record's,
    decided by the in-run gate's PerfGate.check against a stored reference that cannot measure more (both sides are
    records), on the budget the candidate's gate checked (perf.budget.recorded_budget); and the keys only in the
    baseline / only in the candidate. Only the relative question: the candidate's absolute budgets were its own
    run's verdict (`infergate summary`)."""
    old, new = {r.test: r for r in baseline}, {r.test: r for r in candidate}
    outcomes = {}
    for test in sorted(set(old) & set(new)):
        a, b = old[test], new[test]
        budget = recorded_budget(b.budget, b.measurement, max_regression, where=f"the budget recorded for {test}")
        outcome = PerfGate(budget, StoredReference(BaselineEntry(a.fingerprint, a.measurement)),
                           b.fingerprint).check(b.measurement)
        outcome.violations = []  # the relative question only: the absolute budgets were B's own run's verdict
        outcomes[test] = outcome
    return outcomes, sorted(set(old) - set(new)), sorted(set(new) - set(old))

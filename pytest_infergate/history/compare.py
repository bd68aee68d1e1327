"""`infergate compare A B`: B against A as the in-run gates decide. Each perf metric B's gate compares is decided
against A's as against a stored baseline (history.series: PerfGate.check); each quality check (a test, on both
sides) shows A's and B's figures, the thresholds B's policy sets with B's decision, and what changed between them:
a quality check that failed in B where A's passed (or A had none) is a regression, as is one failing another
threshold or further; one that failed alike in both is no change; one on one side only is named, not compared."""

from __future__ import annotations

from pytest_infergate import units
from pytest_infergate.quality.policy import recorded_checks
from pytest_infergate.quality.thresholds import ThresholdCheck
from pytest_infergate.results.records import QualityRecord
from pytest_infergate.results.run import RunResults
from pytest_infergate.results.summary import QUALITY_KEYS, figure
from pytest_infergate.status import Status, under_strict

NOT_COMPARED = "not compared"


def compare_runs(a: RunResults, b: RunResults, max_regression: float | None = None, strict: bool = False
                 ) -> tuple[list[list[str]], Status, list[str]]:
    """Rows of (test, metric, A, B, verdict: the status and the check's own sentence), the run's verdict (fail over
    inconclusive over pass; strict: inconclusive fails) and the notes a reader needs (what changed, another
    machine; B's quality checks that did not pass, in their own sentences)."""
    from pytest_infergate.history.series import compare_records

    rows, statuses, notes = [], [], []
    outcomes, only_a, only_b = compare_records(a.perf, b.perf, max_regression)
    for test in only_a + only_b:
        rows.append([test, "-", "present" if test in only_a else "missing",
                     "present" if test in only_b else "missing", NOT_COMPARED])
    for test, outcome in outcomes.items():
        statuses.append(outcome.status)
        for v in outcome.verdicts:  # the comparison's own sentence, as every output prints it
            rows.append([test, v.metric, units.metric_value(v.metric, v.baseline),
                         units.metric_value(v.metric, v.candidate), f"{v.status} {v.sentence()}"])
            if v.note:
                why = "inconclusive because " if v.status == Status.INCONCLUSIVE else ""
                notes.append(f"{test} {v.metric}: {why}{v.note}")
        if outcome.changes:
            notes.append(f"{test}: changed since A: {', '.join(outcome.changes)}")
        if outcome.machine_mismatch:
            notes.append(f"{test}: A was measured on another machine: {', '.join(outcome.machine_mismatch)}")
    quality_rows, quality_statuses, quality_notes = compare_quality(a, b)
    return rows + quality_rows, under_strict(Status.worst(statuses + quality_statuses), strict), notes + quality_notes


def compare_quality(a: RunResults, b: RunResults) -> tuple[list[list[str]], list[Status], list[str]]:
    """Each quality check of either run (a test comparing a precision with its reference), matched by test: both
    sides' figures, the thresholds B's policy gates with B's decision, and its status as a change from A to B."""
    rows, statuses, notes = [], [], []
    qa, qb = ({r.test: r for r in run.quality} for run in (a, b))
    for test in sorted(set(qa) | set(qb)):
        record = qb.get(test, qa.get(test))
        label = f"quality {record.precision} vs {record.reference_precision}: {test}"
        if record.precision == record.reference_precision:
            notes.append(f"{label}: the reference against itself, identical by construction: not compared")
            continue
        if test not in qb:
            rows.append([label, "-", "present", "missing", NOT_COMPARED])
            continue
        candidate = qb[test]
        decision = candidate.decision()  # B's own checks, as decided in its run: their sentences
        notes += [f"{test}: {sentence}" for sentence in decision.problems + decision.undecided]
        if test not in qa:
            rows.append([label, "-", "missing", "present", f"{candidate.status} in B's own run ({NOT_COMPARED})"])
            statuses.append(candidate.status)
            if candidate.status == Status.FAIL:
                notes.append(f"{label}: failed its policy in B, absent from A")
            continue
        checks = recorded_checks(candidate.summary, candidate.policy)  # B's thresholds, decided on B's figures
        status, note = quality_change(qa[test], candidate, checks)
        statuses.append(status)
        notes += [f"{label}: {note}"] if note else []
        rows += _figure_rows(label, qa[test].summary, candidate.summary, checks)
    return rows, statuses, notes


def quality_change(accepted: QualityRecord, candidate: QualityRecord, checks: list[ThresholdCheck]
                   ) -> tuple[Status, str]:
    """B's quality check as a change from A's (`checks`: B's thresholds on B's figures): B's status, but a failure
    that A shared (each threshold B fails, A failed too under B's policy, and B's figure lies no further past it than
    A's interval reaches) is no change."""
    if candidate.status != Status.FAIL:
        return candidate.status, ""
    before = {c.key: c for c in recorded_checks(accepted.summary, candidate.policy)}
    failed = [c for c in checks if c.status == Status.FAIL]
    shared = failed and all(c.key in before and before[c.key].status == Status.FAIL and _no_worse(c, before[c.key])
                            for c in failed)
    keys = ", ".join(c.key for c in failed) or "its policy"
    if shared:
        return Status.PASS, f"failed {keys} in both runs, B no worse than A's interval: no change between them"
    was = {Status.PASS: "passed", Status.INCONCLUSIVE: "was inconclusive", Status.FAIL: "failed"}[accepted.status]
    return Status.FAIL, f"failed {keys} in B; A {was}" + (" (beyond A's interval)" if accepted.status == Status.FAIL
                                                          else "")


def _no_worse(now: ThresholdCheck, then: ThresholdCheck) -> bool:
    """B's point no further past the threshold than A's interval reaches (A's point where it has none)."""
    if now.point is None or then.point is None:
        return False
    reach = (then.low if now.direction == "min" else then.high)
    reach = then.point if reach is None else reach
    return now.point >= reach if now.direction == "min" else now.point <= reach


def _figure_rows(label: str, sa: dict, sb: dict, checks: list[ThresholdCheck]) -> list[list[str]]:
    """A row per threshold B's policy sets (`checks`: B's decision in its check's words, A's figure beside), then per
    figure either side measured that no threshold gates; the sample counts where they differ."""
    rows = [[label, check.key, figure(sa, check.figure, 4), figure(sb, check.figure, 4),
             f"{check.status} {check.describe()}"] for check in checks]
    gated = {check.figure for check in checks}
    for metric in QUALITY_KEYS:
        if metric not in gated and (units.is_number(sa.get(metric)) or units.is_number(sb.get(metric))):
            rows.append([label, metric, figure(sa, metric, 4), figure(sb, metric, 4), "not gated by B's policy"])
    if sa.get("samples") != sb.get("samples"):
        rows.append([label, "samples", str(sa.get("samples", "-")), str(sb.get("samples", "-")),
                     "the sample sets differ in size: their figures compare other samples"])
    return rows

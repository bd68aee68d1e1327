"""`infergate compare A B`: B against A as the in-run gates decide. Each perf metric B's gate compares is decided
against A's as against a stored baseline (history.series: PerfGate.check); each quality comparison shows A's and
B's figures, its gated figures with B's decision, and what changed between them: a quality gate that failed in B's
own run where A's passed (or A had none) is a regression; one that failed in both is no change; one on one side
only is named, not compared."""

from __future__ import annotations

from pytest_infergate import units
from pytest_infergate.quality.policy import ResolvedPolicy, threshold_checks
from pytest_infergate.results.run import RunResults
from pytest_infergate.results.summary import QUALITY_KEYS, QualityGroup, quality_groups
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
    """Each quality comparison (a precision against its reference) of either run: its figures on both sides, the
    figures B's policy gates with B's decision, and its status as a change from A to B."""
    rows, statuses, notes = [], [], []
    qa, qb = ({(g.precision, g.reference): g for g in quality_groups(run.quality) if not g.is_self_comparison}
              for run in (a, b))
    for key in sorted(set(qa) | set(qb)):
        label = f"quality {key[0]} vs {key[1]}"
        if key not in qb:
            rows.append([label, "-", "present", "missing", NOT_COMPARED])
            continue
        group = qb[key]
        before = qa[key].status if key in qa else None
        status = Status.PASS if group.status == Status.FAIL and before == Status.FAIL else group.status
        statuses.append(status)
        if key not in qa:
            rows.append([label, "-", "missing", "present", f"{group.status} in B's own run ({NOT_COMPARED})"])
        else:
            rows += _figure_rows(label, qa[key], group)
        for record in group.records:  # B's own checks, as decided in its run: their sentences, not re-worded
            decision = record.decision()
            notes += [f"{record.test}: {sentence}" for sentence in decision.problems + decision.undecided]
        if status != group.status:
            notes.append(f"{label}: failed its policy in both runs, so no change between them")
        elif group.status == Status.FAIL:
            notes.append(f"{label}: failed its policy in B" + (", passed in A" if before == Status.PASS else
                                                                 f", {before} in A" if before else ", absent from A"))
    return rows, statuses, notes


def _figure_rows(label: str, a: QualityGroup, b: QualityGroup) -> list[list[str]]:
    """A row per figure either side measured: A's and B's values, and for a figure B's policy gates, B's decision
    in its check's own words; a figure no policy gates says so."""
    sa, sb = a.comparisons[0].summary, b.comparisons[0].summary
    record = b.comparisons[0]
    checks = {check.figure: check for check in
              threshold_checks(sb, ResolvedPolicy.given(record.policy, source=""))}
    rows = []
    for metric in QUALITY_KEYS:
        va, vb = sa.get(metric), sb.get(metric)
        if not (units.is_number(va) or units.is_number(vb)):
            continue
        check = checks.get(metric)
        verdict = f"{check.status} {check.describe()}" if check else "not gated by B's policy"
        rows.append([label, metric, units.number(va, 4) if units.is_number(va) else "-",
                     units.number(vb, 4) if units.is_number(vb) else "-", verdict])
    return rows

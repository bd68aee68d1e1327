"""The verdicts' words: each check's sentence (a perf comparison's figure, the size of its change with its
interval against its limit), what changed since the baseline, the advice that fits the verdict, and the evidence
after ` -- ` (how it was decided: load correction, probe, repetitions), which the report shows one click away.
The terminal, the report, the results JSON and JUnit read these; nothing re-words them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_infergate.measurement import busy_share
from pytest_infergate.perf import interference
from pytest_infergate.perf.verdict import UNDECIDED_ACTION
from pytest_infergate.quality.policy import default_failure_advice
from pytest_infergate.status import Status

if TYPE_CHECKING:
    from pytest_infergate.perf.outcome import Violation
    from pytest_infergate.perf.verdict import Verdict
    from pytest_infergate.results.records import PerfRecord

# where a reason's lead (what a reviewer acts on) ends and its evidence begins, in every output
EVIDENCE = " -- "
MOST_CHANGES = 2  # changes named in a lead; the rest are counted ("and 3 more") and listed in the evidence

# a perf gate that asked for a relative check (max_regression) and had no baseline (no_baseline_message); or had
# none because this run saved it: a save is named as what it is, not as a pass of nothing
NOTHING_COMPARED = "nothing compared"
BASELINE_SAVED = "baseline saved"
# a quality comparison of the reference precision with itself: identical by construction, so it gates nothing
REFERENCE_ITSELF = "reference itself"


def reference_itself_message(precision: str) -> str:
    return (f"{precision} is the reference precision, compared with itself (identical by construction): nothing was "
            "gated; a quantized precision in infergate_precisions (int8, nf4) on a trained model gates its answers")


def no_baseline_message(record: PerfRecord, saved: str | None) -> str:
    """Why a perf gate that asked for a relative check (max_regression) compared nothing: no baseline was given,
    or this run saved it (`saved`: where; its advice is then that path, not the save it made). What was checked
    instead is said as it was: its budgets' limits, or nothing where the budget has none (the starter)."""
    if saved:  # the path and how later runs use it follow the verdict ("baseline: this run saved to ...")
        budgets = ", only its budgets were checked" if record.has_limits else ""
        # a save on a busy runner is a pass of this run (it ran as asked) that later runs will feel: said here
        busy = busy_share(record.measurement.others_share) if record.measurement else None
        under_load = f"; it was {saved_under_load(busy)}" if busy else ""
        return f"saved to {saved}, nothing compared this run{budgets}{under_load}"
    checked = "only its budgets were checked" if record.has_limits else "nothing was checked"
    return (f"max_regression asked for a comparison, but no baseline was given: {checked}; "
            "accept a run with --infergate-save-baseline PATH, then gate with --infergate-baseline PATH")


def saved_under_load(share: float) -> str:
    """What a save measured on a busy runner means for the runs that compare with it, and what makes it decisive."""
    return (f"measured on a busy runner ({interference.describe(share)}): {interference.UNDER_LOAD}; to make it "
            f"decisive, {interference.RESAVE}")


def busy_save_note(records: list[PerfRecord]) -> str:
    """What the saved baseline's line says of the measurements this run saved under load where their own reasons
    compared something (a run that compares and saves at once), or "": a nothing-compared reason says it itself
    (no_baseline_message)."""
    compared = [record.measurement for record in records if record.measurement and not record.compared_nothing
                and record.asks_comparison]  # the gates later runs compare
    shares = [share for share in (busy_share(measurement.others_share) for measurement in compared) if share]
    if not shares:
        return ""
    return f"; {len(shares)} of them {saved_under_load(max(shares))}"


def undecided_notice(record, whole: bool = True) -> str | None:
    """What is said of an inconclusive record, a gate's own undecided verdict, or None where its kind says none:
    `whole`, why with its evidence (a failure under --infergate-strict); else its test's pytest warning, which names
    the undecided checks and points at the infergate section, where the same block is said once."""
    from pytest_infergate.results.records import GoldenRecord, PerfRecord, QualityRecord

    if isinstance(record, PerfRecord):
        again = f" (re-measured {record.outcome.remeasured} more time(s))" if record.outcome.remeasured else ""
        if not whole:
            return (f"{record.test}: perf gate inconclusive{again}: {'; '.join(record.decision().undecided)} (why "
                    "and what to do: the infergate verdict below)")
        return (f"{record.test}: perf gate inconclusive{again} (what to do: the infergate verdict below):\n"
                f"{record.outcome.message()}")
    if isinstance(record, GoldenRecord) and record.undecided:
        return (f"{record.test}: {len(record.changed)} of {record.compared} golden outputs of {record.precision} "
                f"changed: {len(record.drift)} drift, {len(record.near_ties)} near-ties (accepted: {record.path}); "
                f"inconclusive: {record.undecided[0]}")
    if isinstance(record, QualityRecord) and record.undecided:
        return (f"{record.test}: quality of {record.precision} vs {record.reference_precision} inconclusive under "
                f"the {record.decided_by}: " + "; ".join(record.undecided))
    if record.kind == "corpus" and record.undecided:
        return (f"{record.test}: corpus quality of {record.precision} vs {record.result.reference_precision} "
                f"inconclusive under the {record.decided_by}: " + "; ".join(record.undecided))
    return None


def record_message(record) -> str:
    """Why a gate's record did not pass, as a reviewer reads it: one sentence of what changed by how much (at most
    three checks) and since what, the advice that fits the verdict, then the evidence after EVIDENCE."""
    from pytest_infergate.results.records import CorpusRecord, PerfRecord, QualityRecord

    if isinstance(record, PerfRecord):
        return perf_message(record)
    decision = record.decision()
    message = "; ".join((decision.problems + decision.undecided)[:3]) or record.status.value
    if record.status == Status.FAIL and isinstance(record, (QualityRecord, CorpusRecord)):
        advice = default_failure_advice(record.precision, record.decided_by)
        message += f". {advice}" if advice else ""
    return message


def perf_message(record: PerfRecord) -> str:
    status = record.status
    verdicts = [v for v in record.verdicts if v.status == status] if status != Status.PASS else []
    budgets = [v for v in record.violations if v.status == status] if status != Status.PASS else []
    checks = [v.sentence() for v in budgets + verdicts]
    if record.relative_check_missing:
        checks.append("no baseline comparison")
    if not checks:
        return "; ".join(verdict_reasons(record)[:3]) or status.value
    lead = f"{'; '.join(checks[:3])}{changes_phrase(named_changes(record)) if verdicts else ''}."
    evidence = [v.line() for v in budgets] + [v.details() for v in verdicts]
    if record.relative_check_missing:
        evidence.append(f"no baseline comparison: {record.relative_check_missing}")
    if record.baseline_provenance and verdicts:
        evidence.append(f"baseline: {record.baseline_provenance}")
    if len(record.changes) > MOST_CHANGES:
        evidence.append("changed since the baseline: " + ", ".join(record.changes))
    return f"{lead} {perf_advice(record, budgets, verdicts)}{EVIDENCE}{'; '.join(evidence)}"


def named_changes(record: PerfRecord) -> list[str]:
    """What the baseline records as changed since it (engine config, precision, libraries; else the model)."""
    return record.changes or ([record.model_change] if record.model_change else [])


@dataclass(frozen=True)
class ChangeFailure:
    """The perf gates whose comparison failed against a baseline that names what changed since it: what the run's
    verdict line and the report's diagnosis lead with (the change, not the gate), made once (change_failure)."""

    changes: list[str]  # over every such gate, first seen first
    gates: int
    test: str  # the first such gate
    figures: list[str]  # its failing comparisons' sentences, then its broken budgets'

    def lead(self) -> str:
        """'tokens/s 65.9% lower (time per token ×2.93 [2.9–3.01], limit ×1.1) since engine_config.max_batch_size
        8 → 1'."""
        return f"{self.figures[0]}{changes_phrase(self.changes)}"


def change_failure(records: list) -> ChangeFailure | None:
    """The perf gates that failed a comparison with a baseline naming what changed since it; None: none did."""
    from pytest_infergate.results.records import PerfRecord

    failed = [r for r in records if isinstance(r, PerfRecord) and r.status == Status.FAIL and named_changes(r)
              and any(v.status == Status.FAIL for v in r.verdicts)]
    if not failed:
        return None
    first = failed[0]
    figures = [v.sentence() for v in first.verdicts + first.violations if v.status == Status.FAIL]
    return ChangeFailure(list(dict.fromkeys(c for r in failed for c in named_changes(r))), len(failed), first.test,
                         figures)


def changes_phrase(changes: list[str]) -> str:
    """' since engine_config.max_batch_size 8 → 1' (at most MOST_CHANGES named, the rest counted); ''."""
    if not changes:
        return ""
    more = len(changes) - MOST_CHANGES
    return f" since {', '.join(changes[:MOST_CHANGES])}" + (f" and {more} more" if more > 0 else "")


# how a failure's cause is accepted: locally a re-save; in the CI job of `infergate init` the baseline is the job's
# own, saved anew by its next run on the default branch once the file is gone there (docs/guides/ci.md)
ACCEPT = "--infergate-save-baseline (in CI: delete the baseline file on the default branch)"
# what decides an undecided comparison against a stored baseline when nothing it records changed
UNCHANGED_ACTION = ("Measure more (a larger `min_time_s=` or `repeats=` in the `infergate_bench(...)` call: more "
                    "repetitions, fewer of them disturbed), or rerun the job: nothing the baseline records changed, "
                    "so there is no other side to compare in one run.")


def perf_advice(record: PerfRecord, budgets: list[Violation], verdicts: list[Verdict]) -> str:
    """What to do, fitting the verdict: a failure with a named change points at the change (or its acceptance); a
    re-save only where the baseline itself is the problem."""
    if record.status == Status.FAIL:
        if not verdicts:
            return "Over budget: make it faster, or raise the budget if the new figure is right."
        if record.outcome.route != "stored":
            return "Measured in turns with its reference: look at what this side changes."
        if record.changes or record.model_change:
            return f"Look at that change; if it is intended, accept it with {ACCEPT}."
        return ("Nothing the baseline records changed (model, precision, libraries, engine config, workload): look at "
                f"your own code; if intended, accept it with {ACCEPT}.")
    if record.relative_check_missing:
        said = record.outcome.relative_check_fix or record.relative_check_missing
        return said[0].upper() + said[1:] + "."
    if any(v.baseline_at_fault for v in verdicts):
        return f"The baseline was measured under load: {interference.RESAVE}."
    if record.machine_mismatch:
        return "The baseline is from another machine: re-save it on this runner class."
    # against a stored baseline with nothing it records changed there is no other side to measure in one run (a new
    # user was told to A/B unchanged code): what decides is more measuring, or another run
    unchanged = record.outcome.route == "stored" and not (record.changes or record.model_change)
    if any(v.undecided for v in budgets) or any("busy" in v.note for v in verdicts):
        return f"The runner was busy: {interference.RERUN_UNCHANGED if unchanged else interference.RERUN}."
    if unchanged:
        return UNCHANGED_ACTION
    return UNDECIDED_ACTION[0].upper() + UNDECIDED_ACTION[1:] + "."


def verdict_line(v: Verdict) -> str:
    """A comparison in one line: its sentence and status, then what it rests on after EVIDENCE."""
    return f"{v.sentence()}: {v.status.upper()}{EVIDENCE}{v.details()}"


def verdict_reasons(record: PerfRecord, evidence_above: bool = False) -> list[str]:
    """Why the verdict is what it is, one line per check: each broken budget, each baseline comparison, each check
    that could not run. A check's line starts with its own sentence (Violation.line, verdict_line).
    `evidence_above`: the test's failure printed the outcome's message (PerfOutcome.message: each comparison that
    did not pass with its evidence, the baseline, another machine), so those say their sentence only, and point
    there."""
    reasons = [v.line() for v in record.violations]
    for v in sorted(record.verdicts, key=lambda v: v.status == Status.PASS):
        reasons.append(f"{v.sentence()}: {v.status.upper()}{EVIDENCE}its evidence in the test's failure above"
                       if evidence_above and v.status != Status.PASS else verdict_line(v))
    # the failure's heading named the baseline where a comparison did not pass (PerfOutcome.message)
    above = evidence_above and any(v.status != Status.PASS for v in record.verdicts)
    if record.baseline_provenance and not above:
        reasons.append(f"baseline: {record.baseline_provenance}")
    if record.relative_check_missing:
        reasons.append(f"no baseline comparison: {record.relative_check_missing}")
    if record.machine_mismatch and not evidence_above:
        reasons.append("baseline measured on another machine: " + ", ".join(record.machine_mismatch))
    if record.changes:
        reasons.append("changed since the baseline: " + ", ".join(record.changes))
    return reasons

"""The gate step every perf measurement goes through, whatever its target: the budget (ini + markers), the stored
baseline's entry and what changed since, the repetition plan, the decision, the record; an interleaved A/B's budget;
and the one step that records a side measured apart from that plan (record_side). No pytest here: the test is reached
through a TestContext."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_infergate import context
from pytest_infergate.context import TestContext
from pytest_infergate.gates.target import Target
from pytest_infergate.measurement import Measurement, busy_share
from pytest_infergate.perf.budget import merge_budgets, parse_budget, resolve_budget
from pytest_infergate.perf.gate import NoReference, PerfGate, PerfOutcome, StoredReference
from pytest_infergate.perf.outcome import Budget
from pytest_infergate.perf.repetitions import repetition_plan, until_settled
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.status import BUDGET_KEY_CHECK, PERF_CHECK, RELATIVE_CHECK, Finding, Status


def budget_for(ctx: TestContext, precision: str, key: str) -> Budget:
    budget, scopes = resolve_budget(ctx.scopes.lines("infergate_budgets"), ctx.marker_kwargs("infergate_budget"),
                                    precision, key)
    ctx.scopes.note("infergate_budgets", scopes)
    return budget


def measured_budget(ctx: TestContext, target: Target, record: PerfRecord, budget: Budget) -> tuple[Budget, list[str]]:
    """`budget` without the keys `record.measurement` has no figure for (e.g. peak_mem_mb of a remote server,
    goodput_per_s of the local engine), each warned about; returns it and those keys. A measurement its `target`
    calls unusable (every request the engine rejected) fails the test."""
    unusable = target.unusable(record.measurement) if budget.limits else None
    if unusable:
        ctx.fail(f"infergate perf gate for {record.test}: {unusable}")
    budget, unmeasured = budget.measured_in(record.measurement)
    if unmeasured:
        ctx.say(Finding(BUDGET_KEY_CHECK, record.test, f"budget key(s) {', '.join(unmeasured)} not checked: this "
                         f"{target.name} measurement has no such figure"))
    return budget, unmeasured


def finish_gate(ctx: TestContext, record: PerfRecord, outcome: PerfOutcome, budget: Budget,
                unmeasured: list[str]) -> None:
    """Note the budget keys not checked, warn about a relative check that could not run (warn, not fail), and record
    the outcome with the budget that was checked."""
    if unmeasured:
        outcome.notes.append(f"not measured here, not checked: {', '.join(unmeasured)}")
    if outcome.relative_check_missing:  # its own undecided verdict is said with its record (session)
        ctx.say(Finding(RELATIVE_CHECK, record.test, f"relative check not run: {outcome.relative_check_missing}",
                        outcome.relative_check_fix))
    # the default percentile goes unsaid, as in a marker; another is kept, so that `infergate compare` and the history
    # compare the percentile this gate compared
    percentile = {"percentile": budget.percentile} if budget.percentile != Budget().percentile else {}
    record.budget = {limit.key: limit.value for limit in budget.limits} | percentile | {
        "max_regression": budget.max_regression}
    beside_workers(ctx, record.measurement, outcome.status)
    record_outcome(ctx, record, outcome)


def beside_workers(ctx: TestContext, measurement: Measurement, status: Status) -> None:
    """Under pytest-xdist the kernel counts this run's other workers among the co-tenants: a verdict the load left
    undecided (or failed beyond it) says so beside it, since its advice to rerun the job measures beside them again.
    On a GPU the device's time decides, which CPU co-tenants hardly move: nothing to say."""
    workers = ctx.options.xdist_workers
    if workers > 1 and status != Status.PASS and not ctx.options.gpu \
            and busy_share(measurement.others_share) is not None:
        ctx.say(Finding(PERF_CHECK, ctx.test_id, f"measured beside {workers - 1} other pytest-xdist worker"
                        f"{'s' if workers > 2 else ''} of this run, which the kernel counts among the other processes "
                        "that kept the runner busy (a rerun with -n measures beside them again)",
                        fix="gate timings without -n (docs/guides/xdist.md)", status=status))


def prepare_gate(ctx: TestContext, key: str, precision: str, fingerprint: dict,
                 remeasure: Callable[[], None] | None = None) -> PerfGate:
    """The gate of measurement `key`, made before it is measured: its budget (ini + markers), the stored baseline's
    entry for it (if any) and what changed since (the fingerprints); after the measurement only the decision runs.
    `remeasure` adds to the candidate once measured (the stored route's re-measurement and fresh block)."""
    entry = ctx.baseline.get(key) if ctx.baseline is not None else None
    reference = StoredReference(entry, remeasure) if entry is not None else NoReference(ctx.baseline is not None)
    # under --infergate-strict a baseline of another model is compared only when the upgrade is on purpose
    other_model = not ctx.options.strict or ctx.options.allow_model_change
    return PerfGate(budget_for(ctx, precision, key), reference, fingerprint, other_model=other_model)


def gate_measurement(ctx: TestContext, target: Target, record: PerfRecord,
                     remeasure: Callable[[], None] | None = None, notes: Sequence[str] = (),
                     gate: PerfGate | None = None) -> PerfOutcome:
    """Budgets (ini + markers) and the stored-baseline comparison of `record.measurement` through `gate` (made
    here where not given: prepare_gate); gives the record the outcome (`notes` first among its notes), attaches it
    to the test and its key figures as JUnit properties. The caller fails the test."""
    key = record.test
    gate = gate or prepare_gate(ctx, key, record.precision, record.fingerprint, remeasure)
    budget, unmeasured = measured_budget(ctx, target, record, gate.budget)
    gate.budget = budget
    outcome = gate.check(record.measurement)
    outcome.notes[:0] = notes
    if ctx.baseline is not None and budget.max_regression is None:
        # a baseline given and not used would let a slower run PASS with nothing said (issue #45)
        ctx.say(Finding(RELATIVE_CHECK, key, f"--infergate-baseline {ctx.options.baseline} was given but not "
                        "compared with: this measurement's budget has no max_regression",
                        "add max_regression=0.1 to its infergate_budget marker (or the ini infergate_budgets) to "
                        "gate it against the baseline"))  # said as a finding, typed to every output (not a note)
    finish_gate(ctx, record, outcome, budget, unmeasured)
    return outcome


def ab_budget(ctx: TestContext, target: Target, key: str) -> Budget:
    """The budget of an interleaved A/B: the test's, its max_regression 0.10 where it sets none."""
    budget = budget_for(ctx, target.id, key)
    return budget if budget.max_regression is not None else merge_budgets(budget, parse_budget({"max_regression": 0.1}))


def record_side(ctx: TestContext, target: Target, record: PerfRecord, outcome: PerfOutcome, budget: Budget,
                failure: str, note: str = "") -> None:
    """Record one side measured apart from the in-run gate's plan (an A/B's B, the test's side against the baseline
    environment, a side of a speed experiment): `budget` less the keys `record.measurement` has no figure for,
    `note` (what it was measured against) first among the outcome's notes, the record with its outcome; the test
    fails if the gate failed, `failure` ("infergate perf gate failed for <key>") leading the message
    (PerfOutcome.failure_message)."""
    budget, unmeasured = measured_budget(ctx, target, record, budget)
    if note:
        outcome.notes.insert(0, note)
    finish_gate(ctx, record, outcome, budget, unmeasured)
    if outcome.failed:
        ctx.fail(outcome.failure_message(failure))


def record_outcome(ctx: TestContext, record: PerfRecord, outcome: PerfOutcome) -> None:
    """Give `record` the gate's outcome and attach it to the test. Failing the test is the caller's: its message
    names what was measured."""
    record.outcome = outcome
    ctx.record(record)


@dataclass
class WorkloadRun:
    """One call's workload on its target, ready to be measured (made by the target's runs: gates.target.Runs).
    `record` is its record before measuring (what runs it, on what, the fingerprint a stored baseline is compared
    with); `requests` and `config` (an EngineConfig, a LoadPattern) what it runs; `measure(plan, warmup=, repeats=,
    min_time_s=, until=, decided=, progress=)` measures it under the repetition plan (None: as the test asked),
    counting its repetitions on `progress` (context.Steps);
    `extend(measurement, warmup=)` adds repetitions to it (a stored comparison re-measures); `about` follows the key
    in a failure message and `detail(measurement)` ends it."""

    record: PerfRecord
    requests: list
    config: Any
    measure: Callable[..., Measurement]
    extend: Callable[..., object]
    about: str = ""
    detail: Callable[[Measurement], str] = lambda measurement: ""


def measure_planned(ctx: TestContext, run: WorkloadRun, warmup: int, repeats: int, min_time_s: float = 0.0,
                    rewarmup: int | None = None) -> tuple[Measurement, PerfGate]:
    """`run` measured, and the gate it goes through, made before measuring: its budget sets the repetition plan (a
    comparison's failure beyond doubt ends it early); after the measurement only the decision runs. A
    re-measurement warms up with `rewarmup` requests (None: `warmup`)."""
    key = run.record.test
    rewarmup = warmup if rewarmup is None else rewarmup
    # the closure reads `measurement` when the gate re-measures, by then measured
    gate = prepare_gate(ctx, key, run.record.precision, run.record.fingerprint,
                        remeasure=lambda: run.extend(measurement, warmup=rewarmup))
    plan = repetition_plan(gate.budget, ctx, repeats, min_time_s)
    # the terminal's line names the test, and counts against the plan's bounds once its first repetition is timed
    progress = context.Steps(f"measuring {key}", "repetition", plan.least if plan else repeats,
                             most=plan.most if plan else None)
    measurement = run.measure(plan, warmup=warmup, repeats=repeats, min_time_s=min_time_s,
                              until=until_settled(plan, progress), decided=gate.failed_beyond_doubt, progress=progress)
    return measurement, gate


def gated(ctx: TestContext, target: Target, run: WorkloadRun, measurement: Measurement, gate: PerfGate,
          notes: Sequence[str] = ()) -> PerfOutcome:
    """gate_measurement of `run`'s record holding `measurement`."""
    return gate_measurement(ctx, target, replace(run.record, measurement=measurement), notes=notes, gate=gate)


"""PerfBench, the object behind the `infergate_bench` fixture, and the gate step every perf measurement goes
through (budgets, baseline, record). No pytest here: the test is reached through a TestContext."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from pytest_infergate.context import TestContext
from pytest_infergate.gates.ab import local_sides, run_ab
from pytest_infergate.gates.target import OnEngine, Target
from pytest_infergate.measurement import METRICS, Measurement, busy_share
from pytest_infergate.perf import interference, lockstep
from pytest_infergate.perf.budget import merge_budgets, parse_budget, resolve_budget
from pytest_infergate.perf.gate import (
    AB_ROUNDS,
    NoReference,
    PerfGate,
    PerfOutcome,
    StoredReference,
)
from pytest_infergate.perf.lockstep import Claim, Speedup, conclusion, speedup
from pytest_infergate.perf.outcome import Budget
from pytest_infergate.perf.repetitions import probe_wanted, repetition_plan, until_settled
from pytest_infergate.requirements import import_torch
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.status import (
    BASELINE_CHECK,
    BUDGET_KEY_CHECK,
    ENGINE_CHECK,
    RELATIVE_CHECK,
    SPEED_EXPERIMENT_CHECK,
    Finding,
    Status,
)

# Rounds of an A/B against --infergate-baseline-python at the least (infergate_bench.ab()'s default): the paired
# comparison's interval needs perf.gate.AB_ROUNDS rounds whatever `repeats` the test asked for.
ENV_MIN_ROUNDS = AB_ROUNDS


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
    """Note the budget keys not checked, warn about what did not run as asked, and record the outcome with the
    budget that was checked."""
    if unmeasured:
        outcome.notes.append(f"not measured here, not checked: {', '.join(unmeasured)}")
    warn_about_outcome(ctx, record.test, outcome)
    # the default percentile goes unsaid, as in a marker; another is kept, so that `infergate compare` and the history
    # compare the percentile this gate compared
    percentile = {"percentile": budget.percentile} if budget.percentile != Budget().percentile else {}
    record.budget = {limit.key: limit.value for limit in budget.limits} | percentile | {
        "max_regression": budget.max_regression}
    record_outcome(ctx, record, outcome)


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
        unused = Finding(RELATIVE_CHECK, key, f"--infergate-baseline {ctx.options.baseline} was given but not "
                         "compared with: this measurement's budget has no max_regression",
                         "add max_regression=0.1 to its infergate_budget marker (or the ini infergate_budgets) to "
                         "gate it against the baseline")
        outcome.notes.append(unused.text())
        ctx.say(unused)
    finish_gate(ctx, record, outcome, budget, unmeasured)
    busy = busy_share(record.measurement.others_share)
    if ctx.options.save_baseline is not None and busy is not None:
        ctx.say(Finding(BASELINE_CHECK, key, "this baseline entry was measured on a busy runner",
                        f"{interference.UNDER_LOAD}; to make it decisive, {interference.RESAVE}",
                        evidence=interference.describe(busy)))
    return outcome


def warn_about_outcome(ctx: TestContext, key: str, outcome: PerfOutcome) -> None:
    """Warn (not fail) about a relative check of `outcome` that could not run (its own undecided verdict is said
    with its record: results.run.undecided_notice)."""
    if outcome.relative_check_missing:
        ctx.say(Finding(RELATIVE_CHECK, key, f"relative check not run: {outcome.relative_check_missing}"))


def ab_budget(ctx: TestContext, target: Target, key: str) -> Budget:
    """The budget of an interleaved A/B: the test's, its max_regression 0.10 where it sets none."""
    budget = budget_for(ctx, target.id, key)
    return budget if budget.max_regression is not None else merge_budgets(budget, parse_budget({"max_regression": 0.1}))


def finish_ab(ctx: TestContext, target: Target, record: PerfRecord, outcome: PerfOutcome, budget: Budget,
              against: str, note: str) -> None:
    """Record an interleaved A/B's decision (B in `record`, A as its baseline summary), failing the test if the gate
    failed; `against` names the two sides in the failure message, `note` says what A was."""
    record.fingerprint = {}
    budget, unmeasured = measured_budget(ctx, target, record, budget)
    outcome.notes.insert(0, note)
    finish_gate(ctx, record, outcome, budget, unmeasured)
    if outcome.failed:
        ctx.fail(f"infergate A/B gate failed for {record.test} ({against}):\n{outcome.message()}")


def record_outcome(ctx: TestContext, record: PerfRecord, outcome: PerfOutcome) -> None:
    """Give `record` the gate's outcome and attach it to the test. Failing the test is the caller's: its message
    names what was measured."""
    record.outcome = outcome
    ctx.record(record)


class PerfBench:
    """Callable returned by the `infergate_bench` fixture; see its docstring in the plugin's fixtures."""

    def __init__(self, ctx: TestContext, loaded, compare_side: Callable[[], object],
                 baseline_env: Callable[[], object] | None = None, target: Target | None = None):
        from pytest_infergate.perf.local_bench import Bench

        self.ctx = ctx
        self.loaded = loaded
        self.target = target or OnEngine(loaded.record.requested_precision)  # what the gate asks
        self.compare_side = compare_side  # the A side of ab(): --infergate-compare-model, else the reference
        self.baseline_env = baseline_env  # with --infergate-baseline-python: the session's perf.baseline_env worker
        # the calibration probe serves only a comparison with a stored baseline (perf.stored); in any other run it
        # would take a share of the cores from the workload and start a sampler process per test for nothing
        self.bench = Bench(loaded, ctx.options.device, calibrate=None if probe_wanted(ctx) else False)
        self.measurements: list[Measurement] = []

    @property
    def precision(self) -> str:
        return self.loaded.record.requested_precision

    def default_workload(self, num_requests: int = 8):
        from pytest_infergate.workloads import chat_workload

        return chat_workload(self.loaded.tokenizer, num_requests, prompt_tokens=(20, 200), max_new_tokens=(16, 48))

    def _record(self, key: str, label: str, measurement: Measurement, config, tags: dict | None) -> PerfRecord:
        """The record of `measurement` (its fields but the measurement are known before measuring: _unmeasured)."""
        return replace(self._unmeasured(key, label, config, tags), measurement=measurement)

    def _unmeasured(self, key: str, label: str, config, tags: dict | None) -> PerfRecord:
        """The record of measurement `key` before it is measured: what ran it, on what, and the fingerprint a stored
        baseline is compared with."""
        from pytest_infergate.engine.backends import choice_for
        from pytest_infergate.environment import perf_fingerprint

        choice = choice_for(self.loaded)
        ran = choice.run_config(config).to_dict()  # under HF generate: the static batches it really ran
        fingerprint = perf_fingerprint(self.loaded.record, ran, self.ctx.options.device)
        if not choice.is_engine:  # a baseline of the engine is no yardstick for HF generate, nor the reverse
            fingerprint["backend"] = choice.name
        return PerfRecord(test=key, label=label, precision=self.precision, measurement=Measurement(label=label),
                          backend=choice.name, backend_reason=choice.reason,
                          fallback=self.loaded.record.fallback, engine_config=ran, tags=dict(tags or {}),
                          fingerprint=fingerprint)

    def _skip_unless_runnable(self, loaded, config) -> None:
        """An experiment that asks for what only the engine does is skipped where the model runs on HF generate,
        saying what needs the engine and why the engine is not used."""
        from pytest_infergate.engine.backends import choice_for

        refusal = choice_for(loaded).refusal_for(config)
        if refusal is not None:
            self.ctx.skip(Finding(ENGINE_CHECK, self.ctx.test_id, refusal))

    def __call__(self, requests=None, config=None, *, warmup: int = 2, repeats: int = 3, min_time_s: float = 0.0,
                 label: str = "", tags: dict | None = None) -> Measurement:
        from pytest_infergate.engine import EngineConfig
        from pytest_infergate.workloads.request import RequestError

        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            self.ctx.fail(f"infergate_bench(repeats={repeats!r}): take at least one repetition (repeats >= 1); "
                          "nothing measured is nothing gated")
        requests = requests if requests is not None else self.default_workload()
        config = config or EngineConfig()
        self._skip_unless_runnable(self.loaded, config)
        key = self.ctx.measurement_key(label)
        if self.ctx.options.baseline_python is not None and self.baseline_env is not None:
            budget = budget_for(self.ctx, self.precision, key)
            if budget.max_regression is not None:
                return self._against_baseline_env(key, budget, requests, config, warmup, max(repeats, ENV_MIN_ROUNDS),
                                                  label, tags)
        unmeasured = self._unmeasured(key, label, config, tags)
        # made before measuring: after the measurement only the decision runs (the closure reads `measurement` when
        # the gate re-measures, by then measured)
        gate = prepare_gate(self.ctx, key, self.precision, unmeasured.fingerprint,
                            remeasure=lambda: self.bench.extend(measurement, requests, config, warmup=warmup))
        try:
            plan = repetition_plan(gate.budget, self.ctx, repeats)
            # with a plan its bounds, time floor and stop rules (a comparison's failure beyond doubt ends it early);
            # without one Bench.measure's own
            planned = {} if plan is None else dict(max_repeats=plan.cap, until=until_settled(plan, f"measuring {key}"),
                                                   decided=gate.failed_beyond_doubt)
            measurement = self.bench.measure(requests, config, warmup=warmup, repeats=plan.least if plan else repeats,
                                             min_time_s=max(min_time_s, plan.least_seconds if plan else 0.0),
                                             label=label, **planned)
        except RequestError as exc:  # the workload's own mistake: its message, not the plugin's traceback
            self.ctx.fail(f"infergate_bench for {key}: {exc}")
        outcome = gate_measurement(self.ctx, self.target, replace(unmeasured, measurement=measurement), gate=gate)
        self.measurements.append(measurement)
        if outcome.failed:
            self.ctx.fail(f"infergate perf gate failed for {key}:\n{outcome.message()}")
        return measurement

    def _against_baseline_env(self, key: str, budget: Budget, requests, config, warmup: int, rounds: int,
                              label: str, tags: dict | None) -> Measurement:
        """--infergate-baseline-python: the workload in the baseline environment (A) and here (B), alternately,
        gated as an interleaved A/B on the budget's max_regression; the budget's absolute limits are checked on B."""
        torch = import_torch()

        from pytest_infergate.environment import library_versions
        from pytest_infergate.perf.baseline_env import BaselineEnvError, Workload

        env = self.baseline_env()
        options, record = self.ctx.options, self.loaded.record
        workload = Workload(options.model, record.precision, options.device, options.reference_precision,
                            options.backend, str(options.cache_dir), torch.get_num_threads(), config, requests,
                            warmup)
        measurement_id = f"{key}#{id(self)}"
        try:
            b, outcome, theirs, refused = env.ab(measurement_id, workload, self.bench, budget, rounds)
        except BaselineEnvError as exc:
            self.ctx.fail(f"infergate perf gate for {key}: {exc}")
        b.label = label
        result = self._record(key, label, b, config, tags)
        budget, unmeasured = measured_budget(self.ctx, self.target, result, budget)
        note = (f"{lockstep.how(refused)} against the {env.describe(library_versions())}, "
                f"{outcome.baseline.repetitions} rounds")
        if theirs and theirs != result.backend:
            note += f"; the baseline environment ran it on {theirs}, this one on {result.backend}"
        outcome.notes.insert(0, note)
        finish_gate(self.ctx, result, outcome, budget, unmeasured)
        self.measurements.append(b)
        if outcome.failed:
            self.ctx.fail(f"infergate perf gate failed for {key} against the baseline environment:\n"
                          f"{outcome.message()}")
        return b

    def ab(self, requests=None, config=None, *, baseline_model=None, baseline_config=None, rounds: int = AB_ROUNDS,
           warmup: int = 1, label: str = "ab"):
        """Interleaved A/B: the baseline side and this test's model are measured alternately, A B A B ..., so
        drift of the machine hits both alike. The baseline side is `baseline_model`, else --infergate-compare-model
        in this precision, else the reference precision; `baseline_config` defaults to `config`. The verdict of
        B against A uses the budget's max_regression (default 0.10). Returns (A, B) Measurements."""
        from pytest_infergate.engine import EngineConfig
        from pytest_infergate.perf.local_bench import Bench

        requests = requests if requests is not None else self.default_workload()
        config = config or EngineConfig()
        other = baseline_model or self.compare_side()
        other_bench = self.bench if other is self.loaded else Bench(other, self.ctx.options.device)
        other_config = baseline_config or config
        self._skip_unless_runnable(self.loaded, config)
        self._skip_unless_runnable(other, other_config)
        key = self.ctx.measurement_key(label)
        tags = {"experiment": "ab", "baseline_precision": other.record.requested_precision}
        sides = local_sides(other, other_bench, other_config, self.bench, config, requests, warmup,
                            lambda a, b: self._record(key, label, b, config, tags))
        return run_ab(sides, ab_budget(self.ctx, self.target, key), rounds, partial(finish_ab, self.ctx, self.target))

    def speedup(self, requests, config, slower_config, *, labels: tuple[str, str], name: str = "", rounds: int = 3,
                warmup: int = 1, metric: str = "tokens_per_s", tags: dict | None = None) -> Speedup:
        """How many times faster this model runs `requests` on `config` than on `slower_config`: `rounds`
        interleaved rounds of the two (step-locked where both can step), the ratio taken within each round, with
        its 95% bootstrap interval (perf.experiment). Each side is recorded and checked against its budgets under
        its label (`labels`: config's, slower_config's); `name` names the speedup in messages (default: "<label> over
        <label>"). Deciding what the speedup shows is the test's, through `conclude()`."""
        for each in (config, slower_config):
            self._skip_unless_runnable(self.loaded, each)
        run_round, refused = lockstep.interleaved(self.bench, slower_config, self.bench, config, requests, warmup)
        slow, fast = Measurement(label=labels[1]), Measurement(label=labels[0])
        for index in range(rounds):
            run_round(slow, fast, index)
        result = speedup(name or f"{labels[0]} over {labels[1]}", lockstep.per_round(fast, metric),
                         lockstep.per_round(slow, metric),
                         higher_is_better=METRICS[metric][1])
        note = (f"one side of a speed experiment, {lockstep.how(refused)}, {rounds} rounds: {result.describe()}; "
                "compared with the other side, not with a stored baseline")
        for measured, each, label in ((fast, config, labels[0]), (slow, slower_config, labels[1])):
            key = self.ctx.measurement_key(label)
            record = self._record(key, label, measured, each, tags)
            budget = budget_for(self.ctx, self.precision, key)
            budget, unmeasured = measured_budget(self.ctx, self.target, record, budget)
            # each side against its budgets alone: it was compared with the other side, not with a baseline
            outcome = PerfGate(replace(budget, max_regression=None), NoReference()).check(measured)
            outcome.notes.append(note)
            finish_gate(self.ctx, record, outcome, budget, unmeasured)
            self.measurements.append(measured)
            if outcome.failed:
                self.ctx.fail(f"infergate perf gate failed for {key}:\n{outcome.message()}")
        return result

    def conclude(self, experiment: str, claims: list[Claim]) -> Status:
        """Decide a speed experiment on its claims (perf.lockstep.faster / grows): a claim whose intervals lie on
        the wrong side fails the test; an undecided one is a warning that names the intervals (the session fails
        the test on it under --infergate-strict), and the test passes."""
        status, message = conclusion(experiment, claims)
        self.ctx.properties.append(("infergate.experiment", str(status)))
        if status == Status.FAIL:
            self.ctx.fail(message)
        if status == Status.INCONCLUSIVE:
            self.ctx.say(Finding(SPEED_EXPERIMENT_CHECK, self.ctx.test_id, message))
        return status

    def close(self) -> None:
        self.bench.close()

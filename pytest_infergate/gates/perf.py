"""PerfBench, the object behind the `infergate_bench` and `infergate_endpoint` fixtures: one bench whatever the
target, which measures and gates (gates.gating) what the target's runs (gates.target.Runs: a local precision's,
gates.local_runs; the served model's, gates.endpoint) run, and asks them what they cannot. No pytest here: the test is
reached through a TestContext."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from pytest_infergate.context import TestContext
from pytest_infergate.gates import served_loads
from pytest_infergate.gates.ab import run_ab
from pytest_infergate.gates.gating import ab_budget, budget_for, gated, measure_planned, record_side
from pytest_infergate.gates.local_runs import LocalRuns
from pytest_infergate.gates.target import SPEEDUP, OnEngine, Runs
from pytest_infergate.measurement import METRICS, Measurement
from pytest_infergate.perf import lockstep
from pytest_infergate.perf.gate import NoReference, PerfGate
from pytest_infergate.perf.interleaved import AB_ROUNDS
from pytest_infergate.perf.lockstep import Claim, Speedup, conclusion, speedup
from pytest_infergate.perf.outcome import PERF_FAILURE
from pytest_infergate.status import SPEED_EXPERIMENT_CHECK, Finding, Status


class PerfBench:
    """Returned by `infergate_bench` (and `infergate_endpoint`); see their docstrings in the plugin's fixtures.
    Made from a local precision's LoadedModel (`loaded`, with `compare_side`, the A side of ab(), and
    `baseline_env`), or from any target's `runs`."""

    def __init__(self, ctx: TestContext, loaded=None, compare_side: Callable[[], object] | None = None,
                 baseline_env: Callable[[], object] | None = None, target=None, *, runs: Runs | None = None):
        self.ctx = ctx
        self.runs: Runs = runs or LocalRuns(ctx, loaded, target or OnEngine(loaded.record.requested_precision),
                                            compare_side, baseline_env)
        self.target = self.runs.target  # what the gate asks
        self.measurements: list[Measurement] = []

    @property
    def precision(self) -> str | None:
        return self.target.precision

    def default_workload(self, num_requests: int | None = None):
        """The workload of a call that gives none: 6 short chat requests on the engine (default_chat_workload), 16 on
        a served model."""
        return self.runs.default_workload(num_requests)

    def _can(self, what: str) -> Runs:
        """The target's runs where they can run `what`; else the test fails saying why and what would run it."""
        why = self.runs.cannot(what)
        if why is not None:
            self.ctx.fail(f"{self.ctx.test_id}: {self.target.name} target: {why}")
        return self.runs

    def __call__(self, requests=None, config=None, *, warmup: int | None = None, repeats: int | None = None,
                 min_time_s: float = 0.0, label: str = "", tags: dict | None = None, **options) -> Measurement:
        """Measure `requests` (default: default_workload()) on `config` and gate the measurement; `warmup` and
        `repeats` default to the target's (2 and 3 on the engine, 1 and 1 on a served model). A served model also
        takes `pattern` and `slo` (its load(); an EngineConfig's max_batch_size is its concurrency)."""
        warmup = self.runs.defaults[0] if warmup is None else warmup
        repeats = self.runs.defaults[1] if repeats is None else repeats
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            self.ctx.fail(f"infergate_bench(repeats={repeats!r}): take at least one repetition (repeats >= 1); "
                          "nothing measured is nothing gated")
        run = self.runs.workload_run(requests, config, label, tags, options)
        elsewhere = self.runs.elsewhere(run, warmup, repeats)
        if elsewhere is not None:
            self.measurements.append(elsewhere)
            return elsewhere
        measurement, gate = measure_planned(self.ctx, run, warmup, repeats, min_time_s)
        outcome = gated(self.ctx, self.target, run, measurement, gate)
        self.measurements.append(measurement)
        if outcome.failed:
            self.ctx.fail(outcome.failure_message(f"{PERF_FAILURE} {run.record.test}{run.about}")
                          + run.detail(measurement))
        return measurement

    def ab(self, requests=None, config=None, *, rounds: int = AB_ROUNDS, warmup: int = 1, label: str = "ab",
           **options):
        """Interleaved A/B: the other side and this test's target are measured alternately, A B A B ..., so drift
        of the machine hits both alike; the verdict of B against A uses the budget's max_regression (default 0.10)
        on a paired bootstrap CI. Returns the (A, B) Measurements. On the engine the other side is `baseline_model`,
        else --infergate-compare-model in this precision, else the reference precision (`baseline_config`
        defaults to `config`); on a served model it is --infergate-reference-endpoint running the same load
        (`pattern`, `slo`), and the test is skipped without one."""
        sides = self.runs.ab_sides(requests, config, label, rounds, warmup, options)
        return run_ab(sides, ab_budget(self.ctx, self.target, self.ctx.measurement_key(label)), rounds,
                      partial(record_side, self.ctx, self.target))

    def speedup(self, requests, config, slower_config, *, labels: tuple[str, str], name: str = "", rounds: int = 3,
                warmup: int = 1, metric: str = "tokens_per_s", tags: dict | None = None) -> Speedup:
        """How many times faster this model runs `requests` on `config` than on `slower_config`: `rounds`
        interleaved rounds of the two (step-locked where both can step), the ratio taken within each round, with
        its 95% bootstrap interval (perf.experiment). Each side is recorded and checked against its budgets under
        its label (`labels`: config's, slower_config's); `name` names the speedup in messages (default: "<label> over
        <label>"). Deciding what the speedup shows is the test's, through `conclude()`. The engine's configs only:
        a served model's are its server's."""
        runs = self._can(SPEEDUP)
        fast_run, slow_run = (runs.workload_run(requests, each, label, tags, {})
                              for each, label in ((config, labels[0]), (slower_config, labels[1])))
        run_round, refused = runs.interleaved(requests, config, slower_config, warmup)
        slow, fast = Measurement(label=labels[1]), Measurement(label=labels[0])
        for index in range(rounds):
            run_round(slow, fast, index)
        result = speedup(name or f"{labels[0]} over {labels[1]}", lockstep.per_round(fast, metric),
                         lockstep.per_round(slow, metric), higher_is_better=METRICS[metric][1])
        note = (f"one side of a speed experiment, {lockstep.how(refused)}, {rounds} rounds: {result.describe()}; "
                "compared with the other side, not with a stored baseline")
        for measured, run in ((fast, fast_run), (slow, slow_run)):
            record = replace(run.record, measurement=measured)
            budget = budget_for(self.ctx, self.target.id, record.test)
            # each side against its budgets alone (a key it has no figure for goes unchecked, as record_side says):
            # it was compared with the other side, not with a baseline
            outcome = PerfGate(replace(budget, max_regression=None), NoReference()).check(measured)
            outcome.notes.append(note)
            self.measurements.append(measured)
            record_side(self.ctx, self.target, record, outcome, budget, f"{PERF_FAILURE} {record.test}")
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

    # a served model's load tools (gates.endpoint, gates.served_loads, docs/guides/endpoint.md); on the engine the test
    # fails naming the fix
    def load(self, requests=None, pattern=None, slo=None, *, warmup: int = 1, repeats: int = 1, label: str = "",
             tags: dict | None = None) -> Measurement:
        """Run `requests` (default: 16 chat requests) against the endpoint in `pattern` (a LoadPattern, or a dict
        such as {"rate_per_s": 4, "burstiness": 0.5} or {"concurrency": 8}) `repeats` times, and gate the result
        with the test's budgets. `slo` (or the `infergate_slo` marker) defines goodput. Returns the Measurement."""
        self._can("load()")
        return self(requests, warmup=warmup, repeats=repeats, label=label, tags=tags, pattern=pattern, slo=slo)

    def sweep(self, *args, **kwargs):
        """One gated load run per rate or concurrency, or the sweep profile: gates.served_loads.sweep."""
        return served_loads.sweep(self._can("sweep()"), *args, **kwargs)

    def capacity(self, *args, **kwargs):
        """The highest load that still meets the SLO, gated: gates.served_loads.capacity."""
        return served_loads.capacity(self._can("capacity()"), *args, **kwargs)

    def synchronous_rps(self, *args, **kwargs) -> float:
        """The server's rate one request at a time: gates.served_loads.synchronous_rps."""
        return served_loads.synchronous_rps(self._can("synchronous_rps()"), *args, **kwargs)

    def workload(self, *args, **kwargs):
        """Chat requests sized by the local tokenizer or the server's /tokenize: ServedRuns.workload."""
        return self._can("workload()").workload(*args, **kwargs)

    def token_exact_workload(self, *args, **kwargs):
        """Completions requests of exact token counts, sized by the server: ServedRuns.token_exact_workload."""
        return self._can("token_exact_workload()").token_exact_workload(*args, **kwargs)

    def close(self) -> None:
        self.runs.close()

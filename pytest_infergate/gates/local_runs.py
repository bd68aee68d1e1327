"""A local precision bound to one test (`LocalRuns`, gates.target.Runs): its workloads on the reference engine (or
HF generate where the engine refuses the model), its interleaved A/B against the reference precision or
--infergate-compare-model, its speed experiments and its A/B against --infergate-baseline-python. No pytest here."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property, partial

from pytest_infergate.context import TestContext
from pytest_infergate.gates.ab import AbSides, local_sides
from pytest_infergate.gates.gating import WorkloadRun, budget_for, record_side
from pytest_infergate.gates.target import SERVED_LOAD_TOOLS, Target
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf import lockstep
from pytest_infergate.perf.interleaved import AB_ROUNDS
from pytest_infergate.perf.outcome import PERF_FAILURE
from pytest_infergate.perf.repetitions import RepetitionPlan, probe_wanted
from pytest_infergate.requirements import import_torch
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.status import ENGINE_CHECK, Finding

# Rounds of an A/B against --infergate-baseline-python at the least (infergate_bench.ab()'s default): the paired
# comparison's interval needs perf.interleaved.AB_ROUNDS rounds whatever `repeats` the test asked for.
ENV_MIN_ROUNDS = AB_ROUNDS


class LocalRuns:
    """The workloads of one test on a local precision (`loaded`: a LoadedModel, or how to load it at the first
    measurement, so that a test which skips itself before measuring loads no model)."""

    defaults = (2, 3)  # a call's warm-up requests and repetitions

    def __init__(self, ctx: TestContext, loaded, target: Target, compare_side: Callable[[], object],
                 baseline_env: Callable[[], object] | None = None, tokenizer: Callable[[], object] | None = None):
        self.ctx, self.target = ctx, target
        self._loaded = loaded
        self.compare_side = compare_side  # the A side of ab(): --infergate-compare-model, else the reference
        self.baseline_env = baseline_env  # with --infergate-baseline-python: the session's perf.baseline_env worker
        # the model's tokenizer, the same in every precision: a default workload needs no quantized weights
        self._tokenizer = tokenizer or (lambda: self.loaded.tokenizer)

    @cached_property
    def loaded(self):
        return self._loaded() if callable(self._loaded) else self._loaded

    @cached_property
    def bench(self):
        from pytest_infergate.perf.local_bench import Bench

        # the calibration probe serves only a comparison with a stored baseline (perf.stored); in any other run it
        # would take a share of the cores from the workload and start a sampler process per test for nothing
        return Bench(self.loaded, self.ctx.options.device, calibrate=None if probe_wanted(self.ctx) else False)

    def cannot(self, what: str) -> str | None:
        if what in SERVED_LOAD_TOOLS:
            return (f"{what} loads the server of --infergate-endpoint: pass --infergate-endpoint URL, or call "
                    "infergate_bench(...) to measure this precision on the engine")
        return None

    def default_workload(self, num_requests: int | None = None):
        from pytest_infergate.workloads import default_chat_workload

        return default_chat_workload(self._tokenizer(), num_requests)

    def record(self, key: str, label: str, config, tags: dict | None, requests: list) -> PerfRecord:
        """The record of measurement `key` before it is measured: what ran it, on what, and the fingerprint a stored
        baseline is compared with (the workload's too: a changed workload is a change under test, named)."""
        from pytest_infergate.engine.backends import choice_for
        from pytest_infergate.environment import perf_fingerprint
        from pytest_infergate.workloads.identity import workload_identity

        choice = choice_for(self.loaded)
        ran = choice.run_config(config).to_dict()  # under HF generate: the static batches it really ran
        fingerprint = perf_fingerprint(self.loaded.record, ran, self.ctx.options.device)
        fingerprint["workload"] = workload_identity(requests, self._tokenizer())
        if not choice.is_engine:  # a baseline of the engine is no yardstick for HF generate, nor the reverse
            fingerprint["backend"] = choice.name
        return PerfRecord(test=key, label=label, precision=self.target.id, measurement=Measurement(label=label),
                          backend=choice.name, backend_reason=choice.reason,
                          fallback=self.loaded.record.fallback, engine_config=ran, tags=dict(tags or {}),
                          fingerprint=fingerprint)

    def skip_unless_runnable(self, loaded, config) -> None:
        """An experiment that asks for what only the engine does is skipped where the model runs on HF generate,
        saying what needs the engine and why the engine is not used."""
        from pytest_infergate.engine.backends import choice_for

        refusal = choice_for(loaded).refusal_for(config)
        if refusal is not None:
            self.ctx.skip(Finding(ENGINE_CHECK, self.ctx.test_id, refusal))

    def workload_run(self, requests, config, label: str, tags: dict | None, options: dict) -> WorkloadRun:
        from pytest_infergate.engine import EngineConfig
        from pytest_infergate.workloads.request import RequestError

        if options:
            self.ctx.fail(f"{self.ctx.test_id}: infergate_bench got argument(s) {', '.join(sorted(options))}, which "
                          "only a served model's load run takes (--infergate-endpoint)")
        config = config or EngineConfig()
        self.skip_unless_runnable(self.loaded, config)
        requests = requests if requests is not None else self.default_workload()
        key, bench = self.ctx.measurement_key(label), self.bench

        def measure(plan: RepetitionPlan | None, *, warmup: int, repeats: int, min_time_s: float, until,
                    decided, progress) -> Measurement:
            # with a plan its bounds, time floor and stop rules; without one Bench.measure's own
            planned = {} if plan is None else dict(max_repeats=plan.cap, until=until, decided=decided)
            try:
                return bench.measure(requests, config, warmup=warmup, repeats=plan.least if plan else repeats,
                                     min_time_s=max(min_time_s, plan.least_seconds if plan else 0.0), label=label,
                                     progress=progress, **planned)
            except RequestError as exc:  # the workload's own mistake: its message, not the plugin's traceback
                self.ctx.fail(f"infergate_bench for {key}: {exc}")

        # Bench.extend itself, no function of this module between: the gate's path after the measurement stays short
        extend = partial(bench.extend, requests=requests, config=config, what=key)
        return WorkloadRun(self.record(key, label, config, tags, requests), requests, config, measure, extend)

    def elsewhere(self, run: WorkloadRun, warmup: int, repeats: int) -> Measurement | None:
        """--infergate-baseline-python with a max_regression to gate: the workload in the baseline environment (A)
        and here (B), alternately, gated as an interleaved A/B; the budget's absolute limits are checked on B."""
        if self.ctx.options.baseline_python is None or self.baseline_env is None:
            return None
        budget = budget_for(self.ctx, self.target.id, run.record.test)
        if budget.max_regression is None:
            return None
        torch = import_torch()

        from pytest_infergate.environment import library_versions
        from pytest_infergate.perf.baseline_env import BaselineEnvError, Workload

        env, key = self.baseline_env(), run.record.test
        options, record = self.ctx.options, self.loaded.record
        workload = Workload(options.model, record.precision, options.device, options.reference_precision,
                            options.backend, str(options.cache_dir), torch.get_num_threads(), run.config,
                            run.requests, warmup)
        try:
            b, outcome, theirs, refused = env.ab(f"{key}#{id(self)}", workload, self.bench, budget,
                                                 max(repeats, ENV_MIN_ROUNDS))
        except BaselineEnvError as exc:
            self.ctx.fail(f"infergate perf gate for {key}: {exc}")
        b.label = run.record.label
        result = run.record
        result.measurement = b
        note = (f"{lockstep.how(refused)} against the {env.describe(library_versions())}, "
                f"{outcome.baseline.repetitions} rounds")
        if theirs and theirs != result.backend:
            note += f"; the baseline environment ran it on {theirs}, this one on {result.backend}"
        record_side(self.ctx, self.target, result, outcome, budget,
                    f"{PERF_FAILURE} {key} against the baseline environment", note)
        return b

    def ab_sides(self, requests, config, label: str, rounds: int, warmup: int, options: dict) -> AbSides:
        """The baseline side is `baseline_model`, else --infergate-compare-model in this precision, else the
        reference precision; `baseline_config` defaults to `config`."""
        from pytest_infergate.engine import EngineConfig
        from pytest_infergate.perf.local_bench import Bench

        unknown = sorted(set(options) - {"baseline_model", "baseline_config"})
        if unknown:
            self.ctx.fail(f"{self.ctx.test_id}: ab() got unknown argument(s) {', '.join(unknown)}")
        requests = requests if requests is not None else self.default_workload()
        config = config or EngineConfig()
        other = options.get("baseline_model") or self.compare_side()
        other_bench = self.bench if other is self.loaded else Bench(other, self.ctx.options.device)
        other_config = options.get("baseline_config") or config
        self.skip_unless_runnable(self.loaded, config)
        self.skip_unless_runnable(other, other_config)
        key = self.ctx.measurement_key(label)
        tags = {"experiment": "ab", "baseline_precision": other.record.requested_precision}

        def record(a: Measurement, b: Measurement) -> PerfRecord:
            record = self.record(key, label, config, tags, requests)
            record.measurement = b
            return record

        return local_sides(other, other_bench, other_config, self.bench, config, requests, warmup, record)

    def interleaved(self, requests, config, slower_config, warmup: int):
        for each in (config, slower_config):
            self.skip_unless_runnable(self.loaded, each)
        return lockstep.interleaved(self.bench, slower_config, self.bench, config, requests, warmup)

    def close(self) -> None:
        if "bench" in self.__dict__:  # made at the first measurement
            self.bench.close()

"""What a test measures, picked once in the fixture (`infergate_target`): a local precision of --infergate-model on
the reference engine (`LocalTarget`) or the model served at --infergate-endpoint (`ServedTarget`). Both answer one
small Protocol - what the target is called, what it cannot do and why, its perf bench and its golden gate, a
measurement no budget can be checked on - so that no fixture and no gate branches on which one it is (pytest-xdist's
scheduling modes: one class each, chosen once). No pytest here: the fixture hands in the test's context, how pytest
gets the local model (the `infergate_model` fixture) and `needs` (a resource the test cannot run without)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pytest_infergate.context import ENDPOINT_ID, TestContext
from pytest_infergate.measurement import Measurement
from pytest_infergate.status import ENDPOINT_CHECK, Finding

# what a fixture asks a target for (Target.cannot)
LOCAL_MODEL, PERF_BENCH, GOLDEN_GATE = "a local model", "a perf bench", "a golden gate"

NO_LOCAL_MODEL = "measures a local model; with --infergate-endpoint the server's model is under test"
# an endpoint test in a run without --infergate-endpoint: skipped by design (a suite of a served model, collected
# with the others, which nobody asked to run without a server), its reason saying how to run it; an endpoint
# target's golden check, which was asked for, is a check not run with its fix
NEEDS_A_SERVER = Finding(ENDPOINT_CHECK, "", "needs a live server", "pass --infergate-endpoint URL")
NO_SERVER_BY_DESIGN = "needs a live server; pass --infergate-endpoint URL"

Model = Callable[[], Any]  # the test's LoadedModel (models.LoadedModel), got when first asked for
Needs = Callable[[Callable[[], Any]], Any]  # a resource, or the test fails saying why it could not be had


class Target(Protocol):
    """The target of a test. `id` names it where a test is keyed: the parameter id (`[int8]`, `[endpoint]`), the ini
    scope its budgets and policies apply by, a record's `precision`; `name` is what its measurements are called in
    messages ("engine", "endpoint"). `precision` is the local precision, None for the served model."""

    id: str
    name: str
    precision: str | None

    def cannot(self, what: str) -> str | Finding | None:
        """Why this target cannot give `what` (LOCAL_MODEL, PERF_BENCH, GOLDEN_GATE) in this run: a reason to skip
        by design, or a Finding (a check asked for and not run, with its fix); None where it can."""

    def perf_bench(self, ctx: TestContext, model: Model, needs: Needs) -> Any:
        """The object behind `infergate_bench` (gates.perf.PerfBench, gates.endpoint.EndpointPerfBench)."""

    def golden_gate(self, ctx: TestContext, model: Model, needs: Needs, golden_dir: Path) -> Any:
        """The object behind `infergate_golden` (gates.golden.GoldenGate, or a pair of servers' gates.pair)."""

    def unusable(self, measurement: Measurement) -> str | None:
        """Why no budget can be checked on `measurement` (the test then fails), None where one can."""


class _Named:
    """What a user's test may read of its target (docs/reference/fixtures.md); the plugin asks `cannot` instead."""

    precision: str | None

    @property
    def is_endpoint(self) -> bool:
        return self.precision is None


class LocalTarget(_Named):
    """A precision of --infergate-model, run on the reference engine (or HF generate where the engine refuses it)."""

    name: ClassVar[str] = "engine"

    def __init__(self, precision: str, resources=None):
        self.precision = precision
        self.resources = resources  # resources.SessionResources; None: a bench's target, which makes no bench

    @property
    def id(self) -> str:
        return self.precision

    def cannot(self, what: str) -> str | Finding | None:
        return None

    def model(self):
        """This precision's LoadedModel, loaded once per session (the `infergate_model` fixture's)."""
        return self.resources.model(self.precision)

    def perf_bench(self, ctx: TestContext, model: Model, needs: Needs):
        from pytest_infergate.gates.perf import PerfBench

        loaded, resources = model(), self.resources
        return PerfBench(ctx, loaded, lambda: needs(lambda: resources.compare_side(loaded.record.requested_precision)),
                         lambda: needs(resources.baseline_env), target=self)

    def golden_gate(self, ctx: TestContext, model: Model, needs: Needs, golden_dir: Path):
        from pytest_infergate.gates.golden import GoldenGate
        from pytest_infergate.gates.golden_candidates import LocalCandidate

        resources = self.resources
        options, caches = resources.options, resources.caches
        candidate = LocalCandidate(model(), options.device, caches.generated, options.golden_max_len,
                                   caches.reference_scores)
        return GoldenGate(ctx, candidate, lambda: needs(lambda: resources.model(options.reference_precision)),
                          golden_dir, _model_name(resources), caches.comparisons, caches.generated)

    def unusable(self, measurement: Measurement) -> str | None:
        m = measurement
        if not (m.num_requests and m.num_failed >= m.num_requests):
            return None
        why = ", ".join(f"{reason}: {count}" for reason, count in (m.engine.get("failed_requests") or {}).items())
        return (f"every one of the {m.num_requests} requests failed{f' ({why})' if why else ''}, so no budget can be "
                "checked; a rejected request's prompt is longer than the engine takes (max_input_tokens / "
                "max_model_len) or its KV cannot fit")


class ServedTarget(_Named):
    """The model served at --infergate-endpoint, in the server's own precision; its failed requests are counted
    per kind (the budget's success_rate gates them), never a reason to stop."""

    name: ClassVar[str] = "endpoint"
    id: ClassVar[str] = ENDPOINT_ID
    precision: ClassVar[None] = None

    def __init__(self, resources=None):
        self.resources = resources  # resources.SessionResources; None: a bench's target, which makes no bench

    def cannot(self, what: str) -> str | Finding | None:
        if what == LOCAL_MODEL:
            return NO_LOCAL_MODEL
        if self.resources.endpoint is None:
            return NEEDS_A_SERVER if what == GOLDEN_GATE else NO_SERVER_BY_DESIGN
        return None

    def perf_bench(self, ctx: TestContext, model: Model, needs: Needs):
        from pytest_infergate.gates.endpoint import EndpointPerfBench

        resources = self.resources
        return EndpointPerfBench(ctx, resources.endpoint, lambda: resources.pool.tokenizer,
                                 resources.reference_endpoint)

    def golden_gate(self, ctx: TestContext, model: Model, needs: Needs, golden_dir: Path):
        from pytest_infergate.gates.golden import GoldenGate
        from pytest_infergate.gates.golden_candidates import EndpointCandidate

        resources = self.resources
        caches = resources.caches
        candidate = EndpointCandidate(resources.endpoint, lambda: resources.pool.tokenizer, caches.endpoint_answers)
        if resources.reference_endpoint is not None:
            from pytest_infergate.gates.pair import ServerPairCandidate, ServerPairGate

            pair = ServerPairCandidate(resources.endpoint.config, resources.reference_endpoint.config,
                                       caches.endpoint_answers)
            return ServerPairGate(pair, ctx, candidate, lambda: None, golden_dir, _model_name(resources),
                                  caches.comparisons, caches.generated)
        options = resources.options
        return GoldenGate(ctx, candidate, lambda: needs(lambda: resources.model(options.reference_precision)),
                          golden_dir, _model_name(resources), caches.comparisons, caches.generated)

    def unusable(self, measurement: Measurement) -> str | None:
        return None


def target_of(target_id: str, resources=None) -> Target:
    """The target of a test's parameter id (`infergate_precision`): the served model for ENDPOINT_ID, else that
    local precision."""
    return ServedTarget(resources) if target_id == ENDPOINT_ID else LocalTarget(target_id, resources)


def _model_name(resources) -> Callable[[], str]:
    return lambda: resources.pool.source.name  # read when a gate names the model

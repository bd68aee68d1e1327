"""The target a test measures, picked once in the fixture (`infergate_target`): a local precision of
--infergate-model on the reference engine (`LocalTarget`) or the model served at --infergate-endpoint
(`ServedTarget`), each answering gates.target.Target - what it is called, what it cannot do and why, its perf bench
and golden gate - so that no fixture and no gate branches on which one it is (pytest-xdist's scheduling modes: one
class each, chosen once). No pytest here: the fixture hands in the test's context, how pytest gets the local model
(the `infergate_model` fixture) and `needs` (a resource the test cannot run without)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_infergate.context import ENDPOINT_ID, TestContext
from pytest_infergate.gates.endpoint import ServedRuns
from pytest_infergate.gates.golden import GoldenGate
from pytest_infergate.gates.golden_candidates import EndpointCandidate, LocalCandidate
from pytest_infergate.gates.local_runs import LocalRuns
from pytest_infergate.gates.pair import ServerPairCandidate, ServerPairGate
from pytest_infergate.gates.perf import PerfBench
from pytest_infergate.gates.target import (
    GOLDEN_GATE,
    LOCAL_MODEL,
    NEEDS_A_SERVER,
    NO_LOCAL_MODEL,
    NO_SERVER_BY_DESIGN,
    Model,
    Needs,
    OnEngine,
    Served,
    Target,
)
from pytest_infergate.status import Finding


class LocalTarget(OnEngine):
    """A precision of --infergate-model, run on the reference engine (or HF generate where the engine refuses it)."""

    def __init__(self, precision: str, resources=None):
        super().__init__(precision)
        self.resources = resources  # resources.SessionResources; None: a bench's target, which makes no bench

    def cannot(self, what: str) -> str | Finding | None:
        return None

    def model(self):
        """This precision's LoadedModel, loaded once per session (the `infergate_model` fixture's)."""
        return self.resources.model(self.precision)

    def perf_bench(self, ctx: TestContext, model: Model, needs: Needs):
        # the model loads at the first measurement: a test that skips this precision first (the starter's int8
        # speed on the CPU) loads none
        resources = self.resources
        return PerfBench(ctx, runs=LocalRuns(ctx, model, self, lambda: needs(lambda: resources.compare_side(
            self.precision)), lambda: needs(resources.baseline_env), tokenizer=lambda: needs(resources.tokenizer)))

    def golden_gate(self, ctx: TestContext, model: Model, needs: Needs, golden_dir: Path):
        resources = self.resources
        options, caches = resources.options, resources.caches
        candidate = LocalCandidate(model(), options.device, caches.generated, options.golden_max_len,
                                   caches.reference_scores)
        return GoldenGate(ctx, candidate, lambda: needs(lambda: resources.model(options.reference_precision)),
                          golden_dir, _model_name(resources), caches.comparisons, caches.generated)

class ServedTarget(Served):
    """The model served at --infergate-endpoint, in the server's own precision; its failed requests are counted
    per kind (the budget's success_rate gates them), never a reason to stop."""

    def __init__(self, resources=None):
        self.resources = resources  # resources.SessionResources; None: a bench's target, which makes no bench

    def cannot(self, what: str) -> str | Finding | None:
        if what == LOCAL_MODEL:
            return NO_LOCAL_MODEL
        if self.resources.endpoint is None:
            return NEEDS_A_SERVER if what == GOLDEN_GATE else NO_SERVER_BY_DESIGN
        return None

    def perf_bench(self, ctx: TestContext, model: Model, needs: Needs):
        resources = self.resources
        return PerfBench(ctx, runs=ServedRuns(ctx, resources.endpoint, lambda: resources.pool.tokenizer,
                                              resources.reference_endpoint))

    def golden_gate(self, ctx: TestContext, model: Model, needs: Needs, golden_dir: Path):
        resources = self.resources
        caches = resources.caches
        candidate = EndpointCandidate(resources.endpoint, lambda: resources.pool.tokenizer, caches.endpoint_answers)
        if resources.reference_endpoint is not None:
            pair = ServerPairCandidate(resources.endpoint.config, resources.reference_endpoint.config,
                                       caches.endpoint_answers)
            return ServerPairGate(pair, ctx, candidate, lambda: None, golden_dir, _model_name(resources),
                                  caches.comparisons, caches.generated)
        options = resources.options
        return GoldenGate(ctx, candidate, lambda: needs(lambda: resources.model(options.reference_precision)),
                          golden_dir, _model_name(resources), caches.comparisons, caches.generated)

def target_of(target_id: str, resources=None) -> Target:
    """The target of a test's parameter id (`infergate_precision`): the served model for ENDPOINT_ID, else that
    local precision."""
    return ServedTarget(resources) if target_id == ENDPOINT_ID else LocalTarget(target_id, resources)


def _model_name(resources) -> Callable[[], str]:
    return lambda: resources.pool.source.name  # read when a gate names the model

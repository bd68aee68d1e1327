"""What the gates ask of the target a test measures (`Target`, picked once in the fixture: gates.targets), and what
each kind of target is to a gate: its name in messages and why no budget can be checked on a measurement (`OnEngine`,
a local precision; `Served`, the served model). The benches read these and never branch on which target they
measure; the targets themselves, which also make the benches, are gates.targets. `Runs` is a target bound to one
test: how it runs a workload, an interleaved A/B and a speed experiment, and what it cannot run and why; the one
bench (gates.perf.PerfBench) gates what its runs measure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pytest_infergate.context import ENDPOINT_ID, TestContext
from pytest_infergate.measurement import Measurement, every_request_failed
from pytest_infergate.status import ENDPOINT_CHECK, Finding

# what a fixture asks a target for (Target.cannot)
LOCAL_MODEL, PERF_BENCH, GOLDEN_GATE = "a local model", "a perf bench", "a golden gate"
# what a test asks of its bench that only one kind of target runs (Runs.cannot)
SPEEDUP = "speedup()"
SERVED_LOAD_TOOLS = ("load()", "sweep()", "capacity()", "synchronous_rps()", "workload()", "token_exact_workload()")

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
        """The object behind `infergate_bench`: gates.perf.PerfBench over this target's Runs."""

    def golden_gate(self, ctx: TestContext, model: Model, needs: Needs, golden_dir: Path) -> Any:
        """The object behind `infergate_golden` (gates.golden.GoldenGate, or a pair of servers' gates.pair)."""

    def unusable(self, measurement: Measurement) -> str | None:
        """Why no budget can be checked on `measurement` (the test then fails), None where one can."""


class Runs(Protocol):
    """A target bound to one test (gates.local_runs.LocalRuns, gates.endpoint.ServedRuns): what differs between
    measuring a local precision and a served model. A call's `warmup` and `repeats` default to `defaults`."""

    target: Target
    defaults: tuple[int, int]

    def cannot(self, what: str) -> str | None:
        """Why this target cannot run `what` (SPEEDUP, one of SERVED_LOAD_TOOLS), naming the fix; None where it
        can."""

    def default_workload(self, num_requests: int | None = None) -> list:
        """The workload of a call that gives none."""

    def workload_run(self, requests: list | None, config: Any, label: str, tags: dict | None,
                     options: dict) -> Any:
        """The gates.gating.WorkloadRun of one call (`requests` None: default_workload(); `options`: the call's
        target-specific keywords); skips the test where the target cannot run `config` (before any workload is
        built), fails it on an unknown option."""

    def elsewhere(self, run: Any, warmup: int, repeats: int) -> Measurement | None:
        """The call measured another way where the run asks for it (the engine under --infergate-baseline-python:
        an interleaved A/B against the baseline environment), gated and recorded; None: measure `run` here."""

    def ab_sides(self, requests: list | None, config: Any, label: str, rounds: int, warmup: int,
                 options: dict) -> Any:
        """The gates.ab.AbSides of an interleaved A/B; skips the test where there is no other side."""

    def interleaved(self, requests: list, config: Any, slower_config: Any, warmup: int) -> tuple[Any, str]:
        """A speed experiment's round runner and why its sides are not step-locked ("" where they are)."""

    def close(self) -> None:
        """Let go of what the runs hold."""


class _Named:
    """What a user's test may read of its target (docs/reference/fixtures.md); the plugin asks `cannot` instead."""

    precision: str | None

    @property
    def is_endpoint(self) -> bool:
        return self.precision is None


class OnEngine(_Named):
    """A precision of --infergate-model on the reference engine, as a gate sees it."""

    name: ClassVar[str] = "engine"
    # a function of the measurement's own module: the gate's path after measuring runs no code of this one
    unusable = staticmethod(every_request_failed)

    def __init__(self, precision: str):
        self.precision = precision

    @property
    def id(self) -> str:
        return self.precision


class Served(_Named):
    """The model served at --infergate-endpoint, as a gate sees it: its failed requests are counted per kind (the
    budget's success_rate gates them), never a reason to stop."""

    name: ClassVar[str] = "endpoint"
    id: ClassVar[str] = ENDPOINT_ID
    precision: ClassVar[None] = None

    def unusable(self, measurement: Measurement) -> str | None:
        return None

"""Step-locked A/B and the speed experiments decided on its rounds. The two sides' engine steps take turns, A B B A
A B ..., each side timed on a clock that runs only during its own steps, so its TTFT, ITL and tokens/s mean what they
would alone; the order flips every step, so a spell of co-tenant load falls on both sides alike. Only for what both
sides run on the reference engine as one closed batch; anything else interleaves whole repetitions (`refusal` says
why). A speed experiment ("is X faster than Y?", "does the gain grow?") takes the speedup within each round and
decides on its 95% bootstrap interval: pass when it clears the claim, fail only when wholly on the wrong side, else
inconclusive. Why, with measurements: docs/explanation/perf-gates.md, 'Step-locked A/B'; docs/measurements.md."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from pytest_infergate.measurement import METRICS, Measurement, note_per_repetition
from pytest_infergate.perf import interference
from pytest_infergate.perf.interleaved import by_repetition
from pytest_infergate.process_meters import LoadFreeTimer, PeakMemory, PeakMemoryResult
from pytest_infergate.stats import paired_bootstrap_ci, percentile
from pytest_infergate.status import Status
from pytest_infergate.workloads.traffic import Session


class SideClock:
    """Seconds one side has run: advances only inside `running()`."""

    def __init__(self):
        self._elapsed = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._elapsed + running

    @contextmanager
    def running(self):
        self._since = time.perf_counter()
        try:
            yield
        finally:
            self._elapsed += time.perf_counter() - self._since
            self._since = None


class StepSide(Protocol):
    """One side of a step-locked round: `begin` (warm-up, submit), `step` while it returns True, `finish`."""

    def begin(self) -> None: ...

    def step(self) -> bool: ...

    def finish(self, into: Measurement) -> None: ...

    def abort(self) -> None: ...


def refusal(requests: list, backends: dict[str, str]) -> str:
    """Why this workload cannot run step-locked ("" if it can). `backends`: side name -> backend name."""
    if any(isinstance(item, Session) for item in requests):
        return "the workload has multi-turn sessions (each turn is sent when the one before it is answered)"
    if any(item.arrival_s > 0 for item in requests):
        return "the workload's requests arrive over time (arrival_s), and arrivals are wall-clock"
    if any(item.deadline_s is not None for item in requests):
        return "the workload's requests have deadlines, and deadlines are wall-clock"
    other = {side: name for side, name in backends.items() if name != "engine"}
    if other:
        return ", ".join(f"side {side} runs on {name}" for side, name in sorted(other.items())) + (
            ", which has no steps to take in turn")
    return ""


class LocalSide:
    """A side in this process: a Bench's engine (`instance` > 0: another engine of the same config, when both sides
    are the same model), stepped from outside. `around_step` wraps each step (benchmarks inject a slowdown there
    when both sides share one model object)."""

    def __init__(self, bench, requests: list, config, warmup: int, instance: int = 0,
                 around_step: Callable[[], AbstractContextManager] | None = None):
        self.bench, self.requests, self.config, self.warmup = bench, requests, config, warmup
        self.instance = instance
        self.around_step = around_step or nullcontext
        self._stack: ExitStack | None = None
        self.ids: list[str] = []

    def begin(self) -> None:
        self.engine, self.workload = self.bench.begin_repetition(self.requests, self.config, self.warmup,
                                                                 self.instance)
        self.clock = SideClock()
        self._stack = ExitStack()
        self._stack.enter_context(self.engine.use_clock(self.clock))
        self.rise = self.peak = 0
        self.method = ""
        self.ids = []
        # the side's own steps: their wall time, and what it would have been with no co-tenant (process_meters.
        # LoadFreeTimer), for the gate's load-corrected comparison on a busy runner
        self.stepped_s = self.load_free_s = 0.0
        self.load_free_measured = True
        self.load_free_by = ""
        with self.clock.running():  # tokenizing and queueing count, as in Engine.generate
            for item in self.workload:
                self.ids.append(self.engine.submit(item))

    def step(self) -> bool:
        # the peak of each own step, measured from just before it: the other side's steps are not counted
        load_free = LoadFreeTimer(self.engine, self.bench.device)
        with self.around_step(), PeakMemory(self.bench.device, allocated=False) as peak:
            started = self.clock()
            with self.clock.running():
                self.engine.step()
            wall = self.clock() - started
        self._count_load_free(wall, load_free)
        self.rise = max(self.rise, peak.result.delta_bytes)
        self.peak = max(self.peak, peak.result.peak_bytes)
        self.method = f"{peak.result.method}, own steps"
        return self.engine.has_unfinished

    def _count_load_free(self, wall: float, load_free: LoadFreeTimer) -> None:
        seconds = load_free.seconds(wall)
        if seconds is None:
            self.load_free_measured = False
            return
        self.stepped_s += wall
        self.load_free_s += seconds
        self.load_free_by = load_free.by

    def finish(self, into: Measurement) -> None:
        results = [self.engine.result(request_id) for request_id in self.ids]
        wall = self.clock()
        self.abort()
        share = self.load_free_s / self.stepped_s if self.load_free_measured and self.stepped_s > 0 else None
        note_per_repetition(into.load_free_share, share, into.repetitions)
        into.load_free_by = self.load_free_by
        self.bench.record_repetition(into, self.engine, self.workload, results, wall,
                                     PeakMemoryResult(self.method, self.peak, self.peak - self.rise))

    def abort(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            if self.engine.has_unfinished:  # a failed round: nothing of it may leak into the next repetition
                for request_id in self.ids:
                    self.engine.cancel(request_id)
                self.engine.step()
            stack.close()


def lockstep_round(a: StepSide, b: StepSide, into_a: Measurement, into_b: Measurement, a_first: bool) -> None:
    """One repetition of each side, their steps in turn (the order flipping after every step), into `into_a` and
    `into_b`; the share of the machine other processes took during the round goes to both (perf.interference).
    A side that finished first waits while the other runs out."""
    ours = [os.getpid()] + [pid for pid in (getattr(a, "pid", None), getattr(b, "pid", None)) if pid]
    try:
        before = interference.snapshot(ours)
        a.begin()
        b.begin()
        order = [a, b] if a_first else [b, a]
        running = {id(a): True, id(b): True}
        while any(running.values()):
            for side in order:
                if running[id(side)]:
                    running[id(side)] = side.step()
            order.reverse()
        others = interference.others_share(before, interference.snapshot(ours))
        note_per_repetition(into_a.others_share, others, into_a.repetitions)
        note_per_repetition(into_b.others_share, others, into_b.repetitions)
        a.finish(into_a)
        b.finish(into_b)
    except BaseException:
        a.abort()
        b.abort()
        raise


def rounds(a: StepSide, b: StepSide):
    """A RoundRunner (perf.interleaved.evaluate_ab) of step-locked rounds; which side steps first alternates by
    round."""
    def run_round(into_a: Measurement, into_b: Measurement, index: int) -> None:
        lockstep_round(a, b, into_a, into_b, a_first=index % 2 == 0)
    return run_round


def interleaved(a_bench, a_config, b_bench, b_config, requests, warmup: int):
    """The rounds of an A/B of two local benches (perf.local_bench.Bench; A: `a_bench` on `a_config`, B: `b_bench`
    on `b_config`): step-locked where both sides can step, else a whole repetition per side and turn. Returns the
    RoundRunner and why it is not step-locked ("" if it is)."""
    # no calibration probe: the interleaving itself cancels drift of the machine
    # the same model on both sides: side A gets an engine of its own (asked for its name here, so that no
    # engine is built that the rounds do not use)
    a_instance = 1 if a_bench is b_bench else 0
    refused = refusal(requests, {"A": a_bench.engine(a_config, a_instance).name, "B": b_bench.engine(b_config).name})
    if refused:
        return by_repetition(lambda m: a_bench.run_once(requests, a_config, warmup, m, probe=False),
                             lambda m: b_bench.run_once(requests, b_config, warmup, m, probe=False)), refused
    return rounds(LocalSide(a_bench, requests, a_config, warmup, instance=a_instance),
                  LocalSide(b_bench, requests, b_config, warmup)), refused


def how(refused: str) -> str:
    """How an A/B was interleaved, for its record's note."""
    if refused:
        return f"interleaved A/B, a repetition per side and turn (not step-locked: {refused})"
    return "step-locked A/B (engine steps in turn, each side timed on its own steps)"


RERUN_OR_MORE_ROUNDS = "rerun the job (each run reads the runner's load anew), or take more rounds, to decide"


@dataclass(frozen=True)
class Speedup:
    """How many times faster one side ran than the other: the median of per-round ratios, with its 95% interval."""

    name: str
    ratio: float
    low: float
    high: float
    rounds: int

    def __post_init__(self):
        if not 0 < self.low <= self.high:
            raise ValueError(f"Speedup {self.name!r}: low and high must satisfy 0 < low <= high, got "
                             f"{self.low}, {self.high}")

    def describe(self) -> str:
        return f"{self.name} ×{self.ratio:.2f} (95% CI {self.low:.2f}-{self.high:.2f}, {self.rounds} rounds)"


def speedup(name: str, fast: Sequence[float], slow: Sequence[float], higher_is_better: bool = True) -> Speedup:
    """The speedup of `fast` over `slow` from one value per round each (`fast[i]` and `slow[i]` measured in the
    same round): fast/slow for a throughput, slow/fast for a time (`higher_is_better=False`)."""
    if len(fast) != len(slow) or not fast:
        raise ValueError(f"speedup {name!r}: needs one value per round on each side, got {len(fast)} and "
                         f"{len(slow)}")
    if min(fast) <= 0 or min(slow) <= 0:
        raise ValueError(f"speedup {name!r}: values must be positive, got {list(fast)} and {list(slow)}")
    ratios = [(f / s if higher_is_better else s / f) for f, s in zip(fast, slow)]
    point, low, high = paired_bootstrap_ci(ratios, lambda xs: percentile(xs, 50))
    return Speedup(name, point, low, high, len(ratios))


@dataclass(frozen=True)
class Claim:
    """One claim of an experiment, its decision and the intervals it was decided on."""

    claim: str
    status: Status
    evidence: str

    def describe(self) -> str:
        return f"{self.status.upper()}: {self.claim}: {self.evidence}"


def faster(s: Speedup) -> Claim:
    """Passes when the whole interval lies above 1, fails when it lies at or below 1, else inconclusive."""
    status = Status.PASS if s.low > 1.0 else Status.FAIL if s.high <= 1.0 else Status.INCONCLUSIVE
    return Claim(f"{s.name} is faster", status, s.describe())


def grows(before: Speedup, after: Speedup) -> Claim:
    """Passes when `after`'s interval lies wholly above `before`'s, fails when wholly at or below it, else
    inconclusive (overlapping intervals cannot tell which is larger)."""
    if after.low > before.high:
        status = Status.PASS
    elif after.high <= before.low:
        status = Status.FAIL
    else:
        status = Status.INCONCLUSIVE
    return Claim(f"the speedup grows from {before.name} to {after.name}", status,
                   f"{before.describe()} -> {after.describe()}")


def conclusion(experiment: str, claims: Sequence[Claim]) -> tuple[Status, str]:
    """The experiment's status (the worst of its claims) and a message listing every claim; an inconclusive
    one says how to decide it."""
    status = Status.worst(f.status for f in claims)
    lines = [f"{experiment}: {status.upper()}"] + ["  " + f.describe() for f in claims]
    if status == Status.INCONCLUSIVE:
        lines.append(f"  the intervals overlap their threshold: too noisy to decide here; {RERUN_OR_MORE_ROUNDS}")
    return status, "\n".join(lines)


def per_round(measurement: Measurement, metric: str) -> list[float]:
    """One value of `metric` per repetition: a per-request metric's median within each, else its samples."""
    split = measurement.by_repetition(metric) if METRICS[metric][2] else None
    return [percentile(xs, 50) for xs in split] if split else measurement.samples[metric]

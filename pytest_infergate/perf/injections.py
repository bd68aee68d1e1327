"""Known regressions injected on purpose, to check that a gate catches them (benchmarks/gate_power.py,
benchmarks/figure_power.py, the tests): a slowdown after every forward (asleep or computing), one after prefill
forwards only (time to first token alone), and memory held through each repetition of a Bench."""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from statistics import median
from typing import TYPE_CHECKING

from pytest_infergate.requirements import import_torch

if TYPE_CHECKING:
    from pytest_infergate.perf.local_bench import Bench

MIB = 1024 * 1024


def _tokens(args, kwargs) -> int:
    ids = kwargs.get("input_ids", args[0] if args else None)
    return int(ids.numel()) if ids is not None else 0


class QuietForwardTimes:
    """Each forward size's time (median seconds by its number of input tokens) recorded on a quiet machine, so an
    injected slowdown adds the same seconds quiet or under a CPU hog: a slowdown scaled by the forward's time as
    measured would grow with the load and overstate what a gate caught on a busy runner."""

    def __init__(self):
        self.times: dict[int, list[float]] = {}

    @contextmanager
    def recording(self, model):
        starts: list[float] = []

        def before(module, args, kwargs):
            starts.append(time.perf_counter())

        def after(module, args, kwargs, output):
            self.times.setdefault(_tokens(args, kwargs), []).append(time.perf_counter() - starts.pop())
            return output

        with _Hooks(model, before, after):
            yield self

    def of(self, tokens: int) -> float:
        """The recorded time of the nearest recorded size, scaled to `tokens`'s size beyond the largest."""
        if not self.times:
            raise ValueError("QuietForwardTimes.of: nothing recorded; run a workload inside recording() first")
        nearest = min(self.times, key=lambda n: abs(n - tokens))
        return median(self.times[nearest]) * max(1.0, tokens / max(1, nearest))


class _Hooks(ExitStack):
    """`before` and `after` hooked around each forward of `model` while entered; on the way out torch's own handles
    remove them (ExitStack's exit: a test failed inside the `with` reaches its report through no code of ours)."""

    def __init__(self, model, before, after):
        super().__init__()
        self.model, self.before, self.after = model, before, after

    def __enter__(self) -> _Hooks:
        self.callback(self.model.register_forward_pre_hook(self.before, with_kwargs=True).remove)
        self.callback(self.model.register_forward_hook(self.after, with_kwargs=True).remove)
        return self


def injected_slowdown(model, fraction: float, busy: bool = False, quiet: QuietForwardTimes | None = None) -> ExitStack:
    """Make every forward of `model` take (1 + fraction) times as long, by waiting after it for `fraction` of its
    own time: its quiet time from `quiet` where given (the same seconds under any load), else as measured now;
    asleep, or with `busy` computing (torch matmuls, on the threads the forward used), which is what a slower
    library does to the machine; a sleep leaves the cores to everything else meanwhile."""
    starts: list[float] = []
    wait = _busy_waiter() if busy else time.sleep

    def before(module, args, kwargs):
        starts.append(time.perf_counter())

    def after(module, args, kwargs, output):
        elapsed = time.perf_counter() - starts.pop()
        wait((quiet.of(_tokens(args, kwargs)) if quiet is not None else elapsed) * fraction)
        return output

    return _Hooks(model, before, after)


@contextmanager
def held_allocation(bench: Bench, mib: float):
    """Hold `mib` MiB, written (resident), through each repetition of `bench`'s workloads: what a change that keeps
    more memory while serving does (a larger workspace, a dequantized copy), injected to prove the memory gate's
    power (benchmarks/gate_power.py, benchmarks/memory_repro.py)."""
    torch = import_torch()

    @contextmanager
    def holding():
        held = torch.ones(int(mib * MIB) // 4, dtype=torch.float32)
        try:
            yield
        finally:
            del held

    before, bench.beside_repetition = bench.beside_repetition, holding
    try:
        yield bench
    finally:
        bench.beside_repetition = before


def injected_prefill_slowdown(model, fraction: float, min_tokens: int = 16,
                              quiet: QuietForwardTimes | None = None) -> ExitStack:
    """Make every forward of `model` with at least `min_tokens` input tokens (a prefill: a decode step of the
    benchmarks' workloads feeds one token per running sequence, at most 8) take (1 + fraction) times as long, asleep
    after it: a change that slows time to first token alone (benchmarks/gate_power.py)."""
    starts: list[float] = []

    def before(module, args, kwargs):
        starts.append(time.perf_counter())

    def after(module, args, kwargs, output):
        elapsed = time.perf_counter() - starts.pop()
        tokens = _tokens(args, kwargs)
        if tokens >= min_tokens:
            time.sleep((quiet.of(tokens) if quiet is not None else elapsed) * fraction)
        return output

    return _Hooks(model, before, after)


def _busy_waiter():
    torch = import_torch()

    x, w = torch.ones(32, 576), torch.ones(576, 1536)  # ~0.5 ms a matmul on an idle 2-core runner

    def busy_wait(seconds: float) -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            torch.mm(x, w)

    return busy_wait

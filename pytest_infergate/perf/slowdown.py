"""A known slowdown, injected on purpose, to check that a gate catches it (benchmarks/gate_power.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager

from pytest_infergate.lazy import import_torch


@contextmanager
def injected_slowdown(model, fraction: float, busy: bool = False):
    """Make every forward of `model` take (1 + fraction) times as long, by waiting after it for `fraction` of its
    own measured time: asleep, or with `busy` computing (torch matmuls, on the threads the forward used), which
    is what a slower library does to the machine; a sleep leaves the cores to everything else meanwhile."""
    starts: list[float] = []
    wait = _busy_waiter() if busy else time.sleep

    def before(module, args, kwargs):
        starts.append(time.perf_counter())

    def after(module, args, kwargs, output):
        elapsed = time.perf_counter() - starts.pop()
        wait(elapsed * fraction)
        return output

    pre = model.register_forward_pre_hook(before, with_kwargs=True)
    post = model.register_forward_hook(after, with_kwargs=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def _busy_waiter():
    torch = import_torch()

    x, w = torch.ones(32, 576), torch.ones(576, 1536)  # ~0.5 ms a matmul on an idle 2-core runner

    def busy_wait(seconds: float) -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            torch.mm(x, w)

    return busy_wait

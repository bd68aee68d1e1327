"""A known slowdown, injected on purpose, to check that a gate catches it (benchmarks/gate_power.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def injected_slowdown(model, fraction: float):
    """Make every forward of `model` take (1 + fraction) times as long, by sleeping after it for `fraction` of
    its own measured time. For checking that a gate detects a known slowdown."""
    starts: list[float] = []

    def before(module, args, kwargs):
        starts.append(time.perf_counter())

    def after(module, args, kwargs, output):
        elapsed = time.perf_counter() - starts.pop()
        time.sleep(elapsed * fraction)
        return output

    pre = model.register_forward_pre_hook(before, with_kwargs=True)
    post = model.register_forward_hook(after, with_kwargs=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()

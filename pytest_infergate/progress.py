"""Progress of long work (model conversion, repetitions of a measurement, golden generation, capacity search, the
baseline environment's worker) on the terminal, past pytest's output capture, with an estimate of what is left.

The mechanics call `report(...)`; the session installs where it goes (pytest's terminal writer on the controller,
nothing under -q or in an xdist worker, whose output nobody reads). With no sink installed it is silent."""

from __future__ import annotations

import time
from collections.abc import Callable

_sink: Callable[[str], None] | None = None


def current_sink() -> Callable[[str], None] | None:
    return _sink


def set_sink(sink: Callable[[str], None] | None) -> None:
    global _sink
    _sink = sink


def report(message: str) -> None:
    if _sink is not None:
        _sink(f"infergate: {message}")


EVERY_S = 5.0  # work shorter than this prints nothing; longer work a line this often, and one when it ends


class Steps:
    """`done` of `total` steps of one piece of work, the time left estimated from the ones done so far."""

    def __init__(self, what: str, total: int, most: int | None = None):
        # `most`: work that goes on past `total` steps while it needs to (a repetition plan), up to `most`
        self.what, self.total, self.most = what, total, most if most and most > total else None
        self.started = self.last = time.monotonic()

    def step(self, done: int, finished: bool = False) -> None:
        """`done` steps so far (shown as at most `total` where there is no `most`); `finished`: the work ended."""
        now = time.monotonic()
        done = done if self.most else min(done, self.total)
        ended = finished or done >= (self.most or self.total)
        if now - self.last >= EVERY_S or (ended and self.last > self.started):
            self.last = now
            of = f"{self.total}–{self.most}" if self.most else str(self.total)
            left = (now - self.started) / max(done, 1) * (self.total - done)
            report(f"{self.what}: {done} of {of}" + (f", {now - self.started:.0f} s" if ended else
                                                     f", about {left:.0f} s left" if done < self.total else ""))

"""The engine's clock for a measured repetition that also notes each reading's run-queue wait, so that each
request's latencies can be read with its own waiting for a CPU taken out (perf.local_bench). Apart from
process_meters, which the decision modules read, since this one reads the time."""

from __future__ import annotations

import bisect
import os
import time

from pytest_infergate.process_meters import TASKS, thread_id


class WaitClock:
    """The engine's clock (perf_counter seconds) for a repetition on one computing thread, which notes at each
    reading how long this thread has waited for a CPU so far (its run-queue delay, schedstat). `load_free(t)` is
    the instant `t` less the waiting up to it: a request's latencies between two such instants are what they would
    have been with the CPU to itself, each request's own (a repetition's load-free share is the whole repetition's,
    and a time-sliced co-tenant stretches some requests and not others). Exact for one thread, where the waits
    are the whole of what co-tenants do; not made for a team (`for_this_thread` is None where not measurable)."""

    def __init__(self, fd: int):
        self._fd = fd
        self.walls: list[float] = []
        self.waits: list[float] = []

    @classmethod
    def for_this_thread(cls) -> WaitClock | None:
        try:
            fd = os.open(f"{TASKS}/{thread_id()}/schedstat", os.O_RDONLY)
        except OSError:  # not Linux, or no schedstat
            return None
        clock = cls(fd)
        try:
            clock()
        except (OSError, ValueError, IndexError):
            clock.close()
            return None
        return clock

    def __call__(self) -> float:
        wait = int(os.pread(self._fd, 128, 0).split()[1]) / 1e9  # waited before this instant
        now = time.perf_counter()
        self.walls.append(now)
        self.waits.append(wait)
        return now

    def load_free(self, instant: float) -> float:
        """`instant` (a reading of this clock, or between two) less the thread's waiting since the first reading."""
        index = bisect.bisect_right(self.walls, instant) - 1
        return instant - (self.waits[max(index, 0)] - self.waits[0])

    def close(self) -> None:
        os.close(self._fd)

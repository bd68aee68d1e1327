"""The engine thread's own speed, read right before and right after each repetition on the thread that runs it.

Two fresh processes of the same code on the same VM run a workload at speeds that differ by several percent — the
host's clock and neighbours move between them, invisibly to the guest — and a stored baseline is always another
process. perf.calibration's probe runs in a child process on numpy's BLAS, on whichever CPU is free, and does not
follow that move; a short pure-Python loop on the engine's own thread does (docs/measurements.md, "the engine
thread's speed"). It runs no library a gate is gating, so a torch or bitsandbytes upgrade does not run in it; a
Python build does (the probe's name carries it), and so does whatever slows the thread's own CPU in the process (a
tracer a dependency installs, a clock drop). perf.stored normalizes a comparison by it to decide a pass that the
drift between processes alone left undecided; it never makes a failure.
"""

from __future__ import annotations

import platform
import sys
import sysconfig
import time

# The probe's name: readings compare only between measurements that name the same probe on the same interpreter
# build (its version and build string, ABI flags, a free-threaded build apart): another build runs the loop at
# another speed, and is a change under test.
THREAD_PROBE = (f"python-dict-loop/1 {platform.python_implementation()} {sys.version.replace(chr(10), ' ')} "
                f"abi{sys.abiflags or '-'}{' nogil' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''}")
ROUNDS = 3  # the least of these runs is the thread's speed: a run the scheduler interrupted reads slow
LOOP = 40_000  # about 3-4 ms a run on one core of the CI VMs: short beside a repetition, long beside a time slice


def _one_run() -> float:
    counts: dict[int, int] = {}
    start = time.thread_time()  # the thread's CPU time: a wait for a CPU is not the thread's speed
    for i in range(LOOP):
        counts[i % 97] = counts.get(i % 97, 0) + i
    return time.thread_time() - start


def probe_seconds() -> float:
    """The least of ROUNDS runs of the loop, in seconds of the thread's CPU time: a co-tenant that takes the
    thread's CPU for a while does not count, a host that runs the vCPU slower does."""
    return min(_one_run() for _ in range(ROUNDS))

"""What the kernel and the CUDA allocator count of this process over a stretch of work, for the measurements. Peak
memory (`PeakMemory`): on CUDA the allocator's peak counters (allocated, reserved), reset at the start; on the CPU
under Linux the kernel's high-water mark of resident memory (VmHWM, reset by writing 5 to /proc/self/clear_refs);
elsewhere a thread samples RSS every few milliseconds (it can miss short spikes). Our threads' time on a CPU and
runnable but waiting in a run queue (/proc/self/task/TID/schedstat), which is what co-tenant load (another CI job, a
CPU hog) does to us: team_progress_s turns it into the time the work would have taken with the CPUs to ourselves
(perf.local_bench records it per repetition, perf.stored decides with it on a busy runner). Elsewhere than Linux no
thread time is read, and every caller falls back to wall time."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import threading
from dataclasses import dataclass

import psutil

from pytest_infergate.measurement import DEVICE_TIME, RUN_QUEUE
from pytest_infergate.requirements import import_torch

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


@dataclass
class PeakMemoryResult:
    method: str
    peak_bytes: int  # process RSS peak on CPU; max_memory_allocated on CUDA
    start_bytes: int
    reserved_peak_bytes: int | None = None
    # On the CPU with glibc: how far the bytes malloc has handed out and not taken back rose above their start
    # (malloc_in_use, sampled): what the work allocated, whatever the allocator kept of earlier frees. None elsewhere.
    in_use_rise_bytes: int | None = None

    @property
    def delta_bytes(self) -> int:
        """What the work raised memory by: the allocated bytes' rise where measured (reproducible across
        processes), else the peak's rise above the start."""
        if self.in_use_rise_bytes is not None:
            return max(0, self.in_use_rise_bytes)
        return max(0, self.peak_bytes - self.start_bytes)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded on first use (finding it runs ldconfig: not at import, which every pytest run pays);
    None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def malloc_in_use() -> int | None:
    """The bytes glibc's malloc has handed out and not taken back (mallinfo2: in use in every arena plus the mmapped
    chunks), the torch tensors on the CPU among them: unlike the resident set, not what malloc freed and kept, which
    depends on the process's history (docs/explanation/perf-gates.md). None without glibc ≥ 2.33."""
    call = getattr(_libc(), "mallinfo2", None)
    if call is None:
        return None
    call.restype = _MallInfo2
    info = call()
    return int(info.uordblks + info.hblkhd)


def _read_hwm() -> int | None:
    try:
        with open(_STATUS) as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def release_free_memory() -> None:
    """Free what only reference cycles hold, then give the C heap's free pages back to the kernel (glibc's
    malloc_trim), so that a repetition's allocations are counted from what is live and its resident peak is not
    served from what an earlier one freed. Called before a measured repetition's PeakMemory, not inside it: a
    collection takes a tenth of a second, which no timer of the repetition may see."""
    gc.collect()  # tensors held only by reference cycles are freed now, not whenever the collector next runs
    trim = getattr(_libc(), "malloc_trim", None)  # not glibc (musl, macOS): nothing to trim by
    if trim is not None:
        trim(0)


def _reset_hwm() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Context manager: `with PeakMemory(device) as peak: ...; peak.result`."""

    def __init__(self, device: str = "cpu", sample_interval_s: float = 0.002, allocated: bool = True):
        """`allocated`: on the CPU, also sample the bytes malloc has handed out (malloc_in_use) with a thread, whose
        rise is then the result's delta; off for stretches too short for a thread (perf.lockstep's steps)."""
        self.device = device
        self.allocated = allocated
        self.sample_interval_s = sample_interval_s
        self.result: PeakMemoryResult | None = None
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        self._sampled_peak = 0

    def __enter__(self) -> PeakMemory:
        if self.device.startswith("cuda"):
            torch = import_torch()

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            self._method = "cuda.max_memory_allocated"
        else:
            self._start = psutil.Process().memory_info().rss
            self._in_use_start = malloc_in_use() if self.allocated else None
            self._in_use_peak = self._in_use_start
            if _reset_hwm() and _read_hwm() is not None:
                self._method = "VmHWM"
            else:
                self._method = "rss-sampling"
                self._sampled_peak = self._start
            if self._method == "rss-sampling" or self._in_use_start is not None:
                self._sampler = threading.Thread(target=self._sample, daemon=True)
                self._sampler.start()
        return self

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(self.sample_interval_s):
            if self._method == "rss-sampling":
                self._sampled_peak = max(self._sampled_peak, process.memory_info().rss)
            if self._in_use_start is not None:
                self._in_use_peak = max(self._in_use_peak, malloc_in_use() or 0)

    def _stop_sampler(self) -> int | None:
        """Stop the sampler; the allocated bytes' rise (one last reading included), or None where not read."""
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
        if self._in_use_start is None:
            return None
        return max(self._in_use_peak, malloc_in_use() or 0) - self._in_use_start

    def __exit__(self, *exc) -> None:
        if self._method.startswith("cuda"):
            torch = import_torch()

            torch.cuda.synchronize(self.device)
            self.result = PeakMemoryResult(self._method, torch.cuda.max_memory_allocated(self.device), self._start,
                                           torch.cuda.max_memory_reserved(self.device))
        elif self._method == "VmHWM":
            rise = self._stop_sampler()
            self.result = PeakMemoryResult(self._method + (" + malloc in use" if rise is not None else ""),
                                           _read_hwm() or 0, self._start, in_use_rise_bytes=rise)
        else:
            rise = self._stop_sampler()
            rss = psutil.Process().memory_info().rss
            self.result = PeakMemoryResult(self._method, max(self._sampled_peak, rss), self._start,
                                           in_use_rise_bytes=rise)


TASKS = "/proc/self/task"


@dataclass(frozen=True)
class ThreadTimes:
    cpu_s: float  # on a CPU
    wait_s: float  # runnable, waiting in a run queue for a CPU


def thread_id() -> int:
    return threading.get_native_id()


def _read_schedstat(path: str) -> ThreadTimes | None:
    try:
        with open(path, "rb") as stat:
            fields = stat.read().split()
    except OSError:  # a thread that ended, or no schedstat on this kernel
        return None
    if len(fields) < 2:
        return None
    return ThreadTimes(int(fields[0]) / 1e9, int(fields[1]) / 1e9)


def threads() -> dict[int, ThreadTimes]:
    """Every thread of this process now; {} where the kernel does not say (not Linux)."""
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return {}
    out = {}
    for tid in tids:
        times = _read_schedstat(f"{TASKS}/{tid}/schedstat")
        if times is not None:
            out[int(tid)] = times
    return out


def delta(before: dict[int, ThreadTimes], after: dict[int, ThreadTimes]) -> dict[int, ThreadTimes]:
    """What each thread alive at both instants did between them (a thread born in between counts from zero)."""
    zero = ThreadTimes(0.0, 0.0)
    return {tid: ThreadTimes(t.cpu_s - before.get(tid, zero).cpu_s, t.wait_s - before.get(tid, zero).wait_s)
            for tid, t in after.items()}


def team_progress_s(wall_s: float, times: dict[int, ThreadTimes], main: int, computing: float = 0.1) -> float:
    """An estimate of how long `wall_s` of work would have taken with the CPUs to ourselves: the main thread's time
    off a CPU by choice (asleep, blocked) plus its time on a CPU while every other computing thread (on a CPU for
    more than `computing` of the wall time) was on one too. A team of threads meeting at a barrier (torch's OpenMP
    pool) progresses only while all are on a CPU, and spinning keeps each runnable, so neither "wall less our
    run-queue wait" nor CPU time removes the load: both keep the time one thread spun while another waited. Each
    other thread was on a CPU for cpu / (cpu + wait) of the time it was runnable; the estimate takes those shares
    as independent. Under a CPU hog it is not exact, and it errs most where one busy loop shares two cores (the
    shares are then anticorrelated): benchmarks/load_evidence.py, docs/measurements.md."""
    own = times.get(main)
    if own is None:
        return wall_s
    asleep = max(0.0, wall_s - own.cpu_s - own.wait_s)
    share = 1.0
    for tid, t in times.items():
        if tid != main and t.cpu_s > computing * wall_s and t.cpu_s + t.wait_s > 0:
            share *= t.cpu_s / (t.cpu_s + t.wait_s)
    return asleep + own.cpu_s * share



class LoadFreeTimer:
    """How long a stretch of an engine's work would have taken with no co-tenant, from its start (construction) to
    `seconds(wall)`: on the CPU, team_progress_s of our threads; on a CUDA device, the device's time in the
    engine's forwards by CUDA events (engine.runner: CPU co-tenants slow the host's launches, not the kernels; the
    host's own work between forwards is left out on both sides alike). None where neither is measured (not Linux;
    the HF generate backend on a GPU)."""

    def __init__(self, engine, device: str):
        self.engine = engine
        self.on_device = device != "cpu"
        self.by = DEVICE_TIME if self.on_device else RUN_QUEUE
        self._device_s = getattr(engine, "device_s", None) if self.on_device else None
        self._threads = {} if self.on_device else threads()

    def seconds(self, wall: float) -> float | None:
        if self.on_device:
            now = getattr(self.engine, "device_s", None)
            return None if now is None or self._device_s is None else min(wall, now - self._device_s)
        times = delta(self._threads, threads()) if self._threads else {}
        return min(wall, team_progress_s(wall, times, thread_id())) if times else None

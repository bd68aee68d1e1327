"""Peak memory of a region of code.

CUDA: the allocator's own peak counters (allocated and reserved), reset at the start of the region.
CPU on Linux: the kernel's high-water mark of resident memory (VmHWM), reset by writing 5 to
/proc/self/clear_refs. Elsewhere a thread samples RSS every few milliseconds (it can miss short spikes).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psutil

from pytest_infergate.requirements import import_torch

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


@dataclass
class PeakMemoryResult:
    method: str
    peak_bytes: int  # process RSS peak on CPU; max_memory_allocated on CUDA
    start_bytes: int
    reserved_peak_bytes: int | None = None

    @property
    def delta_bytes(self) -> int:
        return max(0, self.peak_bytes - self.start_bytes)


def _read_hwm() -> int | None:
    try:
        with open(_STATUS) as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Context manager: `with PeakMemory(device) as peak: ...; peak.result`."""

    def __init__(self, device: str = "cpu", sample_interval_s: float = 0.002):
        self.device = device
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
            if _reset_hwm() and _read_hwm() is not None:
                self._method = "VmHWM"
            else:
                self._method = "rss-sampling"
                self._sampled_peak = self._start
                self._sampler = threading.Thread(target=self._sample, daemon=True)
                self._sampler.start()
        return self

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(self.sample_interval_s):
            self._sampled_peak = max(self._sampled_peak, process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        if self._method.startswith("cuda"):
            torch = import_torch()

            torch.cuda.synchronize(self.device)
            self.result = PeakMemoryResult(self._method, torch.cuda.max_memory_allocated(self.device), self._start,
                                           torch.cuda.max_memory_reserved(self.device))
        elif self._method == "VmHWM":
            self.result = PeakMemoryResult(self._method, _read_hwm() or 0, self._start)
        else:
            self._stop.set()
            self._sampler.join()
            rss = psutil.Process().memory_info().rss
            self.result = PeakMemoryResult(self._method, max(self._sampled_peak, rss), self._start)

"""The kernel's per-thread counters (pytest_infergate.process_meters): what a busy runner did to our threads."""

from __future__ import annotations

import sys
import time

import pytest

from pytest_infergate import process_meters
from pytest_infergate.process_meters import ThreadTimes, team_progress_s

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux's")


def spin(cpu_seconds: float) -> None:
    """Compute until this thread has had `cpu_seconds` of CPU, however busy the machine."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


@linux_only
def test_the_main_thread_is_read_and_its_cpu_time_grows_while_it_computes():
    main = process_meters.thread_id()
    before = process_meters.threads()
    spin(0.2)
    grown = process_meters.delta(before, process_meters.threads())
    assert main in grown
    assert grown[main].cpu_s > 0.15
    assert grown[main].wait_s >= 0.0


def test_nothing_is_read_where_the_kernel_does_not_say(monkeypatch, tmp_path):
    monkeypatch.setattr(process_meters, "TASKS", str(tmp_path / "absent"))
    assert process_meters.threads() == {}


def test_a_single_thread_loses_exactly_its_run_queue_wait():
    # 10 s of wall: 6 s on a CPU, 3 s waiting for one, 1 s asleep -> 7 s with the CPUs to itself
    assert team_progress_s(10.0, {1: ThreadTimes(6.0, 3.0)}, main=1) == pytest.approx(7.0)


def test_a_team_progresses_only_while_every_computing_thread_is_on_a_cpu():
    # two spinning threads, each on a CPU half the time it was runnable (one busy loop per core beside them):
    # the main thread's 6 s on a CPU made progress only while the other was on one too, half of it
    times = {1: ThreadTimes(6.0, 6.0), 2: ThreadTimes(6.0, 6.0)}
    assert team_progress_s(12.0, times, main=1) == pytest.approx(3.0)
    # a thread that barely ran (a tokenizer's, a logger's) is not part of the team
    times[3] = ThreadTimes(0.01, 5.0)
    assert team_progress_s(12.0, times, main=1) == pytest.approx(3.0)


def test_on_a_quiet_machine_the_estimate_is_the_wall_time():
    times = {1: ThreadTimes(4.0, 0.0), 2: ThreadTimes(4.0, 0.0)}
    assert team_progress_s(4.0, times, main=1) == pytest.approx(4.0)
    assert team_progress_s(4.0, {}, main=1) == 4.0  # the main thread unread: nothing to correct by


def test_an_injected_slowdown_adds_the_quiet_forward_time_whatever_the_load():
    torch = pytest.importorskip("torch")
    from pytest_infergate.perf.injections import QuietForwardTimes, injected_slowdown

    class Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cost_s = 0.02

        def forward(self, input_ids):
            time.sleep(self.cost_s)
            return input_ids

    model, ids = Forward(), torch.zeros(1, 4, dtype=torch.long)
    quiet = QuietForwardTimes()
    with pytest.raises(ValueError, match="nothing recorded"):
        quiet.of(4)
    with quiet.recording(model):
        for _ in range(3):
            model(input_ids=ids)
    assert quiet.of(4) == pytest.approx(0.02, abs=0.015)
    model.cost_s = 0.2  # the machine four times busier now: the injected wait stays the quiet forward's
    start = time.perf_counter()
    with injected_slowdown(model, 1.0, quiet=quiet):
        model(input_ids=ids)
    assert time.perf_counter() - start < 0.2 + 0.1

"""Which project files does one perf gate run after its measurement? (#42, #57: the traced call should touch few.)

    python benchmarks/gate_trace.py              # tiny-random-llama, fp32: a pass, a failure, an undecided one
    python benchmarks/gate_trace.py --functions  # each function's calls, not only each file's

Traces the call of the issue: `infergate_bench(...)` under `@pytest.mark.infergate_budget(max_regression=0.1)`
with `--infergate-baseline` (saved by a first run), along three paths: **pass** (unchanged code), **fail** (every
timed figure ×3) and **inconclusive under --infergate-strict** (the baseline's header rewritten to claim another
machine, so its timings are no yardstick and strict fails the test). A conftest profiles every call into the
pytest_infergate package from the moment the measurement returns until the session has taken the test's call report
(`pytest_runtest_logreport`, after the record was delivered into the report and strict applied), leaving out the
re-measurements (measuring more is measurement, not the gate).

The model runs each repetition for real, but the figures the gate reads are written over with steady ones (the same
small jitter per repetition in the save and in the run; ×3 on the fail path), and the runner reads as quiet (the
kernel's load evidence off): which path a run takes is fixed, not drawn by the machine's noise (a busy runner's
decision is another path, with its own files). Prints, per path, the files and how many calls each took, and their
count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TEST = """\
import pytest
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(prompt_token_ids=[5 + i] * (8 + i), max_new_tokens=6, ignore_eos=True) for i in range(4)]

@pytest.mark.infergate_budget(max_regression=0.1)
def test_speed(infergate_bench):
    infergate_bench(REQS, EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=2, warmup=1)
"""

CONFTEST = """\
# counts the pytest_infergate files that run after the measurement, until the session took the call's report
import json
import os
import sys

import pytest

import pytest_infergate
from pytest_infergate.measurement import MEMORY_METRICS, THROUGHPUT_METRICS
from pytest_infergate.perf import interference
from pytest_infergate.perf.local_bench import Bench

PACKAGE = os.path.dirname(pytest_infergate.__file__)
seen: dict[str, int] = {}


def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
        name = os.path.relpath(frame.f_code.co_filename, PACKAGE)
        if os.environ.get("TRACE_FUNCTIONS"):
            name += ":" + frame.f_code.co_qualname
        seen[name] = seen.get(name, 0) + 1


def measuring(original, after):
    def wrapped(*args, **kwargs):
        sys.setprofile(None)  # measuring more is measurement, not the gate
        try:
            return original(*args, **kwargs)
        finally:
            if after:
                sys.setprofile(profile)
    return wrapped


# the figures the gate reads, per repetition: a latency in ms, a throughput per second, memory in MiB
STEADY = {"ttft_ms": 20.0, "tpot_ms": 5.0, "itl_ms": 5.0, "e2e_ms": 45.0, "queue_ms": 1.0, "tokens_per_s": 400.0,
          "requests_per_s": 60.0, "peak_mem_mb": 300.0, "kv_mem_mb": 1.0}


def steady(original):
    # Bench.run_once, its repetition's figures written over with steady ones: the path is fixed, not the noise's
    def run_once(self, requests, config, warmup, into, probe=None):
        results = original(self, requests, config, warmup, into, probe)
        index = into.repetitions - 1
        slower = (3.0 if os.environ.get("TRACE_SLOWER") else 1.0) * (1.0 + 0.01 * ((index * 3) % 5 - 2))
        for metric, values in into.samples.items():
            ends = into.repetition_ends.get(metric) or []
            if metric not in STEADY or len(ends) != into.repetitions:
                continue
            start = ends[-2] if len(ends) > 1 else 0
            scale = 1.0 if metric in MEMORY_METRICS else 1.0 / slower if metric in THROUGHPUT_METRICS else slower
            values[start:ends[-1]] = [STEADY[metric] * scale] * (ends[-1] - start)
            if metric in into.load_free_samples:
                into.load_free_samples[metric][start:ends[-1]] = values[start:ends[-1]]
        for readings in (into.probe_s, into.probe_quiet_s, into.thread_probe_s):
            if readings:
                readings[-1] = 0.01
        if into.load_free_share:
            into.load_free_share[-1] = 1.0
        return results
    return run_once


Bench.run_once = steady(Bench.run_once)
Bench.measure = measuring(Bench.measure, after=True)
Bench.extend = measuring(Bench.extend, after=True)
# the path of a quiet runner, on a busy one too: the kernel's load evidence would take the busy-runner decision
# (perf.busy), another path with its own files
interference.snapshot = lambda pids: None


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    # after the session's own (tryfirst) took the record out of the call's report: the test's outcome is settled
    if report.when == "call":
        sys.setprofile(None)
        with open("traced.json", "w") as out:
            json.dump(seen, out, indent=1)
"""

OPTIONS = ["-q", "-p", "no:cacheprovider", "--infergate-model=tiny-random-llama", "--infergate-precisions=fp32"]


PATHS = {  # path: (the run's options, its environment, the exit code it must end with)
    "pass": ([], {}, 0),
    "fail": ([], {"TRACE_SLOWER": "1"}, 1),
    "inconclusive under --infergate-strict": (["--infergate-strict"], {"TRACE_OTHER_MACHINE": "1"}, 1),
}


def claim_another_machine(path: Path) -> None:
    """The saved baseline's every entry recorded on another CPU: its timings are no yardstick here."""
    data = json.loads(path.read_text())
    text = json.dumps(data).replace(json.dumps(_this_cpu(data))[1:-1], "Imaginary RISC-V Processor")
    path.write_text(text)


def _this_cpu(data) -> str:
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("cpu"), str):
                found.append(node["cpu"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(data)
    if not found:
        raise SystemExit("gate_trace: the saved baseline names no CPU to rewrite")
    return found[0]


def trace(where: Path, name: str, env: dict) -> dict[str, int] | None:
    options, extra, code = PATHS[name]
    baseline = where / "base.json"
    if extra.get("TRACE_OTHER_MACHINE"):
        other = where / "other.json"
        other.write_text(baseline.read_text())
        claim_another_machine(other)
        baseline = other
    (where / "traced.json").unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "pytest", *OPTIONS, *options, f"--infergate-baseline={baseline}"],
                          cwd=where, env={**env, **extra}, capture_output=True, text=True)
    if done.returncode != code:
        print(f"{name}: exit {done.returncode}, not {code}")
        print(done.stdout[-3000:], done.stderr[-3000:])
        return None
    return json.loads((where / "traced.json").read_text())


def main() -> int:
    env = dict(os.environ, TRACE_FUNCTIONS="1" if "--functions" in sys.argv[1:] else "")
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder)
        (where / "test_speed.py").write_text(TEST)
        (where / "conftest.py").write_text(CONFTEST)
        saved = subprocess.run([sys.executable, "-m", "pytest", *OPTIONS, "--infergate-save-baseline=base.json"],
                               cwd=where, env=env, capture_output=True, text=True)
        if saved.returncode != 0:
            print(saved.stdout[-3000:], saved.stderr[-3000:])
            return 1
        for name in PATHS:
            traced = trace(where, name, env)
            if traced is None:
                return 1
            print(f"{name}:")
            for item, calls in sorted(traced.items(), key=lambda entry: -entry[1]):
                print(f"  {item:32} {calls:8} calls")
            files = {item.split(":")[0] for item in traced}
            print(f"{len(files)} project files run after the measurement on the {name} path (target: <= 8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which project files does one perf gate run after its measurement? (#42: the traced call should touch few.)

    python benchmarks/gate_trace.py              # tiny-random-llama, fp32
    python benchmarks/gate_trace.py --functions  # each function's calls, not only each file's

Traces the call of the issue: `infergate_bench(...)` under `@pytest.mark.infergate_budget(max_regression=0.1)`
with `--infergate-baseline` (saved by a first run). A conftest profiles every call into the pytest_infergate
package from the moment the measurement returns until the test's call ends, leaving out the re-measurements
(measuring more is measurement, not the gate). The runner reads as quiet (the kernel's load evidence off): the
busy-runner decision is another path. Prints the files and how many calls each took, and their count.
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
# counts the pytest_infergate files that run after the measurement, until the test's call ends
import json
import os
import sys

import pytest

import pytest_infergate
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


Bench.measure = measuring(Bench.measure, after=True)
Bench.extend = measuring(Bench.extend, after=True)
# the path of a quiet runner, on a busy one too: the kernel's load evidence would take the busy-runner decision
# (perf.busy), another path with its own files
interference.snapshot = lambda pids: None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    sys.setprofile(None)
    with open("traced.json", "w") as out:
        json.dump(seen, out, indent=1)
"""

OPTIONS = ["-q", "-p", "no:cacheprovider", "--infergate-model=tiny-random-llama", "--infergate-precisions=fp32"]


def main() -> int:
    env = dict(os.environ, TRACE_FUNCTIONS="1" if "--functions" in sys.argv[1:] else "")
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder)
        (where / "test_speed.py").write_text(TEST)
        (where / "conftest.py").write_text(CONFTEST)
        for option in ("--infergate-save-baseline=base.json", "--infergate-baseline=base.json"):
            done = subprocess.run([sys.executable, "-m", "pytest", *OPTIONS, option], cwd=where, env=env,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:])
                return 1
        traced = json.loads((where / "traced.json").read_text())
    for name, calls in sorted(traced.items(), key=lambda item: -item[1]):
        print(f"  {name:32} {calls:8} calls")
    files = {name.split(":")[0] for name in traced}
    print(f"{len(files)} project files run after the measurement (target of #42: <= 8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

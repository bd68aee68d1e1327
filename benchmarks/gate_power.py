"""How often does the perf gate cry wolf, and how often does it catch a real slowdown?

    python benchmarks/gate_power.py                    # --mode ab, 10 trials per condition, embedded model
    python benchmarks/gate_power.py --mode baseline    # against a stored baseline, as --infergate-baseline
    python benchmarks/gate_power.py --mode env         # against a live baseline environment, as
                                                       # --infergate-baseline-python (here: this python)
    python benchmarks/gate_power.py --trials 3         # a quicker look
    python benchmarks/gate_power.py --mode baseline --hog save --slowdowns 0,0.25   # a busy runner at save time
    python benchmarks/gate_power.py --mode baseline --hog run --slowdowns 0,0.25    # a busy runner now

Each trial measures the same workload unchanged, with a 10% slowdown and with a 25% slowdown injected by a hook
that waits after every model forward for that fraction of the forward's own time (asleep, or with `--slowdown
busy` computing torch matmuls), and decides it exactly as the pytest gate does; the three conditions take turns:
- `--mode ab` (default, as `infergate_bench.ab()`): the unchanged model (A) and the candidate (B) alternate for
  `--rounds` rounds, step-locked (perf.lockstep: their engine steps in turn, each side timed on its own steps; or
  `--interleave repetition`, a whole repetition per side and turn), decided by evaluate_ab (every metric by the
  median of per-round ratios with its order-statistic interval; one more round at a time while inconclusive, up
  to three);
- `--mode baseline` (as `--infergate-save-baseline`, then `--infergate-baseline`): a child process measures the
  workload through the `infergate_bench` fixture's object (PerfBench, its calibration probe included) and saves the
  baseline file as the session does; this process loads that file and measures every trial through a fresh
  PerfBench, gated by the same budget marker (gate_measurement: each side's fastest repetitions, normalized
  for machine speed where the calibration probe shows a change beyond the threshold, re-measured up to twice while
  inconclusive; perf/stored.py). `--baseline PATH` reuses a saved file (e.g.
  one saved hours earlier); `--no-calibration` measures the trials without the probe, i.e. as before version 3;
- `--mode env` (as `--infergate-baseline-python`): a worker process of another Python environment (here this
  same interpreter: what is tested is two processes taking turns) runs the baseline side, this process the
  candidate, through the fixture's object (PerfBench) as a test with the budget marker: at least 6 rounds
  (step-locked: the worker takes a step each time this process has taken one), one more while inconclusive, up
  to three, decided as an interleaved A/B.
`--hog save` / `--hog run` (baseline mode) keep a busy runner on one side: one busy-loop process per core (as
another CI job would) while the baseline is saved, or while the trials run. Targets (issue #30): with a hog on
either side, unchanged code never fails and a 25% slowdown never passes (inconclusive, with the reason, is allowed).
Prints verdict counts, false-alarm rate, detection rate and time per trial.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_infergate.context import TestContext  # noqa: E402
from pytest_infergate.engine import EngineConfig  # noqa: E402
from pytest_infergate.gates.perf import PerfBench  # noqa: E402
from pytest_infergate.history.store import baseline_entries, save_run_as_baseline  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import DEFAULT_CPU_THREADS, Options, default_cache_dir  # noqa: E402
from pytest_infergate.perf import lockstep  # noqa: E402
from pytest_infergate.perf.baseline import load_baseline  # noqa: E402
from pytest_infergate.perf.baseline_env import BaselineEnv  # noqa: E402
from pytest_infergate.perf.budget import parse_budget  # noqa: E402
from pytest_infergate.perf.injections import QuietForwardTimes, injected_slowdown  # noqa: E402
from pytest_infergate.perf.interleaved import AB_ROUNDS, by_repetition, evaluate_ab  # noqa: E402
from pytest_infergate.perf.local_bench import Bench  # noqa: E402
from pytest_infergate.results.run import RunResults  # noqa: E402
from pytest_infergate.workloads import chat_workload  # noqa: E402

TEST_ID = "benchmarks/gate_power.py::test_chat_workload"


class GateFailed(Exception):
    pass


# A co-tenant that streams memory (64 MiB of float32 copied and added over and over, numpy's one thread): another
# job's tensors on a shared runner, which evict our caches on every switch, where a busy loop hardly touches memory.
MEMORY_STREAM = ("import numpy as np\na = np.ones(16 << 20, dtype=np.float32); b = np.empty_like(a)\n"
                 "while True:\n    np.copyto(b, a); a += 1.0\n")
# the same busy 20 ms, idle 20 ms: beside two of them our thread waited for a CPU 5-14% of its time, yet its CPU
# time grew as much as beside full-time streams (docs/measurements.md, "a step at a 0.9 share")
HALF_STREAM = ("import time\nimport numpy as np\na = np.ones(16 << 20, dtype=np.float32); b = np.empty_like(a)\n"
               "while True:\n    t = time.time() + 0.02\n    while time.time() < t:\n"
               "        np.copyto(b, a); a += 1.0\n    time.sleep(0.02)\n")


class CpuHog:
    """One busy-loop process per core (or `processes`), as other jobs on a shared runner, `memory_streams`
    processes streaming memory (MEMORY_STREAM) and `half_streams` doing so half the time (HALF_STREAM): started on
    entering, killed on leaving."""

    def __init__(self, enabled: bool, processes: int | None = None, memory_streams: int = 0, half_streams: int = 0):
        self.enabled = enabled
        self.count = (os.cpu_count() or 1) if processes is None else processes
        self.memory_streams, self.half_streams = memory_streams, half_streams
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> CpuHog:
        if self.enabled:
            env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
            self.processes = [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                              for _ in range(self.count)]
            self.processes += [subprocess.Popen([sys.executable, "-c", MEMORY_STREAM], env=env)
                               for _ in range(self.memory_streams)]
            self.processes += [subprocess.Popen([sys.executable, "-c", HALF_STREAM], env=env)
                               for _ in range(self.half_streams)]
            print(f"CPU hog: {self.count} busy-loop processes"
                  + (f", {self.memory_streams} streaming memory" if self.memory_streams else "")
                  + (f", {self.half_streams} streaming memory half the time" if self.half_streams else ""),
                  flush=True)
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []


def budget_values(args) -> dict:
    values = {"max_regression": args.max_regression}
    # a generous absolute limit per metric just names which metrics the relative check compares
    for metric in args.metrics.split(","):
        values[metric] = 1e-9 if metric in ("tokens_per_s", "requests_per_s") else 1e12
    return values


def context(args, records: list, baseline: dict | None, baseline_python: str | None = None) -> TestContext:
    """What the plugin hands the infergate_bench fixture's object for one test with an infergate_budget marker
    (with --infergate-save-baseline when `args.save_baseline` is set)."""
    def fail(message):
        raise GateFailed(message)

    options = Options(model=args.model, precisions=("fp32",), save_baseline=args.save_baseline,
                      baseline_python=baseline_python)
    return TestContext(test_id=TEST_ID, options=options, record=records.append, say=lambda finding: None,
                       fail=fail, skip=fail, markers={"infergate_budget": [budget_values(args)]}, baseline=baseline)


def measure_as_a_test(args, loaded, requests, config, baseline: dict | None, slowdown: float = 0.0, env=None):
    """One `infergate_bench(requests, config, repeats=...)` call of a test: a fresh PerfBench (as the fixture
    makes per test), gated, against `env` (a BaselineEnv) when given; returns the PerfRecord it recorded."""
    records: list = []
    bench = PerfBench(context(args, records, baseline, env.python if env is not None else None), loaded,
                      compare_side=lambda: loaded, baseline_env=(lambda: env) if env is not None else None)
    bench.runs.bench.calibrate = bench.runs.bench.calibrate and not args.no_calibration
    try:
        # no hook at all when unchanged: the baseline side (saved, or in the other process) runs without one
        with injected_slowdown(loaded.model, slowdown, busy=args.slowdown == "busy", quiet=args.quiet_times) \
                if slowdown else nullcontext():
            bench(requests, config, warmup=2, repeats=args.repeats)
    except GateFailed:
        pass
    finally:
        bench.close()
    return records[-1]


def save_baseline_file(args, loaded, requests, config, path: Path) -> None:
    """As `pytest --infergate-save-baseline PATH`: measure as the test does, then write what the session writes."""
    record = measure_as_a_test(args, loaded, requests, config, None)
    save_run_as_baseline(path, RunResults(records=[record]))
    m = record.measurement
    print(f"baseline saved to {path}: {m.repetitions} repetitions, itl p50 {m.value('itl_ms'):.1f} ms, "
          f"{m.value('tokens_per_s'):.2f} tok/s, probe {m.probe or 'none'} "
          f"{', '.join(f'{s * 1000:.0f}' for s in m.probe_s)} ms", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--max-regression", type=float, default=0.10)
    parser.add_argument("--metrics", default="itl_ms,tokens_per_s")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per measurement (baseline mode)")
    parser.add_argument("--mode", choices=("ab", "baseline", "env"), default="ab")
    parser.add_argument("--rounds", type=int, default=AB_ROUNDS, help="A/B rounds per trial (as infergate_bench.ab)")
    parser.add_argument("--interleave", choices=("step", "repetition"), default="step",
                        help="ab mode: take engine steps in turn (as infergate_bench.ab does on a closed batch), "
                             "or whole repetitions (as before 2026-12-02, and for what cannot run step-locked)")
    parser.add_argument("--baseline", type=Path, help="baseline mode: compare with this saved file")
    parser.add_argument("--save-baseline", type=Path, help="baseline mode: only save the baseline file, then exit")
    parser.add_argument("--no-calibration", action="store_true", help="baseline mode: measure without the probe")
    parser.add_argument("--slowdown", choices=("sleep", "busy"), default="sleep",
                        help="how the injected slowdown waits after each forward: asleep (the cores free meanwhile) "
                        "or computing (torch matmuls: the machine as busy as a slower library keeps it)")
    parser.add_argument("--threads", type=int, default=DEFAULT_CPU_THREADS,
                        help=f"torch threads (default {DEFAULT_CPU_THREADS}, as the plugin on the CPU: "
                             "--infergate-cpu-threads)")
    parser.add_argument("--hog", choices=("none", "save", "run", "both"), default="none",
                        help="baseline mode: one busy-loop process per core while the baseline is saved, while "
                        "the trials run, or both (a busy shared runner on that side)")
    parser.add_argument("--slowdowns", default="0,0.10,0.25",
                        help="the conditions, as fractions, taking turns in each trial (default 0,0.10,0.25)")
    parser.add_argument("--json", type=Path, help="baseline mode: write every trial's record (measurement, probe "
                        "times, verdicts) here, for analysis")
    args = parser.parse_args()
    # a SIGTERM (timeout, kill) unwinds like an exception, so the CPU hog's processes are always killed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    loaded = load_model(resolve_model(args.model, default_cache_dir()), "fp32")
    requests = chat_workload(loaded.tokenizer, 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)
    config = EngineConfig(max_batch_size=8, max_model_len=1024, kv_budget_bytes=256 << 20)
    warm = Bench(loaded, calibrate=False)
    warm.measure(requests, config, warmup=2, repeats=1)  # warm the machine up; a cold first measurement drifts
    # each forward's quiet time, so that an injected slowdown adds the same seconds under a CPU hog as quiet (one
    # scaled by the forward's time as measured would grow with the load and overstate the gate's power)
    args.quiet_times = QuietForwardTimes()
    with args.quiet_times.recording(loaded.model):
        warm.measure(requests, config, warmup=1, repeats=1)
    warm.close()
    if args.save_baseline is not None:
        save_baseline_file(args, loaded, requests, config, args.save_baseline)
        return 0
    baseline = None
    if args.mode == "baseline":
        path = args.baseline
        if path is None:  # saved by another process, as a pytest run with --infergate-save-baseline would
            path = Path(tempfile.mkdtemp()) / "baseline.json"
            child = [sys.executable, __file__, "--mode", "baseline", "--model", args.model, "--save-baseline",
                     str(path), "--repeats", str(args.repeats), "--metrics", args.metrics]
            child += ["--threads", str(args.threads)] if args.threads else []
            child += ["--slowdown", args.slowdown]
            with CpuHog(args.hog in ("save", "both")):
                subprocess.run(child + (["--no-calibration"] if args.no_calibration else []), check=True)
        baseline = load_baseline(path, baseline_entries)
    env = BaselineEnv(sys.executable) if args.mode == "env" else None
    import torch

    print(f"mode {args.mode}; gate: max_regression {args.max_regression:.0%} on {args.metrics}; slowdown "
          f"{args.slowdown}; torch threads {torch.get_num_threads()}; CPU hog: {args.hog}"
          f"{'; calibration probe off' if args.no_calibration else ''}", flush=True)
    budget = parse_budget(budget_values(args))
    bench = Bench(loaded, calibrate=False)

    def run(fraction):
        def one(into):
            with injected_slowdown(loaded.model, fraction, busy=args.slowdown == "busy", quiet=args.quiet_times):
                bench.run_once(requests, config, 1, into)
        return one

    def ab_rounds(fraction):
        """As infergate_bench.ab() runs them: step-locked (A on an engine of its own, the hook around B's steps
        only, since both sides share the model object), or `--interleave repetition`."""
        if args.interleave == "repetition":
            return by_repetition(run(0.0), run(fraction))
        def hooked(share):
            return lambda: injected_slowdown(loaded.model, share, busy=args.slowdown == "busy",
                                             quiet=args.quiet_times)
        return lockstep.rounds(lockstep.LocalSide(bench, requests, config, 1, instance=1, around_step=hooked(0.0)),
                               lockstep.LocalSide(bench, requests, config, 1, around_step=hooked(fraction)))

    slowdowns = tuple(float(x) for x in args.slowdowns.split(","))
    outcomes: dict[float, Counter] = {slowdown: Counter() for slowdown in slowdowns}
    durations, dumped = [], []
    hog = CpuHog(args.hog in ("run", "both")).__enter__()
    atexit.register(hog.__exit__, None, None, None)  # never left running, whatever ends this process
    for trial in range(args.trials):  # the conditions take turns, so drift of the machine hits them alike
        for slowdown in slowdowns:
            start = time.perf_counter()
            if args.mode in ("baseline", "env"):
                record = measure_as_a_test(args, loaded, requests, config, baseline, slowdown, env)
                status, verdicts, remeasured = record.status, record.verdicts, record.outcome.remeasured
                probed = next((v for v in verdicts if v.machine_slowdown), None)
                why = next((v.note.split(":")[0] for v in verdicts if v.note), "")
                extra = (f", machine x{probed.machine_slowdown:.3f} by the probe{f' ({why})' if why else ''}"
                         if probed else ", no probe" if env is None else "")
                if args.json is not None:
                    dumped.append({"slowdown": slowdown, "trial": trial, "record": record.to_dict()})
                    args.json.write_text(json.dumps({"baseline": {k: e.to_dict() for k, e in (baseline or {}).items()},
                                                     "trials": dumped}, default=str))
            else:
                _, outcome = evaluate_ab(ab_rounds(slowdown), budget, args.rounds)
                status, verdicts, remeasured, extra = outcome.status, outcome.verdicts, outcome.remeasured, ""
            durations.append(time.perf_counter() - start)
            outcomes[slowdown][status] += 1
            ratios = ", ".join(f"{v.metric} x{v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}]" for v in verdicts)
            print(f"  slowdown {slowdown:4.0%} trial {trial + 1:2d}: {status:12s} {ratios}{extra}"
                  f"{f' (re-measured {remeasured}x)' if remeasured else ''} {durations[-1]:.0f} s", flush=True)
    hog.__exit__(None, None, None)
    bench.close()
    if env is not None:
        env.close()

    print(f"\nverdicts (pass / inconclusive / fail), CPU hog: {args.hog}:")
    for slowdown, counts in outcomes.items():
        print(f"  slowdown {slowdown:4.0%}: {counts['pass']:2d} / {counts['inconclusive']:2d} / {counts['fail']:2d}")
    if 0.0 in outcomes:
        print(f"false failures with no change: {outcomes[0.0]['fail']}/{args.trials} (target 0)")
    if 0.25 in outcomes:
        missed = outcomes[0.25]["pass"]
        print(f"25% slowdown failed: {outcomes[0.25]['fail']}/{args.trials}, passed: {missed}/{args.trials} "
              f"(target: {'0 passed' if args.hog != 'none' else '>= 9 failed'})")
    if 0.10 in outcomes:
        print(f"10% slowdown failed: {outcomes[0.10]['fail']}/{args.trials} (target >= {0.8 * args.trials:.0f})")
    print(f"time per trial: median {sorted(durations)[len(durations) // 2]:.1f} s, max {max(durations):.1f} s "
          "(target < 60 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which figure of a repetition does co-tenant CPU load not distort? Measured side by side on this machine.

    python benchmarks/load_evidence.py                  # 4 rounds, embedded model, one busy loop per core as the hog
    python benchmarks/load_evidence.py --rounds 6 --hog-processes 1
    python benchmarks/load_evidence.py --device cuda --model random-llama-0.5b   # on a GPU (benchmarks/gpu_check.sh)

Each round measures the engine's workload (benchmarks/gate_power.py's) four ways — quiet and under a CPU hog, each
unchanged and with a ×2 slowdown injected (a sleep after every forward as long as the forward's own quiet time) —
and records per repetition, from Linux's per-thread counters (/proc/self/task/*/schedstat: CPU time, time runnable
but waiting for a CPU), every candidate estimate of the repetition's cost:

- wall: the wall time;
- wall - run-queue delay: the wall time less the time our threads waited for a CPU (main thread; mean, max and
  sum over the threads that computed);
- CPU time: the main thread's, and the computing threads' mean.

- device (`--device cuda`): the device's time in the engine's forwards by CUDA events (engine.runner), what the gate
  compares on a busy GPU runner (process_meters.LoadFreeTimer). There the ×2 slowdown is every forward computed twice
  (the second writes the same KV entries, so the outputs do not change): a sleep on the host would not slow the
  device, and CUDA graph replays run no forward hooks.

A good estimate reads the same quiet and busy (the hog/quiet ratio near 1, tight) and still sees the ×2 slowdown
(slow/unchanged near 2) on both. Prints each estimate's ratios over rounds (median and range).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from gate_power import CpuHog  # noqa: E402

from pytest_infergate import process_meters  # noqa: E402
from pytest_infergate.engine import EngineConfig  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402
from pytest_infergate.perf.conversations import run_items  # noqa: E402
from pytest_infergate.perf.injections import QuietForwardTimes, injected_slowdown  # noqa: E402
from pytest_infergate.perf.local_bench import Bench  # noqa: E402
from pytest_infergate.workloads import chat_workload  # noqa: E402

ESTIMATES = ("wall", "wall-rq main", "wall-rq mean", "wall-rq max", "wall-rq sum", "cpu main", "cpu mean", "team")


@contextmanager
def doubled_forwards(engine):
    """Every forward of `engine` computed twice (×2 the device's work and the host's launches), the logits of the
    second returned: the same inputs write the same KV entries, so the outputs are unchanged."""
    runner, forward = engine.runner, engine.runner.forward

    def twice(plan):
        _, first_s = forward(plan)
        logits, second_s = forward(plan)
        return logits, first_s + second_s

    runner.forward = twice
    try:
        yield
    finally:
        runner.forward = forward


def estimates(wall: float, threads: dict[int, process_meters.ThreadTimes], main: int) -> dict[str, float]:
    computing = [t for t in threads.values() if t.cpu_s > 0.1 * wall] or list(threads.values())
    waits = [t.wait_s for t in computing]
    main_times = threads.get(main, process_meters.ThreadTimes(0.0, 0.0))
    return {"wall": wall, "wall-rq main": wall - main_times.wait_s,
            "wall-rq mean": wall - statistics.fmean(waits), "wall-rq max": wall - max(waits),
            "wall-rq sum": wall - sum(waits), "cpu main": main_times.cpu_s,
            "cpu mean": statistics.fmean(t.cpu_s for t in computing),
            "team": process_meters.team_progress_s(wall, threads, main)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="repetitions per condition and round")
    parser.add_argument("--hog-processes", type=int, help="busy-loop processes (default: one per core)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own, one per core)")
    parser.add_argument("--device", default="cpu", help="cpu (fp32), or cuda (fp16; the ×2 is every forward twice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    on_gpu = args.device != "cpu"
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, "
          f"hog {'one busy loop per core' if args.hog_processes is None else args.hog_processes}", flush=True)

    loaded = load_model(resolve_model(args.model, default_cache_dir()), "fp16" if on_gpu else "fp32", args.device,
                        reference="fp16" if on_gpu else "fp32")
    requests = chat_workload(loaded.tokenizer, 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)
    config = EngineConfig(max_batch_size=8, max_model_len=1024, kv_budget_bytes=256 << 20)
    bench = Bench(loaded, device=args.device, calibrate=False)
    bench.measure(requests, config, warmup=2, repeats=1)  # warm up
    quiet = QuietForwardTimes()
    with quiet.recording(loaded.model):
        bench.measure(requests, config, warmup=1, repeats=2)
    main_tid = process_meters.thread_id()
    rows: dict[tuple[bool, bool], list[dict[str, float]]] = {}
    names = ESTIMATES + (("device",) if on_gpu else ())

    def repetition(slow: bool) -> dict[str, float]:
        engine, workload = bench.begin_repetition(requests, config, 1)
        before = process_meters.threads()
        device_before = engine.device_s
        start = time.perf_counter()
        # the injected sleep lasts as long as the forward took on the quiet machine: the same ×2 quiet or busy
        slowdown = doubled_forwards(engine) if on_gpu else injected_slowdown(loaded.model, 1.0, quiet=quiet)
        with slowdown if slow else nullcontext():
            run_items(engine, workload)
        wall = time.perf_counter() - start
        figures = estimates(wall, process_meters.delta(before, process_meters.threads()), main_tid)
        if on_gpu:
            figures["device"] = engine.device_s - device_before
        return figures

    for round_ in range(args.rounds):
        for busy in (False, True):
            with CpuHog(busy, args.hog_processes):
                time.sleep(0.5 if busy else 0.0)
                for slow in (False, True):
                    for _ in range(args.repeats):
                        rows.setdefault((busy, slow), []).append(repetition(slow))
        print(f"round {round_ + 1}: " + ", ".join(
            f"{'busy' if b else 'quiet'}/{'x2' if s else 'same'} wall {statistics.median(r['wall'] for r in v):.2f} s"
            for (b, s), v in rows.items()), flush=True)

    def ratio(num: tuple[bool, bool], den: tuple[bool, bool], name: str) -> str:
        """The median ratio [min, max] over the pairs; "-" where no denominator is positive (an estimate that
        takes off more waiting than the wall time, as the sum over threads does on a busy machine)."""
        pairs = [a[name] / b[name] for a, b in zip(rows[num], rows[den]) if b[name] > 0]
        if not pairs:
            return "-".rjust(22)
        return f"{statistics.median(pairs):6.2f} [{min(pairs):5.2f},{max(pairs):5.2f}]".rjust(22)

    print(f"\n{'estimate':14s} {'busy/quiet':>22s} {'x2 quiet':>22s} {'x2 busy':>22s} {'x2 busy/quiet same':>22s}")
    for name in names:
        cols = [ratio((True, False), (False, False), name), ratio((False, True), (False, False), name),
                ratio((True, True), (True, False), name), ratio((True, True), (False, False), name)]
        print(f"{name:14s} " + " ".join(cols))
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

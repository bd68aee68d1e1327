"""How far does a busy runner move the figure a load-corrected gate compares — one engine thread's CPU time per token?

    python benchmarks/preempted_cpu_time.py                    # tiny-random-llama, every co-tenant kind, 8 reps each
    python benchmarks/preempted_cpu_time.py --kinds "2 loops,2 streams" --repeats 4

On one torch thread the gate's load-corrected cost of a busy repetition is the thread's time on a CPU
(process_meters.team_progress_s: wall less its run-queue wait). That removes the co-tenants' share of the CPUs,
but not what they do to the thread while it runs: each of its time slices starts with caches the co-tenants have
refilled with their own data. This measures the workload of the starter's bench call (the default chat workload,
`max_batch_size=8`) beside each kind of co-tenant, each block of repetitions between two quiet blocks, and prints
per kind the median load-free share and the load-corrected cost per token over the two quiet blocks' geometric
mean (median and least repetition), with the quiet blocks' own move beside it: the host's drift between blocks,
which a stored baseline (another process, minutes apart) meets as well. perf.busy.BUSY_CPU_INFLATION is read from
these figures (docs/measurements.md, "A preempted thread's CPU time").

Co-tenants: `loops` are Python busy loops (hardly touch memory), `streams` copy and add 64 MiB of float32 in numpy
(gate_power.MEMORY_STREAM: another job's tensors), `torch` multiply 768×768 float32 matrices on one thread (another
test suite's model); `half loops` and `half streams` do the same busy 20 ms, idle 20 ms (our thread then waited for a
CPU 0-14% of its time, as beside jobs in other cgroups).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gate_power import HALF_STREAM, MEMORY_STREAM  # noqa: E402

from pytest_infergate.engine import EngineConfig  # noqa: E402
from pytest_infergate.measurement import Measurement  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402
from pytest_infergate.perf.local_bench import Bench  # noqa: E402
from pytest_infergate.workloads import default_chat_workload  # noqa: E402

TORCH_JOB = ("import torch; torch.set_num_threads(1); a = torch.randn(768, 768); b = torch.randn(768, 768)\n"
             "while True:\n    a @ b\n")
# half-busy co-tenants (busy 20 ms, idle 20 ms): a share of the machine between one and two busy processes, where our
# thread waited for a CPU 0-14% of its time (a shared runner's jobs in other cgroups)
HALF_LOOP = ("import time\nwhile True:\n    t = time.time() + 0.02\n    while time.time() < t: pass\n"
             "    time.sleep(0.02)\n")
CODE = {"loops": "while 1: pass", "streams": MEMORY_STREAM, "torch": TORCH_JOB, "half loops": HALF_LOOP,
        "half streams": HALF_STREAM}
KINDS = {"1 loop": {"loops": 1}, "1 stream": {"streams": 1}, "1 torch job": {"torch": 1}, "2 loops": {"loops": 2},
         "4 loops": {"loops": 4},
         "1 loop + 1 stream": {"loops": 1, "streams": 1}, "2 streams": {"streams": 2},
         "2 loops + 2 streams": {"loops": 2, "streams": 2}, "2 torch jobs": {"torch": 2}, "4 torch jobs": {"torch": 4},
         "2 half loops": {"half loops": 2}, "3 half loops": {"half loops": 3}, "1 half stream": {"half streams": 1},
         "2 half streams": {"half streams": 2}, "3 half streams": {"half streams": 3}}


def co_tenants(counts: dict[str, int]) -> list[subprocess.Popen]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, "-c", CODE[kind]], env=env)
            for kind, count in counts.items() for _ in range(count)]


def beside(bench: Bench, requests, config, repeats: int, counts: dict[str, int]) -> Measurement:
    """`repeats` repetitions in a row beside the co-tenants `counts` (none: quiet)."""
    others = co_tenants(counts)
    try:
        if others:
            time.sleep(1.0)  # the co-tenants started and touched their memory
        m = Measurement()
        for _ in range(repeats):
            bench.run_once(requests, config, 1, m, probe=False)
        return m
    finally:
        for process in others:
            process.kill()
            process.wait()


def block(bench: Bench, requests, config, repeats: int, counts: dict[str, int]) -> tuple[float, float, float]:
    """(median load-free share, median and least load-corrected seconds per token) of `repeats` repetitions."""
    m = beside(bench, requests, config, repeats, counts)
    costs = [share / tps for share, tps in zip(m.load_free_share, m.samples["tokens_per_s"])]
    return statistics.median(m.load_free_share), statistics.median(costs), min(costs)


def kinds_of(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The co-tenant kinds named in `text` (comma-separated), or the parser's error naming the unknown ones."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown co-tenant kind(s) {unknown}: choose from {', '.join(KINDS)}")
    return kinds


def starter_bench(model: str) -> tuple[Bench, list, EngineConfig]:
    """The starter's bench call (the default chat workload, `max_batch_size=8`) on one torch thread, warmed up."""
    torch.set_num_threads(1)
    loaded = load_model(resolve_model(model, default_cache_dir()), "fp32")
    requests = default_chat_workload(loaded.tokenizer)
    config = EngineConfig(max_batch_size=8, max_model_len=1024, kv_budget_bytes=256 << 20)
    bench = Bench(loaded, calibrate=False)
    bench.measure(requests, config, warmup=2, repeats=1)
    return bench, requests, config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random-llama")
    parser.add_argument("--repeats", type=int, default=8, help="repetitions per block")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="co-tenant kinds, comma-separated: " + ", ".join(KINDS))
    args = parser.parse_args()
    kinds = kinds_of(parser, args.kinds)
    bench, requests, config = starter_bench(args.model)
    print(f"{args.model}, one torch thread, {args.repeats} repetitions a block, {os.cpu_count()} CPUs; load-corrected "
          "cost per token over the quiet blocks before and after:", flush=True)
    before = block(bench, requests, config, args.repeats, {})
    for kind in kinds:
        share, median, least = block(bench, requests, config, args.repeats, KINDS[kind])
        after = block(bench, requests, config, args.repeats, {})
        quiet_median, quiet_least = math.sqrt(before[1] * after[1]), math.sqrt(before[2] * after[2])
        print(f"  {kind:20s} load-free share {share:.2f}   cost ×{median / quiet_median:.2f} median, "
              f"×{least / quiet_least:.2f} least   (quiet blocks moved ×{after[1] / before[1]:.2f})", flush=True)
        before = after
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

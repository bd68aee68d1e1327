"""Is peak memory the same figure in every process? The gate compares it with a baseline another process saved, so
its spread between fresh processes bounds what a memory regression gate can resolve.

    python benchmarks/memory_repro.py                          # int8 and nf4, 4 fresh processes each
    python benchmarks/memory_repro.py --precisions fp32 --processes 6
    python benchmarks/memory_repro.py --extra-mb 100           # hold 100 MiB through each repetition (power)

Each process loads the embedded model at one precision (after loading the reference precision first, as a test
session parametrized over precisions does), measures the default chat workload as `infergate_bench` does, and prints
its peak memory (weights + KV cache allocated + what serving raised the process by) and the split; the parent prints
each precision's spread (max/min - 1) across processes and within each process's repetitions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def child(args) -> None:
    import torch

    from pytest_infergate.engine import EngineConfig
    from pytest_infergate.models import load_model, resolve_model
    from pytest_infergate.options import DEFAULT_CPU_THREADS, default_cache_dir
    from pytest_infergate.perf.injections import held_allocation
    from pytest_infergate.perf.local_bench import Bench
    from pytest_infergate.workloads import chat_workload

    torch.set_num_threads(DEFAULT_CPU_THREADS)
    source = resolve_model(args.model, default_cache_dir())
    if args.reference_first and args.precision != "fp32":
        load_model(source, "fp32")  # a session over fp32,int8 loads the reference first and keeps it
    loaded = load_model(source, args.precision)
    requests = chat_workload(loaded.tokenizer, 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)
    bench = Bench(loaded, calibrate=False)
    with held_allocation(bench, args.extra_mb) if args.extra_mb else nullcontext():
        measurement = bench.measure(requests, EngineConfig(max_batch_size=8), warmup=2, repeats=args.repeats)
    bench.close()
    print(json.dumps({"peak_mem_mb": measurement.samples["peak_mem_mb"], "memory": measurement.memory}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--precisions", default="int8,nf4")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--extra-mb", type=float, default=0.0, help="hold this many MiB through each repetition")
    parser.add_argument("--no-reference-first", dest="reference_first", action="store_false")
    parser.add_argument("--precision", help=argparse.SUPPRESS)  # set in the child
    args = parser.parse_args()
    if args.precision:
        child(args)
        return 0
    for precision in args.precisions.split(","):
        peaks = []
        for index in range(args.processes):
            command = [sys.executable, __file__, "--model", args.model, "--precision", precision,
                       "--repeats", str(args.repeats), "--extra-mb", str(args.extra_mb)]
            command += [] if args.reference_first else ["--no-reference-first"]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            result = json.loads(out)
            reps, memory = result["peak_mem_mb"], result["memory"]
            peaks.append(sorted(reps)[len(reps) // 2])
            print(f"{precision} process {index + 1}: peak_mem_mb per repetition "
                  f"{', '.join(f'{x:.1f}' for x in reps)} (within ×{max(reps) / min(reps):.3f}); weights "
                  f"{memory['weights_mb']:.1f}, KV allocated {memory['kv_allocated_mb']:.1f}, serving's rise "
                  f"{memory['other_mb']:.1f} MiB ({memory['method']})", flush=True)
        print(f"{precision}: median per process {', '.join(f'{x:.1f}' for x in peaks)} MiB; spread across "
              f"{len(peaks)} processes {max(peaks) / min(peaks) - 1:.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

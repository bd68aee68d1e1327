"""Does the engine thread's speed probe follow the host's drift between processes? (issue #54, perf.thread_speed)

    python benchmarks/thread_speed.py [--processes 10] [--repetitions 8] [--co-tenant]

Runs figure_power's workload (tiny-random-llama, fp32, 6 chat requests, max_batch_size 8, one torch thread) in
`--processes` fresh processes one after another; each process measures `--repetitions` repetitions, the probe
right before and after each (as Bench records it), and prints its best tokens/s and TTFT p50 over repetitions, its
least probe reading, and both figures at the probe's speed. Then, over the processes, the spread of each figure as
measured and at the probe's speed (what perf.speed_pass.at_thread_speed compares), as max/min and coefficient of
variation: the smaller the second beside the first, the more of the drift between processes the probe takes out.
--co-tenant: one busy loop beside every process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def one_process(repetitions: int) -> dict:
    import torch

    from pytest_infergate.engine import EngineConfig
    from pytest_infergate.models import load_model, resolve_model
    from pytest_infergate.options import DEFAULT_CPU_THREADS, default_cache_dir
    from pytest_infergate.perf.local_bench import Bench
    from pytest_infergate.workloads import chat_workload

    torch.set_num_threads(DEFAULT_CPU_THREADS)
    loaded = load_model(resolve_model("tiny-random-llama", default_cache_dir()), "fp32")
    requests = chat_workload(loaded.tokenizer, 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)
    config = EngineConfig(max_batch_size=8, max_model_len=1024, kv_budget_bytes=256 << 20)
    bench = Bench(loaded, calibrate=False)
    bench.measure(requests, config, warmup=2, repeats=1)
    measured = bench.measure(requests, config, warmup=0, repeats=repetitions)
    bench.close()
    from pytest_infergate.stats import percentile

    ttft_p50 = [percentile(rep, 50) for rep in measured.by_repetition("ttft_ms")]
    return {"tokens_per_s": max(measured.samples["tokens_per_s"]), "ttft_ms": min(ttft_p50),
            "probe_s": min(measured.thread_probe_s)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--repetitions", type=int, default=8)
    parser.add_argument("--co-tenant", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_process(args.repetitions)))
        return 0
    from gate_power import CpuHog

    from pytest_infergate.environment import cpu_model

    rows = []
    with CpuHog(args.co_tenant, 1):
        for _ in range(args.processes):
            done = subprocess.run([sys.executable, __file__, "--child", "--repetitions", str(args.repetitions)],
                                  check=True, capture_output=True, text=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"  tokens/s {row['tokens_per_s']:7.0f}   TTFT p50 {row['ttft_ms']:6.2f} ms   probe "
                  f"{row['probe_s'] * 1e3:6.3f} ms   tokens/s × probe {row['tokens_per_s'] * row['probe_s']:6.3f}   "
                  f"TTFT / probe {row['ttft_ms'] / row['probe_s'] / 1e3:6.3f}", flush=True)
    print(f"{cpu_model()}, {args.processes} fresh processes{', one busy loop beside them' if args.co_tenant else ''}:")
    for name, values in (("tokens/s as measured", [r["tokens_per_s"] for r in rows]),
                         ("tokens/s × thread probe", [r["tokens_per_s"] * r["probe_s"] for r in rows]),
                         ("TTFT p50 as measured", [r["ttft_ms"] for r in rows]),
                         ("TTFT p50 / thread probe", [r["ttft_ms"] / r["probe_s"] for r in rows])):
        print(f"  {name:24s} max/min ×{max(values) / min(values):.3f}, "
              f"c.v. {100 * statistics.stdev(values) / statistics.mean(values):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

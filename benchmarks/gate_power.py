"""How often does the perf gate cry wolf, and how often does it catch a real slowdown?

    python benchmarks/gate_power.py            # 10 trials per condition on the embedded model
    python benchmarks/gate_power.py --trials 3 # a quicker look

Each trial measures the same workload unchanged, with a 10% slowdown and with a 25% slowdown injected by a hook
that sleeps after every model forward for that fraction of the forward's own time, and decides it exactly as the
pytest gate does:
- `--mode ab` (default, as `infergate_bench.ab()`): the unchanged model (A) and the candidate (B) alternate for
  `--rounds` rounds (evaluate_ab: per-request latencies by a bootstrap CI of the ratio of percentiles, per-
  repetition throughput by the median of per-round ratios; one more round at a time while inconclusive, up to two);
- `--mode baseline` (as `--infergate-baseline`): one baseline measured first, after a discarded warm-up, then
  each trial against it (evaluate_perf, re-measured up to twice while inconclusive).
Prints verdict counts, false-alarm rate, detection rate and time per trial.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_infergate.engine import EngineConfig  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402
from pytest_infergate.perf.baseline import BaselineEntry  # noqa: E402
from pytest_infergate.perf.bench import Bench  # noqa: E402
from pytest_infergate.perf.budget import parse_budget  # noqa: E402
from pytest_infergate.perf.gate import evaluate_ab, evaluate_perf  # noqa: E402
from pytest_infergate.perf.slowdown import injected_slowdown  # noqa: E402
from pytest_infergate.workloads import chat_workload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--max-regression", type=float, default=0.10)
    parser.add_argument("--metrics", default="itl_ms,tokens_per_s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-repeats", type=int, default=5)
    parser.add_argument("--mode", choices=("ab", "baseline"), default="ab")
    parser.add_argument("--rounds", type=int, default=4, help="A/B rounds per trial (as infergate_bench.ab)")
    args = parser.parse_args()

    loaded = load_model(resolve_model(args.model, default_cache_dir()), "fp32")
    requests = chat_workload(loaded.tokenizer, 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)
    config = EngineConfig(max_batch_size=8, max_model_len=1024, kv_budget_bytes=256 << 20)
    budget_values = {"max_regression": args.max_regression}
    # a generous absolute limit per metric just names which metrics the relative check compares
    for metric in args.metrics.split(","):
        budget_values[metric] = 1e-9 if metric in ("tokens_per_s", "requests_per_s") else 1e12
    budget = parse_budget(budget_values)
    bench = Bench(loaded)
    bench.measure(requests, config, warmup=2, repeats=2)  # warm the machine up; a cold first measurement drifts
    entry = None
    if args.mode == "baseline":
        with injected_slowdown(loaded.model, 0.0):
            baseline = bench.measure(requests, config, warmup=2, repeats=args.baseline_repeats)
        entry = BaselineEntry({}, baseline)
        print(f"baseline: {baseline.repetitions} repetitions, tpot p50 {baseline.value('tpot_ms'):.1f} ms, "
              f"{baseline.value('tokens_per_s'):.1f} tok/s")
    print(f"mode {args.mode}; gate: max_regression {args.max_regression:.0%} on {args.metrics}")

    def run(fraction):
        def one(into):
            with injected_slowdown(loaded.model, fraction):
                bench.run_once(requests, config, 1, into)
        return one

    outcomes: dict[float, Counter] = {}
    durations = []
    for slowdown in (0.0, 0.10, 0.25):
        outcomes[slowdown] = Counter()
        for trial in range(args.trials):
            start = time.perf_counter()
            if args.mode == "baseline":
                with injected_slowdown(loaded.model, slowdown):
                    m = bench.measure(requests, config, warmup=2, repeats=args.repeats)
                    outcome = evaluate_perf(m, budget, {}, entry,
                                            remeasure=lambda m=m: bench.extend(m, requests, config, warmup=1))
                status, verdicts, remeasured = outcome.status, outcome.verdicts, outcome.remeasured
            else:
                _, outcome = evaluate_ab(run(0.0), run(slowdown), budget, args.rounds)
                status, verdicts, remeasured = outcome.status, outcome.verdicts, outcome.remeasured
            durations.append(time.perf_counter() - start)
            outcomes[slowdown][status] += 1
            ratios = ", ".join(f"{v.metric} x{v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}]" for v in verdicts)
            print(f"  slowdown {slowdown:4.0%} trial {trial + 1:2d}: {status:12s} {ratios}"
                  f"{f' (re-measured {remeasured}x)' if remeasured else ''}", flush=True)
    bench.close()

    print("\nverdicts (pass / inconclusive / fail):")
    for slowdown, counts in outcomes.items():
        print(f"  slowdown {slowdown:4.0%}: {counts['pass']:2d} / {counts['inconclusive']:2d} / {counts['fail']:2d}")
    unchanged = outcomes[0.0]
    print(f"false failures with no change: {unchanged['fail']}/{args.trials} (target 0)")
    print(f"25% slowdown failed: {outcomes[0.25]['fail']}/{args.trials} (target {args.trials}/{args.trials})")
    caught = outcomes[0.10]["fail"] + outcomes[0.10]["inconclusive"]
    print(f"10% slowdown failed or inconclusive: {caught}/{args.trials} (target >= {0.8 * args.trials:.0f})")
    print(f"time per budgeted measurement: median {sorted(durations)[len(durations) // 2]:.1f} s, "
          f"max {max(durations):.1f} s (target < 60 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much do per-round A/B ratios of the same code spread, a repetition per side and turn against step-locked?

    python benchmarks/lockstep_spread.py                  # 12 rounds each way, code unchanged
    python benchmarks/lockstep_spread.py --slowdown 0.10  # side B's forwards 10% longer

Both sides are the embedded model in fp32 on the gate-power workload (6 chat requests), each on an engine of its
own; every round measures one repetition per side twice: one after the other (as `--interleave repetition`), then
step-locked (perf.lockstep, as infergate_bench.ab() and --infergate-baseline-python run a closed batch). Prints the
per-round B/A ratios of tokens/s cost (A's tokens/s over B's: > 1 is B slower) and of ITL p50, and the standard
deviation of their logs: the noise a round-by-round verdict has to see through.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_infergate.engine import EngineConfig  # noqa: E402
from pytest_infergate.measurement import Measurement  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402
from pytest_infergate.perf import lockstep  # noqa: E402
from pytest_infergate.perf.injections import injected_slowdown  # noqa: E402
from pytest_infergate.perf.local_bench import Bench  # noqa: E402
from pytest_infergate.workloads import chat_workload  # noqa: E402


def ratios(a: Measurement, b: Measurement) -> tuple[float, float]:
    """(cost ratio by tokens/s, ITL p50 ratio) of the last repetition of each side."""
    from pytest_infergate.stats import percentile

    itl_a, itl_b = a.by_repetition("itl_ms")[-1], b.by_repetition("itl_ms")[-1]
    return a.samples["tokens_per_s"][-1] / b.samples["tokens_per_s"][-1], percentile(itl_b, 50) / percentile(itl_a, 50)


def spread(name: str, values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    sd = statistics.stdev(logs)
    print(f"  {name:32s} median x{statistics.median(values):.3f}  range {min(values):.3f}-{max(values):.3f}  "
          f"sd(log) {sd:.3f}")
    return sd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--slowdown", type=float, default=0.0, help="side B's forwards this much longer")
    args = parser.parse_args()

    loaded = load_model(resolve_model(args.model, default_cache_dir()), "fp32")
    requests = chat_workload(loaded.tokenizer, 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)
    config = EngineConfig(max_batch_size=8, max_model_len=1024, kv_budget_bytes=256 << 20)
    bench = Bench(loaded, calibrate=False)

    def hooked(share):
        return (lambda: injected_slowdown(loaded.model, share)) if share else nullcontext

    side_a = lockstep.LocalSide(bench, requests, config, 1, instance=1)
    side_b = lockstep.LocalSide(bench, requests, config, 1, around_step=hooked(args.slowdown))
    by_rep: dict[str, list[float]] = {"cost": [], "itl": []}
    locked: dict[str, list[float]] = {"cost": [], "itl": []}
    a_rep, b_rep, a_lock, b_lock = (Measurement() for _ in range(4))
    print(f"{args.rounds} rounds, side B slowed by {args.slowdown:.0%}", flush=True)
    try:
        for index in range(args.rounds):
            bench.run_once(requests, config, 1, a_rep, probe=False)  # A alone on the instance-0 engine
            with hooked(args.slowdown)():
                bench.run_once(requests, config, 1, b_rep, probe=False)
            for key, value in zip(("cost", "itl"), ratios(a_rep, b_rep)):
                by_rep[key].append(value)
            lockstep.lockstep_round(side_a, side_b, a_lock, b_lock, a_first=index % 2 == 0)
            for key, value in zip(("cost", "itl"), ratios(a_lock, b_lock)):
                locked[key].append(value)
            print(f"  round {index + 1:2d}: by repetition x{by_rep['cost'][-1]:.3f} (ITL x{by_rep['itl'][-1]:.3f})"
                  f" | step-locked x{locked['cost'][-1]:.3f} (ITL x{locked['itl'][-1]:.3f})", flush=True)
    finally:
        bench.close()
    print("per-round B/A ratios:")
    rep_cost, lock_cost = spread("tokens/s cost, by repetition", by_rep["cost"]), spread(
        "tokens/s cost, step-locked", locked["cost"])
    rep_itl, lock_itl = spread("ITL p50, by repetition", by_rep["itl"]), spread("ITL p50, step-locked", locked["itl"])
    print(f"step-locked / by repetition, sd(log): tokens/s {lock_cost / rep_cost:.2f}, ITL {lock_itl / rep_itl:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

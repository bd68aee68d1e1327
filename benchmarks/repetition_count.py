"""Does a side's fastest-repetitions figure depend on how many repetitions it has?

    python benchmarks/repetition_count.py                        # tiny-random-llama, quiet and beside 2 busy loops
    python benchmarks/repetition_count.py --repetitions 40 --sizes 6,12,20 --kinds "2 loops"

A stored comparison summarizes each side by its fastest repetitions (stats.least_disturbed: the Harrell-Davis
p10 of the per-repetition figures), and the two sides need not have as many repetitions: a baseline saved with
the default plan has about 12, a run with `min_time_s=20` about 40. Were the p10 of fewer repetitions biased
slow, a candidate with fewer repetitions than its baseline would lean toward failing, and one with more toward
passing. This measures it where the load's own move cannot: one long run of the starter's workload per load
(quiet, or beside each kind of co-tenant from preempted_cpu_time.py), then every window of consecutive
repetitions of each size in it (consecutive, as one run's repetitions are: a co-tenant's bursts come in spells).
Prints per load and size the median of the windows' fastest-repetitions tokens/s (as measured, and load-corrected
where measured) over that of the whole run's, and the windows' spread: ×1.000 means no bias.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from preempted_cpu_time import KINDS, beside, kinds_of, starter_bench  # noqa: E402

from pytest_infergate.stats import least_disturbed  # noqa: E402


def window_bias(costs: list[float], size: int) -> tuple[float, float, float]:
    """The median, least and most over every window of `size` consecutive repetitions of its fastest-repetitions
    cost, over the whole run's (a cost: larger is slower)."""
    whole = least_disturbed(costs)
    ratios = [least_disturbed(costs[start:start + size]) / whole for start in range(len(costs) - size + 1)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random-llama")
    parser.add_argument("--repetitions", type=int, default=60, help="repetitions of each load's one long run")
    parser.add_argument("--sizes", default="6,12,20,40", help="window sizes (repetitions), comma-separated")
    parser.add_argument("--kinds", default="2 loops", help="co-tenant kinds beside the quiet run, comma-separated: "
                        + ", ".join(KINDS) + " (none: quiet only)")
    args = parser.parse_args()
    kinds = kinds_of(parser, args.kinds)
    sizes = [int(s) for s in args.sizes.split(",")]
    if max(sizes) > args.repetitions:
        parser.error(f"--sizes {max(sizes)} is more than --repetitions {args.repetitions}: raise --repetitions")
    bench, requests, config = starter_bench(args.model)
    print(f"{args.model}, one torch thread, {args.repetitions} repetitions a load; the fastest-repetitions cost "
          "(1 / tokens/s) of every window of consecutive repetitions over the whole run's: median [least, most]",
          flush=True)
    for name, counts in [("quiet", {})] + [(kind, KINDS[kind]) for kind in kinds]:
        measurement = beside(bench, requests, config, args.repetitions, counts)
        tps = measurement.samples["tokens_per_s"]
        measured = [1.0 / value for value in tps]
        shares = measurement.load_free_share
        corrected = [share / value for share, value in zip(shares, tps)] if len(shares) == len(tps) else []
        share = f", load-free share {statistics.median(shares):.2f}" if shares else ""
        print(f"  {name}{share}:", flush=True)
        for size in sizes:
            line = "    {:3d} repetitions: as measured ×{:.3f} [{:.3f}, {:.3f}]".format(size,
                                                                                   *window_bias(measured, size))
            if corrected:
                line += "   load-corrected ×{:.3f} [{:.3f}, {:.3f}]".format(*window_bias(corrected, size))
            print(line, flush=True)
    bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

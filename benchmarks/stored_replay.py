"""How well can a stored baseline decide on this machine? Replays a `gate_power.py --mode baseline --json` file.

    python benchmarks/gate_power.py --mode baseline --trials 10 --json trials.json
    python benchmarks/stored_replay.py trials.json [--repetitions 8] [--max-regression 0.10]

gate_power compares every trial with the one baseline it saved, so its counts depend on how lucky that one save
was. Every unchanged trial is itself a fresh measurement of the same code, so each can stand in as the baseline:
this replays every other trial against each of them (the first `--repetitions` repetitions of each, as a first
decision sees them, before re-measuring) through the gate's own decision (perf.gate.decide_perf), and prints the share
of pass / inconclusive / fail per slowdown. It also prints each unchanged trial's level (median per-repetition ITL)
beside the calibration probe's quiet level and their correlation across trials: whether the machine itself moved
between trials, and whether the probe saw it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate_power import budget_values  # noqa: E402

from pytest_infergate.measurement import Measurement  # noqa: E402
from pytest_infergate.perf.baseline import BaselineEntry  # noqa: E402
from pytest_infergate.perf.budget import parse_budget  # noqa: E402
from pytest_infergate.perf.gate import StoredReference, decide_perf  # noqa: E402

PER_REPETITION = ("probe_s", "probe_quiet_s", "others_share")


def first_repetitions(measurement: Measurement, count: int) -> Measurement:
    """`measurement` as it stood after its first `count` repetitions."""
    if measurement.repetitions <= count:
        return measurement
    out = Measurement.from_dict(measurement.to_dict())
    out.repetitions = count
    for metric, ends in measurement.repetition_ends.items():
        out.repetition_ends[metric] = ends[:count]
        out.samples[metric] = measurement.samples[metric][:ends[count - 1]]
    for name in PER_REPETITION:
        values = getattr(measurement, name)
        setattr(out, name, values[:count] if len(values) == measurement.repetitions else [])
    return out


def level(measurement: Measurement, metric: str = "itl_ms") -> float:
    """The median over repetitions of each repetition's median."""
    return statistics.median(statistics.median(r) for r in measurement.by_repetition(metric))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trials", type=Path, help="a gate_power.py --mode baseline --json file")
    parser.add_argument("--repetitions", type=int, default=8, help="repetitions of each side a decision sees")
    parser.add_argument("--max-regression", type=float, default=0.10)
    parser.add_argument("--metrics", default="itl_ms,tokens_per_s")
    args = parser.parse_args()

    data = json.loads(args.trials.read_text())
    trials: dict[float, list[tuple[Measurement, dict]]] = {}
    for trial in data["trials"]:
        record = trial["record"]
        measurement = first_repetitions(Measurement.from_dict(record["measurement"]), args.repetitions)
        trials.setdefault(trial["slowdown"], []).append((measurement, record.get("fingerprint") or {}))
    unchanged = trials.get(0.0) or []
    if len(unchanged) < 2:
        print("need at least two unchanged trials (slowdown 0) to stand in as baselines")
        return 1
    budget = parse_budget(budget_values(args))  # as gate_power's trials were gated

    print(f"{len(unchanged)} unchanged trials as baselines, {args.repetitions} repetitions a side, max_regression "
          f"{args.max_regression:.0%} on {args.metrics}, decided by perf.gate.decide_perf:")
    for slowdown, measured in sorted(trials.items()):
        counts: Counter = Counter()
        for i, (baseline, fingerprint) in enumerate(unchanged):
            reference = StoredReference(BaselineEntry(fingerprint, baseline))
            for j, (candidate, candidate_fingerprint) in enumerate(measured):
                if slowdown == 0.0 and i == j:
                    continue
                counts[decide_perf(candidate, reference, budget, candidate_fingerprint).status] += 1
        pairs = sum(counts.values())
        print(f"  slowdown {slowdown:4.0%}: pass {counts['pass'] / pairs:4.0%}, inconclusive "
              f"{counts['inconclusive'] / pairs:4.0%}, fail {counts['fail'] / pairs:4.0%} ({pairs} pairs)")

    levels = [(level(m), statistics.median(m.probe_quiet_s) * 1000) for m, _ in unchanged if m.probe_quiet_s]
    print("\nunchanged trials in order: ITL level (median of per-repetition medians), quiet probe median:")
    print("  " + ", ".join(f"{itl:.0f} ms / {probe:.0f} ms" for itl, probe in levels))
    if len(levels) >= 3:
        itl = [math.log(a) for a, _ in levels]
        probe = [math.log(b) for _, b in levels]
        print(f"  spread of the level: ×{max(a for a, _ in levels) / min(a for a, _ in levels):.2f} (max / min); "
              f"correlation with the quiet probe across trials r = {statistics.correlation(itl, probe):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

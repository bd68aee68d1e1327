"""A/B comparisons round by round: where both sides of each round ran back to back (an interleaved or step-locked
A/B), the ratio is taken within each round, so the machine's drift between rounds cancels; on a busy runner each
side's steps are load-corrected first (load_aware_paired)."""

from __future__ import annotations

import math
from dataclasses import replace

from pytest_infergate import units
from pytest_infergate.measurement import METRICS, Measurement, busy_share
from pytest_infergate.perf import interference
from pytest_infergate.perf.verdict import Verdict, compare_samples
from pytest_infergate.stats import interval_status, median_interval, min_rounds, percentile
from pytest_infergate.status import Status


def compare_paired(metric: str, candidate: list[float], baseline: list[float], max_regression: float,
                   confidence: float = 0.95, pct: int | None = None,
                   shown: tuple[float, float] | None = None) -> Verdict:
    """Like compare_samples for one value per round of an interleaved A/B run, where candidate[i] and
    baseline[i] were measured back to back: the ratio is taken within each round, so drift of the machine
    between rounds cancels instead of widening the interval; the median of the per-round ratios decides, with its
    order-statistic interval (stats.median_interval: no assumption on how a busy runner spreads the rounds; below
    stats.min_rounds rounds it decides nothing, and the gate measures more rounds). `pct`: the values are each
    round's percentile of a per-request metric; `shown`: the (candidate, baseline) values to show (default: the
    medians of the per-round values)."""
    higher_is_better = METRICS[metric][1]
    ratios = [(b / c if higher_is_better else c / b) for c, b in zip(candidate, baseline) if c > 0 and b > 0]
    if len(ratios) != len(candidate):
        return compare_samples(metric, candidate, baseline, max_regression)
    point, low, high = median_interval(ratios, confidence)
    threshold = 1.0 + max_regression
    shown = shown or (percentile(candidate, 50), percentile(baseline, 50))
    note = "" if math.isfinite(high) else (f"{len(ratios)} rounds cannot bound the median ratio at "
                                           f"{confidence:.0%}: an A/B needs at least {min_rounds(confidence)}")
    return Verdict(metric, interval_status(low, high, threshold), point, low, high, threshold, pct,
                   shown[0], shown[1], (len(candidate), len(baseline)), paired=True, note=note)


def compare_paired_percentiles(metric: str, candidate: Measurement, baseline: Measurement, max_regression: float,
                               pct: int | None) -> Verdict | None:
    """A per-request metric of an interleaved A/B run, round by round: each round's percentile on each side, then
    as compare_paired. Pooling the requests instead takes them as independent, and a spell of interference on one
    side's repetition moves hundreds of them at once (README: a false failure of unchanged code, ITL p50 x1.206).
    None: a side without the split by repetition, or the rounds do not pair up."""
    pct = pct or 50
    rounds_c, rounds_b = per_round(metric, candidate, pct), per_round(metric, baseline, pct)
    if rounds_c is None or rounds_b is None or len(rounds_c) != len(rounds_b) or len(rounds_c) < 2:
        return None
    return compare_paired(metric, rounds_c, rounds_b, max_regression, pct=pct,
                          shown=(candidate.value(metric, pct), baseline.value(metric, pct)))


def per_round(metric: str, measurement: Measurement, pct: int | None, load_free: bool = False) -> list[float] | None:
    """One value of `metric` per round (a per-request metric: the round's percentile `pct`), with `load_free` each
    multiplied by the round's load-free share (a throughput divided by it); None where not split by round or, with
    `load_free`, the shares were not measured for every round."""
    split = measurement.by_repetition(metric)
    if not split or not all(split):
        return None
    values = [percentile(xs, pct or 50) for xs in split] if METRICS[metric][2] else [xs[0] for xs in split]
    if not load_free:
        return values
    shares = measurement.load_free_share
    if len(shares) != len(values) or min(shares, default=0.0) <= 0:
        return None
    return [v / s if METRICS[metric][1] else v * s for v, s in zip(values, shares)]


def load_aware_paired(measured: Verdict, candidate: Measurement, baseline: Measurement,
                      max_regression: float) -> Verdict:
    """An A/B's verdict on a busy runner. The co-tenants' load hits both sides of a round alike, but it stretches
    what computes and not what waits (a slowdown that sleeps reads smaller under a co-tenant), and it spreads the
    rounds. So each side's own steps are load-corrected (process_meters.team_progress_s: the side's
    load-free share per round) and compared round by round. A failure as measured stands (the load slows both
    sides of a round alike: it cannot make B slower than A); a pass as measured does not (the load could have
    hidden a slowdown that waits). So a load-corrected pass decides (unless as measured it fails: inconclusive),
    a load-corrected failure decides beyond the estimate's error (interference.load_free_residual on the
    threshold: none where both sides ran on one CPU thread, ×1.6 for a team); otherwise a failure as measured
    stands and anything else is inconclusive. Quiet, or without the shares: `measured` as it is."""
    share = busy_share(candidate.others_share)
    if share is None:
        return measured
    pct = measured.percentile
    cand, base = (per_round(measured.metric, m, pct, load_free=True) for m in (candidate, baseline))
    if cand is None or base is None or len(cand) != len(base):
        return measured
    by = candidate.load_free_source()
    if baseline.load_free_source() != by:
        return measured  # the two sides' loads taken out by different evidence: not comparable
    corrected = replace(compare_paired(measured.metric, cand, base, max_regression, pct=pct), load_free_by=by)
    busy = interference.describe(share)
    as_measured = f"×{measured.ratio:.3f} [{measured.low:.3f}, {measured.high:.3f}] as measured"
    bound = corrected.threshold * interference.load_free_residual(candidate, baseline, paired=True)
    if corrected.status == Status.FAIL and corrected.low <= bound:
        # the estimate keeps a side's waits whole and shrinks its compute by its own error: a slowdown that waits
        # reads larger load-corrected than it is (docs/measurements.md): a failure stands only beyond the
        # estimate's own error
        corrected = replace(corrected, status=Status.INCONCLUSIVE, fail_bar=bound, fail_bar_load_corrected=True, note=(
            f"load-corrected ×{corrected.ratio:.3f} [{corrected.low:.3f}, {corrected.high:.3f}] lies above the "
            f"limit but not beyond ×{bound:.2f} (the limit {units.ratio(corrected.threshold)} × the load correction's "
            "own error)"))
    if corrected.status != Status.INCONCLUSIVE:
        if corrected.status == Status.PASS and measured.status == Status.FAIL:
            return replace(corrected, status=Status.INCONCLUSIVE, load_corrected=True, note=(
                f"the runner was busy ({busy}): load-corrected it would pass, as measured ({as_measured}) it "
                "would fail"))
        return replace(corrected, load_corrected=True, note=(
            f"{interference.load_corrected(by)}: each side's steps with the co-tenants' load taken out ({as_measured}; "
            f"{busy})"))
    if measured.status == Status.FAIL:
        return replace(measured, note=f"the runner was busy ({busy}), which slows both sides of a round alike; "
                                      f"load-corrected ×{corrected.ratio:.3f} [{corrected.low:.3f}, "
                                      f"{corrected.high:.3f}]")
    return replace(corrected, load_corrected=True, note=(
        f"the runner was busy ({busy}): {corrected.note or 'load-corrected the interval straddles the threshold'}; "
        f"a pass as measured ({as_measured}) does not stand, since the load stretches what computes and not what "
        "waits: while the runner is this busy only a slowdown beyond the load fails here; rerun the job (each run "
        "reads the runner's load anew) to decide"))

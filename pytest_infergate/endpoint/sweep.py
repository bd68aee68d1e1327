"""The sweep profile, as guidellm's `--profile sweep`: one load run at concurrency 1 (synchronous: the server's
speed for one user), one with every request at once up to the client's concurrency (throughput: its ceiling),
then Poisson request rates evenly spaced between the two. Where a service stops keeping up is the *knee*: the
highest offered rate at which the median end-to-end latency stays within `KNEE_LATENCY` times the synchronous
run's (beyond it requests wait in a queue that grows with the rate). Latency, not answered/offered requests per
second: a short run's throughput is cut by its last requests' latency whatever the server's capacity. With an SLO,
the point of the highest goodput is marked too."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.endpoint.load_run import LoadPattern
from pytest_infergate.errors import OptionError
from pytest_infergate.stats import percentile

KNEE_LATENCY = 2.0  # median e2e within this many times the synchronous run's: the server keeps up

SYNCHRONOUS, THROUGHPUT, RATE = "synchronous", "throughput", "rate"


@dataclass
class SweepPoint:
    role: str  # synchronous, throughput, rate
    pattern: LoadPattern
    achieved_rps: float  # answered requests per second (median over repetitions)
    goodput_rps: float | None  # requests per second that met the SLO (None: no SLO)
    e2e_ms_p50: float | None  # median end-to-end latency of the answered requests (None: none answered)

    @property
    def offered_rps(self) -> float | None:
        return self.pattern.rate_per_s

    @classmethod
    def of(cls, role: str, pattern: LoadPattern, samples: dict) -> SweepPoint:
        goodput, e2e = samples.get("goodput_per_s"), samples.get("e2e_ms")
        return cls(role, pattern, percentile(samples.get("requests_per_s") or [0.0], 50),
                   percentile(goodput, 50) if goodput else None, percentile(e2e, 50) if e2e else None)


def rates_between(synchronous_rps: float, throughput_rps: float, points: int) -> list[float]:
    """`points` - 2 request rates evenly spaced strictly between the synchronous and the throughput rate (the two
    ends are the closed-loop points themselves). None when the server gains nothing from concurrency."""
    if points < 2:
        raise OptionError(f"a sweep profile has at least 2 points (synchronous, throughput), got points={points}")
    if not synchronous_rps > 0 or throughput_rps <= synchronous_rps:
        return []
    step = (throughput_rps - synchronous_rps) / (points - 1)
    return [round(synchronous_rps + step * i, 4) for i in range(1, points - 1)]


def knee(points: list[SweepPoint]) -> SweepPoint | None:
    """The highest offered rate whose median e2e stayed within KNEE_LATENCY x the synchronous run's, if any."""
    alone = next((p.e2e_ms_p50 for p in points if p.role == SYNCHRONOUS), None)
    if alone is None:
        return None
    kept = [p for p in points if p.role == RATE and p.e2e_ms_p50 is not None
            and p.e2e_ms_p50 <= KNEE_LATENCY * alone]
    return max(kept, key=lambda p: p.offered_rps) if kept else None


def best_goodput(points: list[SweepPoint]) -> SweepPoint | None:
    scored = [p for p in points if p.goodput_rps is not None]
    return max(scored, key=lambda p: p.goodput_rps) if scored else None


def point_name(point: SweepPoint) -> str:
    if point.role == RATE:
        return f"rate {point.offered_rps:g}/s"
    return point.role


def describe(points: list[SweepPoint]) -> str:
    """One line for the records' notes: the ends, the knee and the best goodput."""
    ends = {p.role: p.achieved_rps for p in points if p.role != RATE}
    parts = [f"sweep profile: synchronous {ends.get(SYNCHRONOUS, 0):.3g} req/s, throughput "
             f"{ends.get(THROUGHPUT, 0):.3g} req/s, {sum(p.role == RATE for p in points)} rates between"]
    found = knee(points)
    if not any(p.role == RATE for p in points):
        parts.append("the server answered no faster with requests at once than one at a time: no rate between")
    elif found is not None:
        parts.append(f"knee at {point_name(found)} (median e2e {found.e2e_ms_p50:.4g} ms, within "
                     f"{KNEE_LATENCY:g}x the synchronous run's)")
    else:
        parts.append(f"no rate point kept its median e2e within {KNEE_LATENCY:g}x the synchronous run's: the knee "
                     "is below the lowest rate")
    best = best_goodput(points)
    if best is not None:
        parts.append(f"best goodput {best.goodput_rps:.3g} req/s at {point_name(best)}")
    return "; ".join(parts)

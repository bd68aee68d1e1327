"""The slow tail of an endpoint load run, from its per-request records (endpoint.loadgen.request_record): the
requests a p99 summarizes away, each with when it left, its first token, its end, tokens and status."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate import units
from pytest_infergate.results.records import PerfRecord

SHOWN = 10  # slowest requests per measurement


@dataclass(frozen=True)
class SlowRequest:
    request_id: str
    repetition: int
    sent: str
    ttft: str
    e2e: str
    tokens: str
    outcome: str


@dataclass(frozen=True)
class SlowTail:
    test: str
    recorded: int
    rows: list[SlowRequest]


def _ms(seconds: float | None) -> str:
    return units.duration_ms(seconds * 1000) if seconds is not None else units.DASH


def slow_tails(records: list[PerfRecord]) -> list[SlowTail]:
    out = []
    for record in records:
        requests = record.measurement.requests
        if not requests:
            continue

        def e2e(r: dict) -> float:
            return (r.get("finished_s") or 0.0) - (r.get("sent_s") or 0.0)

        rows = [SlowRequest(str(r.get("request_id") or "–"), int(r.get("repetition") or 0), _ms(r.get("sent_s")),
                            _ms(r["first_token_s"] - r["sent_s"]) if r.get("first_token_s") is not None else
                            units.DASH, _ms(e2e(r)), units.number(r.get("output_tokens")),
                            r.get("error") or f"HTTP {r.get('status')}")
                for r in sorted(requests, key=e2e, reverse=True)[:SHOWN]]
        out.append(SlowTail(record.test, len(requests), rows))
    return out

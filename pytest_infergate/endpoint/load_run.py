"""One load run against an endpoint: how its load arrives (`LoadPattern`), what a request must meet to count for
goodput (`Slo`), what it gave (`LoadRun`: the requests' results, the window its figures count, its summary) and what
it adds to a Measurement (`add_to_measurement`: latencies, throughput, a record per request, the server's own
figures). Driving the load: endpoint.loadgen."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from pytest_infergate.endpoint.client import NOT_SENT, EndpointResult
from pytest_infergate.endpoint.server_metrics import ServerMetrics
from pytest_infergate.errors import OptionError, unknown_keys
from pytest_infergate.measurement import MAX_REQUEST_RECORDS, Measurement, add_request_latencies
from pytest_infergate.workloads.request import gamma_arrival_offsets


@dataclass(frozen=True)
class LoadPattern:
    """`concurrency` alone: closed loop, that many requests (or sessions) in flight. `rate_per_s`: open loop,
    arrivals with gamma-distributed gaps (burstiness 1 = Poisson, < 1 burstier), at most `concurrency` in flight
    if given. `replay`: each request or session arrives at its own `arrival_s` (a trace's timestamps, see
    workloads.from_file). None of them: every request at once, capped by the client's max concurrency.
    `warmup_s` / `cooldown_s` (guidellm's --warmup / --cooldown, in seconds): every request is sent as the pattern
    says, but the figures count only those sent `warmup_s` or more after the start and finished `cooldown_s` or
    more before the end (the server's steady state); a failure anywhere still counts as one."""

    concurrency: int | None = None
    rate_per_s: float | None = None
    burstiness: float = 1.0
    seed: int = 0
    replay: bool = False
    warmup_s: float = 0.0
    cooldown_s: float = 0.0

    def __post_init__(self):
        for name in ("warmup_s", "cooldown_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise OptionError(f"load pattern {name}={value!r} must be a number of seconds, 0 or more")
        if self.concurrency is not None and self.concurrency < 1:
            raise OptionError(f"load pattern concurrency must be at least 1, got {self.concurrency}")
        if self.rate_per_s is not None and not self.rate_per_s > 0:
            raise OptionError(f"load pattern rate_per_s must be positive (requests per second), got {self.rate_per_s}")
        if not self.burstiness > 0:
            raise OptionError(f"load pattern burstiness must be positive (1 is Poisson), got {self.burstiness}")
        if self.replay and self.rate_per_s is not None:
            raise OptionError("a load pattern replays its trace's timestamps or sets rate_per_s, not both")

    def describe(self) -> str:
        parts = ["replay (trace timestamps)"] if self.replay else []
        if self.rate_per_s is not None:
            kind = "poisson" if self.burstiness == 1 else f"gamma(burstiness={self.burstiness:g})"
            parts.append(f"rate={self.rate_per_s:g}/s {kind}")
        if self.concurrency is not None:
            parts.append(f"concurrency={self.concurrency}")
        window = [f"{name} {value:g} s" for name, value in (("warmup", self.warmup_s), ("cooldown", self.cooldown_s))
                  if value]
        return ", ".join(parts or ["all at once"]) + (f" (not counted: {', '.join(window)})" if window else "")

    def arrival_offsets(self, count: int) -> list[float]:
        if self.rate_per_s is None:
            return [0.0] * count
        return gamma_arrival_offsets(count, self.rate_per_s, self.burstiness, self.seed)

    def offsets_for(self, items: list) -> list[float]:
        """When each item (request or session) starts, in seconds from the start of the run."""
        return [item.arrival_s for item in items] if self.replay else self.arrival_offsets(len(items))


@dataclass(frozen=True)
class Slo:
    """Service-level objectives per request, in milliseconds; a request counts for goodput if it succeeded and
    met every objective given (vLLM's `--goodput ttft:... tpot:... e2el:...`)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self):
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise OptionError(f"SLO {name}={value!r} must be a positive number of milliseconds")

    @classmethod
    def parse(cls, values: dict | None) -> Slo:
        values = dict(values or {})
        unknown = unknown_keys(sorted(values), ["ttft_ms", "tpot_ms", "e2e_ms"], "SLO key")
        if unknown:
            raise OptionError(f"{unknown}; allowed: ttft_ms, tpot_ms, e2e_ms")
        return cls(**values)

    @property
    def is_empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None

    def met(self, result: EndpointResult) -> bool:
        if not result.ok:
            return False
        checks = ((self.ttft_ms, result.ttft_s), (self.tpot_ms, result.tpot_s), (self.e2e_ms, result.e2e_s))
        # a one-token answer has no TPOT; that objective does not apply to it
        return all(limit is None or value is None or value * 1000 <= limit for limit, value in checks)


@dataclass
class LoadRun:
    pattern: LoadPattern
    results: list[EndpointResult]
    duration_s: float
    slo: Slo = field(default_factory=Slo)
    server_metrics: ServerMetrics | None = None
    stopped: str = ""  # why the run ended before every request did: "stopped early", "deadline"
    started: float = 0.0  # the perf_counter instant the arrival schedule counts from

    @property
    def succeeded(self) -> list[EndpointResult]:
        return [r for r in self.results if r.ok]

    @property
    def errors(self) -> dict[str, int]:
        return dict(Counter(r.error for r in self.results if not r.ok))

    @property
    def success_rate(self) -> float:
        return len(self.succeeded) / len(self.results) if self.results else 0.0

    @property
    def goodput_per_s(self) -> float:
        counted, seconds = self.window()
        return sum(self.slo.met(r) for r in counted) / seconds if seconds else 0.0

    def window(self) -> tuple[list[EndpointResult], float]:
        """The requests the figures count and the seconds they span: all of them over the whole run, or with the
        pattern's warmup / cooldown those sent after the warmup and finished before the cooldown, over the time
        between. Raises OptionError when no request falls in it."""
        warmup, cooldown = self.pattern.warmup_s, self.pattern.cooldown_s
        if not warmup and not cooldown:
            return self.results, self.duration_s
        first, last = self.started + warmup, self.started + self.duration_s - cooldown
        counted = [r for r in self.results if r.arrival >= first and (r.finished or r.arrival) <= last]
        if not counted or last <= first:
            raise OptionError(f"no request was sent after the {warmup:g} s warmup and finished before the "
                              f"{cooldown:g} s cooldown of a {self.duration_s:.1f} s load run ({len(self.results)} "
                              "requests): send more requests, or shorten warmup_s / cooldown_s")
        return counted, last - first

    @property
    def sent(self) -> list[EndpointResult]:
        """The requests the run did not cancel itself (an early stop or a deadline cancels the rest)."""
        return [r for r in self.results if r.error not in NOT_SENT]

    def cached_prompt_share(self) -> float | None:
        """usage.prompt_tokens_details.cached_tokens / prompt_tokens over the answered requests that report it."""
        reported = [r for r in self.succeeded if r.cached_tokens is not None and r.prompt_tokens]
        prompt = sum(r.prompt_tokens for r in reported)
        return sum(r.cached_tokens for r in reported) / prompt if prompt else None

    def summary(self) -> dict:
        counted, seconds = self.window()
        ok = [r for r in counted if r.ok]
        out_tokens = sum(r.num_output_tokens or 0 for r in ok)
        return {"pattern": self.pattern.describe(), "requests": len(self.results), "succeeded": len(self.succeeded),
                "counted": len(counted), "errors": self.errors, "duration_s": self.duration_s,
                "output_tokens": out_tokens, "tokens_per_s": out_tokens / seconds if seconds else 0.0,
                "requests_per_s": len(ok) / seconds if seconds else 0.0,
                "success_rate": self.success_rate, "goodput_per_s": self.goodput_per_s, "slo": asdict(self.slo),
                "usage_reported": all(r.usage_reported for r in ok) if ok else False,
                "cached_prompt_share": self.cached_prompt_share(), "stopped": self.stopped}


def add_to_measurement(run: LoadRun, into: Measurement) -> None:
    """One repetition: per-request latencies of the successful requests, throughput figures once."""
    samples = into.samples
    ok = run.succeeded
    for r in run.window()[0]:
        if r.ok:
            add_request_latencies(samples, r.ttft_s, r.tpot_s, r.itl_s, r.e2e_s)
    summary = run.summary()
    samples.setdefault("tokens_per_s", []).append(summary["tokens_per_s"])
    samples.setdefault("requests_per_s", []).append(summary["requests_per_s"])
    samples.setdefault("success_rate", []).append(summary["success_rate"])
    if not run.slo.is_empty:
        samples.setdefault("goodput_per_s", []).append(summary["goodput_per_s"])
    into.num_requests += len(run.results)
    into.num_failed += len(run.results) - len(ok)
    into.repetitions += 1
    errors = Counter(into.engine.get("errors", {}))
    errors.update(summary["errors"])
    into.engine.update(errors=dict(errors), pattern=summary["pattern"], slo=summary["slo"],
                       usage_reported=summary["usage_reported"])
    start = min((r.arrival for r in run.results if r.arrival), default=0.0)
    room = MAX_REQUEST_RECORDS - len(into.requests)
    into.requests += [request_record(r, start, into.repetitions - 1) for r in run.results[:max(0, room)]]
    into.engine.setdefault("failures", [])
    into.engine["failures"] += [{"request_id": r.request_id, "error": r.error, "detail": r.error_detail}
                                for r in run.results if not r.ok][:20 - len(into.engine["failures"])]
    add_server_figures(run, into)


MAX_CHUNKS = 4096  # chunk arrivals kept per request record


def request_record(result: EndpointResult, start: float, repetition: int) -> dict:
    """One request as the JSON results keep it: instants in seconds from the load run's first send."""
    def offset(instant: float | None) -> float | None:
        return None if instant is None else round(instant - start, 6)

    return {"repetition": repetition, "request_id": result.request_id, "sent_s": offset(result.arrival),
            "first_token_s": offset(result.first_token), "finished_s": offset(result.finished),
            "chunks_s": [offset(t) for t in result.token_times[:MAX_CHUNKS]],
            "prompt_tokens": result.prompt_tokens, "output_tokens": result.num_output_tokens, "status": result.status,
            "error": result.error, "sent_on_wire": result.sent_on_wire}


def add_server_figures(run: LoadRun, into: Measurement) -> None:
    """The server's own figures of the run (peak KV usage, prefix-cache hit rate, preemptions, peak queue and
    batch) as samples - one per repetition, usable as budget keys - and the whole scrape (with its timeline) in
    `engine["server_metrics"]` for the report. The prefix-cache hit rate falls back to the share of prompt tokens
    the server reported as cached in `usage`."""
    figures = dict(run.server_metrics.figures()) if run.server_metrics is not None else {}
    source = "server /metrics" if "prefix_cache_hit_rate" in figures else ""
    client_share = run.cached_prompt_share()
    if client_share is not None and not source:
        figures["prefix_cache_hit_rate"], source = client_share, "usage.prompt_tokens_details.cached_tokens"
    for name, value in figures.items():
        into.samples.setdefault(name, []).append(value)
    if run.server_metrics is not None:
        into.engine["server_metrics"] = {**run.server_metrics.to_dict(), "prefix_cache_source": source,
                                         "cached_prompt_share": client_share}

"""The report's serving sections, read from the endpoint records through the endpoint package's own types: the
server's /metrics beside the client figures of each load run, the capacity search drawn (goodput and latency p99
against the load, the SLO and the knee marked), and A/B runs with both sides named. A server that exposed no
metrics gets a note, never an error. And each load run's slow tail, from its per-request records
(endpoint.load_run.request_record): the requests a p99 summarizes away, each with when it left, its first token,
its end, tokens and status."""

from __future__ import annotations

from dataclasses import dataclass, field

from markupsafe import Markup

from pytest_infergate import units
from pytest_infergate.endpoint.capacity_records import CapacityResult
from pytest_infergate.endpoint.server_metrics import ServerMetrics
from pytest_infergate.perf.conversations import prefix_cache_use
from pytest_infergate.report import charts
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.summary import figure as summary_figure
from pytest_infergate.results.summary import verdict_reasons


@dataclass(frozen=True)
class RanOn:
    """What a perf record ran on, as the report shows it: the one place the report reads a record's kind."""

    served: bool  # the served model (--infergate-endpoint), not a local precision
    setting: str | None  # its load pattern on a server, its batching on the engine
    name: str  # in a chart: the pattern on a server, "<precision> <batching>" on the engine

    @classmethod
    def of(cls, r: PerfRecord) -> RanOn:
        served = r.is_endpoint
        setting = r.engine_config.get("pattern" if served else "batching")
        return cls(served, setting, str(setting) if served else f"{r.precision} {setting}")


def served(records: list[PerfRecord]) -> list[PerfRecord]:
    """The served model's records, in order."""
    return [r for r in records if RanOn.of(r).served]


def local(records: list[PerfRecord]) -> list[PerfRecord]:
    """The local precisions' records, in order."""
    return [r for r in records if not RanOn.of(r).served]


# the server figures shown per load run: (budget metric, header); the record's samples hold them (median over
# repetitions), the last scrape says where they came from
SERVER_COLUMNS = (("kv_usage", "KV cache usage (peak)"), ("prefix_cache_hit_rate", "prefix-cache hits"),
                  ("preemptions", "preemptions"), ("waiting_requests", "queue (peak)"),
                  ("running_requests", "batch (peak)"))
TOKEN_COUNTERS = (("prompt_tokens", "prompt tokens"), ("generation_tokens", "generated tokens"))
# the client figures an A/B row shows for each side
AB_COLUMNS = (("ttft_ms_p50", "TTFT p50"), ("ttft_ms_p99", "TTFT p99"), ("tpot_ms_p50", "TPOT p50"),
              ("e2e_ms_p99", "e2e p99"), ("tokens_per_s", "throughput"), ("success_rate", "success"))
SLO_PERCENTILE = "p99"


def experiment(record: PerfRecord) -> str:
    return str(record.tags.get("experiment") or "")


def server_value(metric: str, value: float | None) -> str:
    """A server figure: fractions as percentages, counts as plain numbers."""
    if metric in ("kv_usage", "prefix_cache_hit_rate"):
        return units.percent(value)
    return units.number(value)


@dataclass
class ServerSide:
    """One deployment's server-side view of a load run."""

    name: str  # what it served
    url: str
    server: str  # vLLM, SGLang, TGI, llama.cpp, or "" when not recognized / not scraped
    cells: list[str]  # SERVER_COLUMNS, formatted ("–" where the server exposes no such metric)
    tokens: list[str]  # TOKEN_COUNTERS over the run
    notes: list[str] = field(default_factory=list)


def server_side(name: str, url: str, scraped: dict | None, figures: dict[str, float],
                prefix_source: str = "") -> ServerSide:
    """`scraped`: a Measurement's `engine["server_metrics"]` (None: /metrics was not read for this run)."""
    if not scraped:
        return ServerSide(name, url, "", [units.DASH] * len(SERVER_COLUMNS), [units.DASH] * len(TOKEN_COUNTERS),
                          ["no server metrics for this run: the server's /metrics was not read (pass "
                           "--infergate-endpoint-metrics-url where it lives elsewhere)"])
    metrics = ServerMetrics.from_dict(scraped)
    figures = {**metrics.figures(), **figures}  # the repetitions' median where recorded, else the last scrape
    notes = list(metrics.notes)
    if prefix_source and prefix_source != "server /metrics" and "prefix_cache_hit_rate" in figures:
        notes.append(f"prefix-cache hits from the responses' {prefix_source}")
    return ServerSide(name, url, metrics.server, [server_value(key, figures.get(key)) for key, _ in SERVER_COLUMNS],
                      [units.number(metrics.delta(key)) for key, _ in TOKEN_COUNTERS], notes)


@dataclass
class LoadRunServers:
    test: str
    label: str
    sides: list[ServerSide]


def _candidate_side(record: PerfRecord) -> ServerSide:
    engine = record.measurement.engine
    scraped = engine.get("server_metrics")
    return server_side(str(record.engine_config.get("served_model") or engine.get("served_model") or ""),
                       str(record.engine_config.get("url") or engine.get("url") or ""), scraped, record.summary,
                       (scraped or {}).get("prefix_cache_source", ""))


def _reference_side(record: PerfRecord) -> ServerSide | None:
    """Side A of a two-deployment A/B (--infergate-reference-endpoint), as the candidate's record keeps it."""
    reference = record.measurement.engine.get("reference")
    if not isinstance(reference, dict):
        return None
    scraped = reference.get("server_metrics")
    return server_side(str(reference.get("served_model") or ""), str(reference.get("url") or ""), scraped,
                       dict(record.baseline_summary or {}),
                       (scraped or {}).get("prefix_cache_source", ""))


def server_metric_rows(records: list[PerfRecord]) -> list[LoadRunServers]:
    """Every endpoint load run (a capacity search shows its server figures per point instead)."""
    rows = []
    for record in records:
        if not RanOn.of(record).served or experiment(record) == "capacity":
            continue
        reference = _reference_side(record)
        rows.append(LoadRunServers(record.test, record.label or record.test.split("::")[-1],
                                   ([reference] if reference else []) + [_candidate_side(record)]))
    return rows


@dataclass
class AbSide:
    role: str  # "A (baseline)" / "B (candidate)"
    name: str
    url: str  # "" for a local precision
    cells: list[str]  # AB_COLUMNS


@dataclass
class AbRun:
    test: str
    status: str
    sides: list[AbSide]
    verdicts: list[str]  # why, as the perf table's verdict column says it
    notes: list[str]


def ab_runs(records: list[PerfRecord]) -> list[AbRun]:
    """Interleaved A/B runs: two deployments (the reference endpoint and the endpoint) or two precisions."""
    out = []
    for record in records:
        if experiment(record) != "ab" or record.baseline_summary is None:
            continue
        if RanOn.of(record).served:
            reference = record.measurement.engine.get("reference") or {}
            a = (str(record.engine_config.get("reference_served_model") or reference.get("served_model") or "?"),
                 str(record.engine_config.get("reference_url") or reference.get("url") or ""))
            b = (str(record.engine_config.get("served_model") or "?"), str(record.engine_config.get("url") or ""))
        else:
            a, b = (str(record.tags.get("baseline_precision", "?")), ""), (record.precision, "")
        sides = [AbSide(role, name, url, [summary_figure(summary, key) for key, _ in AB_COLUMNS])
                 for role, (name, url), summary in (("A (baseline)", a, record.baseline_summary),
                                                    ("B (candidate)", b, record.summary))]
        out.append(AbRun(record.test, record.status.value, sides, verdict_reasons(record),
                         list(record.notes)))
    return out


@dataclass
class CapacityPointRow:
    load: str
    requests: int
    attainment: str  # share within the SLO, with its 95% CI
    verdict: str  # pass / fail / unresolved (the target inside the interval) / undecided (cut by the time budget)
    goodput: str
    throughput: str
    latency: list[str]  # p99 of each SLO metric
    stopped: str


@dataclass
class CapacitySection:
    test: str
    status: str
    description: str
    slo_metrics: list[str]  # the SLO's metrics, as latency columns
    points: list[CapacityPointRow]
    charts: list[Markup]


def _load_unit(result: CapacityResult) -> str:
    return "req/s offered" if result.spec.search == "rate" else "requests in flight"


def _interval(ci: tuple[float, float]) -> str:
    """An attainment's interval, named as CapacityResult.describe names it: '(95% CI 83%–99%)'."""
    return f"(95% CI {units.percent(ci[0])}–{units.percent(ci[1])})"


def _capacity_charts(test: str, result: CapacityResult) -> list[Markup]:
    x_unit = _load_unit(result)
    best = result.best
    mark = band = None
    if best is not None:
        mark = (best.load, f"capacity {units.number(best.load)}: {units.percent(best.attainment)} in SLO "
                           f"{_interval(best.ci)}")
    low, high = result.bracket
    if low is not None and high is not None:
        band = (low, high)
    name = test.split("::")[-1][:40]
    goodput = charts.marked_xy_chart(
        # goodput drawn last, on top: below the knee it equals the throughput
        f"Goodput vs load: {name}", {"throughput": [(p.load, p.throughput_rps) for p in result.points],
                                     "goodput": [(p.load, p.goodput_rps) for p in result.points]},
        "req/s", x_unit, mark=mark, band=band)
    slo = result.spec.slo
    limits = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms}
    latency = {f"{metric[:-3].upper() if metric != 'e2e_ms' else 'e2e'} {SLO_PERCENTILE}":
               [(p.load, p.latency_ms[f"{metric}_{SLO_PERCENTILE}"]) for p in result.points
                if f"{metric}_{SLO_PERCENTILE}" in p.latency_ms]
               for metric, limit in limits.items() if limit is not None}
    guides = tuple((limit, f"SLO {metric[:-3] if metric != 'e2e_ms' else 'e2e'} ≤ {units.duration_ms(limit)}")
                   for metric, limit in limits.items() if limit is not None)
    latency_chart = charts.marked_xy_chart(f"Latency {SLO_PERCENTILE} vs load: {name}",
                                           {k: v for k, v in latency.items() if v}, "ms", x_unit, guides=guides,
                                           mark=mark, band=band)
    return [Markup(chart) for chart in (goodput, latency_chart) if chart]


def capacity_sections(records: list[PerfRecord]) -> list[CapacitySection]:
    out = []
    for record in records:
        data = record.measurement.engine.get("capacity")
        if experiment(record) != "capacity" or not isinstance(data, dict):
            continue
        result = CapacityResult.from_dict(data)
        slo = result.spec.slo
        metrics = [m for m, limit in (("ttft_ms", slo.ttft_ms), ("tpot_ms", slo.tpot_ms), ("e2e_ms", slo.e2e_ms))
                   if limit is not None]
        rows = [CapacityPointRow(units.number(p.load), p.requests,
                                 f"{units.percent(p.attainment)} {_interval(p.ci)}",
                                 p.verdict,
                                 f"{units.number(p.goodput_rps)} req/s", f"{units.number(p.throughput_rps)} req/s",
                                 [units.duration_ms(p.latency_ms.get(f"{m}_{SLO_PERCENTILE}")) for m in metrics],
                                 p.stopped)
                for p in sorted(result.points, key=lambda p: p.load)]
        out.append(CapacitySection(record.test, record.status.value, result.describe(), metrics, rows,
                                   _capacity_charts(record.test, result)))
    return out


def prefix_cache_detail(record: PerfRecord) -> str | None:
    """A local run's prefix-cache reuse, for its row's details (None when it recorded none or reused nothing)."""
    reuse = prefix_cache_use(record.measurement.engine)
    if reuse is None or not (reuse.cached_tokens or reuse.sessions or record.engine_config.get("prefix_caching")):
        return None
    return reuse.describe()


SLOW_SHOWN = 10  # slowest requests per measurement


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
                for r in sorted(requests, key=e2e, reverse=True)[:SLOW_SHOWN]]
        out.append(SlowTail(record.test, len(requests), rows))
    return out

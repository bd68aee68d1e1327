"""The server's own view of a load run: its Prometheus `/metrics`, scraped before, during (sampled) and after the
run, parsed with prometheus-client's parser and mapped from vLLM's, SGLang's, TGI's and llama.cpp's names to one
vocabulary. A metric a server does not expose is skipped with a note, never an error; so is a server without
`/metrics` (llama.cpp's needs `--metrics`, SGLang's `--enable-metrics`) or one that stops answering mid-run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

import httpx

# vocabulary name -> (kind, how label sets combine, the servers' sample names). Counters are named as exposed
# (with _total); several names per server cover renames across versions (vLLM V0 -> V1).
VOCABULARY: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "running_requests": ("gauge", "sum", ("vllm:num_requests_running", "sglang:num_running_reqs",
                                          "tgi_batch_current_size", "llamacpp:requests_processing")),
    "waiting_requests": ("gauge", "sum", ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size",
                                          "llamacpp:requests_deferred")),
    "kv_usage": ("gauge", "max", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                                  "llamacpp:kv_cache_usage_ratio")),
    "prefix_cache_hit_rate_gauge": ("gauge", "max", ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")),
    "prefix_cache_queries": ("counter", "sum", ("vllm:prefix_cache_queries_total",)),
    "prefix_cache_hits": ("counter", "sum", ("vllm:prefix_cache_hits_total", "llamacpp:prompt_tokens_cached_total")),
    "preemptions": ("counter", "sum", ("vllm:num_preemptions_total",)),
    # llama.cpp counts computed prompt tokens here, without the cached ones
    "prompt_tokens": ("counter", "sum", ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total",
                                         "llamacpp:prompt_tokens_total", "tgi_request_input_length_sum")),
    "generation_tokens": ("counter", "sum", ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
                                             "llamacpp:tokens_predicted_total", "tgi_request_generated_tokens_sum")),
}
SERVERS = {"vllm:": "vLLM", "sglang:": "SGLang", "tgi_": "TGI", "llamacpp:": "llama.cpp"}
# what a load run reports per vocabulary entry, as the budget metric of the same name (measurement.py)
BUDGET_FIGURES = ("kv_usage", "prefix_cache_hit_rate", "preemptions", "waiting_requests", "running_requests")


def parse_metrics(text: str) -> dict[str, list[float]]:
    """Prometheus text format -> sample name -> its values (one per label set). Raises ValueError if malformed."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(float(sample.value))
    return values


def to_vocabulary(values: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, str]]:
    """The vocabulary's figures found in one scrape, and which server name each came from."""
    figures, names = {}, {}
    for name, (_, combine, sources) in VOCABULARY.items():
        for source in sources:
            if values.get(source):
                figures[name] = sum(values[source]) if combine == "sum" else max(values[source])
                names[name] = source
                break
    return figures, names


@dataclass
class ServerMetrics:
    """One load run as the server counted it. `before` / `after`: vocabulary figures at the edges of the run;
    `timeline`: [seconds since the run started, {figure: value}] sampled during it; `names`: which server
    metric each figure came from."""

    url: str
    server: str = ""  # vLLM, SGLang, TGI, llama.cpp (from the names' prefixes); "" when none was recognized
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    timeline: list[list] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return bool(self.before or self.after or self.timeline)

    def _seen(self, name: str) -> list[float]:
        points = [self.before, *(values for _, values in self.timeline), self.after]
        return [p[name] for p in points if name in p]

    def peak(self, name: str) -> float | None:
        seen = self._seen(name)
        return max(seen) if seen else None

    def delta(self, name: str) -> float | None:
        if name in self.before and name in self.after:
            return max(0.0, self.after[name] - self.before[name])  # a restarted server resets its counters
        return None

    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens served from the prefix cache during the run: vLLM's hits / queries counters; llama.cpp's
        cached / (computed + cached) prompt tokens; else the server's own hit-rate gauge at the end."""
        hits = self.delta("prefix_cache_hits")
        queries = self.delta("prefix_cache_queries")
        if hits is not None and queries is None and self.names.get("prefix_cache_hits", "").startswith("llamacpp:"):
            computed = self.delta("prompt_tokens")
            queries = None if computed is None else computed + hits
        if hits is not None and queries:
            return hits / queries
        gauge = self.after.get("prefix_cache_hit_rate_gauge")
        return gauge

    def figures(self) -> dict[str, float]:
        """The budget figures this server exposes: peaks of the gauges, deltas of the counters."""
        out = {"kv_usage": self.peak("kv_usage"), "prefix_cache_hit_rate": self.prefix_cache_hit_rate(),
               "preemptions": self.delta("preemptions"), "waiting_requests": self.peak("waiting_requests"),
               "running_requests": self.peak("running_requests")}
        return {name: value for name, value in out.items() if value is not None}

    def missing(self) -> list[str]:
        return [name for name in BUDGET_FIGURES if name not in self.figures()]

    def to_dict(self) -> dict:
        out = asdict(self)
        deltas = {name: self.delta(name) for name, (kind, _, _) in VOCABULARY.items() if kind == "counter"}
        out.update(figures=self.figures(), missing=self.missing(),
                   deltas={name: value for name, value in deltas.items() if value is not None})
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ServerMetrics:
        """Read back what `to_dict` wrote (its derived figures are computed again from before / after)."""
        return cls(str(data.get("url", "")), str(data.get("server") or ""), dict(data.get("before") or {}),
                   dict(data.get("after") or {}), [list(point) for point in data.get("timeline") or []],
                   dict(data.get("names") or {}), list(data.get("notes") or []))


class MetricsScraper:
    """Scrapes `url` when entered, every `interval_s` while the run goes on, and when left; use around a run with
    `async with`. Failures become notes in `result`; nothing raises."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, interval_s: float = 0.5,
                 timeout_s: float = 2.0):
        self.result = ServerMetrics(url)
        self.interval_s = interval_s
        self._http = httpx.AsyncClient(headers=headers or {}, timeout=timeout_s)
        self._task: asyncio.Task | None = None
        self._start = 0.0
        self._enabled = True
        self._parsed = False  # some scrape answered in the Prometheus format

    async def scrape(self) -> dict[str, float] | None:
        if not self._enabled:
            return None
        url = self.result.url
        try:
            response = await self._http.get(url)
        except httpx.HTTPError as exc:
            return self._note(f"GET {url} failed ({type(exc).__name__}): server-side figures missing from then on")
        if response.status_code != 200:
            self._enabled = False  # asked again next run, not every half second
            return self._note(f"no Prometheus metrics at {url} (HTTP {response.status_code}): server-side figures "
                              "skipped (llama.cpp's server needs --metrics, SGLang --enable-metrics)")
        try:
            values = parse_metrics(response.text)
        except ValueError as exc:
            self._enabled = False
            return self._note(f"{url} is not in the Prometheus text format ({exc}): server-side figures skipped")
        self._parsed = True
        figures, names = to_vocabulary(values)
        self.result.names.update(names)
        if not self.result.server:
            prefixes = [prefix for prefix in SERVERS if any(name.startswith(prefix) for name in values)]
            self.result.server = SERVERS[prefixes[0]] if prefixes else ""
        return figures

    def _note(self, note: str) -> None:
        if note not in self.result.notes:
            self.result.notes.append(note)
        return None

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            figures = await self.scrape()
            if figures is not None:
                self.result.timeline.append([round(time.perf_counter() - self._start, 3), figures])

    async def __aenter__(self) -> MetricsScraper:
        self._start = time.perf_counter()
        self.result.before = await self.scrape() or {}
        if self._enabled:
            self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.result.after = await self.scrape() or {}
        await self._http.aclose()
        if self._parsed and not self.result.server:
            self._note("the server's metric names are none of vLLM's, SGLang's, TGI's or llama.cpp's: nothing mapped")
        elif self._parsed:
            missing = self.result.missing()
            if missing:
                self._note(f"{self.result.server} exposes no {', '.join(missing)}: not measured, not gated")

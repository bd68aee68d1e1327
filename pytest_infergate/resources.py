"""What a session's tests share, as plain Python (no pytest): the model pools (the model under test in each
precision, the compare model), the served endpoints, the baseline environment's worker, and the caches the golden
gates share. The session owns one; fixtures ask it for what a test needs. What cannot be had raises
ResourceError saying why (the fixture fails the test with it), so a REPL or a unit test drives it alone."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_infergate.endpoint.exchange import EndpointConfig
from pytest_infergate.errors import InfergateError, ModelLoadError, OptionError
from pytest_infergate.models import ModelPool
from pytest_infergate.options import Options
from pytest_infergate.quality.scoring import ScoreCache


class ResourceError(InfergateError):
    """A model, tokenizer or worker a test needs that could not be had; the message says why."""


@dataclass
class GoldenCaches:
    """What the golden gates of a session compute once and share."""

    generated: dict = field(default_factory=dict)  # local models' golden outputs, by precision and sample set
    comparisons: dict = field(default_factory=dict)  # one quality comparison per precision and sample set
    reference_scores: ScoreCache = field(default_factory=ScoreCache)  # the reference's log-probabilities
    endpoint_answers: dict = field(default_factory=dict)  # the endpoint's golden answers


class SessionResources:
    def __init__(self, options: Options):
        self.options = options
        self.pool = ModelPool(options)
        self.caches = GoldenCaches()
        self.endpoint = None  # endpoint.loadgen.EndpointBench, with --infergate-endpoint (connect_endpoints)
        self.reference_endpoint = None  # with --infergate-reference-endpoint
        self._compare_pool: ModelPool | None = None
        self._refused: dict[int, str] = {}  # id of a LoadedModel the engine refused under --infergate-backend engine
        self._baseline_env: Any = None  # perf.baseline_env.BaselineEnv, or the error it could not start with

    def connect_endpoints(self) -> None:
        """With --infergate-endpoint: ask each server for its model once (raises InfergateError where one is down)."""
        if self.options.endpoint is None:
            return
        from pytest_infergate.endpoint.loadgen import EndpointBench

        bench = EndpointBench(endpoint_config(self.options))
        bench.model  # noqa: B018 - GET /v1/models once; the served name is reused by every test
        if self.options.reference_endpoint is not None:
            reference = EndpointBench(endpoint_config(self.options, reference=True))
            reference.model  # noqa: B018
            self.reference_endpoint = reference
        self.endpoint = bench

    def model(self, precision: str):
        """The model under test in `precision`, loaded once, with the backend --infergate-backend chooses."""
        return self._with_backend(_loaded(lambda: self.pool.get(precision), "infergate could not load the model"))

    def compare_side(self, precision: str):
        """The A side of an interleaved A/B run: --infergate-compare-model in `precision`, else the reference."""
        if not self.options.compare_model:
            return self.model(self.options.reference_precision)
        if self._compare_pool is None:
            self._compare_pool = ModelPool(replace(self.options, model=self.options.compare_model))
        return self._with_backend(_loaded(lambda: self._compare_pool.get(precision),
                                          "infergate could not load the compare model"))

    def tokenizer(self):
        return _loaded(lambda: self.pool.tokenizer, "infergate could not load the tokenizer")

    def baseline_env(self):
        """The worker of --infergate-baseline-python, started at the first measurement that needs it; one that
        cannot start is not retried: every test that needs it fails with the same reason."""
        from pytest_infergate.perf.baseline_env import BaselineEnv, BaselineEnvError

        if self._baseline_env is None:
            try:
                self._baseline_env = BaselineEnv(self.options.baseline_python, self.options.baseline_python_timeout)
            except BaselineEnvError as exc:
                self._baseline_env = exc
        if isinstance(self._baseline_env, BaselineEnvError):
            raise ResourceError(f"infergate could not start the baseline environment: {self._baseline_env}")
        return self._baseline_env

    def close(self) -> None:
        if self._baseline_env is not None and not isinstance(self._baseline_env, Exception):
            self._baseline_env.close()
        self._baseline_env = None

    def _with_backend(self, loaded):
        """`loaded`, with its backend (the engine's self-check runs once per loaded model). Under `engine` a model
        the engine refuses fails every test that needs it, naming the family and what the self-check found."""
        if loaded.backend is not None:
            return loaded
        key = id(loaded)
        if key not in self._refused:
            from pytest_infergate.engine import UnsupportedModelError
            from pytest_infergate.engine.backends import choose_backend

            try:
                loaded.use_backend(choose_backend(loaded.model, loaded.tokenizer, self.options.backend))
                return loaded
            except UnsupportedModelError as exc:
                self._refused[key] = (f"infergate: --infergate-backend engine, but the engine refuses "
                                      f"{loaded.record.model} in {loaded.record.requested_precision}: {exc}")
        raise ResourceError(self._refused[key])


def _loaded(load, what: str):
    """`load()`, or ResourceError with the load error's message (raised outside the except block: the test fails
    with the message once, not with a "During handling of the above exception" chain)."""
    try:
        return load()
    except ModelLoadError as exc:
        message = f"{what}: {exc}"
    raise ResourceError(message)


def endpoint_config(options: Options, reference: bool = False) -> EndpointConfig:
    """The EndpointConfig of --infergate-endpoint (or, `reference`, of --infergate-reference-endpoint) and its
    companion options (the API key read from the named environment variable, never from the command line)."""
    api_key = None
    key_env, flag = options.api_key_env, "--infergate-api-key-env"
    if reference and options.reference_api_key_env:
        key_env, flag = options.reference_api_key_env, "--infergate-reference-api-key-env"
    if key_env:
        api_key = os.environ.get(key_env)
        if not api_key:
            raise OptionError(f"{flag} names {key_env!r}, but that environment variable is not set or empty: "
                              "export it, or drop the option for a server without authentication")
    if reference:
        return EndpointConfig(options.reference_endpoint, options.reference_endpoint_model, api_key,
                              options.endpoint_timeout, options.endpoint_concurrency, options.endpoint_api,
                              option="--infergate-reference-endpoint")
    return EndpointConfig(options.endpoint, options.endpoint_model, api_key, options.endpoint_timeout,
                          options.endpoint_concurrency, options.endpoint_api, options.endpoint_metrics_url)

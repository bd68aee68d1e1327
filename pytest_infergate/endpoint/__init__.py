"""The endpoint backend: gates a live OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp) instead of the
reference engine - load runs, capacity under an SLO, a second deployment side by side, the server's /metrics."""

from pytest_infergate.endpoint.capacity import search_capacity
from pytest_infergate.endpoint.capacity_records import CapacityResult, CapacitySpec
from pytest_infergate.endpoint.client import (
    EndpointClient,
    EndpointConfig,
    EndpointError,
    EndpointRequest,
    EndpointResult,
)
from pytest_infergate.endpoint.load_run import LoadPattern, LoadRun, Slo
from pytest_infergate.endpoint.loadgen import run_load, sweep_patterns
from pytest_infergate.endpoint.server_metrics import ServerMetrics, parse_metrics

__all__ = ["CapacityResult", "CapacitySpec", "EndpointClient", "EndpointConfig", "EndpointError", "EndpointRequest",
           "EndpointResult", "LoadPattern", "LoadRun", "ServerMetrics", "Slo", "parse_metrics", "run_load",
           "search_capacity", "sweep_patterns"]

"""The endpoint backend: gates a live OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp) instead of the
reference engine."""

from pytest_infergate.endpoint.client import (
                                              EndpointClient,
                                              EndpointConfig,
                                              EndpointError,
                                              EndpointRequest,
                                              EndpointResult,
)
from pytest_infergate.endpoint.load import LoadPattern, LoadRun, Slo, run_load, sweep_patterns

__all__ = ["EndpointClient", "EndpointConfig", "EndpointError", "EndpointRequest", "EndpointResult", "LoadPattern",
           "LoadRun", "Slo", "run_load", "sweep_patterns"]

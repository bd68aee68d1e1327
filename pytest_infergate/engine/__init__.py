"""The reference inference engine: KV cache (none / contiguous / paged), sequential / static / dynamic /
continuous batching, streaming and limits. Exact: greedy output equals `model.generate`, checked on every model
at construction (models it cannot run exactly raise UnsupportedModelError)."""

from pytest_infergate.engine.attention import UnsupportedModelError
from pytest_infergate.engine.backends import engine_only, hf_config, make_backend
from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.engine import Engine
from pytest_infergate.engine.hf_backend import HFGenerateBackend
from pytest_infergate.engine.request import FinishReason, Request, RequestTimings, Result

__all__ = ["Engine", "EngineConfig", "FinishReason", "HFGenerateBackend", "Request", "RequestTimings", "Result",
           "UnsupportedModelError", "engine_only", "hf_config", "make_backend"]

"""The reference inference engine: KV cache (none / contiguous / paged), sequential / static / dynamic /
continuous batching, streaming and limits. Exact: greedy output equals `model.generate`, checked on every model
at construction (models it cannot run exactly raise UnsupportedModelError).

The names below are imported on first use (PEP 562): `EngineConfig` and `Request` are plain records that an
install without torch (endpoint gating, see docs/install.md) uses too, so importing them must not load torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_WHERE = {
    "UnsupportedModelError": "attention", "engine_only": "backends", "hf_config": "backends",
    "make_backend": "backends", "EngineConfig": "config", "Engine": "engine", "HFGenerateBackend": "hf_backend",
    "FinishReason": "request", "Request": "request", "RequestTimings": "request", "Result": "request",
}

__all__ = ["Engine", "EngineConfig", "FinishReason", "HFGenerateBackend", "Request", "RequestTimings", "Result",
           "UnsupportedModelError", "engine_only", "hf_config", "make_backend"]

if TYPE_CHECKING:
    from pytest_infergate.engine.attention import UnsupportedModelError
    from pytest_infergate.engine.backends import engine_only, hf_config, make_backend
    from pytest_infergate.engine.config import EngineConfig
    from pytest_infergate.engine.engine import Engine
    from pytest_infergate.engine.hf_backend import HFGenerateBackend
    from pytest_infergate.engine.request import FinishReason, Request, RequestTimings, Result


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value

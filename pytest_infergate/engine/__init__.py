"""The reference inference engine: KV cache (none / contiguous / paged), sequential / static / dynamic /
continuous batching, streaming and limits. Exact: greedy output equals `model.generate`, checked on every model
at construction (models it cannot run exactly raise UnsupportedModelError).

The names below are imported on first use (PEP 562): `EngineConfig` and `Request` are plain records that an
install without torch (endpoint gating, see docs/install.md) uses too, so importing them must not load torch.
`Request` lives in `pytest_infergate.workloads` (the endpoint takes it too); it is named here as well, where an
engine user looks for it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_WHERE = {  # name -> its module (a leading dot: in the engine)
    "UnsupportedModelError": ".attention", "engine_only": ".backends", "hf_config": ".backends",
    "make_backend": ".backends", "EngineConfig": ".config", "Engine": ".engine", "HFGenerateBackend": ".hf_backend",
    "FinishReason": ".sequence", "RequestTimings": ".sequence", "Result": ".sequence",
    "Request": "pytest_infergate.workloads.request",
}

__all__ = ["Engine", "EngineConfig", "FinishReason", "HFGenerateBackend", "Request", "RequestTimings", "Result",
           "UnsupportedModelError", "engine_only", "hf_config", "make_backend"]

if TYPE_CHECKING:
    from pytest_infergate.engine.attention import UnsupportedModelError
    from pytest_infergate.engine.backends import engine_only, hf_config, make_backend
    from pytest_infergate.engine.config import EngineConfig
    from pytest_infergate.engine.engine import Engine
    from pytest_infergate.engine.hf_backend import HFGenerateBackend
    from pytest_infergate.engine.sequence import FinishReason, RequestTimings, Result
    from pytest_infergate.workloads.request import Request


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value

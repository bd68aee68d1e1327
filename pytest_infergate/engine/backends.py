"""Which backend runs a model's workloads: the engine, or transformers' own generate where the engine refuses.

    backend, reason = make_backend(model, tokenizer, config, backend="auto")
    results = backend.generate(requests)            # Engine and HFGenerateBackend have the same surface
    record["backend"] = backend.name                # "engine" or "hf-generate"
    record["backend_reason"] = reason               # "" for the engine; why not, otherwise
    record["self_check_s"] = backend.self_check_s   # the engine's self-check cost (None for hf-generate)

`auto` tries the engine and falls back to HF generate on UnsupportedModelError, keeping the error's message as
the reason. `engine` raises that error instead; `hf` uses HF generate (the reason says it was asked for).
The HF backend runs static batches only: `engine_only(config)` lists what a config asks for that only the engine
does (experiments that need it are skipped with that reason); `hf_config(config)` is the config it runs.
"""

from __future__ import annotations

from dataclasses import replace

from pytest_infergate.engine.attention import UnsupportedModelError
from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.engine import Engine
from pytest_infergate.engine.hf_backend import HFGenerateBackend
from pytest_infergate.errors import OptionError

BACKENDS = ("auto", "engine", "hf")


def engine_only(config: EngineConfig) -> list[str]:
    """What `config` asks for that only the engine does (empty: the HF backend can run it). Continuous batching,
    the engine's default, is not in the list: the HF backend runs the same requests in static batches."""
    needs = []
    if config.batching == "dynamic":
        needs.append("dynamic batching")
    if config.cache_mode == "none":
        needs.append("cache_mode='none'")
    if config.prefix_caching:
        needs.append("prefix caching")
    for name in ("length_bucketing", "schedule_by_tokens"):
        if getattr(config, name):
            needs.append(name)
    if config.max_length_spread is not None:
        needs.append("max_length_spread")
    return needs


def hf_config(config: EngineConfig) -> EngineConfig:
    """The config the HF backend runs for `config`: static batches of max_batch_size (sequential stays one at a
    time) on transformers' own cache. Raises OptionError for what only the engine does."""
    needs = engine_only(config)
    if needs:
        raise OptionError(f"the hf-generate backend cannot run {', '.join(needs)}: that needs the infergate engine")
    batching = "sequential" if config.batching == "sequential" else "static"
    return replace(config, batching=batching, cache_mode="contiguous")


def make_backend(model, tokenizer, config: EngineConfig | None = None,
                 backend: str = "auto") -> tuple[Engine | HFGenerateBackend, str]:
    """(backend, reason): the engine, or HF generate with the reason it is used ("" for the engine).

    backend: "auto" (the engine; HF generate if the engine refuses the model), "engine" (raise
    UnsupportedModelError if it refuses) or "hf" (always HF generate). For HF generate the config is converted
    with hf_config (OptionError if it needs the engine)."""
    if backend not in BACKENDS:
        raise OptionError(f"backend {backend!r}: choose from {', '.join(BACKENDS)}")
    config = config or EngineConfig()
    if backend == "hf":
        return HFGenerateBackend(model, tokenizer, hf_config(config)), "asked for (backend 'hf')"
    try:
        return Engine(model, tokenizer, config), ""
    except UnsupportedModelError as exc:
        if backend == "engine":
            raise
        return HFGenerateBackend(model, tokenizer, hf_config(config)), str(exc)

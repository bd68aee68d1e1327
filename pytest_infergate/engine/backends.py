"""Which backend runs a model's workloads: the engine, or transformers' own generate where the engine refuses.

    choice = choose_backend(model, tokenizer, backend="auto")   # once per loaded model: runs the self-check
    skip = choice.refusal_for(config)                           # why `config` cannot run here (None: it can)
    with choice.build(model, tokenizer, config) as backend:     # Engine and HFGenerateBackend: the same surface

`auto` falls back to HF generate on UnsupportedModelError (its message the reason); `engine` raises it; `hf` uses HF
generate (`engine_only`, `hf_config`, `make_backend` below). When each is used: docs/explanation/engine.md.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from pytest_infergate.engine.attention import UnsupportedModelError
from pytest_infergate.engine.config import BACKENDS, EngineConfig
from pytest_infergate.engine.engine import Engine
from pytest_infergate.engine.hf_backend import HFGenerateBackend
from pytest_infergate.errors import OptionError

ENGINE, HF_GENERATE = Engine.name, HFGenerateBackend.name
ASKED_FOR_HF = "asked for (--infergate-backend hf)"
# the smallest engine that still runs the whole self-check: no KV cache to allocate, one request at a time
PROBE_CONFIG = dict(cache_mode="none", batching="sequential")


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
    _check_backend(backend)
    config = config or EngineConfig()
    if backend == "hf":
        return HFGenerateBackend(model, tokenizer, hf_config(config)), ASKED_FOR_HF
    try:
        return Engine(model, tokenizer, config), ""
    except UnsupportedModelError as exc:
        if backend == "engine":
            raise
        return HFGenerateBackend(model, tokenizer, hf_config(config)), str(exc)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise OptionError(f"backend {backend!r}: choose from {', '.join(BACKENDS)}")


@dataclass(frozen=True)
class BackendChoice:
    """Which backend runs one loaded model's workloads, decided once (choose_backend) and recorded with every
    result: the self-check does not depend on the engine config, so one probe answers for all of them."""

    name: str  # ENGINE or HF_GENERATE
    reason: str = ""  # why not the engine ("" for the engine)
    self_check_s: float | None = None  # what the engine's self-check cost (None: it did not run, as under `hf`)

    @property
    def is_engine(self) -> bool:
        return self.name == ENGINE

    def run_config(self, config: EngineConfig) -> EngineConfig:
        """The config this backend really runs for `config` (OptionError for what only the engine does)."""
        return config if self.is_engine else hf_config(config)

    def build(self, model, tokenizer, config: EngineConfig | None = None) -> Engine | HFGenerateBackend:
        """A fresh backend of this kind for `config`: the Engine (with its own self-check, as always), or the HF
        backend on hf_config(config)."""
        config = config or EngineConfig()
        if self.is_engine:
            return Engine(model, tokenizer, config)
        return HFGenerateBackend(model, tokenizer, hf_config(config))

    def refusal(self, what: str) -> str | None:
        """Why `what` (something only the engine does) cannot run under this choice; None with the engine. The
        skip reason of an experiment that needs the engine."""
        if self.is_engine:
            return None
        return f"{what} needs the infergate engine; this run uses the hf-generate backend: {self.reason}"

    def refusal_for(self, config: EngineConfig) -> str | None:
        """refusal() of what `config` asks for that only the engine does (None: this backend can run it)."""
        needs = engine_only(config)
        return self.refusal(", ".join(needs)) if needs else None

    def to_dict(self) -> dict:
        return asdict(self)


def choose_backend(model, tokenizer, backend: str = "auto") -> BackendChoice:
    """The backend for `model` (see make_backend for `backend`). Under `auto` and `engine` the engine's
    self-check runs once here, on an engine without a KV cache, and its cost is kept; a refusal under `engine`
    raises UnsupportedModelError (naming the family and what failed)."""
    _check_backend(backend)
    if backend == "hf":
        return BackendChoice(HF_GENERATE, ASKED_FOR_HF)
    start = time.perf_counter()
    try:
        with Engine(model, tokenizer, EngineConfig(**PROBE_CONFIG)) as engine:
            return BackendChoice(ENGINE, "", engine.self_check_s)
    except UnsupportedModelError as exc:
        if backend == "engine":
            raise
        return BackendChoice(HF_GENERATE, str(exc), time.perf_counter() - start)


def choice_for(loaded) -> BackendChoice:
    """The backend of a loaded model (models.LoadedModel): the one the pytest session chose for it with
    --infergate-backend, or, where nothing chose yet (a LoadedModel used from a REPL), `auto`'s, chosen now."""
    if loaded.backend is None:
        loaded.use_backend(choose_backend(loaded.model, loaded.tokenizer))
    return loaded.backend

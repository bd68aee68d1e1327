"""Load a resolved model (models/sources.py) in one precision, with what the load cost and the weights' fingerprint,
and keep one loaded model per precision for a session (`ModelPool`). torch is imported only when loading.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_infergate.errors import CacheCorrupted, ModelLoadError
from pytest_infergate.models.cache import read_meta, sha256_file
from pytest_infergate.models.sources import TOKENIZER_FILES, ModelSource, resolve_model
from pytest_infergate.requirements import (
    QUANTIZED,
    check_precision,
    compute_dtype_name,
    import_torch,
    quantization_config,
    require_local_model_stack,
    torch_dtype,
)

if TYPE_CHECKING:
    from pytest_infergate.options import Options

_WEIGHT_SUFFIXES = (".safetensors", ".bin")


# config.json keys that record who wrote the file, not the model: a transformers upgrade rewrites them on
# conversion, and the weights must keep their fingerprint (else every library upgrade reads as new weights, and
# the golden gate compares with "the weights before these" instead of this model's accepted outputs)
_WRITER_KEYS = ("transformers_version",)


def model_fingerprint(source: ModelSource) -> str:
    """First 16 hex digits of a sha256 over config.json (its writer's version left out) and the weight files.
    Cache entries recorded each weight file's digest when they were built; other directories are hashed once per
    (file, size, mtime)."""
    directory = Path(source.path)
    try:
        recorded = {name: info["sha256"] for name, info in read_meta(directory)["files"].items()}
    except CacheCorrupted:
        recorded = {}
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.name == "config.json":
            digest.update(path.name.encode())
            digest.update(_config_digest(path).encode())
        elif path.suffix in _WEIGHT_SUFFIXES:
            digest.update(path.name.encode())
            digest.update((recorded.get(path.name) or _cached_file_digest(path)).encode())
    return digest.hexdigest()[:16]


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _config_digest(path: Path) -> str:
    """sha256 of config.json as the model sees it: keys sorted, the writer's version left out (the raw bytes
    where it is not a JSON object: a broken config still fingerprints, and fails where it is loaded)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return _cached_file_digest(path)
    if not isinstance(config, dict):
        return _cached_file_digest(path)
    canonical = {key: value for key, value in config.items() if key not in _WRITER_KEYS}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def _cached_file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


@dataclass
class LoadRecord:
    """What loading one model in one precision cost and produced."""

    model: str
    precision: str
    requested_precision: str
    device: str
    dtype: str
    load_s: float
    weight_bytes: int
    peak_mem_bytes: int  # the process's peak while loading (CPU: RSS high-water mark; CUDA: allocated)
    peak_mem_method: str
    quantized_modules: int
    fingerprint: str
    versions: dict[str, str]
    fallback: bool = False
    fallback_reason: str = ""
    load_mem_delta_bytes: int = 0  # how far the peak rose above the memory in use before the load
    # what runs the gates' workloads on it (engine.backends.BackendChoice, set by LoadedModel.use_backend): "" until
    # chosen, then "engine" or "hf-generate" with why not the engine, and the engine self-check's cost
    backend: str = ""
    backend_reason: str = ""
    self_check_s: float | None = None
    plain_text_prompts: bool = False  # a base model: its tokenizer has no chat template (workloads.request.plain_text)
    model_name: str = ""  # ModelSource.name: "SmolLM2-135M-Instruct", a GGUF's stem, a directory's name
    architecture: str = ""  # architecture_of(config): "llama, 30 layers, hidden 576"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    source: ModelSource
    record: LoadRecord
    config: Any = field(init=False)
    backend: Any = None  # engine.backends.BackendChoice once chosen (choice_for; the session, per --infergate-backend)

    def __post_init__(self):
        self.config = self.model.config

    def use_backend(self, choice) -> None:
        """Run this model's workloads on `choice` (a BackendChoice), and say so in its load record."""
        self.backend = choice
        self.record.backend, self.record.backend_reason = choice.name, choice.reason
        self.record.self_check_s = choice.self_check_s

    @property
    def precision(self) -> str:
        """The precision the model really has (the reference's when it stands in as a fallback)."""
        return self.record.precision


def load_tokenizer(source: ModelSource):
    require_local_model_stack(f"the local tokenizer of {source.spec}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path)
    except Exception as exc:
        raise ModelLoadError(f"could not load the tokenizer of {source.spec}: {exc}") from exc
    if len(tokenizer) < 2:
        raise ModelLoadError(f"the tokenizer of {source.spec} has {len(tokenizer)} token(s): its vocabulary files are "
                             f"missing or empty (one of {', '.join(TOKENIZER_FILES)}); save the model's tokenizer "
                             "with it")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # decoder-only batch generation pads on the left
    return tokenizer


def weight_bytes(model) -> int:
    """Bytes the parameters and buffers occupy as stored (int8 / packed 4-bit for bitsandbytes layers)."""
    total = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        total += tensor.numel() * tensor.element_size()
    return total


def count_quantized_modules(model) -> int:
    try:
        import bitsandbytes as bnb
    except ImportError:
        return 0
    return sum(isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)) for m in model.modules())


def silence_library_noise() -> None:
    """Progress bars and per-call warnings from transformers / bitsandbytes would drown test output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    # bitsandbytes logs "inputs will be cast to float16" on every int8 matmul, and a missing optional
    # CPU kernel package once per process; both are expected here and neither is actionable.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def architecture_of(config) -> str:
    """A model's family and shape in a few words, from its config: "llama, 30 layers, hidden 576"."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    parts = [str(getattr(text, "model_type", "") or getattr(config, "model_type", "") or "?")]
    for field_name, unit in (("num_hidden_layers", "layers"), ("hidden_size", "hidden")):
        value = getattr(text, field_name, None)
        if isinstance(value, int):
            parts.append(f"{value} {unit}" if unit == "layers" else f"{unit} {value}")
    return ", ".join(parts)


def load_model(source: ModelSource, precision: str, device: str = "cpu", reference: str = "fp32",
               tokenizer=None) -> LoadedModel:
    """Load `source` in `precision` on `device`; raise ModelLoadError with the underlying reason on failure."""
    precision = check_precision(precision)
    silence_library_noise()
    torch = import_torch()
    from transformers import AutoModelForCausalLM

    from pytest_infergate.environment import library_versions
    from pytest_infergate.process_meters import PeakMemory

    kwargs: dict[str, Any] = {"dtype": torch_dtype(precision, reference)}
    quant = quantization_config(precision, reference)
    if quant is not None:
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": torch.device(device).index or 0} if device.startswith("cuda") else "cpu"
    start = time.perf_counter()
    try:
        with PeakMemory(device) as peak:
            model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
            if quant is None:
                model = model.to(device)
            model.eval()
    except Exception as exc:
        raise ModelLoadError(f"loading {source.spec} in {precision} on {device} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    load_s = time.perf_counter() - start
    quantized = count_quantized_modules(model)
    if precision in QUANTIZED and quantized == 0:
        raise ModelLoadError(f"{source.spec} loaded in {precision} but no bitsandbytes layer was created: the "
                             "weights are not quantized. Check that bitsandbytes supports this device and model")
    record = LoadRecord(
        model=source.spec, precision=precision, requested_precision=precision, device=device,
        dtype=compute_dtype_name(precision, reference), load_s=load_s, weight_bytes=weight_bytes(model),
        peak_mem_bytes=peak.result.peak_bytes, peak_mem_method=peak.result.method, quantized_modules=quantized,
        fingerprint=model_fingerprint(source), versions=library_versions(),
        load_mem_delta_bytes=peak.result.delta_bytes)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(source)
    record.plain_text_prompts = getattr(tokenizer, "chat_template", None) is None
    record.model_name, record.architecture = source.name, architecture_of(model.config)
    return LoadedModel(model, tokenizer, source, record)


class ModelPool:
    """Resolves the session's model once and hands out one LoadedModel per precision.

    A failed load is remembered, so every test that needs that precision reports the same error at once
    instead of retrying a slow load. With `fallback` on, a failed precision is served by the reference
    precision and the record says so (`fallback=True`, with the reason).
    """

    def __init__(self, options: Options):
        self.options = options
        self._source: ModelSource | ModelLoadError | None = None
        self._tokenizer = None
        self._loaded: dict[tuple[str, str, str], LoadedModel] = {}
        self._failed: dict[tuple[str, str, str], ModelLoadError] = {}

    @property
    def source(self) -> ModelSource:
        if isinstance(self._source, ModelLoadError):  # failed once: every test says so at once, without retrying
            raise self._source
        if self._source is None:
            try:
                self._source = resolve_model(self.options.model, self.options.cache_dir)
            except ModelLoadError as exc:
                self._source = exc
                raise
        return self._source

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.source)
        return self._tokenizer

    @property
    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    @property
    def any_fallback(self) -> bool:
        return any(m.record.fallback for m in self._loaded.values())

    def get(self, precision: str) -> LoadedModel:
        key = (self.source.path, precision, self.options.device)
        if key in self._loaded:
            return self._loaded[key]
        if key in self._failed:
            raise self._failed[key]
        if self.options.torch_threads:
            torch = import_torch()

            torch.set_num_threads(self.options.torch_threads)
        try:
            model = load_model(self.source, precision, self.options.device, self.options.reference_precision,
                               tokenizer=self.tokenizer)
        except ModelLoadError as exc:
            reference = self.options.reference_precision
            if not self.options.fallback or precision == reference:
                self._failed[key] = exc
                raise
            base = self.get(reference)
            model = LoadedModel(base.model, base.tokenizer, base.source,
                                replace(base.record, requested_precision=precision, fallback=True,
                                        fallback_reason=str(exc)), backend=base.backend)
        self._loaded[key] = model
        return model

    def reference(self) -> LoadedModel:
        return self.get(self.options.reference_precision)

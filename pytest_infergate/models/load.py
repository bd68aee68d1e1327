"""Resolve a model name to a local directory, and load it in one precision.

A model spec is a built-in alias, a local Hugging Face directory, a .gguf file, or a hub id. Everything is
turned into a local directory first (hub ids excepted), so a model loads the same way whatever its source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_infergate.errors import CacheCorrupted, ModelLoadError
from pytest_infergate.models.builtin import (
    BUILTIN_ALIASES,
    RANDOM_LLAMAS,
    ensure_converted_gguf,
    ensure_random_llama,
    ensure_smollm2,
)
from pytest_infergate.models.cache import read_meta, sha256_file
from pytest_infergate.precision import (
    QUANTIZED,
    check_precision,
    compute_dtype_name,
    quantization_config,
    torch_dtype,
)
from pytest_infergate.requirements import import_torch, require_local_model_stack

_WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True)
class ModelSource:
    spec: str  # what the user wrote
    path: str  # local directory, or the hub id
    kind: str  # "alias", "directory", "gguf", "hub"
    name: str


def resolve_model(spec: str, cache_dir: Path) -> ModelSource:
    """Turn --infergate-model into something from_pretrained can load, fetching/converting once if needed."""
    spec = str(spec).strip()
    if spec in ("smollm2-135m", *RANDOM_LLAMAS) or spec.lower().endswith(".gguf"):
        require_local_model_stack(f"the model {spec}")  # before fetching what only a local model would use
    if spec == "smollm2-135m":
        return ModelSource(spec, str(ensure_smollm2(cache_dir)), "alias", "SmolLM2-135M-Instruct")
    if spec in RANDOM_LLAMAS:
        return ModelSource(spec, str(ensure_random_llama(cache_dir, spec)), "alias", spec)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        return ModelSource(spec, str(ensure_converted_gguf(path, cache_dir)), "gguf", path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a directory without config.json: point --infergate-model at a "
                                 "Hugging Face model directory (one saved with save_pretrained)")
        _check_config(path / "config.json")
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ModelLoadError(f"{path} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}): without them "
                                 "transformers builds a one-token tokenizer and every output is garbage; save the "
                                 f"tokenizer next to the model: tokenizer.save_pretrained({str(path)!r})")
        return ModelSource(spec, str(path.resolve()), "directory", path.name)
    looks_like_path = spec.startswith((".", "/", "~")) or path.suffix or spec.count("/") != 1
    if looks_like_path:
        raise ModelLoadError(f"model {spec!r} is not a built-in alias ({', '.join(BUILTIN_ALIASES)}), "
                             "an existing directory, a .gguf file or a hub id ORG/NAME: check the spelling or path")
    return ModelSource(spec, resolve_hub_id(spec), "hub", spec.split("/")[-1])


def _check_config(config: Path) -> None:
    """A model directory's config.json must be a JSON object: said here, naming the file and the JSON error, before
    transformers fails on it with a message about something else (issue #44: missing tokenizer files)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config} is not valid JSON ({exc}): repair it or save the model again with "
                             "save_pretrained") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{config} holds a JSON {type(data).__name__}, not the object of a model's config: "
                             "repair it or save the model again with save_pretrained")


# a tokenizer's vocabulary, in each of the formats transformers reads (fast, SentencePiece, BPE, WordPiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def resolve_hub_id(repo_id: str, timeout_s: float = 5.0) -> str:
    """A hub model's local snapshot: the Hugging Face cache first (no network), then a download only if the hub
    answers within `timeout_s`, so a machine without network fails at once instead of retrying for a minute."""
    from huggingface_hub import constants, snapshot_download

    try:
        return snapshot_download(repo_id, local_files_only=True, allow_patterns=HUB_FILES)
    except Exception:  # not cached (the exception type differs between huggingface_hub versions)
        pass
    fix = ("copy the model over and pass its directory or a .gguf file, e.g. --infergate-model=/models/NAME "
           "(or run `infergate fetch-model ORG/NAME` on a machine with network and copy the cache)")
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelLoadError(f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
                             f"{fix}")
    import httpx

    try:
        httpx.head(constants.ENDPOINT, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ModelLoadError(f"model {repo_id!r} is not in the local Hugging Face cache and the hub "
                             f"({constants.ENDPOINT}) cannot be reached ({type(exc).__name__}): {fix}") from None
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES)
    except Exception as exc:
        raise ModelLoadError(f"could not download {repo_id!r} from the hub ({type(exc).__name__}: {exc}); check the "
                             f"id and your access, or {fix}") from None


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

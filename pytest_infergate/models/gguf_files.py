"""GGUF files as a model source: checked, dequantized once into a float32 safetensors directory (the cache entry
records which quantization the weights came from: a GGUF model's float "reference" is that quantization's
dequantization, and its verdicts say so), parsed once per conversion (`read_gguf_once`)."""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pytest_infergate.errors import ModelLoadError
from pytest_infergate.models.cache import ensure_entry, sha256_file
from pytest_infergate.requirements import import_torch

GGUF_MAGIC = b"GGUF"
GGUF_SHARED = ("GGUFReader", "get_tensor_name_map")  # what read_gguf_once shares within a conversion
FLOAT_TYPES = ("F32", "F16", "BF16")  # GGUF file types whose conversion to float32 changes no weight


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist: check the path given to --infergate-model")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r}): "
                             "point --infergate-model at a real .gguf file or a Hugging Face directory")


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict:
    """Dequantize a GGUF file into a float32 safetensors HF directory (tokenizer included)."""
    check_gguf(gguf_path)
    torch = import_torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with read_gguf_once():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                         dtype=torch.float32)
    except Exception as exc:
        raise ModelLoadError(f"transformers could not read GGUF file {gguf_path}: {exc}. Is the `gguf` package "
                             "installed and the architecture supported by transformers' GGUF loader?") from exc
    # save_pretrained refuses a model that still carries the GGUF quantizer marker; the weights are plain
    # float tensors by now, so the marker is stale.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return {"source": str(gguf_path), "source_sha256": sha256_file(gguf_path),
            "quantization": gguf_quantization(gguf_path)}


@contextmanager
def read_gguf_once() -> Iterator[None]:
    """Within it, each GGUF file is parsed once and each gguf-py tensor-name map built once. transformers' GGUF
    loader parses the metadata once for the config, once for the tokenizer and once for the weights, and builds the
    name map once per module (hundreds of times for a small model: most of a conversion's time,
    docs/measurements.md). Both are read-only, so sharing them changes nothing loaded (the converted weights are
    byte-identical); where gguf-py lacks either name, nothing is patched and the conversion only takes longer."""
    import gguf

    originals = {name: getattr(gguf, name, None) for name in GGUF_SHARED}
    if any(value is None for value in originals.values()):
        yield
        return
    readers: dict[tuple, object] = {}

    def shared_reader(path, mode: str = "r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = originals["GGUFReader"](path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader  # transformers imports both names from gguf inside its functions
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(originals["get_tensor_name_map"])
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(gguf, name, value)
        readers.clear()


def ensure_converted_gguf(gguf_path: Path, cache_dir: Path) -> tuple[Path, str]:
    """(the converted directory, the quantization its weights were dequantized from: gguf_quantization)."""
    check_gguf(gguf_path)
    key = "gguf-" + sha256_file(gguf_path)[:16]
    entry, meta = ensure_entry(cache_dir / "models", key, lambda out: convert_gguf(gguf_path, out))
    quantization = meta.get("quantization")  # entries built before it was recorded: read from the file
    return entry, quantization if isinstance(quantization, str) else gguf_quantization(gguf_path)


def gguf_quantization(path: Path) -> str:
    """The quantization a GGUF file's weights are stored in, as llama.cpp names it ("Q4_K_M", "Q8_0"): its header's
    `general.file_type`, else its matrices' most common tensor type; "" for a float file (F32, F16, BF16), whose
    conversion changes no weight."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("general.file_type")
    if field is not None and field.data:
        value = int(field.parts[field.data[0]][0])
        try:
            name = gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            name = f"GGUF file type {value}"
    else:
        types = Counter(tensor.tensor_type.name for tensor in reader.tensors if len(tensor.shape) > 1)
        name = types.most_common(1)[0][0] if types else ""
    return "" if name in FLOAT_TYPES else name

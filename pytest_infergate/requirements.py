"""The local model's stack (torch, transformers, accelerate, bitsandbytes, gguf, safetensors): what its precisions
mean to it (the name tables; torch dtypes and bitsandbytes configs made inside the functions that need them), and
that it is optional: an install without it gates a served model (`--infergate-endpoint`) from a small runner. That
install's requirements are the plugin's own less the stack, read from the installed package's metadata
(`python -m pytest_infergate.requirements --endpoint | pip install -r /dev/stdin`; standard library only: it runs
before the other dependencies are installed; docs/install.md). torch is imported on demand, `import_torch()`, so a
pytest run of a project that installs the plugin loads it only when an infergate fixture needs a model."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from importlib import metadata
from types import ModuleType

from pytest_infergate.errors import ModelLoadError, OptionError

DISTRIBUTION = "pytest-infergate"
# what only the local model uses (the engine, loading, quantization, the local tokenizer)
LOCAL_MODEL_STACK = frozenset({"torch", "transformers", "accelerate", "bitsandbytes", "gguf", "safetensors"})
# of those, what no local model runs without (the others come with a quantization or a file format)
LOCAL_MODEL_CORE = ("torch", "transformers")


def require_local_model_stack(what: str) -> None:
    """Raise a clear error, naming the fix, when an install without torch (endpoint gating only) is asked for
    something that runs a model here."""
    missing = [name for name in LOCAL_MODEL_CORE if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelLoadError(
            f"{what} needs {' and '.join(missing)}, which this Python lacks: pytest-infergate was installed for "
            "endpoint gating only (`python -m pytest_infergate.requirements --endpoint`), which gates a served model "
            "(--infergate-endpoint) and sizes prompts with the server's /tokenize. Install the full plugin "
            "(`pip install pytest-infergate`, or `bash setup.sh` in a checkout) to run a model on this machine")


def import_torch() -> ModuleType:
    require_local_model_stack("a model loaded on this machine")
    return importlib.import_module("torch")


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirements(endpoint_only: bool, requires: list[str] | None = None) -> list[str]:
    """The distribution's requirements (no extras); with `endpoint_only`, less LOCAL_MODEL_STACK."""
    requires = metadata.requires(DISTRIBUTION) if requires is None else requires
    base = [r for r in requires or [] if "extra ==" not in r.replace("extra==", "extra ==")]
    return [r for r in base if not (endpoint_only and _name(r) in LOCAL_MODEL_STACK)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_infergate.requirements",
                                     description="print pytest-infergate's requirements, one per line")
    parser.add_argument("--endpoint", action="store_true",
                        help="only what endpoint gating needs (no torch / transformers / bitsandbytes)")
    args = parser.parse_args(argv)
    try:
        lines = requirements(args.endpoint)
    except metadata.PackageNotFoundError:
        print(f"{DISTRIBUTION} is not installed in this Python ({sys.executable}): install it first, with "
              f"`pip install --no-deps {DISTRIBUTION}`", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())


PRECISIONS = ("fp32", "fp16", "bf16", "int8", "nf4")
QUANTIZED = frozenset({"int8", "nf4"})
_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def check_precision(name: str, what: str = "precision") -> str:
    name = name.strip().lower()
    if name not in PRECISIONS:
        raise OptionError(f"unknown {what} {name!r}: choose from {', '.join(PRECISIONS)}")
    return name


def parse_precisions(text: str) -> tuple[str, ...]:
    names = [part for part in (p.strip() for p in text.split(",")) if part]
    if not names:
        raise OptionError(f"--infergate-precisions is empty: give a comma list from {', '.join(PRECISIONS)}")
    checked = tuple(dict.fromkeys(check_precision(n, "precision in --infergate-precisions") for n in names))
    return checked


def default_reference(device: str) -> str:
    """fp16 is the usual serving reference on GPUs; on CPUs fp16/bf16 matmuls are slow, so fp32."""
    return "fp16" if device.startswith("cuda") else "fp32"


def compute_dtype_name(precision: str, reference: str) -> str:
    """The floating dtype the model computes in. Quantized weights compute in the reference dtype."""
    base = reference if precision in QUANTIZED else precision
    if base in QUANTIZED:
        base = "fp32"
    return _DTYPE_NAMES[base]


def torch_dtype(precision: str, reference: str = "fp32"):
    torch = import_torch()

    return getattr(torch, compute_dtype_name(precision, reference))


def quantization_config(precision: str, reference: str = "fp32"):
    """A BitsAndBytesConfig for int8 / nf4, None for floating precisions."""
    if precision not in QUANTIZED:
        return None
    from transformers import BitsAndBytesConfig

    if precision == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch_dtype(precision, reference),
        bnb_4bit_use_double_quant=True,
    )

"""Precision names and what they mean to torch / bitsandbytes.

Only the name tables live at module level; torch is imported inside the functions that need it.
"""

from __future__ import annotations

from pytest_infergate.errors import OptionError
from pytest_infergate.requirements import import_torch

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

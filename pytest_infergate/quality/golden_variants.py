"""Accepted golden outputs per numerics environment.

int8 and nf4 outputs depend on which kernels run: bitsandbytes multiplies int8 with `torch._int_mm` on AVX-512
and in fp32 on AVX2, and runs nf4 as a bf16 gemv with AVX512-BF16 and dequantize-then-matmul without. Outputs
accepted on one kernel path are not a regression baseline for the other: 12 of 48 int8 samples read as drift on
an AVX2 machine against files recorded with AVX-512, with no code changed. So a precision may have several
accepted files side by side:

    cpu-int8.jsonl                 the default (the first one accepted)
    cpu-int8.avx2-3f9c01ab.jsonl   accepted on another kernel path

The check compares with the file whose header records this machine's kernel path (`numerics_key`: the kernels
and the GPU, not the library versions, which are what a golden check gates); without one it falls back to the
default file and warns that the environments differ. An update rewrites the file of this kernel path, writing a
tagged file only when the default belongs to another one.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path


def numerics_key(environment: dict | None) -> dict | None:
    """What picks the kernels golden outputs are computed with, from a header's `environment`."""
    if not environment or "kernels" not in environment:
        return None
    return {"kernels": environment.get("kernels") or {}, "gpu": environment.get("gpu")}


def variant_tag(environment: dict) -> str:
    """A short, readable and unique file tag for a numerics key: `avx2-3f9c01ab`, `nvidia-h200-0c1d2e3f`."""
    key = numerics_key(environment) or {}
    label = key.get("gpu") or (key.get("kernels") or {}).get("torch_cpu_capability") or "numerics"
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^a-z0-9]+', '-', str(label).lower()).strip('-')}-{digest}"


def variants(default: Path) -> list[Path]:
    """The default accepted file (whether or not it exists) and the tagged ones beside it."""
    default = Path(default)
    stem = default.name[:-len(".jsonl")]
    return [default, *sorted(default.parent.glob(f"{stem}.*.jsonl"))]


def _recorded_key(path: Path) -> dict | None:
    """The numerics key in a file's header line; None when absent or unreadable (the full read reports why)."""
    try:
        with open(path, encoding="utf-8") as handle:
            header = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    return numerics_key(header.get("environment")) if isinstance(header, dict) else None


def select_accepted(default: Path, environment: dict | None) -> tuple[Path, bool]:
    """(file to compare with, whether its header records this machine's kernel path). Without a match: the default
    file, or the first tagged one if there is no default."""
    key = numerics_key(environment)
    if key is not None:
        for path in variants(default):
            if path.exists() and _recorded_key(path) == key:
                return path, True
    existing = [path for path in variants(default) if path.exists()]
    return (existing[0] if existing else Path(default)), False


def path_to_update(default: Path, environment: dict | None) -> Path:
    """Where --infergate-update-golden writes: the file of this kernel path; the default when it is absent or
    records no kernel path (an older file); a new tagged file when the default belongs to another kernel path."""
    default = Path(default)
    path, matches = select_accepted(default, environment)
    if matches or numerics_key(environment) is None or not default.exists() or _recorded_key(default) is None:
        return path
    return default.with_name(f"{default.name[:-len('.jsonl')]}.{variant_tag(environment)}.jsonl")

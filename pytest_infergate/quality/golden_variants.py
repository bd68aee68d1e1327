"""Accepted golden outputs per numerics environment. int8 and nf4 outputs depend on which kernels run and, for int8,
on the CPU model too, so outputs accepted on one machine are no regression baseline on another: a precision may
have several accepted files side by side, one per machine (CPU model, kernels, GPU), e.g. `cpu-int8.jsonl` (the
default, the first accepted) and `cpu-int8.avx2-3f9c01ab.jsonl`. The check compares with the file whose header
records this machine (`machine_key`); else one recorded on the same kernel path (`numerics_key`: the kernels and
the GPU, not the library versions a golden check gates); else the default, warning that the environments differ.
An update rewrites this machine's file, or writes a tagged one. Why, with the measurements:
docs/explanation/quality-gates.md, 'Accepted files per machine' and 'What remains hardware-dependent'.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pytest_infergate.quality.golden_files import golden_key, header_line


def numerics_key(environment: dict | None) -> dict | None:
    """What picks the kernels golden outputs are computed with, from a header's `environment`."""
    if not environment or "kernels" not in environment:
        return None
    return {"kernels": environment.get("kernels") or {}, "gpu": environment.get("gpu")}


def variant_tag(environment: dict) -> str:
    """A short, readable and unique file tag for a machine: `avx2-3f9c01ab`, `nvidia-h200-0c1d2e3f`."""
    key = machine_key(environment) or {}
    label = key.get("gpu") or (key.get("kernels") or {}).get("torch_cpu_capability") or "numerics"
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^a-z0-9]+', '-', str(label).lower()).strip('-')}-{digest}"


def variants(default: Path) -> list[Path]:
    """The default accepted file (whether or not it exists) and the tagged ones beside it."""
    default = Path(default)
    stem = default.name[:-len(".jsonl")]
    return [default, *sorted(default.parent.glob(f"{stem}.*.jsonl"))]


def machine_key(environment: dict | None) -> dict | None:
    """The numerics key and the CPU model: what must be equal for outputs to be reproduced bit for bit."""
    key = numerics_key(environment)
    return None if key is None else {**key, "cpu": environment.get("cpu")}


def _recorded_environment(path: Path) -> dict | None:
    """The machine a file's header records (its key's machine part: environment.AcceptedKey); None when it records none
    or is unreadable (the full read reports why)."""
    try:
        with open(path, encoding="utf-8") as handle:
            header = json.loads(handle.readline())
        machine = golden_key(header).machine if isinstance(header, dict) else {}
    except (OSError, ValueError):
        return None
    return machine or None


# how closely the chosen accepted file matches this machine (select_accepted)
SAME_MACHINE = "machine"  # CPU model, kernels and GPU: outputs reproduce bit for bit
SAME_KERNELS = "kernels"  # the kernel path only: another CPU model's MKL may change last bits


def select_accepted(default: Path, environment: dict | None) -> tuple[Path, str | None]:
    """(file to compare with, SAME_MACHINE / SAME_KERNELS / None): the file recorded on this machine, else one
    recorded on its kernel path, else the default file (or the first tagged one if there is no default)."""
    existing = [path for path in variants(default) if path.exists()]
    if numerics_key(environment) is not None:
        recorded = [(path, _recorded_environment(path)) for path in existing]
        for match, key in ((SAME_MACHINE, machine_key), (SAME_KERNELS, numerics_key)):
            for path, header_environment in recorded:
                if header_environment is not None and key(header_environment) == key(environment):
                    return path, match
    return (existing[0] if existing else Path(default)), None


def accepted_for_another_model(default: Path) -> Path | None:
    """The accepted file of the same model name, device and precision recorded for other weights (another model
    fingerprint folder beside this one's): the accepted release a model upgrade is gated against. The most
    recently written one; None when there is none."""
    default = Path(default)
    others = [path for path in default.parent.parent.glob(f"*/{default.name}") if path.parent != default.parent]
    return max(others, key=lambda path: (path.stat().st_mtime, path.parent.name)) if others else None


def path_to_update(default: Path, environment: dict | None) -> Path:
    """Where --infergate-update-golden writes: this machine's file; the default when it is absent or records no
    kernel path (an older file); a new tagged file when the default belongs to another machine."""
    default = Path(default)
    path, match = select_accepted(default, environment)
    if match == SAME_MACHINE:
        return path
    default_unkeyed = not default.exists() or numerics_key(_recorded_environment(default)) is None
    if numerics_key(environment) is None or default_unkeyed:  # nothing to keep apart: the default file
        return default
    return default.with_name(f"{default.name[:-len('.jsonl')]}.{variant_tag(environment)}.jsonl")


def recorded_elsewhere(header: dict, match: str | None) -> str:
    """"" when an accepted file (its `header`, chosen with `match`) was recorded on this machine; else the machine
    it was recorded on, in words, for the gate's messages."""
    if match == SAME_MACHINE:
        return ""
    environment = header.get("environment") or {}
    if not environment:
        return "a machine its header does not record"
    kernels = ", ".join(f"{name} {path}" for name, path in sorted((environment.get("kernels") or {}).items()))
    return "; ".join(part for part in (environment.get("gpu") or environment.get("cpu") or "an unnamed CPU", kernels)
                     if part)


def with_figures(default: Path, environment: dict | None) -> Path | None:
    """The accepted file beside `default` that records quality figures against the reference (schema 3, header
    `figures_against`), for the decision on another machine (quality.travel): one recorded on this kernel path
    first, else any. None when none records them."""
    recorded = []
    for path in variants(default):
        header = header_line(path) if path.exists() else {}
        if header.get("figures_against"):
            recorded.append((path, golden_key(header).machine or None))
    for path, machine in recorded:
        if machine is not None and numerics_key(machine) == numerics_key(environment):
            return path
    return recorded[0][0] if recorded else None

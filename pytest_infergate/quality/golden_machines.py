"""Golden outputs per machine: what they depend on besides the model and the samples, and which accepted file a
check compares with. Headers record the CPU's vector ISA and model, the GPU, the libraries, bitsandbytes' kernel path
and how the outputs were generated and scored (`golden_environment`); a difference explains changed outputs: a
warning, or a failure under `same_environment=1`. int8 and nf4 outputs depend on the kernels (int8 on the CPU model
too), so a precision may have one accepted file per machine (`cpu-int8.jsonl`, `cpu-int8.avx2-3f9c01ab.jsonl`): the
check takes the one recorded on this machine, else on its kernel path, else the default, warning. Why, with the
measurements: docs/explanation/quality-gates.md, 'Accepted files per machine', 'What remains hardware-dependent'.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pytest_infergate.environment import cpu_model, library_versions
from pytest_infergate.quality.golden_files import golden_key, header_line
from pytest_infergate.requirements import import_torch

# ISA extensions whose presence changes which kernels run (and so the last bits of results)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8", "avx_vnni", "neon", "asimd", "sve")
LIBRARIES = ("torch", "transformers", "bitsandbytes")
# recorded, but a difference is not a mismatch: the thread count did not change any golden output in the
# measurements (1 vs 2 threads, batched and alone, every precision), and `-n 2` runs one thread per worker
INFORMATIONAL = ("threads",)


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in ISA_FLAGS if flag in present]
    except OSError:
        pass
    return []


def kernel_paths(loaded) -> dict[str, str]:
    """Which kernels the model's quantized layers run on this machine, where bitsandbytes lets us read it."""
    torch = import_torch()

    device = next(loaded.model.parameters()).device
    paths: dict[str, str] = {}
    if device.type == "cuda":
        paths["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        return paths
    paths["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    precision = loaded.record.precision
    if precision not in ("int8", "nf4"):
        return paths
    try:
        from bitsandbytes.backends.cpu import ops as bnb_cpu
        from bitsandbytes.functional import has_avx512bf16

        if precision == "nf4":
            if not has_avx512bf16():
                paths["bnb_nf4"] = "dequantize to the compute dtype, then matmul"
            elif getattr(bnb_cpu, "gemm_4bit_forward_kernel", None) is not None:
                paths["bnb_nf4"] = "avx512-bf16, kernels-community gemm_4bit_forward"
            else:
                paths["bnb_nf4"] = "avx512-bf16, bf16 activations (native gemv_4bit)"
        else:
            paths["bnb_int8"] = "torch._int_mm" if getattr(bnb_cpu, "_has_avx512", False) else "fp32 matmul"
    except Exception as exc:  # noqa: BLE001 - another bitsandbytes layout: say that we could not read it
        paths["bnb"] = f"unknown ({type(exc).__name__})"
    return paths


def golden_environment(loaded, threads: int | None = None) -> dict:
    """The environment of this machine for `loaded`'s golden outputs (header key `environment`)."""
    torch = import_torch()

    device = next(loaded.model.parameters()).device
    versions = library_versions()
    env = {"cpu": cpu_model(), "cpu_flags": cpu_flags(),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           **{name: versions.get(name) for name in LIBRARIES}, "kernels": kernel_paths(loaded),
           "threads": threads if threads is not None else torch.get_num_threads()}
    return env


def environment_mismatch(accepted: dict, now: dict) -> list[str]:
    """What differs between an accepted file's header and this run's (`environment`, `method`, `compositions`),
    informational keys aside."""
    recorded = accepted.get("environment")
    if not recorded:
        return ["the accepted outputs record no environment (written by an older pytest-infergate): regenerate them "
                "on this machine kind with --infergate-update-golden"]
    out = []
    current = now.get("environment", {})
    for key in sorted(set(recorded) | set(current)):
        if key not in INFORMATIONAL and recorded.get(key) != current.get(key):
            out.append(f"{key}: accepted {recorded.get(key)!r}, now {current.get(key)!r}")
    if accepted.get("method") != now.get("method"):
        out.append(f"generation method: accepted {accepted.get('method')!r}, now {now.get('method')!r}")
    before, after = accepted.get("compositions") or {}, now.get("compositions") or {}
    for name in sorted(set(before) & set(after)):
        if before[name] != after[name]:
            out.append(f"sample set {name} changed since the outputs were accepted: its samples share one "
                       "generation run, so other samples' int8/nf4 outputs may change with it")
    return out


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

"""What golden outputs depend on besides the model and the samples, recorded in accepted files' headers and
compared at check time: the CPU's vector ISA (MKL, oneDNN and ATen pick kernels by it; bitsandbytes runs another
nf4 algorithm with AVX512-BF16 than without), the GPU, the libraries, bitsandbytes' kernel path, and how the
outputs were generated and scored. A difference explains changed outputs; it is a warning, or a failure under
the policy key `same_environment=1`."""

from __future__ import annotations

from pytest_infergate.environment import cpu_model, library_versions
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

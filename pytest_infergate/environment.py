"""What a measurement depends on besides the code under test: machine, libraries, model."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from pytest_infergate.requirements import import_torch

LIBRARIES = ("torch", "transformers", "bitsandbytes", "accelerate", "gguf", "pytest-infergate")


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_fingerprint(device: str) -> dict:
    """Everything about the machine that changes performance numbers."""
    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": sys.platform, "device": device}
    if "torch" in sys.modules or device.startswith("cuda"):
        torch = import_torch()

        info["torch_threads"] = torch.get_num_threads()
        if device.startswith("cuda") and torch.cuda.is_available():
            index = torch.device(device).index or 0
            info["gpu"] = torch.cuda.get_device_name(index)
            info["cuda"] = torch.version.cuda
            info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
    return info


def perf_fingerprint(record, engine_config: dict, device: str) -> dict:
    """What a perf measurement depends on: machine, library versions, model, precision, engine config."""
    identity = {key: value for key, value in (("model_name", record.model_name),
                                              ("architecture", record.architecture)) if value}
    return {**machine_fingerprint(device), **record.versions,
            "model_fingerprint": record.fingerprint, **identity, "precision": record.precision,
            "requested_precision": record.requested_precision, "engine_config": engine_config}

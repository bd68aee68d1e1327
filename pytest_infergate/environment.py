"""What a measurement depends on besides the code under test (machine, libraries, model), and how every accepted
result is keyed by it (perf baselines, accepted golden outputs, the history's series): an `AcceptedKey` holds the
**machine** it was accepted on (CPU, cores, threads, ISA and kernel path, GPU, CUDA, device, the endpoint's address)
and the **change under test** it was accepted with (weights, precision, library versions, engine config, backend,
generation method, sample-set composition, this plugin's version). Another machine makes timings, and outputs of
kernels that do not reproduce, no yardstick; a change under test is what an accepted result exists to gate: compared
and named, never a reason to skip. Every field not the machine's is under test, so a field added later is gated.
Per store: docs/explanation/perf-gates.md ('Baselines'), quality-gates.md; docs/guides/read-the-report.md."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

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


MACHINE_FIELDS = ("cpu", "cpu_count", "cpu_flags", "platform", "threads", "torch_threads", "device", "gpu", "cuda",
                  "gpu_capability", "kernels", "url")
# a change of these makes even memory figures incomparable (another device's allocator and kernels)
DEVICE_FIELDS = frozenset({"device", "gpu", "cuda", "gpu_capability", "url"})
# which model it is (a change of these is a model change, said in the run's verdict; weights alone are an upgrade)
MODEL_IDENTITY_FIELDS = ("model_name", "architecture", "served_model")
# the fields a perf fingerprint compares as the change under test, in the order a message names them
UNDER_TEST_FIELDS = ("model_fingerprint", "model_name", "architecture", "served_model", "precision",
                     "requested_precision", "backend", "api", "engine_config", "workload", "torch", "transformers",
                     "bitsandbytes", "accelerate", "gguf", "python", "pytest-infergate")
# the workload's key that changes with any field of any request (workloads.identity): named only where no size moved
WORKLOAD_DIGEST = "digest"


def canonical(value: Any) -> str:
    """One text per value, whatever the order of its keys: two machines (or environments) are the same machine
    when their canonical texts are equal."""
    return json.dumps(value, sort_keys=True, default=str)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()[:12]


def run_fingerprint(environment: dict) -> str:
    """A short hash of what a run's numbers depend on besides the code (its results file's `environment`):
    machine, library versions (not pytest-infergate's own), model, device, the endpoint's address. A history
    splits its series on a record's machine (AcceptedKey), on this where a record has no fingerprint."""
    versions = {k: v for k, v in (environment.get("versions") or {}).items() if k != "pytest-infergate"}
    basis = {"machine": environment.get("machine"), "versions": versions, "model": environment.get("model"),
             "device": environment.get("device"), "endpoint": (environment.get("endpoint") or {}).get("url")}
    return _digest(basis)


@dataclass(frozen=True)
class AcceptedKey:
    machine: dict[str, Any] = field(default_factory=dict)
    under_test: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, fields: dict[str, Any]) -> AcceptedKey:
        """Split a flat fingerprint (a perf measurement's, or a golden header's environment and method)."""
        return cls({k: v for k, v in fields.items() if k in MACHINE_FIELDS},
                   {k: v for k, v in fields.items() if k not in MACHINE_FIELDS})

    def flat(self) -> dict[str, Any]:
        return {**self.under_test, **self.machine}

    def machine_id(self) -> str:
        """A short, stable name of the machine part: equal machines, equal ids."""
        return _digest(self.machine)

    def to_dict(self) -> dict[str, Any]:
        return {"machine": dict(self.machine), "under_test": dict(self.under_test)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AcceptedKey:
        if not isinstance(data, dict) or not isinstance(data.get("machine"), dict) \
                or not isinstance(data.get("under_test"), dict):
            raise ValueError("an accepted key is a mapping with `machine` and `under_test` mappings")
        return cls(dict(data["machine"]), dict(data["under_test"]))

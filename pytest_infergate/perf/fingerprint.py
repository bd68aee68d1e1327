"""What a stored baseline's fingerprint says about a comparison, split in two: the **machine** (CPU model, core and
thread count, GPU, CUDA, device, the endpoint's address), where a difference makes timings incomparable and a
relative verdict inconclusive with the reason; and the **change under test** (model weights, precision, library
versions, engine config, backend, this plugin's version, the served model), which a stored baseline exists to gate:
compared, never a reason to skip, and named in every verdict ("torch 2.12.0 → 2.13.0, engine_config.max_batch_size
8 → 4"). Which field is which is defined once for every store (environment.AcceptedKey); fields a fingerprint does not
carry (an older baseline, an endpoint measurement) are not compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pytest_infergate.environment import (
    DEVICE_FIELDS,
    MACHINE_FIELDS,
    MODEL_IDENTITY_FIELDS,
    UNDER_TEST_FIELDS,
    WORKLOAD_DIGEST,
    AcceptedKey,
)

__all__ = ["DEVICE_FIELDS", "MACHINE_FIELDS", "UNDER_TEST_FIELDS", "FieldChange", "FingerprintDiff",
           "diff_fingerprints", "machine_key", "machine_text", "without_new_defaults"]

@dataclass(frozen=True)
class FieldChange:
    """One fingerprint field that differs between the baseline and now (engine config keys one by one)."""

    name: str  # "torch", or "engine_config.max_batch_size"
    baseline: Any
    now: Any

    def describe(self) -> str:
        return f"{self.name} {_show(self.baseline)} → {_show(self.now)}"


@dataclass(frozen=True)
class FingerprintDiff:
    """What changed since the baseline. Its words are made with it, once, before the candidate is measured: the
    decision after the measurement only reads them."""

    machine: list[FieldChange] = field(default_factory=list)
    under_test: list[FieldChange] = field(default_factory=list)
    # which model it is changed (its name, architecture or the served model), not only its weights
    model_changes: list[FieldChange] = field(init=False, compare=False)
    device_changed: bool = field(init=False, compare=False)
    machine_described: list[str] = field(init=False, compare=False)  # ["cpu_count 2 → 4", "torch_threads 2 → 4"]
    under_test_described: list[str] = field(init=False, compare=False)
    model_text: str = field(init=False, compare=False)  # the model_changes, said
    machine_text: str = field(init=False, compare=False)  # "cpu_count 2 → 4, torch_threads 2 → 4"
    under_test_text: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        machine, under_test = [c.describe() for c in self.machine], [c.describe() for c in self.under_test]
        model_changes = [c for c in self.under_test if c.name in MODEL_IDENTITY_FIELDS]
        derived = {"model_changes": model_changes, "device_changed": any(c.name in DEVICE_FIELDS for c in self.machine),
                   "machine_described": machine, "under_test_described": under_test,
                   "model_text": ", ".join(c.describe() for c in model_changes),
                   "machine_text": ", ".join(machine), "under_test_text": ", ".join(under_test)}
        for name, value in derived.items():
            object.__setattr__(self, name, value)


def _show(value: Any) -> str:
    if value is None:
        return "–"
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def diff_fingerprints(current: dict, accepted: dict) -> FingerprintDiff:
    """How `current` (this run's fingerprint) differs from `accepted` (the baseline's), field by field."""
    machine = [FieldChange(name, accepted.get(name), current.get(name)) for name in MACHINE_FIELDS
               if name in accepted and name in current and _canonical(accepted[name]) != _canonical(current[name])]
    under_test = []
    # every field that is not the machine's is under test (keys): the known ones in their order, then the rest
    others = sorted((set(accepted) | set(current)) - set(MACHINE_FIELDS) - set(UNDER_TEST_FIELDS))
    for name in (*UNDER_TEST_FIELDS, *others):
        if name not in accepted and name not in current:
            continue
        old, new = accepted.get(name), current.get(name)
        if name == "engine_config" and isinstance(old, dict) and isinstance(new, dict):
            under_test += _config_changes(name, without_new_defaults(new, old), old)
        elif name == "workload":  # compared where both sides recorded it (a file of an older version did not)
            if not (isinstance(old, dict) and isinstance(new, dict)):
                continue
            changed = _config_changes(name, new, old, ordered=True)  # requests first: what a user edits first
            # a size that moved says what changed; the digest alone only where none did (the same sizes, new prompts)
            sized = [c for c in changed if c.name != f"{name}.{WORKLOAD_DIGEST}"]
            under_test += sized or changed
        elif name in accepted and _canonical(old) != _canonical(new):
            under_test.append(FieldChange(name, old, new))
    return FingerprintDiff(machine, under_test)


def _config_changes(prefix: str, new: dict, old: dict, ordered: bool = False) -> list[FieldChange]:
    keys = list(dict.fromkeys([*new, *old])) if ordered else sorted(set(old) | set(new))
    return [FieldChange(f"{prefix}.{key}", old.get(key), new.get(key)) for key in keys
            if _canonical(old.get(key)) != _canonical(new.get(key))]


def _canonical(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list, tuple)) else value


def without_new_defaults(config: dict, accepted: dict) -> dict:
    """`config` less the EngineConfig fields a baseline saved by an older version does not know, where they have
    their default value (the engine then runs as it did before the field existed)."""
    from dataclasses import fields

    from pytest_infergate.engine.config import EngineConfig

    defaults = {f.name: f.default for f in fields(EngineConfig)}
    return {k: v for k, v in config.items() if k in accepted or k not in defaults or v != defaults[k]}


def machine_key(fingerprint: dict) -> dict:
    """The machine part of a fingerprint (environment.AcceptedKey): what a history splits its series on."""
    return AcceptedKey.of(fingerprint).machine



def machine_text(fingerprint: dict) -> str:
    """Where a measurement was taken, in a few words: "AMD EPYC, 2 CPUs, 2 threads, cpu" (what the fingerprint has)."""
    parts = [str(fingerprint["gpu"]) if fingerprint.get("gpu") else str(fingerprint.get("cpu") or ""),
             f"{fingerprint['cpu_count']} CPUs" if fingerprint.get("cpu_count") else "",
             f"{fingerprint['torch_threads']} thread{'' if fingerprint['torch_threads'] == 1 else 's'}"
             if fingerprint.get("torch_threads") else "",
             str(fingerprint.get("url") or fingerprint.get("device") or "")]
    return ", ".join(part for part in parts if part) or "an unrecorded machine"

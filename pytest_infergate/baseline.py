"""Baseline files: accepted measurements with the environment they were taken in.

Written atomically (temp file + rename) with a schema version; a malformed file is an error naming it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pytest_infergate.atomic import write_json_atomic
from pytest_infergate.errors import InfergateError
from pytest_infergate.perf import Measurement

SCHEMA_VERSION = 1
# fingerprint fields whose change makes a relative comparison meaningless
COMPARED_FIELDS = ("cpu", "cpu_count", "torch_threads", "gpu", "cuda", "device", "torch", "transformers",
                   "bitsandbytes", "model_fingerprint", "precision", "engine_config")


class BaselineError(InfergateError):
    """A baseline file that cannot be read or written."""


def save_baseline(path: Path, entries: dict[str, dict]) -> None:
    """entries: test id -> {"fingerprint": {...}, "measurement": Measurement.to_dict()}."""
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "created": time.time(), "entries": entries})


def load_baseline(path: Path) -> dict[str, dict]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"baseline file {path} does not exist: create it with --infergate-save-baseline {path}") from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline file {path} is not valid JSON ({exc}); re-create it with "
                            "--infergate-save-baseline") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION or not isinstance(data.get("entries"), dict):
        found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise BaselineError(f"baseline file {path} has schema version {found!r}, this pytest-infergate reads "
                            f"{SCHEMA_VERSION}; re-create it with --infergate-save-baseline")
    for key, entry in data["entries"].items():
        if not isinstance(entry, dict) or "measurement" not in entry or "fingerprint" not in entry:
            raise BaselineError(f"baseline file {path}: entry {key!r} lacks measurement/fingerprint")
    return data["entries"]


def baseline_measurement(entry: dict) -> Measurement:
    return Measurement.from_dict(entry["measurement"])


def fingerprint_mismatches(current: dict, accepted: dict) -> list[str]:
    out = []
    for name in COMPARED_FIELDS:
        if current.get(name) != accepted.get(name):
            out.append(f"{name}: baseline {accepted.get(name)!r}, now {current.get(name)!r}")
    return out

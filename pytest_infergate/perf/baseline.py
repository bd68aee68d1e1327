"""Baseline files: accepted measurements with the environment they were taken in, written atomically (temp file +
rename) with a `kind` and a schema version; a file that is not a baseline (a results file, a golden file, another
version) is an error that says what it is and what to pass instead. Version 4 keys each entry as every accepted
result is keyed (environment.AcceptedKey) and keeps the calibration probe's time beside each repetition; versions 1 to 3
are still read, with a note. The versions and what each added: docs/reference/outputs.md, 'Baseline and golden
files'.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_infergate.atomic import write_json_atomic
from pytest_infergate.environment import AcceptedKey
from pytest_infergate.errors import InfergateError
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.fingerprint import machine_text

KIND = "baseline"
SCHEMA_VERSION = 4
# version 1 had no `kind`; 3 added the calibration probe per repetition; 4 the entry's `key` for its `fingerprint`
READABLE_VERSIONS = (1, 2, 3, 4)


class BaselineError(InfergateError):
    """A baseline file that cannot be read or written."""


@dataclass
class BaselineEntry:
    fingerprint: dict
    measurement: Measurement
    recorded: float = 0.0  # when it was measured (seconds since the epoch; files before 0.3: the file's creation)

    @property
    def key(self) -> AcceptedKey:
        return AcceptedKey.of(self.fingerprint)

    def to_dict(self) -> dict:
        return {"key": self.key.to_dict(), "measurement": self.measurement.to_dict(),
                "recorded": self.recorded or time.time()}

    @classmethod
    def from_dict(cls, data: dict, created: float = 0.0) -> BaselineEntry:
        fingerprint = AcceptedKey.from_dict(data["key"]).flat() if "key" in data else dict(data["fingerprint"])
        return cls(fingerprint, Measurement.from_dict(data["measurement"]),
                   float(data.get("recorded") or created or 0.0))

    def provenance(self) -> str:
        """"8 repetitions, recorded 2026-12-03 07:10 UTC on AMD EPYC, 2 CPUs, 2 threads, cpu"."""
        when = (time.strftime(" %Y-%m-%d %H:%M UTC", time.gmtime(self.recorded)) if self.recorded else "")
        return (f"{self.measurement.repetitions} repetitions, recorded{when} on "
                f"{machine_text(self.fingerprint)}")


def save_baseline(path: Path, entries: dict[str, BaselineEntry], run_started: float | None = None) -> list[str]:
    """entries: measurement key (test id, plus ::label) -> BaselineEntry. A measurement without a single sample
    (every request failed or timed out) is no yardstick: refused, naming it, and nothing is written.

    Saving replaces the file, except that entries another run saved into it after this run started (two CI jobs,
    e.g. shards of one suite, saving one baseline at once) are kept when this run did not measure them: the
    file is read and rewritten under a lock, so neither job's entries are lost. Returns the keys kept that way."""
    from pytest_infergate.atomic import exclusive

    empty = [key for key, entry in entries.items() if not any(entry.measurement.samples.values())]
    if empty:
        raise BaselineError(f"{len(empty)} measurement(s) have no samples (every request failed or was rejected): "
                            f"{', '.join(empty)}; fix them or deselect them before saving a baseline")
    with exclusive(path):
        concurrent = _saved_since(Path(path), run_started) if run_started is not None else {}
        kept = {key: entry for key, entry in concurrent.items() if key not in entries}
        write_json_atomic(path, {"kind": KIND, "schema_version": SCHEMA_VERSION, "created": time.time(),
                                 "entries": {key: entry.to_dict() for key, entry in {**kept, **entries}.items()}})
    return sorted(kept)


def _saved_since(path: Path, since: float) -> dict[str, BaselineEntry]:
    """The entries of the baseline at `path` if another run saved it after `since`, else nothing (a file saved
    before this run started is the accepted baseline this run replaces)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or float(data.get("created") or 0.0) < since:
        return {}
    try:
        return load_baseline(path)
    except BaselineError:
        return {}


def schema_note(path: Path) -> str:
    """"" for a baseline file in the current schema (or unreadable: loading says why); else the line a run that
    reads it prints."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if file_kind(data) != KIND:  # a results file read as a baseline: its own schema, read by results.run
        return ""
    version = data.get("schema_version", 1) if isinstance(data, dict) else SCHEMA_VERSION
    if version == SCHEMA_VERSION:
        return ""
    return (f"baseline file {path} has schema version {version}: read as {SCHEMA_VERSION} (each entry keyed by its "
            f"machine and its change under test); `infergate migrate {path}` or the next --infergate-save-baseline "
            "rewrites it")


def file_kind(data: object) -> str:
    """What an infergate JSON file is: its `kind`, or what its shape says for files written before kinds."""
    if not isinstance(data, dict):
        return type(data).__name__
    if isinstance(data.get("kind"), str):
        return data["kind"]
    if "entries" in data:
        return KIND
    if "records" in data:
        return "results"
    return "unknown"


def load_baseline(path: Path, results_entries: Callable[[dict], dict[str, BaselineEntry]] | None = None
                  ) -> dict[str, BaselineEntry]:
    """The entries of a baseline file, by measurement key. With `results_entries` (the session passes
    results.run.baseline_entries), a results file (--infergate-json) is read as one too: the accepted run is the
    baseline, each of its perf records an entry."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"baseline file {path} does not exist: create it with "
                            f"--infergate-save-baseline={path}") from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline file {path} is not valid JSON ({exc}); re-create it with "
                            "--infergate-save-baseline") from None
    kind = file_kind(data)
    if kind == "results" and results_entries is not None:
        entries = results_entries(data)
        if not entries:
            raise BaselineError(f"--infergate-baseline {path}: this results file holds no perf measurement to compare "
                                "with; pass the results of a run that measured (infergate_bench), or a baseline file")
        _check_entries(path, entries)
        return entries
    if kind != KIND:
        hint = (" (written by --infergate-json); a baseline is written by --infergate-save-baseline"
                if kind == "results" else "; create a baseline with --infergate-save-baseline")
        raise BaselineError(f"--infergate-baseline {path} is a {kind} file, not a baseline file{hint}")
    if data.get("schema_version") in READABLE_VERSIONS and not isinstance(data.get("entries"), dict):
        raise BaselineError(f"baseline file {path}: `entries` must be a mapping of measurement key to entry, found "
                            f"{type(data.get('entries')).__name__}; re-create it with --infergate-save-baseline")
    if data.get("schema_version") not in READABLE_VERSIONS:
        raise BaselineError(f"baseline file {path} has schema version {data.get('schema_version')!r}, this "
                            f"pytest-infergate reads {', '.join(map(str, READABLE_VERSIONS))}; re-create it with "
                            "--infergate-save-baseline")
    entries = {}
    for key, entry in data["entries"].items():
        try:
            entries[key] = BaselineEntry.from_dict(entry, created=float(data.get("created") or 0.0))
        except (KeyError, TypeError, ValueError):
            raise BaselineError(f"baseline file {path}: entry {key!r} lacks a measurement or fingerprint; "
                                "re-create the file with --infergate-save-baseline") from None
    _check_entries(path, entries)
    return entries


def _check_entries(path: Path, entries: dict[str, BaselineEntry]) -> None:
    for key, entry in entries.items():
        if not any(entry.measurement.samples.values()):
            raise BaselineError(f"baseline file {path}: entry {key!r} has no samples, so nothing can be compared "
                                "with it; re-create the file with --infergate-save-baseline")
        bad = _unusable_samples(entry.measurement.samples)
        if bad:
            raise BaselineError(f"baseline file {path}: entry {key!r} has {bad}, which no comparison can use; "
                                "re-create the file with --infergate-save-baseline")


def _unusable_samples(samples: dict) -> str:
    """What in a baseline's samples is not a finite number ("" if nothing): NaN, infinity, null or text. A NaN
    makes every interval NaN and the verdict silently inconclusive (issue #44)."""
    for metric, values in samples.items():
        if not isinstance(values, list):
            return f"{metric} = {values!r} (not a list of numbers)"
        for index, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"{metric}[{index}] = {value!r} (not a finite number)"
    return ""

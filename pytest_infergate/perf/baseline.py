"""What the stored perf gate compares with: a BaselineEntry per measurement key (the accepted measurement and the
fingerprint it was taken with), read from a saved run (a results file: --infergate-json, --infergate-save-baseline,
or a history run, through the store of runs' history.store.baseline_entries) or from a baseline file of the older
format (kind "baseline", schema 1 to 4, no longer written: `infergate migrate` rewrites one as a results file). The
older format is read here, below the results, beside the entries it is made of; every other file of a run is read
and written by history.store, which reads --infergate-baseline through load_baseline. A file that is neither is an
error that says what it is and what to pass instead. The versions and what each added: docs/reference/outputs.md,
'Baseline and golden files'.
"""

from __future__ import annotations

import difflib
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_infergate.environment import AcceptedKey
from pytest_infergate.errors import InfergateError
from pytest_infergate.measurement import Measurement, busy_share
from pytest_infergate.perf import interference
from pytest_infergate.perf.fingerprint import machine_text

KIND = "baseline"  # the older format's kind; a baseline is now a saved run (history.store.save_run_as_baseline)
SCHEMA_VERSION = 4  # its last version
# version 1 had no `kind`; 3 added the calibration probe per repetition; 4 the entry's `key` for its `fingerprint`
READABLE_VERSIONS = (1, 2, 3, 4)


# Samples of one value per generated token: the bulk of a saved run (the starter's: about 2,800 a repetition block
# of 96 requests, 3/4 of its file), kept in a baseline only where its gate compares them (a limit names them).
PER_TOKEN = frozenset({"itl_ms"})


def for_baseline(measurement: Measurement, compared: Iterable[str]) -> Measurement:
    """What a later run reads of a saved measurement: its samples with their split by repetition, probes and load
    evidence, which decide; the per-token samples only of `compared` (the metrics its gate compares) or where they
    are all it has; not this run's detail that only its own report draws (the engine's step timeline, an endpoint's
    per-request records). A later gate that compares a metric the baseline dropped says so
    (perf.gate.stored_comparison): re-save it."""
    dropped = PER_TOKEN - set(compared)
    if not any(values for metric, values in measurement.samples.items() if metric not in dropped):
        dropped = frozenset()  # per-token samples alone: all it measured, and what a later run compares

    def kept(by_metric: dict) -> dict:
        return {metric: values for metric, values in by_metric.items() if metric not in dropped}

    return replace(measurement, samples=kept(measurement.samples),
                   load_free_samples=kept(measurement.load_free_samples),
                   repetition_ends=kept(measurement.repetition_ends), steps=[], requests=[])


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
        """"8 repetitions, recorded 2026-12-03 07:10 UTC on AMD EPYC, 2 CPUs, 2 threads, cpu", and where the save
        was measured on a busy runner, what that means for every comparison with it (a new user's unchanged runs
        read 12–19% faster than such a save, load-corrected, and nothing said why at the comparison)."""
        when = (time.strftime(" %Y-%m-%d %H:%M UTC", time.gmtime(self.recorded)) if self.recorded else "")
        busy = busy_share(self.measurement.others_share)
        under_load = (f", on a busy runner ({interference.describe(busy)}): a slowdown smaller than what that load "
                      "took from the save may pass against it; a save in a later run, which may find the runner "
                      "quieter, gates those") if busy else ""
        return (f"{self.measurement.repetitions} repetitions, recorded{when} on "
                f"{machine_text(self.fingerprint)}{under_load}")


def schema_note(path: Path) -> str:
    """"" for a results file, a baseline file of the older format's last schema (4, read as it is) or an unreadable
    file (loading says why); else the line a run that reads it prints."""
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
            "rewrites it as a results file (a baseline is a saved run)")


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


def unreadable(path: Path, exc: Exception) -> str:
    """Why a JSON file could not be read, as it is: 'is empty' (not JSON's "Expecting value: line 1 column 1")."""
    return "is empty" if path.is_file() and path.stat().st_size == 0 else f"is not valid JSON ({exc})"


def a_kind(kind: str) -> str:
    """`kind` with its article: 'a golden', 'an unknown'."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def missing_baseline(path: Path) -> str:
    """Why a baseline path cannot be read, pointing at what exists: the closest JSON file by name in its folder or
    the folders beside it (a typo in CI would otherwise start a second baseline at the wrong path), else how to
    save one there."""
    near = [p for folder in {path.parent, path.parent.parent} if folder.is_dir()
            for pattern in ("*.json", "*/*.json") for p in folder.glob(pattern)]
    names = {str(p): p for p in near}
    close = difflib.get_close_matches(str(path), list(names), n=1, cutoff=0.6)
    if close:
        return (f"baseline file {path} does not exist; did you mean {close[0]}? (to start a baseline at {path} "
                f"instead, save one with --infergate-save-baseline={path})")
    return (f"baseline file {path} does not exist and no JSON file near it looks like one: save the accepted run "
            f"with --infergate-save-baseline={path}, then pass --infergate-baseline={path}")


def load_baseline(path: Path, results_entries: Callable[[dict, str], dict[str, BaselineEntry]] | None = None
                  ) -> dict[str, BaselineEntry]:
    """The entries of a baseline, by measurement key. A results file (--infergate-json, --infergate-save-baseline)
    is read through `results_entries` (history.store.baseline_entries, which the store passes: this layer
    lies below the results'): the accepted run is the baseline, each of its perf records an entry. A baseline file of
    the older format is read here."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(missing_baseline(path)) from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline file {path} {unreadable(path, exc)}; re-create it with "
                            "--infergate-save-baseline") from None
    kind = file_kind(data)
    if kind == "results" and results_entries is None:
        raise BaselineError(f"baseline file {path} is a results file (a saved run): read it with "
                            "load_baseline(path, history.store.baseline_entries)")
    if kind == "results":
        try:
            entries = results_entries(data, f"--infergate-baseline {path}")
        except BaselineError:
            raise
        except InfergateError as exc:
            raise BaselineError(str(exc)) from None
        _check_entries(path, entries)
        return entries
    if kind != KIND:
        raise BaselineError(f"--infergate-baseline {path} is {a_kind(kind)} file, not a baseline: pass a results file "
                            "(--infergate-json, --infergate-save-baseline) or a run of --infergate-history")
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

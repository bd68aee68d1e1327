"""Baselines in tests: a run saved as the baseline (--infergate-save-baseline writes the run's results file, issue
#42: a baseline is a saved run), and a baseline file of the older format (kind "baseline", schema 1 to 4), which
--infergate-baseline still reads and `infergate migrate` rewrites as a results file."""

from __future__ import annotations

import time

from pytest_infergate.measurement import Measurement
from pytest_infergate.outputs import baseline_entries
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults


def perf_record(key: str, fingerprint: dict, measurement: Measurement) -> PerfRecord:
    """A measured perf record, as infergate_bench records one."""
    return PerfRecord(test=key, label=measurement.label, precision=str(fingerprint.get("precision", "fp32")),
                      measurement=measurement, fingerprint=dict(fingerprint))


def saved_run(entries: dict[str, BaselineEntry], started: float | None = None) -> RunResults:
    """A run that measured each entry (key -> fingerprint and measurement), as a session's results."""
    records = [perf_record(key, entry.fingerprint, entry.measurement) for key, entry in entries.items()]
    return RunResults(started=time.time() if started is None else started, records=records)


def perf_records(saved: dict) -> list[dict]:
    """The perf records of a results file's data (a saved baseline): what a later run compares with."""
    return [record for record in saved["records"] if record["kind"] == "perf"]


def older_baseline(entries: dict[str, BaselineEntry], version: int = 4, created: float = 1_700_000_000.0) -> dict:
    """A baseline file of the older format, as --infergate-save-baseline wrote it before a baseline was a saved run
    (version 4: each entry's `key`; before, its `fingerprint`; version 1 without a `kind`)."""
    written = {}
    for key, entry in entries.items():
        data = entry.to_dict()
        if version < 4:
            del data["key"]
            data["fingerprint"] = dict(entry.fingerprint)
        written[key] = data
    kind = {"kind": "baseline"} if version > 1 else {}  # version 1 had no kind: its `entries` say what it is
    return {**kind, "schema_version": version, "created": created, "entries": written}


def older_baseline_of(saved: dict, version: int = 4) -> dict:
    """A saved results file's data as the older baseline file that held the same entries."""
    return older_baseline(baseline_entries(saved), version)

"""The one store of runs: every file that holds a run is written and read here, each written whole (atomic: a
temporary file renamed over the target). A run is kept as its results file (results.run, a versioned JSON file):
`--infergate-json PATH` the run as it ended (save_run); `--infergate-save-baseline PATH` the run a later run compares
with (save_run_as_baseline: the accepted run *is* the baseline); `--infergate-history DIR` one results file per run
(`<run id>.json`, the run id starting with its UTC time, so names sort by time), with that run's report beside it
(`<run id>.html`) when the run wrote one, the oldest removed beyond a retention count (append_run, prune). Any
folder of results files (`--infergate-json` outputs collected by CI) can be read as a history too: a report named as
its results file, `.html` for `.json`, is linked from the page.

Read back: a results file by path (load_run: `infergate compare`, `summary`, `report`), the runs of files and
folders (load_runs: a history), a history's run by id or `latest` (run_file), and the baseline of
--infergate-baseline as its perf entries (read_baseline: a results file, a history run, or a baseline file of the
older format, whose reader is perf.baseline, below the results); `migrate_baseline` rewrites such an older file as
the results file of the run it accepted."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from pytest_infergate.atomic import exclusive, write_json_atomic
from pytest_infergate.errors import InfergateError
from pytest_infergate.perf import baseline
from pytest_infergate.perf.baseline import BaselineEntry, BaselineError, for_baseline
from pytest_infergate.perf.budget import parse_budget
from pytest_infergate.results.records import PerfRecord, Record
from pytest_infergate.results.run import KIND, RunResults, new_run_id

_RUN_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}"  # results.run.new_run_id: the run's UTC time and a random suffix
RUN_ID = re.compile(rf"^{_RUN_ID}$")
RUN_FILE = re.compile(rf"^{_RUN_ID}\.json$")  # what append_run writes, and the only files it prunes
LATEST = "latest"  # the newest run of a history, as --infergate-baseline
DEFAULT_KEEP = 100


# ---- a run written: the results file, the baseline, a history's run ----------------------------------------
def save_run(path: Path, results: RunResults) -> None:
    """--infergate-json: the run as it ended."""
    write_json_atomic(path, results.to_dict())


def save_run_as_baseline(path: Path, results: RunResults) -> list[str]:
    """--infergate-save-baseline: the run saved as its results file (what --infergate-json writes), so that the
    accepted run is the baseline. A perf measurement without a single sample (every request failed or timed out) is
    no yardstick: refused, naming it, and nothing is written.

    Saving replaces the file, except that the perf records another run saved into it after this run started (two CI
    jobs, e.g. shards of one suite, saving one baseline at once) are kept when this run did not measure their key:
    the file is read and rewritten under a lock, so neither job's measurements are lost. Returns the keys kept that
    way."""
    empty = [record.test for record in results.perf if not any(record.measurement.samples.values())]
    if empty:
        raise BaselineError(f"{len(empty)} measurement(s) have no samples (every request failed or was rejected): "
                            f"{', '.join(empty)}; fix them or deselect them before saving a baseline")
    if not results.run_id:  # one id for this run in every file it writes (--infergate-json, the history)
        results.run_id = new_run_id(results.started)
    measured = {record.test for record in results.perf}
    with exclusive(path):
        kept = [record for record in _saved_since(Path(path), results.started) if record.test not in measured]
        saved = replace(results, records=[*map(baseline_record, results.records), *kept])
        write_json_atomic(path, saved.to_dict())
    return sorted({record.test for record in kept})


def baseline_record(record: Record) -> Record:
    """A record as a baseline keeps it: a perf measurement trimmed to what a later run's decision and report read
    (perf.baseline.for_baseline); other records whole."""
    if not isinstance(record, PerfRecord):
        return record
    budget = parse_budget(record.budget) if record.asks_comparison else None
    return replace(record, measurement=for_baseline(record.measurement, budget.relative_metrics() if budget else ()))


def _saved_since(path: Path, since: float) -> list[PerfRecord]:
    """The perf records of the results file at `path` if another run saved it after `since`, else none (a file
    saved before this run started is the accepted baseline this run replaces)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("kind") != KIND:
        return []
    if float(data.get("finished") or data.get("started") or 0.0) < since:
        return []
    try:
        return RunResults.from_dict(data).perf
    except InfergateError:
        return []


def append_run(folder: Path, results: RunResults, keep: int = DEFAULT_KEEP) -> Path:
    """Write this run into `folder` and remove the oldest runs beyond `keep`. The copy leaves out each
    measurement's per-step engine timeline (the bulk of a results file, never drawn in a history)."""
    data = results.to_dict()
    for record in data["records"]:
        if record.get("kind") == "perf":
            record["measurement"]["steps"] = []
    path = Path(folder) / f"{data['run_id']}.json"
    write_json_atomic(path, data)
    prune(folder, keep)
    return path


def prune(folder: Path, keep: int) -> list[Path]:
    """Remove the oldest run files beyond `keep`; other files in the folder are not touched."""
    runs = sorted(p for p in Path(folder).iterdir() if RUN_FILE.match(p.name))
    removed = runs[:max(0, len(runs) - keep)]
    for path in removed:
        path.unlink(missing_ok=True)  # a concurrent run may have pruned it already
        report_beside(path).unlink(missing_ok=True)
    return removed


def report_beside(results_file: Path) -> Path:
    """Where a run's report is kept in a history folder: its results file's name with `.html`."""
    return Path(results_file).with_suffix(".html")


# ---- a run read: by path, a history's runs, a history run by id or `latest` -------------------------------
def load_run(path: str | Path) -> RunResults:
    """The run of a results file (--infergate-json, --infergate-save-baseline, a history's run)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InfergateError(f"{path} does not exist: write one with pytest --infergate-json={path}") from None
    except (OSError, ValueError) as exc:
        raise InfergateError(f"{path} {baseline.unreadable(Path(path), exc)}: not a results file") from None
    return RunResults.from_dict(data, source=str(path))


def load_runs(sources: list[str | Path]) -> tuple[list[RunResults], list[str]]:
    """The runs of the results files and folders given, oldest first, each once; and what was skipped and why
    (in a folder, JSON files that are not results files, e.g. a baseline kept beside them)."""
    runs: dict[str, RunResults] = {}
    skipped = []
    for source in map(Path, sources):
        if source.is_dir():
            files = sorted(source.glob("*.json"))
            if not files:
                raise InfergateError(f"{source} holds no *.json results files; give files written by pytest "
                                     "--infergate-json or a folder written by --infergate-history")
        elif source.exists():
            files = [source]
        else:
            raise InfergateError(f"{source} does not exist: give results files (pytest --infergate-json) or a "
                                 "history folder (pytest --infergate-history)")
        for path in files:
            try:
                run = RunResults.from_dict(json.loads(path.read_text(encoding="utf-8")), source=str(path))
            except (OSError, ValueError, InfergateError) as exc:
                if not source.is_dir():
                    raise InfergateError(str(exc) if isinstance(exc, InfergateError) else
                                         f"{path} {baseline.unreadable(path, exc)}: not a results file") from None
                skipped.append(f"{path.name}: {exc}")
                continue
            if report_beside(path).is_file():
                run.report_copy = str(report_beside(path).resolve())
            runs.setdefault(run.run_id or f"{path.name}@{run.started}", run)
    return sorted(runs.values(), key=lambda r: (r.started, r.run_id)), skipped


def names_a_run(text: str) -> bool:
    """`text` is a history run's id or `latest`, not a file path."""
    return text == LATEST or bool(RUN_ID.match(text))


def run_file(folder: Path | None, run: str) -> Path:
    """The results file of the history run `run` (its id, or `latest`: the newest), for --infergate-baseline: the
    accepted run is the baseline."""
    flag = f"--infergate-baseline {run}"
    if folder is None:
        raise InfergateError(f"{flag} names a run of a history: give its folder with --infergate-history DIR (the "
                             "folder earlier runs were appended to), or pass a baseline or results file")
    runs = sorted(p for p in Path(folder).iterdir() if RUN_FILE.match(p.name)) if Path(folder).is_dir() else []
    if not runs:
        raise InfergateError(f"{flag}: the history {folder} holds no run yet; run once with "
                             f"--infergate-history={folder} to record the run to compare with")
    if run == LATEST:
        return runs[-1]
    path = Path(folder) / f"{run}.json"
    if not path.is_file():
        newest = ", ".join(p.stem for p in runs[-3:])
        raise InfergateError(f"{flag}: no such run in the history {folder} (its newest: {newest}); give one of its "
                             f"run ids (`infergate history {folder}` lists them) or `{LATEST}`")
    return path


# ---- the baseline: a saved run read as its perf entries; the older format read and migrated ---------------
def read_baseline(given: Path, history: Path | None = None) -> tuple[dict[str, BaselineEntry], str]:
    """--infergate-baseline: the entries of a results file, of a history run (its id or `latest`, in `history`) or
    of a baseline file of the older format (perf.baseline.load_baseline); and the line a run says of a file read as
    the current schema ("" when there is none)."""
    path = Path(given)
    if not path.exists() and names_a_run(str(given)):  # a history run: the accepted run is the baseline
        path = run_file(history, str(given))
    return baseline.load_baseline(path, baseline_entries), baseline.schema_note(path)


def baseline_entries(data: dict, source: str = "results file") -> dict[str, BaselineEntry]:
    """A results file (--infergate-json, --infergate-save-baseline) as a stored baseline (issue #42: the accepted run
    *is* the baseline): each perf record with samples and a fingerprint (not side B of an A/B run) an entry, keyed
    by its measurement key, with its fingerprint, measured when the run started."""
    if not isinstance(data.get("records", []), list):
        raise InfergateError(f"{source}: `records` must be a list of records, found "
                             f"{type(data.get('records')).__name__}; re-create it with --infergate-save-baseline")
    run = RunResults.from_dict(data, source)
    entries = {record.test: BaselineEntry(record.fingerprint, record.measurement, run.started)
               for record in run.perf if record.fingerprint and any(record.measurement.samples.values())}
    if not entries:
        empty = sum(1 for record in run.perf if not any(record.measurement.samples.values()))
        paired = sum(1 for record in run.perf if not record.fingerprint and any(record.measurement.samples.values()))
        if paired and not empty:  # a run of A/B tests only: they compare with their side A, not with this file
            return {}
        why = [f"{empty} without samples"] * bool(empty) + [f"{paired} side B of an A/B run"] * (paired > 0)
        raise InfergateError(f"{source}: this results file holds no perf measurement to compare with"
                             + (f" (its perf records: {', '.join(why)})" if why else "")
                             + "; pass the results of a run that measured (infergate_bench)")
    return entries


def run_of_baseline(entries: dict[str, BaselineEntry]) -> RunResults:
    """A baseline file of the older format (perf.baseline.load_baseline's entries) as the run it accepted: a perf
    record per entry, with its measurement and fingerprint, the run started when its first entry was recorded
    (what `infergate migrate` writes; read back, the same entries)."""
    recorded = [entry.recorded for entry in entries.values() if entry.recorded]
    started = min(recorded, default=0.0)
    records: list[Record] = [
        PerfRecord(test=key, label=entry.measurement.label, precision=str(entry.fingerprint.get("precision", "")),
                   measurement=entry.measurement, fingerprint=dict(entry.fingerprint))
        for key, entry in entries.items()]
    return RunResults(started=started, finished=max(recorded, default=started), records=records)


def migrate_baseline(path: Path, quiet: bool) -> list[str]:
    """`infergate migrate PATH`: a baseline file of the older format rewritten as the results file of the run it
    accepted, under its lock (the one a concurrent save takes); what was done, one line (`quiet`: nothing said of a
    file that is no such baseline, as in a folder)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        if quiet:
            return []
        raise InfergateError(f"{path} {baseline.unreadable(path, exc)}") from None
    kind = baseline.file_kind(data)
    if kind != baseline.KIND:
        return [] if quiet else [f"{path}: {baseline.a_kind(kind)} file: nothing to migrate (every version is read)"]
    with exclusive(path):  # read again under the lock: a save may have replaced the file meanwhile
        data = json.loads(path.read_text(encoding="utf-8"))
        if baseline.file_kind(data) != baseline.KIND:  # a save won the lock first: a results file now
            return [] if quiet else [f"{path}: {baseline.a_kind(baseline.file_kind(data))} file: nothing to migrate"]
        version = data.get("schema_version", 1)
        entries = baseline.load_baseline(path)
        write_json_atomic(path, run_of_baseline(entries).to_dict())
    return [f"{path}: perf baseline, {len(entries)} entries, schema {version} → a results file (a baseline is a "
            f"saved run)"]

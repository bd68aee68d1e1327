"""A history folder: one results file per run (`<run id>.json`, the run id starting with its UTC time, so names
sort by time), written atomically, with that run's report beside it (`<run id>.html`) when the run wrote one; the
oldest removed beyond a retention count. Any folder of results files (`--infergate-json` outputs collected by CI)
can be read as a history too: a report named as its results file, `.html` for `.json`, is linked from the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pytest_infergate.atomic import write_json_atomic
from pytest_infergate.errors import InfergateError
from pytest_infergate.results.run import RunResults

_RUN_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}"  # results.run.new_run_id: the run's UTC time and a random suffix
RUN_ID = re.compile(rf"^{_RUN_ID}$")
RUN_FILE = re.compile(rf"^{_RUN_ID}\.json$")  # what append_run writes, and the only files it prunes
LATEST = "latest"  # the newest run of a history, as --infergate-baseline
DEFAULT_KEEP = 100


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


def report_beside(results_file: Path) -> Path:
    """Where a run's report is kept in a history folder: its results file's name with `.html`."""
    return Path(results_file).with_suffix(".html")


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
                                         f"{path} is not a JSON results file ({exc})") from None
                skipped.append(f"{path.name}: {exc}")
                continue
            if report_beside(path).is_file():
                run.report_copy = str(report_beside(path).resolve())
            runs.setdefault(run.run_id or f"{path.name}@{run.started}", run)
    return sorted(runs.values(), key=lambda r: (r.started, r.run_id)), skipped

"""How a run ends: the files it writes at its end (the baseline, which is this run saved as a results file; the JSON
results; the history folder; the HTML report), each on its own, so one that cannot be written is reported and does
not stop the others (the report last: it links to the history page the run has just been appended to);
`--junitxml`, which pytest writes straight over the previous file, pointed at a temporary file beside it and renamed
once whole; and a CI job cancelled with SIGTERM (GitHub Actions, GitLab and Kubernetes send it first) ended as Ctrl-C
ends one, so the outputs are written as for an interrupted run (the baseline not saved over the accepted one, every
other file complete or untouched) instead of the process dying wherever it was. Only a SIGTERM nobody else handles is
taken over, in the main thread."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from _pytest.junitxml import xml_key

from pytest_infergate.atomic import plain_file_mode
from pytest_infergate.errors import InfergateError
from pytest_infergate.options import Options
from pytest_infergate.perf.baseline import BaselineEntry, BaselineError, for_baseline
from pytest_infergate.perf.budget import parse_budget
from pytest_infergate.results.records import PerfRecord, Record
from pytest_infergate.results.run import KIND, RunResults, new_run_id

if TYPE_CHECKING:
    from pytest_infergate.history import History


@dataclass
class Written:
    errors: list[str] = field(default_factory=list)  # one line per output not written, naming option and path
    notes: list[str] = field(default_factory=list)  # what a reviewer should know about an output that was written
    history: History | None = None  # when --infergate-history was written
    saved: list[str] = field(default_factory=list)  # what was written, said in the terminal ("baseline: ...")


def write_outputs(results: RunResults, options: Options, interrupted: bool = False) -> Written:
    """Write every output the options ask for. `interrupted` (Ctrl-C, a crash of the session): the baseline is
    not written, so an accepted one is never replaced by a run that did not finish."""
    from pytest_infergate.atomic import write_json_atomic

    history: History | None = None
    notes: list[str] = []
    saved: list[str] = []

    def save_baseline(path: Path) -> None:
        if interrupted:
            raise InfergateError("the run was interrupted, so it is no accepted measurement; the file is left as it "
                                 "was: save the baseline from a run that completes")
        results.saved_baseline = str(path)  # in the file it writes too (a baseline is a saved run)
        try:
            kept = save_run_as_baseline(path, results)
        except BaseException:  # not saved: the verdict must not say it was
            results.saved_baseline = None
            raise
        measured = len({record.test for record in results.perf if record.fingerprint})
        saved.append(f"baseline: this run saved to {path}, {measured} perf measurement{'' if measured == 1 else 's'} "
                     f"to compare with (later runs compare with --infergate-baseline {path})")
        if kept:
            notes.append(f"--infergate-save-baseline {path}: another run saved it while this one ran; its "
                         f"{len(kept)} measurement{'' if len(kept) == 1 else 's'} this run did not measure kept "
                         f"({', '.join(kept[:3])}{', ...' if len(kept) > 3 else ''})")

    def record_history(folder: Path) -> None:
        from pytest_infergate.report.history_page import record_run

        nonlocal history
        history = record_run(folder, results, options.history_keep, options.report)

    def write_report(path: Path) -> None:
        from pytest_infergate.report import write_report

        href = None
        if history is not None:
            from pytest_infergate.report.history_page import keep_report, page_href

            href = page_href(options.history, path)
        write_report(results, path, results.commit, history, href)
        if history is not None:  # a copy in the history folder, which each point of the history links to
            keep_report(options.history, results, history, path)

    outputs: list[tuple[str, Path | None, Callable[[Path], None]]] = [
        ("--infergate-save-baseline", options.save_baseline, save_baseline),
        ("--infergate-json", options.json, lambda path: write_json_atomic(path, results.to_dict())),
        ("--infergate-history", options.history, record_history),
        ("--infergate-report", options.report, write_report)]
    errors = []
    for option, path, write in outputs:
        if path is None:
            continue
        try:
            write(path)
        except (OSError, InfergateError) as exc:
            errors.append(f"{option} {path} was not written: {exc}")
    return Written(errors, notes, history, saved)


class AtomicJUnitXml:
    """Writes `--junitxml` to a temporary file beside the target, renamed over it once complete."""

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        xml = session.config.stash.get(xml_key, None)
        if xml is None:  # no --junitxml, or an xdist worker (the controller writes it)
            return (yield)
        target = xml.logfile
        folder = os.path.dirname(os.path.abspath(target))
        os.makedirs(folder, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp", dir=folder)
        os.close(handle)
        xml.logfile = tmp
        try:
            result = yield
            if os.path.getsize(tmp):  # junitxml wrote it whole
                os.chmod(tmp, plain_file_mode())
                os.replace(tmp, target)
            return result
        finally:
            xml.logfile = target  # the terminal's "generated xml file" line names the real file
            Path(tmp).unlink(missing_ok=True)


class TerminateAsInterrupt:
    """SIGTERM raises KeyboardInterrupt while installed (in the main thread, where Python runs signal handlers)."""

    def __init__(self) -> None:
        self._previous = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous = signal.signal(signal.SIGTERM, self._interrupt)

    def restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    @staticmethod
    def _interrupt(signum, frame) -> None:
        raise KeyboardInterrupt(f"terminated by signal {signal.Signals(signum).name}")


# ---- the saved baseline: a run saved as its results file, and a results file read as a baseline ------------
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


def save_run_as_baseline(path: Path, results: RunResults) -> list[str]:
    """--infergate-save-baseline: the run saved as its results file (what --infergate-json writes), so that the
    accepted run is the baseline. A perf measurement without a single sample (every request failed or timed out) is
    no yardstick: refused, naming it, and nothing is written.

    Saving replaces the file, except that the perf records another run saved into it after this run started (two CI
    jobs, e.g. shards of one suite, saving one baseline at once) are kept when this run did not measure their key:
    the file is read and rewritten under a lock, so neither job's measurements are lost. Returns the keys kept that
    way."""
    from pytest_infergate.atomic import exclusive, write_json_atomic

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
    budget = parse_budget(record.budget) if record.budget.get("max_regression") is not None else None
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

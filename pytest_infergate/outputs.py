"""How a run ends: the files it writes at its end (the baseline, which is this run saved as a results file; the JSON
results; the history folder; the HTML report), each on its own, so one that cannot be written is reported and does
not stop the others (the report last: it links to the history page the run has just been appended to);
`--junitxml`, which pytest writes straight over the previous file, pointed at a temporary file beside it and renamed
once whole; and a CI job cancelled with SIGTERM (GitHub Actions, GitLab and Kubernetes send it first) ended as Ctrl-C
ends one, so the outputs are written as for an interrupted run (the baseline not saved over the accepted one, every
other file complete or untouched) instead of the process dying wherever it was. Only a SIGTERM nobody else handles is
taken over, in the main thread."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from _pytest.junitxml import xml_key

from pytest_infergate.atomic import plain_file_mode
from pytest_infergate.errors import InfergateError
from pytest_infergate.history.store import baseline_entries, save_run, save_run_as_baseline
from pytest_infergate.options import Options
from pytest_infergate.results.reasons import busy_save_note
from pytest_infergate.results.run import RunResults

if TYPE_CHECKING:
    from pytest_infergate.history import History

# baseline_entries and save_run_as_baseline: the store's (history.store), still importable from here
__all__ = ["AtomicJUnitXml", "TerminateAsInterrupt", "Written", "baseline_entries", "save_run_as_baseline",
           "write_outputs"]


@dataclass
class Written:
    errors: list[str] = field(default_factory=list)  # one line per output not written, naming option and path
    notes: list[str] = field(default_factory=list)  # what a reviewer should know about an output that was written
    history: History | None = None  # when --infergate-history was written
    saved: list[str] = field(default_factory=list)  # what was written, said in the terminal ("baseline: ...")


def write_outputs(results: RunResults, options: Options, interrupted: bool = False) -> Written:
    """Write every output the options ask for. `interrupted` (Ctrl-C, a crash of the session): the baseline is
    not written, so an accepted one is never replaced by a run that did not finish."""
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
        measured = {record.test for record in results.perf if record.fingerprint}
        # a gate without max_regression never compares with a baseline: said at the save, not at the later run
        relative = {record.test for record in results.perf if record.fingerprint and record.asks_comparison}
        if relative:
            unused = len(measured - relative)
            compares = (f"{len(relative)} perf measurement{'' if len(relative) == 1 else 's'} to compare with "
                        f"(later runs compare with --infergate-baseline {path})"
                        + (f"; {unused} without max_regression compared with none" if unused else ""))
        else:
            compares = (f"{len(measured)} perf measurement{'' if len(measured) == 1 else 's'}, but no gate asks for a "
                        "comparison: add max_regression=0.1 to an infergate_budget marker to fail a figure 10% worse "
                        f"than it with --infergate-baseline {path}")
        saved.append(f"baseline: this run saved to {path}, {compares}{busy_save_note(results.perf)}")
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
        ("--infergate-json", options.json, lambda path: save_run(path, results)),
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

"""Run history: each run's results kept in a folder (`--infergate-history`), read back as trends per test and
metric, with change points and slow creep (`infergate history`). No pytest here."""

from pytest_infergate.history.series import DEFAULT_METRICS, History, build_history, findings
from pytest_infergate.history.store import append_run, load_runs

__all__ = ["DEFAULT_METRICS", "History", "append_run", "build_history", "findings", "load_runs"]

"""Runs kept and read back: the one store of runs (`store`: the results file, the saved baseline and a history
folder's runs, each written whole; read by path, by history run id or `latest`; pruned; older baseline files
migrated), and the history across runs (`series`, `changepoint`): trends per test and metric, with change points and
slow creep (`infergate history`). Data below the report: nothing here draws (its page is report.history_page). No
pytest here."""

from pytest_infergate.history.series import DEFAULT_METRICS, History, build_history, findings
from pytest_infergate.history.store import append_run, load_runs

__all__ = ["DEFAULT_METRICS", "History", "append_run", "build_history", "findings", "load_runs"]

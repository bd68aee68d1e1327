"""Moved to `pytest_infergate.workloads` (0.4): kept so the conftest `infergate init` wrote before then
(`from pytest_infergate.workload_files import from_file`) still imports; new code imports from workloads."""

import warnings

from pytest_infergate.workloads.traffic import Session, Turn, WorkloadError, from_file

__all__ = ["Session", "Turn", "WorkloadError", "from_file"]

warnings.warn("pytest_infergate.workload_files moved to pytest_infergate.workloads: import from_file from there",
              DeprecationWarning, stacklevel=2)

"""A CI job cancelled with SIGTERM (GitHub Actions, GitLab and Kubernetes all send it first) ends as Ctrl-C does:
pytest reports the run as interrupted and the plugin writes its outputs as for an interrupted run (the baseline
not saved over the accepted one, every other file complete or untouched), instead of the process dying wherever
it was. Only a SIGTERM nobody else handles is taken over, and only in the main thread (where Python runs
signal handlers)."""

from __future__ import annotations

import signal
import threading


class TerminateAsInterrupt:
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

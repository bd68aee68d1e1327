"""Files that appear whole or not at all: written to a temporary file beside the target, then renamed; and a lock
for the outputs that are read, merged and rewritten (baseline, accepted golden outputs) by runs that may overlap
(two CI jobs on one runner, pytest-xdist workers)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from pytest_infergate.errors import InfergateError

LOCK_TIMEOUT_S = 600.0  # a merge takes milliseconds; a holder this long is a stuck process, named in the error


@contextmanager
def exclusive(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the machine-wide lock of one output file while it is read, merged and rewritten, so two runs that save
    the same file at once both land (no lost entry). The lock file lives in the temporary directory, keyed by the
    output's absolute path: beside the output it would show up in every checkout that commits its baselines."""
    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:24]
    folder = Path(tempfile.gettempdir()) / "infergate-locks"
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / f"{key}.lock", timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        raise InfergateError(f"{path} is being written by another run that has held its lock ({lock.lock_file}) "
                             f"for over {timeout_s:g} s; if no other run is writing it, remove the lock file") from None
    try:
        yield
    finally:
        lock.release()


def plain_file_mode() -> int:
    """What open() would have given: mkstemp creates 0600, and a renamed output should look like any other file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, plain_file_mode())
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: dict) -> None:
    """`data` in the order its writer built it (a run's file opens with its kind, schema, verdict and verdict line,
    what a reader looks for first; dict order is deterministic, so the bytes are too)."""
    write_text_atomic(path, json.dumps(data, indent=1, default=str))

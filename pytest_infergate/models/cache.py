"""Cache entries that are built once, under a file lock, and appear atomically.

An entry is a directory holding `infergate-meta.json`, written last, which lists each file with its size and
sha256. A directory without that file, or whose files no longer match it (size, or contents: checked once per
process), is corrupted: it is moved aside and rebuilt, never loaded. Parallel pytest-xdist workers wait on the
lock and then find the finished entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from pytest_infergate import context
from pytest_infergate.errors import CacheCorrupted, ModelLoadError

META_NAME = "infergate-meta.json"
META_SCHEMA = 1


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def make_cache_dir(root: Path) -> None:
    """Create the cache folder, or say which option to change when it cannot be."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"the model cache {root} cannot be created ({exc.strerror}): set --infergate-cache-dir "
                             "(or $INFERGATE_CACHE_DIR) to a writable folder") from None


def read_meta(entry: Path) -> dict:
    """The entry's metadata, after checking every listed file is there with its recorded size."""
    meta_path = entry / META_NAME
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise CacheCorrupted(f"{entry} has no {META_NAME}: it was never finished") from None
    except (OSError, ValueError) as exc:
        raise CacheCorrupted(f"{meta_path} is unreadable: {exc}") from None
    if not isinstance(meta, dict) or meta.get("schema") != META_SCHEMA or not isinstance(meta.get("files"), dict):
        schema = meta.get("schema") if isinstance(meta, dict) else "?"
        raise CacheCorrupted(f"{meta_path} has an unknown layout (schema {schema})")
    for name, info in meta["files"].items():
        path = entry / name
        if not path.is_file():
            raise CacheCorrupted(f"{path} is missing")
        stat = path.stat()
        if stat.st_size != info["size"]:
            raise CacheCorrupted(f"{path} is {stat.st_size} bytes, expected {info['size']}")
        # every file's contents, once per process: a change in place that kept size and time (bit rot, `cp -p`
        # over it) is caught too, for a second or two of sha256 on the embedded model (docs/measurements.md)
        _check_digest(path, stat, info["sha256"])
    return meta


_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime) whose digest matched, in this process


def _check_digest(path: Path, stat: os.stat_result, expected: str) -> None:
    """A file must still have the digest recorded when the entry was built; checked once per process."""
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key in _VERIFIED:
        return
    if sha256_file(path) != expected:
        raise CacheCorrupted(f"{path} does not match the sha256 recorded when it was built: it was changed in place "
                             "or its bits rotted")
    _VERIFIED.add(key)


def write_meta(entry: Path, extra: dict) -> dict:
    files = {p.name: {"size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns, "sha256": sha256_file(p)}
             for p in sorted(entry.iterdir()) if p.is_file() and p.name != META_NAME}
    meta = {"schema": META_SCHEMA, "created": time.time(), "files": files, **extra}
    tmp = entry / (META_NAME + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp, entry / META_NAME)
    return meta


def ensure_entry(root: Path, key: str, build: Callable[[Path], dict]) -> tuple[Path, dict]:
    """Return (directory, meta) of cache entry `key`, building it with `build(tmp_dir) -> extra meta` if needed."""
    make_cache_dir(root)
    entry = root / key
    try:
        return entry, read_meta(entry)
    except CacheCorrupted:
        pass
    try:
        return _build_entry(root, key, build)
    except OSError as exc:  # disk full, a read-only or foreign-owned cache: the entries already built are intact
        raise ModelLoadError(f"the model cache {root} could not be written while building {key} ({exc.strerror or exc}"
                             f"{': ' + str(exc.filename) if exc.filename else ''}): free space there or set "
                             "--infergate-cache-dir (or $INFERGATE_CACHE_DIR) to a writable folder") from None


def _build_entry(root: Path, key: str, build: Callable[[Path], dict]) -> tuple[Path, dict]:
    entry = root / key
    with FileLock(str(root / (key + ".lock"))):
        if entry.exists():
            try:
                return entry, read_meta(entry)  # another process finished it while we waited
            except CacheCorrupted:
                aside = root / f"{key}.corrupt-{os.getpid()}"
                os.replace(entry, aside)
                shutil.rmtree(aside, ignore_errors=True)
        tmp = root / f"{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        started = time.monotonic()
        context.report(f"building {key} in the model cache {root} (once per machine; a minute or more)")
        try:
            extra = build(tmp)
            write_meta(tmp, extra)
            os.replace(tmp, entry)
            context.report(f"built {key} in {time.monotonic() - started:.0f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry, read_meta(entry)

"""`infergate migrate PATH...`: rewrite accepted results written by an older pytest-infergate (perf baselines,
accepted golden outputs) in the current schema, where every entry carries its environment.AcceptedKey. Each file is
read, converted and rewritten whole under its lock (atomic.exclusive, the lock a concurrent save takes), so a run
saving the same file meanwhile loses nothing; a file already current is left untouched. Results files and
history folders need no migration (every version of them is read)."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_infergate.atomic import exclusive, write_json_atomic
from pytest_infergate.errors import InfergateError
from pytest_infergate.perf import baseline
from pytest_infergate.precision import QUANTIZED
from pytest_infergate.quality import golden_files


def migrate(path: Path) -> list[str]:
    """Migrate a baseline file, an accepted golden file, or every such file under a folder; one line per file."""
    path = Path(path)
    if path.is_dir():
        lines, failed = [], []
        for item in sorted(p for p in path.rglob("*.json*") if p.suffix in (".json", ".jsonl")):
            try:
                lines += _migrate_file(item, quiet=True)
            except InfergateError as exc:  # the others still migrate; this one is named with why
                failed.append(f"{item}: not migrated: {exc}")
        if failed:
            raise InfergateError("\n".join(lines + failed))
        return lines or [f"{path}: no baseline or accepted golden file needed migrating"]
    if not path.exists():
        raise InfergateError(f"{path} does not exist: give a baseline file (--infergate-save-baseline), an accepted "
                             "golden file or a folder of them (--infergate-golden-dir)")
    lines = _migrate_file(path, quiet=False)
    return lines


def _migrate_file(path: Path, quiet: bool) -> list[str]:
    if path.suffix == ".jsonl":
        header = golden_files.header_line(path)
        if "schema_version" not in header:  # a sample set (one sample a line), not accepted outputs
            return [] if quiet else [f"{path}: a golden sample set, not accepted outputs: nothing to migrate"]
        if header["schema_version"] == golden_files.SCHEMA_VERSION:
            return [] if quiet else [f"{path}: already schema {golden_files.SCHEMA_VERSION}"]
        with exclusive(path):
            accepted = golden_files.read_outputs(path)
            if accepted.header.get("schema_version") == golden_files.SCHEMA_VERSION:  # an update won the lock first
                return [] if quiet else [f"{path}: already schema {golden_files.SCHEMA_VERSION}"]
            golden_files.write_outputs(path, accepted.header, list(accepted.outputs.values()))
        later = ("; its quality figures against the reference, which decide on other machines, come with the next "
                 "--infergate-update-golden" if accepted.header.get("precision") in QUANTIZED
                 and not accepted.header.get("figures_against") else "")
        return [f"{path}: accepted golden outputs, schema {header['schema_version']} → {golden_files.SCHEMA_VERSION}"
                + later]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        if quiet:
            return []
        raise InfergateError(f"{path} is not a JSON file ({exc})") from None
    kind = baseline.file_kind(data)
    if kind != baseline.KIND:
        return [] if quiet else [f"{path}: a {kind} file: nothing to migrate (every version is read)"]
    if data.get("schema_version", 1) == baseline.SCHEMA_VERSION:
        return [] if quiet else [f"{path}: already schema {baseline.SCHEMA_VERSION}"]
    with exclusive(path):  # read again under the lock: a save may have replaced the file meanwhile
        data = json.loads(path.read_text(encoding="utf-8"))
        version = data.get("schema_version", 1)
        if version == baseline.SCHEMA_VERSION:
            return [] if quiet else [f"{path}: already schema {baseline.SCHEMA_VERSION}"]
        entries = baseline.load_baseline(path)
        created = float(data.get("created") or 0.0)
        write_json_atomic(path, {"kind": baseline.KIND, "schema_version": baseline.SCHEMA_VERSION,
                                 "created": created, "entries": {key: entry.to_dict() for key, entry in
                                                                 entries.items()}})
    return [f"{path}: perf baseline, {len(entries)} entries, schema {version} → {baseline.SCHEMA_VERSION}"]

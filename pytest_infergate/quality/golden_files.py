"""Golden sample sets and accepted golden outputs: reading, validating and writing them. Sample sets are JSONL, one
sample a line; accepted outputs live beside them, under
`<golden dir>/<model name>/<fingerprint>/<device>-<precision>.jsonl`: a header line (schema version, model,
precision, device, library versions, the `key` every accepted result carries) and one line per sample (token ids,
text, the top-k log-probabilities of its own continuation, and its `figures` against a reference precision:
quality.travel). Written atomically and only by --infergate-update-golden; schema 1 and 2 files are read and
rewritten as 3 by `infergate migrate`. The format and its versions: docs/reference/outputs.md, 'Baseline and golden
files'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_infergate.atomic import write_text_atomic
from pytest_infergate.environment import AcceptedKey
from pytest_infergate.errors import InfergateError, unknown_keys

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # 2 added the header's `key`, 3 each output's `figures` against the reference
CATEGORIES = ("factual", "reasoning", "long-form", "code", "format", "chat", "summarization", "multilingual")
_SAMPLE_KEYS = {"id", "category", "messages", "prompt", "max_new_tokens", "expected", "regex", "json_schema",
                "must_parse_json", "max_words"}


class GoldenError(InfergateError):
    """A golden sample set or golden output file that is malformed; the message names file and line."""


@dataclass(frozen=True)
class GoldenSample:
    id: str
    category: str
    messages: tuple[dict, ...] | None
    prompt: str | None
    max_new_tokens: int
    expected: tuple[str, ...] = ()
    regex: str | None = None
    json_schema: dict | None = None
    must_parse_json: bool = False
    max_words: int | None = None
    where: str = field(default="", compare=False)  # "file:line" it was read from, for error messages
    source: str = field(default="", compare=False)  # the sample set file; golden outputs are generated per file

    @property
    def has_task_checks(self) -> bool:
        return bool(self.expected or self.regex or self.json_schema or self.must_parse_json or self.max_words)

    def request_kwargs(self) -> dict[str, Any]:
        if self.messages is not None:
            return {"messages": [dict(m) for m in self.messages], "max_new_tokens": self.max_new_tokens}
        return {"prompt": self.prompt, "max_new_tokens": self.max_new_tokens}


def _sample_from(data: Any, where: str, source: str = "") -> GoldenSample:
    if not isinstance(data, dict):
        raise GoldenError(f"{where}: a sample must be a JSON object, got {type(data).__name__}")
    unknown = unknown_keys(list(data), sorted(_SAMPLE_KEYS), "key")
    if unknown:
        raise GoldenError(f"{where}: {unknown}; allowed: {sorted(_SAMPLE_KEYS)}")
    for key in ("id", "category", "max_new_tokens"):
        if key not in data:
            raise GoldenError(f"{where}: missing required key {key!r}")
    if ("messages" in data) == ("prompt" in data):
        raise GoldenError(f"{where}: give exactly one of 'messages' or 'prompt'")
    messages = data.get("messages")
    if messages is not None and (not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise GoldenError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    if data.get("prompt") is not None and (not isinstance(data["prompt"], str) or not data["prompt"].strip()):
        raise GoldenError(f"{where}: 'prompt' must be non-empty text")
    if isinstance(data["max_new_tokens"], bool) or not isinstance(data["max_new_tokens"], int) \
            or data["max_new_tokens"] <= 0:
        raise GoldenError(f"{where}: 'max_new_tokens' must be a positive integer")
    expected = data.get("expected", [])
    if isinstance(expected, str):
        expected = [expected]
    if not isinstance(expected, list) or not all(isinstance(e, str) for e in expected):
        raise GoldenError(f"{where}: 'expected' must be a string or a list of strings (any of them counts)")
    regex = data.get("regex")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise GoldenError(f"{where}: 'regex' does not compile: {exc}") from None
    return GoldenSample(id=str(data["id"]), category=str(data["category"]),
                        messages=tuple(messages) if messages is not None else None, prompt=data.get("prompt"),
                        max_new_tokens=data["max_new_tokens"], expected=tuple(expected), regex=regex,
                        json_schema=data.get("json_schema"), must_parse_json=bool(data.get("must_parse_json")),
                        max_words=data.get("max_words"), where=where, source=source)


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise GoldenError(f"cannot read {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except ValueError as exc:
            raise GoldenError(f"{path}:{number}: not valid JSON ({exc.msg}); fix or delete that line") from None
    return rows


def load_samples(path: Path) -> list[GoldenSample]:
    samples = [_sample_from(data, f"{path}:{number}", str(path)) for number, data in _read_jsonl(path)]
    seen = set()
    for sample in samples:
        if sample.id in seen:
            raise GoldenError(f"{path}: sample id {sample.id!r} appears twice; ids must be unique")
        seen.add(sample.id)
    if not samples:
        raise GoldenError(f"{path} holds no samples")
    return samples


# the default sample set, shipped in the package: a project without sample sets of its own is gated on it
BUILTIN_SAMPLE_SET = Path(__file__).with_name("samples") / "default.jsonl"
BUILTIN_NOTICE = ("golden samples: using the built-in 48-sample set (no *.jsonl sample set in {folder}); copy it "
                  "with `infergate init-golden {folder}` to make it yours")


def find_sample_sets(golden_dir: Path, explicit: bool = False) -> list[Path]:
    """The project's sample sets (`golden_dir`/*.jsonl), else the built-in set (BUILTIN_SAMPLE_SET). A folder
    named explicitly (--infergate-golden-dir) that does not exist is an error: a typo must not fall back."""
    golden_dir = Path(golden_dir)
    if explicit and not golden_dir.is_dir():
        raise GoldenError(f"golden directory {golden_dir} does not exist: set --infergate-golden-dir (ini "
                          "infergate_golden_dir) to a folder of .jsonl sample sets, or leave it unset to use the "
                          "built-in sample set")
    sets = sorted(golden_dir.glob("*.jsonl")) if golden_dir.is_dir() else []
    return sets or [BUILTIN_SAMPLE_SET]


def copy_builtin_samples(folder: Path) -> Path:
    """`infergate init-golden FOLDER`: the built-in sample set copied into FOLDER (created), to edit and extend.
    An existing file of that name is left alone (an error says so)."""
    folder = Path(folder)
    target = folder / BUILTIN_SAMPLE_SET.name
    if target.exists():
        raise GoldenError(f"{target} exists already: it is left as it is (remove it first to start again from the "
                          "built-in set)")
    folder.mkdir(parents=True, exist_ok=True)
    target.write_bytes(BUILTIN_SAMPLE_SET.read_bytes())
    return target


@dataclass
class GoldenOutput:
    id: str
    token_ids: list[int]
    text: str
    # per generated token: [[token id, logprob], ...] top-k of the precision's own distribution
    top_logprobs: list[list[list[float]]] = field(default_factory=list)
    # against the reference precision on the accepting machine (travel.SampleFigures.to_dict); None: not recorded
    figures: dict | None = None

    def to_dict(self) -> dict:
        data = {"id": self.id, "token_ids": self.token_ids, "text": self.text, "top_logprobs": self.top_logprobs}
        return {**data, "figures": self.figures} if self.figures is not None else data


@dataclass
class GoldenOutputs:
    header: dict
    outputs: dict[str, GoldenOutput]


def outputs_path(golden_dir: Path, model_name: str, fingerprint: str, device: str, precision: str) -> Path:
    return Path(golden_dir) / _path_safe(model_name) / fingerprint / f"{device.split(':')[0]}-{precision}.jsonl"


def endpoint_outputs_path(golden_dir: Path, model_name: str, served_model: str) -> Path:
    """Accepted outputs of an endpoint: per local model name and the model name the server reports."""
    return Path(golden_dir) / _path_safe(model_name) / "endpoint" / f"{_path_safe(served_model)}.jsonl"


def holds_accepted_outputs(golden_dir: Path) -> bool:
    """Whether `golden_dir` holds accepted outputs of any model (outputs_path, endpoint_outputs_path: a file two
    folders down, model and fingerprint or "endpoint")."""
    return any(Path(golden_dir).glob("*/*/*.jsonl"))


def _path_safe(name: str) -> str:
    """A model name as one path component (hub ids have slashes, served names anything)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def read_outputs(path: Path) -> GoldenOutputs:
    rows = _read_jsonl(path)
    if not rows:
        raise GoldenError(f"{path} is empty: regenerate it with --infergate-update-golden")
    number, header = rows[0]
    if not isinstance(header, dict) or header.get("schema_version") not in READABLE_VERSIONS:
        raise GoldenError(f"{path}:{number}: header has schema version "
                          f"{header.get('schema_version') if isinstance(header, dict) else '?'}, this "
                          f"pytest-infergate reads {', '.join(map(str, READABLE_VERSIONS))}; regenerate with "
                          "--infergate-update-golden")
    if "key" in header:
        try:
            AcceptedKey.from_dict(header["key"])
        except ValueError as exc:
            raise GoldenError(f"{path}:{number}: header `key`: {exc}; regenerate with --infergate-update-golden"
                              ) from None
    header = unfolded(header)
    outputs = {}
    for number, data in rows[1:]:
        if (not isinstance(data, dict) or not isinstance(data.get("id"), str)
                or not isinstance(data.get("token_ids"), list)):
            raise GoldenError(f"{path}:{number}: an output line needs 'id' and 'token_ids'")
        figures = data.get("figures")
        if figures is not None and not isinstance(figures, dict):
            raise GoldenError(f"{path}:{number}: 'figures' must be an object (top1, mean_kl, task, reference_task); "
                              "regenerate with --infergate-update-golden")
        outputs[data["id"]] = GoldenOutput(data["id"], list(data["token_ids"]), str(data.get("text", "")),
                                           list(data.get("top_logprobs", [])), figures)
    return GoldenOutputs(header, outputs)


def header_line(path: Path) -> dict:
    """The first line of an accepted file as a mapping ({} when unreadable or not a mapping: a full read says why)."""
    try:
        with open(path, encoding="utf-8") as handle:
            header = json.loads(handle.readline())
    except (OSError, ValueError):
        return {}
    return header if isinstance(header, dict) else {}


def schema_note(path: Path, version: int | None = None) -> str:
    """"" for an accepted golden file in the current schema; else the line the golden check prints. `version`:
    the schema its header says, when the caller has read it (else the header line is read)."""
    version = header_line(path).get("schema_version") if version is None else version
    if version is None or version == SCHEMA_VERSION:
        return ""
    return (f"accepted golden outputs {path} have schema version {version}: read as {SCHEMA_VERSION} (the header's "
            f"key derived from its fields); `infergate migrate {path}` rewrites the file")


# schema 2 keeps these in the header's key (the one record of what the outputs depend on), not beside it
FOLDED = ("environment", "method", "compositions")
# the key's fields that are no part of a schema 1 `environment` (readers get those from the header's own fields)
_ABOUT = ("device", "model_fingerprint", "precision", "method", "compositions")


def golden_key(header: dict) -> AcceptedKey:
    """The key of an accepted golden file: its header's (schema 2), else derived from a header's fields (schema 1,
    or a header being written)."""
    if isinstance(header.get("key"), dict):
        return AcceptedKey.from_dict(header["key"])
    about = {"device": header.get("device"), "model_fingerprint": header.get("fingerprint"),
             "precision": header.get("precision"), "method": header.get("method"),
             "compositions": header.get("compositions")}
    return AcceptedKey.of({**(header.get("environment") or {}),
                           **{name: value for name, value in about.items() if value is not None}})


def unfolded(header: dict) -> dict:
    """A header as its readers use it: a schema 2 header's `environment`, `method` and `compositions` taken from
    its key (a schema 1 header has them as they are)."""
    if not isinstance(header.get("key"), dict):
        return header
    key = golden_key(header)
    fields = {**key.machine, **key.under_test}
    environment = {name: value for name, value in fields.items() if name not in _ABOUT}
    return {**header, "environment": environment, "method": key.under_test.get("method"),
            "compositions": key.under_test.get("compositions")}


def write_outputs(path: Path, header: dict, outputs: list[GoldenOutput]) -> None:
    header = {name: value for name, value in header.items() if name not in ("schema_version", "key")}
    on_disk = {name: value for name, value in header.items() if name not in FOLDED}
    on_disk.update(key=golden_key(header).to_dict(), schema_version=SCHEMA_VERSION)
    lines = [json.dumps(on_disk, ensure_ascii=False, sort_keys=True)]
    lines += [json.dumps(output.to_dict(), ensure_ascii=False) for output in outputs]
    write_text_atomic(path, "\n".join(lines) + "\n")


def update_outputs(path: Path, header: dict, outputs: list[GoldenOutput], known_ids: list[str]) -> list[str]:
    """Rewrite an accepted file with `outputs` (--infergate-update-golden) and say what changed. Accepted outputs
    of other samples still in the sample sets (`known_ids`, in their order) are kept: a test that updates with a
    `limit` or `categories`, or two runs updating one file at once, keep each other's samples. Read and written
    under the file's lock."""
    from pytest_infergate.atomic import exclusive

    produced = {output.id for output in outputs}
    with exclusive(path):
        old = None
        if path.exists():
            try:
                old = read_outputs(path)
            except GoldenError:  # rewritten anyway
                pass
        kept = [old.outputs[id_] for id_ in known_ids if old is not None and id_ in old.outputs and id_ not in produced]
        write_outputs(path, header, outputs + kept)
    return diff_outputs(old, outputs + kept)


def diff_outputs(old: GoldenOutputs | None, new: list[GoldenOutput]) -> list[str]:
    """Human-readable lines saying which samples an update changed."""
    if old is None:
        return [f"new golden file with {len(new)} samples"]
    lines = []
    for output in new:
        before = old.outputs.get(output.id)
        if before is None:
            lines.append(f"+ {output.id}: new sample")
        elif before.token_ids != output.token_ids:
            lines.append(f"~ {output.id}: {before.text[:60]!r} -> {output.text[:60]!r}")
    for gone in sorted(set(old.outputs) - {o.id for o in new}):
        lines.append(f"- {gone}: removed")
    return lines or ["no output changed"]

"""The corpus figures accepted for a precision: what `check_corpus()` measured when the golden outputs were accepted
(`--infergate-update-golden`), so a later run's mean KL against its reference is compared with them chunk by chunk
(policy key `max_corpus_kl_rise`). Kept beside the accepted golden outputs, one file per precision:
`<golden dir>/<model>/<fingerprint>/<device>-<precision>.corpus.json` — a figure against the precision's own
reference travels across machines (quality.travel rests on the same), so the file records where it was measured
for the message, not to pick a file by machine. Written atomically with a kind and a schema version."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_infergate.atomic import write_text_atomic
from pytest_infergate.errors import InfergateError
from pytest_infergate.quality.corpus_figures import ChunkFigures, CorpusResult

KIND = "corpus-figures"
SCHEMA_VERSION = 1
SUFFIX = ".corpus.json"


@dataclass
class AcceptedCorpus:
    """The corpus comparison accepted for one precision, with where and when it was measured."""

    precision: str
    reference_precision: str
    corpus: str
    digest: str
    chunk_tokens: int
    chunks: list[ChunkFigures]
    summary: dict = field(default_factory=dict)
    machine: str = ""  # the CPU (and GPU) it was measured on
    accepted_at: str = ""  # UTC date and time

    @classmethod
    def of(cls, result: CorpusResult, machine: str) -> AcceptedCorpus:
        summary = {k: v for k, v in result.summary.items() if k not in ("accepted_mean_kl", "kl_rise", "kl_rise_ci")}
        return cls(result.precision, result.reference_precision, result.corpus, result.digest, result.chunk_tokens,
                   list(result.chunks), summary, machine, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))

    def to_dict(self) -> dict:
        return {"kind": KIND, "schema_version": SCHEMA_VERSION, "precision": self.precision,
                "reference_precision": self.reference_precision, "corpus": self.corpus, "digest": self.digest,
                "chunk_tokens": self.chunk_tokens, "machine": self.machine, "accepted_at": self.accepted_at,
                "summary": self.summary, "chunks": [c.to_dict() for c in self.chunks]}

    @classmethod
    def from_dict(cls, data: dict) -> AcceptedCorpus:
        return cls(str(data["precision"]), str(data["reference_precision"]), str(data.get("corpus", "")),
                   str(data["digest"]), int(data["chunk_tokens"]),
                   [ChunkFigures.from_dict(c) for c in data["chunks"]], dict(data.get("summary", {})),
                   str(data.get("machine", "")), str(data.get("accepted_at", "")))

    def comparable(self, result: CorpusResult) -> str:
        """Why `result` cannot be compared with these figures chunk by chunk ("" where it can)."""
        if self.reference_precision != result.reference_precision:
            return (f"accepted against {self.reference_precision}, this run against {result.reference_precision}: "
                    "figures against another reference do not compare")
        if self.digest != result.digest or len(self.chunks) != len(result.chunks):
            return ("accepted over other tokens (another corpus, chunk size or tokenizer): accept this run's with "
                    "--infergate-update-golden")
        return ""


def corpus_path(accepted_outputs: Path) -> Path:
    """The corpus figures' file beside a precision's accepted golden outputs (`cpu-int8.jsonl` ->
    `cpu-int8.corpus.json`)."""
    name = accepted_outputs.name
    return accepted_outputs.with_name((name[:-len(".jsonl")] if name.endswith(".jsonl") else name) + SUFFIX)


def read_accepted(path: Path) -> AcceptedCorpus:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InfergateError(f"cannot read the accepted corpus figures {path}: {exc}; accept them again with "
                             "--infergate-update-golden") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
        raise InfergateError(f"{path} is not a corpus figures file of schema {SCHEMA_VERSION}; accept them again "
                             "with --infergate-update-golden")
    try:
        return AcceptedCorpus.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InfergateError(f"{path}: incomplete corpus figures ({type(exc).__name__}: {exc}); accept them again "
                             "with --infergate-update-golden") from None


def write_accepted(path: Path, accepted: AcceptedCorpus) -> None:
    write_text_atomic(path, json.dumps(accepted.to_dict(), indent=1) + "\n")

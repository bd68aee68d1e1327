"""The report's corpus section: each corpus check (results.records.CorpusRecord) as a row of formatted figures,
each with its 95% interval over the chunks, beside the quality comparisons on golden samples."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate import units
from pytest_infergate.results.records import CorpusRecord


@dataclass
class CorpusSection:
    test: str
    precision: str
    reference: str
    status: str
    corpus: str
    size: str  # "10,109 tokens in 21 chunks of 512"
    mean_kl: str  # each: the figure and its interval
    top1: str
    delta_ppl: str
    tails: str  # KL p99 / p99.9 / max
    perplexity: str  # reference -> candidate
    rise: str  # against the accepted figures, where compared
    accepted: str  # the file compared with, or why none
    decided_by: str
    problems: list[str]
    undecided: list[str]
    notes: list[str]
    seconds: str


def _with_interval(summary: dict, key: str, shown=units.number) -> str:
    value, ci = summary.get(key), summary.get(key + "_ci")
    if not units.is_number(value):
        return units.DASH
    return shown(value) + (f" ({shown(ci[0])}–{shown(ci[1])})" if ci else "")


def _signed_percent(value: float) -> str:
    return ("+" if value > 0 else "") + units.percent(value)


def corpus_sections(records: list[CorpusRecord]) -> list[CorpusSection]:
    out = []
    for record in records:
        result, s = record.result, record.result.summary
        out.append(CorpusSection(
            record.test, result.precision, result.reference_precision, record.status.value, result.corpus,
            f"{s.get('tokens', 0):,} tokens in {s.get('chunks', 0)} chunks of {result.chunk_tokens}",
            _with_interval(s, "mean_kl"), _with_interval(s, "top1"),
            _with_interval(s, "delta_ppl_rel", _signed_percent),
            " / ".join(units.number(s.get(k)) for k in ("p99_kl", "p999_kl", "max_kl")),
            f"{units.number(s.get('reference_ppl'))} → {units.number(s.get('candidate_ppl'))}",
            (f"{_with_interval(s, 'kl_rise', _signed_percent)} over {units.number(s.get('accepted_mean_kl'))}"
             if "kl_rise" in s else units.DASH),
            result.accepted, record.decided_by, list(record.problems), list(record.undecided), list(result.notes),
            units.number(result.seconds)))
    return out

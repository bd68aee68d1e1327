"""The figures of a corpus comparison and their decision: a candidate precision against the reference precision
teacher-forced over a text corpus, as llama.cpp's `llama-perplexity --kl-divergence` reports them (mean
KL(reference || candidate) of the next-token distributions, the share of tokens whose top-1 token agrees, the
relative change in perplexity, KL p99 and p99.9), each with a 95% interval where one is meaningful.

Tokens within a chunk share their context, so their figures are correlated: a bootstrap over tokens would treat
10,000 tokens as 10,000 independent draws and give an interval several times too narrow. The interval resamples
whole chunks (a block bootstrap), each chunk carrying the sums over its tokens, so a mean is a ratio of sums and
a chunk weighs by its tokens. Percentiles over tokens have no interval here; the point decides them.

Pure: the scoring that fills these (quality.corpus_scoring) runs the models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_infergate.quality.metrics import TokenStats
from pytest_infergate.quality.policy import CORPUS_KEYS, ResolvedPolicy
from pytest_infergate.quality.thresholds import ThresholdCheck
from pytest_infergate.stats import paired_bootstrap_ci, percentile
from pytest_infergate.status import Decision, Status

CHUNK_TOKENS = 512  # llama-perplexity's default context: each chunk is scored as one forward
RESAMPLES = 2000
MORE_CHUNKS = "a longer corpus (`check_corpus(corpus=PATH)`, more text)"
RISE_KEY = "max_corpus_kl_rise"


@dataclass(frozen=True)
class ChunkFigures:
    """One chunk's teacher-forced figures, summed over its scored tokens (every token but its first, which has
    nothing before it to be predicted from): what the block bootstrap resamples."""

    source: str  # the text it was cut from
    tokens: int
    kl: float  # sum of KL(reference || candidate), nats
    top1: int  # tokens whose top-1 token is the same under both
    reference_nll: float  # sum of -log p_reference(actual next token)
    candidate_nll: float

    @classmethod
    def of(cls, source: str, stats: TokenStats) -> ChunkFigures:
        return cls(source, len(stats.kl), math.fsum(stats.kl), sum(map(bool, stats.top1_agree)),
                   math.fsum(stats.ref_nll), math.fsum(stats.cand_nll))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ChunkFigures:
        return cls(str(data["source"]), int(data["tokens"]), float(data["kl"]), int(data["top1"]),
                   float(data["reference_nll"]), float(data["candidate_nll"]))


def mean_kl(chunks: Sequence[ChunkFigures]) -> float:
    return sum(c.kl for c in chunks) / sum(c.tokens for c in chunks)


def top1_share(chunks: Sequence[ChunkFigures]) -> float:
    return sum(c.top1 for c in chunks) / sum(c.tokens for c in chunks)


def delta_ppl_rel(chunks: Sequence[ChunkFigures]) -> float:
    """exp(mean candidate NLL - mean reference NLL) - 1: the candidate's perplexity relative to the reference's."""
    return math.exp(sum(c.candidate_nll - c.reference_nll for c in chunks) / sum(c.tokens for c in chunks)) - 1.0


def corpus_summary(chunks: list[ChunkFigures], token_kl: Sequence[float]) -> dict[str, Any]:
    """Mean KL, top-1 share and relative Δ perplexity with their 95% intervals over the chunks (block bootstrap),
    both perplexities, and KL p99 / p99.9 / max over every token (points)."""
    tokens = sum(c.tokens for c in chunks)
    out: dict[str, Any] = {"chunks": len(chunks), "tokens": tokens}
    if not tokens:
        return out
    for name, statistic in (("mean_kl", mean_kl), ("top1", top1_share), ("delta_ppl_rel", delta_ppl_rel)):
        point, low, high = paired_bootstrap_ci(chunks, statistic, resamples=RESAMPLES)
        out[name], out[name + "_ci"] = point, [low, high]
    out["reference_ppl"] = math.exp(sum(c.reference_nll for c in chunks) / tokens)
    out["candidate_ppl"] = math.exp(sum(c.candidate_nll for c in chunks) / tokens)
    out["p99_kl"] = percentile(token_kl, 99)
    out["p999_kl"] = percentile(token_kl, 99.9)
    out["max_kl"] = max(token_kl)
    return out


def kl_rise(accepted: list[ChunkFigures], current: list[ChunkFigures]) -> tuple[float, float, float] | None:
    """(point, low, high) of how much the mean KL rose against the accepted run's, relative to it (0.5: half as
    much again), over the same chunks paired (same tokens: what changed is the candidate or its libraries, not
    the text), resampled in pairs. None where the accepted KL is 0 (no rise is relative to nothing)."""
    pairs = list(zip(accepted, current))

    def rise(sample: Sequence[tuple[ChunkFigures, ChunkFigures]]) -> float:
        before = sum(a.kl for a, _ in sample)
        return sum(c.kl for _, c in sample) / before - 1.0 if before > 0 else math.inf

    if not pairs or sum(a.kl for a, _ in pairs) <= 0:
        return None
    return paired_bootstrap_ci(pairs, rise, resamples=RESAMPLES)


@dataclass
class CorpusResult:
    """A candidate against the reference precision over a corpus: its chunks' figures and their summary."""

    precision: str
    reference_precision: str
    corpus: str  # what was scored: "built-in: constitution.txt, alice.txt", or the project's path
    digest: str  # of the chunks' token ids: accepted figures compare chunk by chunk only over the same tokens
    chunk_tokens: int
    chunks: list[ChunkFigures]
    summary: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)  # how to read the figures; never fail the gate
    accepted: str = ""  # the accepted figures compared with: file, machine and date; or why none

    def to_dict(self) -> dict:
        return {"precision": self.precision, "reference_precision": self.reference_precision, "corpus": self.corpus,
                "digest": self.digest, "chunk_tokens": self.chunk_tokens, "summary": self.summary,
                "seconds": self.seconds, "notes": self.notes, "accepted": self.accepted,
                "chunks": [c.to_dict() for c in self.chunks]}

    @classmethod
    def from_dict(cls, data: dict) -> CorpusResult:
        return cls(data["precision"], data["reference_precision"], str(data.get("corpus", "")),
                   str(data.get("digest", "")), int(data.get("chunk_tokens", CHUNK_TOKENS)),
                   [ChunkFigures.from_dict(c) for c in data.get("chunks", [])], dict(data.get("summary", {})),
                   float(data.get("seconds", 0.0)), list(data.get("notes", [])), str(data.get("accepted", "")))

    def with_accepted(self, chunks: list[ChunkFigures] | None, accepted: str) -> CorpusResult:
        """This result compared with accepted chunk figures (None: none to compare with; `accepted` says why):
        the summary gains `accepted_mean_kl` and `kl_rise` with its interval."""
        summary = dict(self.summary)
        if chunks is not None:
            summary["accepted_mean_kl"] = mean_kl(chunks)
            rise = kl_rise(chunks, self.chunks)
            if rise is not None:
                summary["kl_rise"], summary["kl_rise_ci"] = rise[0], [rise[1], rise[2]]
            else:
                accepted += ": its mean KL is 0 (a precision identical to the reference), so no rise is relative to it"
        return CorpusResult(self.precision, self.reference_precision, self.corpus, self.digest, self.chunk_tokens,
                            self.chunks, summary, self.seconds, list(self.notes), accepted)

    def line(self) -> str:
        """The figures in one line, as the terminal and the failure message say them."""
        s = self.summary
        text = (f"{s.get('tokens', 0):,} tokens in {s.get('chunks', 0)} chunks: mean KL {_ci(s, 'mean_kl')}, "
                f"top-1 {_ci(s, 'top1')}, Δppl {_ci(s, 'delta_ppl_rel', percent=True)}")
        if "p99_kl" in s:
            text += f", KL p99 {s['p99_kl']:.3g}, p99.9 {s['p999_kl']:.3g}"
        if "kl_rise" in s:
            text += f"; mean KL vs accepted {s['accepted_mean_kl']:.4g}: {_ci(s, 'kl_rise', percent=True)}"
        return text


def _ci(summary: dict, key: str, percent: bool = False) -> str:
    value, ci = summary.get(key), summary.get(key + "_ci")
    if not isinstance(value, (int, float)):
        return "–"

    def shown(x: float) -> str:
        return f"{x:+.1%}" if percent else f"{x:.4g}"

    return shown(value) + (f" ({shown(ci[0])} to {shown(ci[1])})" if ci else "")


def decide_corpus(result: CorpusResult, policy: ResolvedPolicy) -> Decision:
    """The corpus comparison under `policy`'s corpus keys, each on its interval over the chunks (FAIL beyond,
    PASS within, INCONCLUSIVE straddling, saying about how many chunks would decide). A rise over the accepted
    figures that could not be measured (none accepted, or accepted over other tokens) is undecided where the
    test asked for it and a note where the default would have; percentiles are decided on the point (a note)."""
    checks = [ThresholdCheck.of(result.summary, key, *CORPUS_KEYS[key], threshold.value, threshold.named(),
                                unit="chunk", more=MORE_CHUNKS)
              for key, threshold in policy.thresholds.items() if key in CORPUS_KEYS]
    problems = [check.describe() for check in checks if check.status == Status.FAIL]
    undecided = [check.describe() for check in checks if check.measured and check.status == Status.INCONCLUSIVE]
    unmeasured = [f"{check.describe()}: {result.accepted or 'nothing to compare with'}" for check in checks
                  if not check.measured]
    on_point = [check.describe() for check in checks if check.status == Status.PASS and check.low is None]
    if policy.default:
        return Decision(problems, undecided, notes=on_point + unmeasured)
    return Decision(problems, undecided + unmeasured, notes=on_point)

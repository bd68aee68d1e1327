"""Two deployments side by side: the candidate server (--infergate-endpoint) against the reference server
(--infergate-reference-endpoint), e.g. an FP8/AWQ/GPTQ build against fp16. Quality compares their greedy answers on
the golden samples with no local model and no tokenizer, so a deployment too big for the CI machine is gated from a
CPU-only runner. Tokens are the servers' own pieces (in words where either returned none); KL and top-1 are
computed up to and including the first position where the answers differ. KL(candidate top-k || reference top-k)
puts the mass beyond each top-k into one bucket, and a candidate token missing from the reference's top-k gets the
smaller of the reference's lowest listed probability and its unlisted mass, so the KL is a lower bound. Guide:
docs/guides/endpoint.md, 'Two deployments side by side'.
"""

from __future__ import annotations

import math
import re
import time

from pytest_infergate.endpoint.exchange import EndpointConfig, EndpointResult
from pytest_infergate.errors import InfergateError
from pytest_infergate.gates.golden import GoldenGate
from pytest_infergate.gates.golden_candidates import ask_greedy
from pytest_infergate.quality.golden_files import GoldenSample
from pytest_infergate.quality.metrics import QualityResult, TokenStats, aggregate, by_category, compare_sample

REFERENCE_ENDPOINT = "reference-endpoint"  # the reference_precision of a two-server comparison
_WORDS = re.compile(r"\s*\S+|\s+")


class Pieces:
    """Token strings <-> small integer ids, shared by both servers' answers of one comparison."""

    def __init__(self):
        self.ids: dict[str, int] = {}
        self.strings: list[str] = []

    def encode(self, pieces: list[str]) -> list[int]:
        out = []
        for piece in pieces:
            if piece not in self.ids:
                self.ids[piece] = len(self.strings)
                self.strings.append(piece)
            out.append(self.ids[piece])
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.strings[i] for i in ids)


def _pieces(result: EndpointResult, by_words: bool) -> list[str]:
    return _WORDS.findall(result.text) if by_words else [entry["token"] for entry in result.logprobs]


def topk_pair_kl(candidate: dict[str, float], reference: dict[str, float]) -> float:
    """KL(candidate || reference) from two top-k logprob lists (see the module docstring)."""
    if not candidate or not reference:
        return 0.0
    listed = {t: math.exp(lp) for t, lp in reference.items()}
    unlisted = max(0.0, 1.0 - sum(listed.values()))
    floor = min(min(listed.values()), unlisted) if unlisted > 0 else min(listed.values())
    kl, p_sum, q_sum = 0.0, 0.0, 0.0
    for token, logprob in candidate.items():
        p = math.exp(logprob)
        q = max(listed.get(token, floor), 1e-12)
        kl += p * (math.log(max(p, 1e-12)) - math.log(q))
        p_sum, q_sum = p_sum + p, q_sum + q
    p_tail, q_tail = max(1.0 - p_sum, 1e-12), max(1.0 - q_sum, 1e-12)
    return max(0.0, kl + p_tail * (math.log(p_tail) - math.log(q_tail)))


def pair_stats(reference: EndpointResult, candidate: EndpointResult) -> TokenStats | None:
    """KL, top-1 agreement and both servers' NLL of the candidate's tokens at the positions with equal context."""
    if not reference.logprobs or not candidate.logprobs:
        return None
    stats = TokenStats()
    for ref, cand in zip(reference.logprobs, candidate.logprobs):
        ref_top = ref["top"] or {ref["token"]: ref["logprob"]}
        cand_top = cand["top"] or {cand["token"]: cand["logprob"]}
        stats.kl.append(topk_pair_kl(cand_top, ref_top))
        stats.top1_agree.append(max(cand_top, key=cand_top.get) == max(ref_top, key=ref_top.get))
        chosen = cand["token"]
        ref_lp = ref_top.get(chosen, min(ref_top.values()))
        stats.ref_nll.append(-ref_lp if math.isfinite(ref_lp) else 0.0)
        stats.cand_nll.append(-cand["logprob"] if cand["logprob"] is not None and math.isfinite(cand["logprob"])
                              else 0.0)
        if ref["token"] != cand["token"]:  # the contexts differ from here on
            break
    return stats


def compare_servers(samples: list[GoldenSample], reference: list[EndpointResult], candidate: list[EndpointResult],
                    notes: list[str], started: float | None = None) -> QualityResult:
    """The candidate server's greedy answers against the reference server's (the metrics of
    quality.scoring, with the servers' own tokens)."""
    started = time.perf_counter() if started is None else started
    pieces = Pieces()
    per_sample, token_kl, by_words = [], [], 0
    for sample, ref, cand in zip(samples, reference, candidate):
        words = not (ref.logprobs and cand.logprobs)
        by_words += words
        ref_ids, cand_ids = pieces.encode(_pieces(ref, words)), pieces.encode(_pieces(cand, words))
        stats = None if words else pair_stats(ref, cand)
        if stats is not None:
            token_kl += stats.kl
        per_sample.append(compare_sample(sample, ref_ids, ref.text, cand_ids, cand.text, stats,
                                         decode=pieces.decode))
    result = QualityResult("endpoint", REFERENCE_ENDPOINT, per_sample, aggregate(per_sample, token_kl),
                           by_category(per_sample), time.perf_counter() - started)
    if by_words:
        notes = notes + [f"{by_words} of {len(samples)} samples compared in words: a server returned no logprobs"]
    if token_kl:
        notes = notes + ["KL is KL(candidate top-k || reference top-k) at the positions where both servers saw the "
                         "same context (up to the first differing token); top-1 is agreement of their top tokens"]
    result.notes = notes
    return result


class ServerPairCandidate:
    """The quality side of a two-server gate: both servers' greedy answers are asked once per session (cached in
    `answers`) and compared; nothing local is loaded."""

    precision = "endpoint"

    def __init__(self, candidate: EndpointConfig, reference: EndpointConfig, answers: dict):
        self.candidate, self.reference = candidate, reference
        self.answers = answers  # the session's cache

    def compare(self, samples: list[GoldenSample]) -> QualityResult:
        key = ("server-pair", tuple(s.id for s in samples))
        if key not in self.answers:
            started = time.perf_counter()
            ref, ref_notes = ask_greedy(self.reference, samples)
            cand, cand_notes = ask_greedy(self.candidate, samples)
            result = compare_servers(samples, ref, cand, ref_notes + cand_notes, started)
            result.notes.insert(0, f"candidate {self.candidate.model} at {self.candidate.base_url} against reference "
                                   f"{self.reference.model} at {self.reference.base_url}")
            self.answers[key] = result
        return self.answers[key]


class ServerPairGate(GoldenGate):
    """`infergate_golden` with two servers: `check()` compares the candidate server with the reference server
    (ServerPairCandidate) instead of with a local reference precision, so no local model is loaded;
    `check_regression()` is the endpoint's own (GoldenGate's)."""

    def __init__(self, pair: ServerPairCandidate, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pair = pair

    def check(self, limit: int | None = None, categories=None, policy: dict | None = None) -> QualityResult:
        """The candidate server vs the reference server on the golden samples, decided by the policy of scope
        `endpoint` (marker `infergate_quality`, ini `infergate_quality_policy`, or `policy`)."""
        samples = self.samples(limit, categories)
        key = (self.precision, tuple(s.id for s in samples))
        if key not in self.comparisons:  # GoldenGate.check finds it there and loads no reference model
            try:
                self.comparisons[key] = self.pair.compare(samples)
            except InfergateError as exc:
                self.ctx.fail(str(exc))
        return super().check(limit, categories, policy)

"""Golden samples through an endpoint (greedy, temperature 0) and their quality against the local reference
precision. The server's text is re-tokenized with the local tokenizer, so token-level metrics (exact match, first
divergence) line up with the reference engine's. Where the server returns top logprobs, KL and top-1 agreement are
computed too: along the endpoint's own continuation, where the contexts of both models are the same tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pytest_infergate.endpoint.client import EndpointConfig, EndpointRequest, EndpointResult
from pytest_infergate.endpoint.load import LoadPattern, run_load
from pytest_infergate.engine.request import Request, render_prompt
from pytest_infergate.golden import GoldenSample
from pytest_infergate.quality import TokenStats

TOP_LOGPROBS = 5
GOLDEN_CONCURRENCY = 4


class EndpointGenerationError(Exception):
    """Golden samples that the endpoint did not answer; the message lists them with the error kinds."""


@dataclass
class EndpointGenerated:
    id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[dict] = field(default_factory=list)


def generate(config: EndpointConfig, tokenizer, samples: list[GoldenSample],
             top_logprobs: int = TOP_LOGPROBS) -> tuple[list[EndpointGenerated], list[str]]:
    """Greedy answers of the endpoint to every sample. Returns the outputs and notes (e.g. no logprobs)."""
    notes = []
    requests = [EndpointRequest(messages=[dict(m) for m in s.messages] if s.messages is not None else None,
                                prompt=s.prompt if s.messages is None else None, max_tokens=s.max_new_tokens,
                                temperature=0.0, seed=0, logprobs=top_logprobs, request_id=s.id) for s in samples]
    if config.api == "chat" and any(r.prompt is not None for r in requests):
        requests = [replace(r, messages=[{"role": "user", "content": r.prompt}], prompt=None) if r.prompt else r
                    for r in requests]
    # a few in flight: a request's timeout also runs while it waits in the server's queue
    pattern = LoadPattern(concurrency=min(config.max_concurrency, GOLDEN_CONCURRENCY))
    results = run_load(config, requests, pattern, stream=False).results
    if top_logprobs and any(r.error and r.error.startswith("http_4") for r in results):
        # some servers refuse logprobs; the text metrics still hold without them
        results = run_load(config, [replace(r, logprobs=0) for r in requests], pattern, stream=False).results
        notes.append("the endpoint refused logprobs: KL and top-1 were not computed")
    failed = [r for r in results if not r.ok]
    if failed:
        raise EndpointGenerationError(f"{len(failed)} of {len(results)} golden samples got no answer from "
                                      f"{config.base_url}: " + "; ".join(f"{r.request_id}: {r.error} {r.error_detail}"
                                                                         for r in failed[:5]))
    if top_logprobs and not notes and not any(r.logprobs for r in results):
        notes.append("the endpoint returned no logprobs: KL and top-1 were not computed")
    return [_generated(tokenizer, s, r) for s, r in zip(samples, results)], notes


def _generated(tokenizer, sample: GoldenSample, result: EndpointResult) -> EndpointGenerated:
    token_ids = tokenizer(result.text, add_special_tokens=False)["input_ids"] if result.text else []
    prompt_ids = render_prompt(tokenizer, Request(**sample.request_kwargs()))
    return EndpointGenerated(sample.id, prompt_ids, token_ids, result.text, result.logprobs)


class PieceIndex:
    """Token text (as servers report it in logprobs) -> local token id."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._ids: dict[str, int] = {}
        for token_id in range(len(tokenizer)):
            self._ids.setdefault(tokenizer.decode([token_id]), token_id)

    def piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def id(self, piece: str) -> int | None:
        return self._ids.get(piece)


def aligned_positions(generated: EndpointGenerated, pieces: PieceIndex) -> int:
    """How many leading tokens of the re-tokenized output match the server's own tokens (same context)."""
    count = 0
    for token_id, entry in zip(generated.token_ids, generated.logprobs):
        if pieces.piece(token_id) != entry["token"]:
            break
        count += 1
    return count


def endpoint_stats(reference_model, generated: list[EndpointGenerated], pieces: PieceIndex) -> list[TokenStats | None]:
    """Per sample: KL(endpoint top-k || reference) and top-1 agreement at every aligned position of the endpoint's
    continuation, and the NLL of the chosen tokens under both. None where the server gave no logprobs."""
    from pytest_infergate.golden_check import _continuation_logprobs, topk_kl

    out: list[TokenStats | None] = []
    for g in generated:
        aligned = aligned_positions(g, pieces)
        if not aligned:
            out.append(None)
            continue
        ref = _continuation_logprobs(reference_model, [(g.prompt_ids, g.token_ids[:aligned])])[0]
        stored = []
        for entry in g.logprobs[:aligned]:
            top = [[pieces.id(p), lp] for p, lp in sorted(entry["top"].items(), key=lambda kv: -kv[1])]
            stored.append([[t, lp] for t, lp in top if t is not None] or [[pieces.id(entry["token"]), entry["logprob"]]])
        stats = TokenStats()
        stats.kl = topk_kl(stored, ref)
        stats.top1_agree = [row[0][0] == int(r.argmax()) for row, r in zip(stored, ref)]
        stats.ref_nll = [-float(r[t]) for r, t in zip(ref, g.token_ids[:aligned])]
        stats.cand_nll = [-e["logprob"] if e["logprob"] is not None and math.isfinite(e["logprob"]) else 0.0
                          for e in g.logprobs[:aligned]]
        out.append(stats)
    return out


def compare_with_reference(reference, samples: list[GoldenSample], reference_outputs: list,
                           endpoint_outputs: list[EndpointGenerated], notes: list[str]):
    """The endpoint's greedy outputs against the local reference precision's, as a QualityResult."""
    import time

    from pytest_infergate.golden_check import QualityResult
    from pytest_infergate.quality import aggregate, by_category, compare_sample

    start = time.perf_counter()
    stats = endpoint_stats(reference.model, endpoint_outputs, PieceIndex(reference.tokenizer)) \
        if any(g.logprobs for g in endpoint_outputs) else [None] * len(endpoint_outputs)
    decode = reference.tokenizer.decode
    per_sample = [compare_sample(s, r.token_ids, r.text, c.token_ids, c.text, st,
                                 decode=lambda ids: decode(ids, skip_special_tokens=True))
                  for s, r, c, st in zip(samples, reference_outputs, endpoint_outputs, stats)]
    token_kl = [kl for st in stats if st is not None for kl in st.kl]
    result = QualityResult("endpoint", reference.record.precision, per_sample, aggregate(per_sample, token_kl),
                           by_category(per_sample), time.perf_counter() - start)
    if token_kl:
        notes = notes + ["KL is KL(endpoint top-k || reference) along the endpoint's own continuation; top-1 is "
                         "agreement of the endpoint's top token with the reference's argmax there"]
    result.notes = notes
    return result

"""What a golden gate compares with the reference precision (gates.golden.Candidate): a local precision
(LocalCandidate: its golden outputs generated once per session in the fixed composition, its accepted outputs' path
and provenance, its batch invariance) or a served model (EndpointCandidate: golden samples asked greedily at
temperature 0, the server's text re-tokenized with the local tokenizer so token-level metrics line up with the
reference engine's; where the server returns top logprobs, KL and top-1 agreement along its own continuation)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_infergate.endpoint.client import EndpointConfig, EndpointRequest, EndpointResult
from pytest_infergate.endpoint.load_run import LoadPattern
from pytest_infergate.endpoint.loadgen import run_load
from pytest_infergate.errors import InfergateError
from pytest_infergate.quality.golden_files import GoldenSample, endpoint_outputs_path, outputs_path
from pytest_infergate.quality.metrics import TokenStats
from pytest_infergate.quality.regression import compare_with_golden, outputs_to_accept
from pytest_infergate.quality.scoring import QualityResult, ScoreCache, compare_with_reference
from pytest_infergate.workloads.request import Request, render_prompt
from pytest_infergate.workloads.transcript import answer_end, next_turn_markers, plain_text

TOP_LOGPROBS = 5
GOLDEN_CONCURRENCY = 4


class EndpointGenerationError(InfergateError):
    """Golden samples that the endpoint did not answer; the message lists them with the error kinds."""


@dataclass
class EndpointGenerated:
    id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[dict] = field(default_factory=list)


def ask_greedy(config: EndpointConfig, samples: list[GoldenSample], top_logprobs: int = TOP_LOGPROBS,
               ) -> tuple[list[EndpointResult], list[str]]:
    """The endpoint's greedy answers to every sample (with top logprobs where it serves them), and notes (e.g.
    no logprobs). Raises EndpointGenerationError naming the samples that got no answer."""
    notes = []
    requests = [EndpointRequest(messages=[dict(m) for m in s.messages] if s.messages is not None else None,
                                prompt=s.prompt if s.messages is None else None, max_tokens=s.max_new_tokens,
                                temperature=0.0, seed=0, logprobs=top_logprobs, request_id=s.id) for s in samples]
    if config.api == "chat" and any(r.prompt is not None for r in requests):
        requests = [replace(r, messages=[{"role": "user", "content": r.prompt}], prompt=None) if r.prompt else r
                    for r in requests]
    if config.api == "completions":  # a base model's server: chat samples as the engine sends a base model them,
        # its answer ending where it opens the transcript's next turn
        requests = [replace(r, prompt=plain_text(r.messages), messages=None, stop=next_turn_markers(r.messages))
                    if r.messages is not None else r for r in requests]
    # a few in flight: a request's timeout also runs while it waits in the server's queue
    pattern = LoadPattern(concurrency=min(config.max_concurrency, GOLDEN_CONCURRENCY))
    results = run_load(config, requests, pattern, stream=False, scrape=False).results
    if top_logprobs and any(r.error and r.error.startswith("http_4") for r in results):
        # some servers refuse logprobs; the text metrics still hold without them
        results = run_load(config, [replace(r, logprobs=0) for r in requests], pattern, stream=False,
                           scrape=False).results
        notes.append(f"{config.base_url} refused logprobs: KL and top-1 were not computed")
    stops = {r.request_id: r.stop for r in requests}
    results = [until_next_turn(result, stops.get(result.request_id, ())) for result in results]
    failed = [r for r in results if not r.ok]
    if failed:
        raise EndpointGenerationError(f"{len(failed)} of {len(results)} golden samples got no answer from "
                                      f"{config.base_url}: " + "; ".join(f"{r.request_id}: {r.error} {r.error_detail}"
                                                                         for r in failed[:5]))
    if top_logprobs and not notes and not any(r.logprobs for r in results):
        notes.append(f"{config.base_url} returned no logprobs: KL and top-1 were not computed")
    return results, notes


def until_next_turn(result: EndpointResult, markers) -> EndpointResult:
    """A base model's answer cut before the first next-turn marker, text and logprobs (a server that honours `stop`
    left none; one that does not ran on into the next turn)."""
    end = answer_end(result.text, markers) if markers else None
    if end is None:
        return result
    kept, length = [], 0
    for entry in result.logprobs:  # the tokens whose text ends before the marker
        length += len(entry.get("token") or "")
        if length > end:
            break
        kept.append(entry)
    return replace(result, text=result.text[:end], logprobs=kept)


def request_golden_answers(config: EndpointConfig, tokenizer, samples: list[GoldenSample],
                           top_logprobs: int = TOP_LOGPROBS) -> tuple[list[EndpointGenerated], list[str]]:
    """Greedy answers of the endpoint to every sample, re-tokenized with the local tokenizer."""
    results, notes = ask_greedy(config, samples, top_logprobs)
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
    # imported here, where a model runs: the endpoint-only install (no torch) imports this module
    from pytest_infergate.quality.scoring import continuation_logprobs, topk_kl

    out: list[TokenStats | None] = []
    for g in generated:
        aligned = aligned_positions(g, pieces)
        if not aligned:
            out.append(None)
            continue
        ref = continuation_logprobs(reference_model, [(g.prompt_ids, g.token_ids[:aligned])])[0]
        stored = []
        for entry in g.logprobs[:aligned]:
            top = [[pieces.id(p), lp] for p, lp in sorted(entry["top"].items(), key=lambda kv: -kv[1])]
            known = [[t, lp] for t, lp in top if t is not None]
            stored.append(known or [[pieces.id(entry["token"]), entry["logprob"]]])
        stats = TokenStats()
        stats.kl = topk_kl(stored, ref)
        stats.top1_agree = [row[0][0] == int(r.argmax()) for row, r in zip(stored, ref)]
        stats.ref_nll = [-float(r[t]) for r, t in zip(ref, g.token_ids[:aligned])]
        stats.cand_nll = [-e["logprob"] if e["logprob"] is not None and math.isfinite(e["logprob"]) else 0.0
                          for e in g.logprobs[:aligned]]
        out.append(stats)
    return out


def compare_endpoint(reference, samples: list[GoldenSample], reference_outputs: list,
                     endpoint_outputs: list[EndpointGenerated], notes: list[str]) -> QualityResult:
    """The endpoint's greedy outputs against the local reference precision's (the one comparison of
    quality.scoring), with KL and top-1 along the endpoint's own continuation where it returned logprobs."""
    started = time.perf_counter()
    stats = endpoint_stats(reference.model, endpoint_outputs, PieceIndex(reference.tokenizer)) \
        if any(g.logprobs for g in endpoint_outputs) else [None] * len(endpoint_outputs)
    result = compare_with_reference(reference, samples, reference_outputs, endpoint_outputs, stats, "endpoint",
                                    started)
    if any(st is not None and st.kl for st in stats):
        notes = notes + ["KL is KL(endpoint top-k || reference) along the endpoint's own continuation; top-1 is "
                         "agreement of the endpoint's top token with the reference's argmax there"]
    result.notes = [*notes, *result.notes]
    return result


class EndpointCandidate:
    """The server as the candidate of a golden gate (see gates.golden.Candidate): its greedy answers, asked
    once per session, compared with the local reference precision; its accepted outputs are keyed by the name
    it serves and store tokens and text only (an endpoint's logits are not a local model's)."""

    precision = "endpoint"

    def __init__(self, bench, tokenizer_source, answers: dict):
        self.bench = bench  # EndpointBench
        self._tokenizer_source = tokenizer_source  # the local tokenizer, loaded on demand
        self.answers = answers  # the session's cache: sample ids -> (outputs, notes), or the error

    def _answers(self, samples: list[GoldenSample]) -> tuple[list[EndpointGenerated], list[str]]:
        key = tuple(s.id for s in samples)
        if key not in self.answers:
            try:
                self.answers[key] = request_golden_answers(self.bench.config, self._tokenizer_source(), samples)
            except EndpointGenerationError as exc:
                self.answers[key] = exc
        if isinstance(self.answers[key], EndpointGenerationError):  # failed once: every golden test says so
            raise self.answers[key]
        return self.answers[key]

    def outputs(self, samples: list[GoldenSample]) -> list[EndpointGenerated]:
        return self._answers(samples)[0]

    def compare(self, reference, samples, reference_outputs) -> QualityResult:
        outputs, notes = self._answers(samples)
        return compare_endpoint(reference, samples, reference_outputs, outputs, notes)

    def accepted(self, golden_dir, model_name: str):
        path = endpoint_outputs_path(golden_dir, model_name, self.bench.model)
        return path, {"model": model_name, "endpoint": self.bench.config.base_url,
                      "served_model": self.bench.model, "precision": self.precision}

    def regression(self, samples, current, accepted):
        return compare_with_golden(self._tokenizer_source(), samples, current, accepted, self.precision)

    def to_accept(self, samples, current):
        return outputs_to_accept(samples, current)


@dataclass
class LocalCandidate:
    """A local precision: outputs generated once per session per sample set in the fixed composition
    (`generated` is the session's shared cache, so the reference's outputs are computed once for every precision
    compared with it)."""

    loaded: object
    device: str
    generated: dict
    max_model_len: int = 2048  # of the engine that generates golden outputs
    reference_scores: ScoreCache | None = None  # the session's: the reference's log-probabilities, scored once

    @property
    def precision(self) -> str:
        return self.loaded.record.requested_precision

    @property
    def backend(self):
        """The BackendChoice its golden outputs are generated on (the engine, or HF generate and why)."""
        from pytest_infergate.engine.backends import choice_for

        return choice_for(self.loaded)

    def outputs(self, samples: list[GoldenSample]) -> list:
        from pytest_infergate.quality.golden_generation import fixed_outputs

        return fixed_outputs(self.loaded, samples, self.generated, self.max_model_len)

    def compare(self, reference, samples, reference_outputs) -> QualityResult:
        from pytest_infergate.quality.scoring import compare_precision

        return compare_precision(reference, self.loaded, samples, reference_outputs, self.outputs(samples),
                                 self.reference_scores)

    def accepted(self, golden_dir: Path, model_name: str) -> tuple[Path, dict]:
        record = self.loaded.record
        path = outputs_path(golden_dir, model_name, record.fingerprint, self.device, self.precision)
        return path, {"model": model_name, "fingerprint": record.fingerprint, "device": self.device,
                      "precision": self.precision, "versions": record.versions}

    def provenance(self, samples: list[GoldenSample]) -> dict:
        """What this precision's golden outputs depend on now: environment, method, sample-set compositions."""
        from pytest_infergate.quality.golden_generation import composition_id, fixed_runs, golden_method, sample_sets_of
        from pytest_infergate.quality.golden_machines import golden_environment

        runs = fixed_runs(self.loaded, samples, self.generated, self.max_model_len)
        compositions = {Path(source).name or "(in code)": composition_id(whole)
                        for source, whole in sample_sets_of(samples).items()}
        return {"environment": golden_environment(self.loaded, runs[0].threads if runs else None),
                "method": golden_method(self.backend.name, self.loaded.record.plain_text_prompts),
                "compositions": compositions}

    def regression(self, samples, current, accepted):
        from pytest_infergate.quality.regression import compare_with_golden

        return compare_with_golden(self.loaded.tokenizer, samples, current, accepted, self.precision,
                                   self.loaded.model)

    def to_accept(self, samples, current):
        from pytest_infergate.quality.regression import outputs_to_accept

        return outputs_to_accept(samples, current, self.loaded.model)

    def corpus(self, reference, name: str, chunks: list, chunk_tokens: int):
        """This precision against `reference` teacher-forced over a corpus's chunks (quality.corpus_scoring)."""
        from pytest_infergate.quality.corpus_scoring import score_corpus

        return score_corpus(reference, self.loaded, name, chunks, chunk_tokens)

    def batch_invariance(self, samples, max_new_tokens: int | None = None):
        from pytest_infergate.quality.golden_generation import check_variants, fixed_outputs

        fixed = fixed_outputs(self.loaded, samples, self.generated, self.max_model_len)
        return check_variants(self.loaded, samples, fixed, self.max_model_len, max_new_tokens=max_new_tokens)

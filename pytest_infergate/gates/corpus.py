"""`infergate_golden.check_corpus()`: the candidate precision against the reference precision teacher-forced over a
text corpus (quality.corpus_scoring), decided under the quality policy's corpus keys on intervals over the chunks
(quality.corpus_figures), and compared with the corpus figures accepted for the precision (quality.corpus_accepted).
No pytest here: the test is reached through the gate's TestContext."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_infergate.environment import cpu_model
from pytest_infergate.errors import InfergateError
from pytest_infergate.quality.corpus_accepted import AcceptedCorpus, corpus_path, read_accepted, write_accepted
from pytest_infergate.quality.corpus_figures import ChunkFigures, CorpusResult, decide_corpus
from pytest_infergate.quality.policy import CORPUS_KEYS, default_failure_advice
from pytest_infergate.results.records import CorpusRecord
from pytest_infergate.status import QUALITY_CHECK, Finding, Status

if TYPE_CHECKING:
    from pathlib import Path

CORPUS = "corpus"  # the first part of a corpus comparison's key in the session's comparisons


def check_corpus(gate, policy: dict | None, corpus, chunk_tokens: int) -> CorpusResult:
    """See GoldenGate.check_corpus; `gate` is that GoldenGate (gates.golden imports this module, not the other way
    round: its context, candidate, reference, policy and the session's comparisons are what is read here)."""
    from pytest_infergate.quality.corpus_scoring import chunks_digest, corpus_chunks, corpus_texts

    ctx = gate.ctx
    if not hasattr(gate.candidate, "corpus"):
        ctx.skip(f"the corpus check scores every token of a text under both models (prefill only): it needs a local "
                 f"model's logits; the {gate.precision} candidate is a server")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 2:
        ctx.fail(f"check_corpus(chunk_tokens={chunk_tokens!r}): give a whole number of tokens >= 2 (default 512)")
    reference = gate._reference()
    longest = getattr(reference.model.config, "max_position_embeddings", None)
    if isinstance(longest, int) and chunk_tokens > longest:
        ctx.fail(f"check_corpus(chunk_tokens={chunk_tokens}): the model reads at most {longest} positions; give "
                 "fewer tokens a chunk")
    try:
        name, texts = corpus_texts(corpus)
        chunks = corpus_chunks(reference.tokenizer, texts, chunk_tokens)
    except InfergateError as exc:
        ctx.fail(str(exc))
    key = (CORPUS, gate.precision, chunks_digest(chunks))
    if key not in gate.comparisons:  # once per precision and corpus a session, whichever test asks first
        gate.comparisons[key] = gate.candidate.corpus(reference, name, chunks, chunk_tokens)
    result = _against_accepted(gate, gate.comparisons[key])
    resolved = gate.policy(policy).for_corpus(gate.precision)
    decided_by = resolved.decided_by(tuple(CORPUS_KEYS))
    decision = decide_corpus(result, resolved)
    for note in decision.notes:  # a point decided without an interval; a rise not measured under the default
        ctx.say(Finding(QUALITY_CHECK, ctx.test_id, f"corpus, {result.precision} vs {result.reference_precision}: "
                        f"{note}", status=Status.PASS))
    result.notes = [*result.notes, *decision.notes]
    rules = {k: v for k, v in resolved.rules.items() if k in CORPUS_KEYS}
    ctx.record(CorpusRecord(ctx.test_id, decision.status, result, rules, decision.problems,
                            undecided=decision.undecided, decided_by=decided_by))
    if decision.problems:
        advice = default_failure_advice(result.precision, decided_by)
        ctx.fail(f"corpus quality of {result.precision} vs {result.reference_precision} breaks the policy "
                 f"({decided_by}):\n  " + "\n  ".join(decision.problems) + f"\n  {result.line()}"
                 + (f"\n{advice}" if advice else ""))
    return result


def _against_accepted(gate, result: CorpusResult) -> CorpusResult:
    """`result` with the accepted figures it is compared with; under --infergate-update-golden this run's figures
    become the accepted ones instead."""
    path = _accepted_path(gate)
    if gate.ctx.options.update_golden:
        machine = cpu_model() + ("" if gate.ctx.options.device == "cpu" else f", {gate.ctx.options.device}")
        try:
            write_accepted(path, AcceptedCorpus.of(result, machine))
        except OSError as exc:
            gate.ctx.fail(f"--infergate-update-golden could not write {path}: {exc}")
        return result.with_accepted(result.chunks, f"accepted now: {path}")  # a rise of 0 over itself
    if not path.exists():
        return result.with_accepted(None, f"no corpus figures accepted at {path}: accept them with "
                                          "--infergate-update-golden")
    try:
        accepted = read_accepted(path)
    except InfergateError as exc:
        gate.ctx.fail(str(exc))
    why_not = accepted.comparable(result)
    if why_not:
        return result.with_accepted(None, f"{path}: {why_not}")
    chunks: list[ChunkFigures] = accepted.chunks
    return result.with_accepted(chunks, f"{path} (accepted {accepted.accepted_at} on {accepted.machine})")


def _accepted_path(gate) -> Path:
    """Beside the precision's accepted golden outputs (the default file: the figures travel across machines)."""
    default, _ = gate.candidate.accepted(gate.golden_dir, gate._model_name())
    return corpus_path(default)

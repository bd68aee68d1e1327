"""A candidate precision against the reference precision over a text corpus, prefill only: each text tokenized
alone and cut into chunks of `chunk_tokens`, each chunk run as one forward under both models (alone, as golden
scoring is: a row's numbers in a batch depend on its neighbours), and per token the KL(reference || candidate) of
the next-token distributions, whether their top-1 tokens agree, and the log-likelihood of the actual next token
under each (quality.scoring's `token_stats`, the figures of `check()` on golden samples). Summed per chunk for the
block bootstrap (quality.corpus_figures).

The built-in corpus is package data (`corpus/*.txt`, their source and licence in `corpus/README.md`): about 10,100
tokens of the embedded model's tokenizer in 21 chunks of 512. Light to import: torch comes with `scoring` where a
model runs."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pytest_infergate.context import Steps
from pytest_infergate.errors import InfergateError
from pytest_infergate.quality.corpus_figures import CHUNK_TOKENS, ChunkFigures, CorpusResult, corpus_summary

CORPUS_DIR = Path(__file__).with_name("corpus")
MIN_CHUNK_TOKENS = 2  # a chunk's first token predicts the second: fewer predict nothing


def corpus_texts(path: Path | str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """(what the corpus is called, [(file name, text), ...]): the built-in corpus, or a project's `.txt` file or
    folder of them (every `*.txt` in it, by name)."""
    where = CORPUS_DIR if path is None else Path(path)
    if where.is_dir():
        files = sorted(where.glob("*.txt"))
    elif where.is_file():
        files = [where]
    else:
        raise InfergateError(f"check_corpus(corpus={str(path)!r}): no such file or folder; give a .txt file or a "
                             "folder of them, or leave it out for the built-in corpus")
    if not files:
        raise InfergateError(f"check_corpus(corpus={str(path)!r}): the folder holds no .txt file")
    try:
        texts = [(file.name, file.read_text(encoding="utf-8")) for file in files]
    except (OSError, UnicodeDecodeError) as exc:
        raise InfergateError(f"check_corpus(corpus={str(path)!r}): cannot read it as UTF-8 text: {exc}") from None
    names = ", ".join(name for name, _ in texts)
    return (f"built-in: {names}" if path is None else f"{where}: {names}" if where.is_dir() else str(where)), texts


def corpus_chunks(tokenizer, texts: list[tuple[str, str]], chunk_tokens: int = CHUNK_TOKENS
                  ) -> list[tuple[str, list[int]]]:
    """(file name, token ids) of each chunk: each text tokenized alone, without special tokens, and cut every
    `chunk_tokens`, so a chunk's context is one text; a last piece too short to predict anything is left out."""
    chunks = []
    for name, text in texts:
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        chunks += [(name, ids[start:start + chunk_tokens]) for start in range(0, len(ids), chunk_tokens)
                   if len(ids) - start >= MIN_CHUNK_TOKENS]
    return chunks


def chunks_digest(chunks: list[tuple[str, list[int]]]) -> str:
    """What identifies the scored tokens: accepted figures compare chunk by chunk only over the same ones."""
    return hashlib.sha256(json.dumps(chunks, separators=(",", ":")).encode()).hexdigest()[:16]


def score_corpus(reference, candidate, corpus: str, chunks: list[tuple[str, list[int]]],
                 chunk_tokens: int = CHUNK_TOKENS) -> CorpusResult:
    """`candidate` (a LoadedModel) against `reference` over `chunks` (corpus_chunks), one chunk per forward of
    each model; the reference's log-probabilities are not kept between chunks (about 100 MB a chunk of 512 for a
    49k-token vocabulary)."""
    from pytest_infergate.quality.scoring import continuation_logprobs, token_stats

    started = time.perf_counter()
    figures, token_kl = [], []
    steps = Steps(f"corpus check of {candidate.record.requested_precision} vs {reference.record.precision}", "chunk",
                  len(chunks))  # a minute or more on a CPU: a line on the terminal every few seconds
    for done, (source, ids) in enumerate(chunks, 1):
        rows = [(ids[:1], ids[1:])]
        ref = continuation_logprobs(reference.model, rows)[0]
        cand = ref if candidate.model is reference.model else continuation_logprobs(candidate.model, rows)[0]
        stats = token_stats(ref, cand, ids[1:])
        figures.append(ChunkFigures.of(source, stats))
        token_kl += stats.kl
        steps.step(done)
    return CorpusResult(candidate.record.requested_precision, reference.record.precision, corpus,
                        chunks_digest(chunks), chunk_tokens, figures, corpus_summary(figures, token_kl),
                        time.perf_counter() - started)

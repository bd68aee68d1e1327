"""Issue #55 point 4, the pure parts: the corpus figures on synthetic logits (KL, top-1, Δ perplexity, tails), their
intervals over chunks (a block bootstrap, which covers where a bootstrap over tokens does not), the rise over
accepted figures, the decision under the corpus keys, the accepted file, the record in every output, and the corpus
shipped as package data. Through pytest on tiny-random-llama: test_plugin_corpus.py."""

import json
import math
import random
from pathlib import Path

import pytest
import torch

from pytest_infergate.quality.corpus_accepted import AcceptedCorpus, corpus_path, read_accepted, write_accepted
from pytest_infergate.quality.corpus_figures import (
    MORE_CHUNKS,
    ChunkFigures,
    CorpusResult,
    corpus_summary,
    decide_corpus,
    delta_ppl_rel,
    kl_rise,
    mean_kl,
)
from pytest_infergate.quality.corpus_scoring import CORPUS_DIR, chunks_digest, corpus_chunks, corpus_texts
from pytest_infergate.quality.policy import QualityPolicyError, ResolvedPolicy, parse_policy
from pytest_infergate.quality.scoring import token_stats
from pytest_infergate.results import RunResults
from pytest_infergate.results.records import CorpusRecord, record_from_dict
from pytest_infergate.results.summary import summary_lines
from pytest_infergate.stats import paired_bootstrap_ci, percentile
from pytest_infergate.status import Status

ROOT = Path(__file__).resolve().parents[1]


def synthetic(tokens: int = 64, vocab: int = 50, noise: float = 0.3, seed: int = 0):
    """(reference log-probs, candidate log-probs, actual next tokens): the candidate's logits are the reference's
    plus Gaussian noise, as a quantization's rounding moves them."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(tokens, vocab, generator=generator)
    ref = torch.log_softmax(logits, -1)
    cand = torch.log_softmax(logits + noise * torch.randn(tokens, vocab, generator=generator), -1)
    actual = torch.multinomial(ref.exp(), 1, generator=generator)[:, 0].tolist()
    return ref, cand, actual


def chunk(kl: float, tokens: int = 100, top1: int | None = None, ref_nll: float = 2.0, cand_nll: float = 2.1,
          source: str = "a.txt") -> ChunkFigures:
    return ChunkFigures(source, tokens, kl * tokens, tokens if top1 is None else top1, ref_nll * tokens,
                        cand_nll * tokens)


def result(chunks: list[ChunkFigures], token_kl: list[float] | None = None, precision: str = "int8") -> CorpusResult:
    token_kl = token_kl or [c.kl / c.tokens for c in chunks]
    return CorpusResult(precision, "fp32", "built-in: a.txt", "d1g35t", 512, chunks, corpus_summary(chunks, token_kl),
                        12.5)


# ---- figures per token and per chunk ------------------------------------------------------------------------------

def test_token_figures_on_synthetic_logits_are_kl_top1_and_both_likelihoods():
    ref, cand, actual = synthetic()
    stats = token_stats(ref, cand, actual)
    direct = torch.nn.functional.kl_div(cand, ref, log_target=True, reduction="none").sum(-1)
    assert stats.kl == pytest.approx(direct.tolist(), abs=1e-5)
    assert stats.top1_agree == (ref.argmax(-1) == cand.argmax(-1)).tolist()
    assert stats.ref_nll == pytest.approx([-float(ref[i, t]) for i, t in enumerate(actual)])
    figures = ChunkFigures.of("a.txt", stats)
    assert figures.tokens == 64 and figures.kl == pytest.approx(float(direct.sum()), rel=1e-5)
    assert figures.top1 == sum(stats.top1_agree) and 0 < figures.top1 < 64  # the noise flips some top tokens
    assert figures.candidate_nll == pytest.approx(-sum(float(cand[i, t]) for i, t in enumerate(actual)), rel=1e-5)


def test_the_reference_against_itself_reads_zero_kl_full_agreement_and_no_perplexity_change():
    ref, _, actual = synthetic()
    chunks = [ChunkFigures.of("a.txt", token_stats(ref, ref, actual))] * 3
    summary = corpus_summary(chunks, [0.0] * 192)
    assert summary["mean_kl"] == 0 and summary["mean_kl_ci"] == [0, 0]
    assert summary["top1"] == 1 and summary["delta_ppl_rel"] == 0 and summary["p999_kl"] == 0


def test_the_summary_is_token_weighted_with_perplexities_and_tails_over_every_token():
    chunks = [chunk(0.01, tokens=300, top1=270, ref_nll=2.0, cand_nll=2.1), chunk(0.05, tokens=100, top1=80)]
    token_kl = [0.01] * 300 + [0.05] * 99 + [3.0]
    summary = corpus_summary(chunks, token_kl)
    assert summary["chunks"] == 2 and summary["tokens"] == 400
    assert summary["mean_kl"] == pytest.approx((3 + 5) / 400)  # a ratio of sums, not a mean of chunk means
    assert summary["top1"] == pytest.approx(350 / 400)
    assert summary["delta_ppl_rel"] == pytest.approx(math.exp(0.1) - 1)
    assert summary["reference_ppl"] == pytest.approx(math.exp(2.0))
    assert (summary["p99_kl"], summary["p999_kl"], summary["max_kl"]) == (
        percentile(token_kl, 99), percentile(token_kl, 99.9), 3.0)
    for key in ("mean_kl", "top1", "delta_ppl_rel"):
        low, high = summary[key + "_ci"]
        assert low <= summary[key] <= high


def test_delta_perplexity_is_relative_and_signed():
    assert delta_ppl_rel([chunk(0, ref_nll=2.0, cand_nll=2.0)]) == 0
    assert delta_ppl_rel([chunk(0, ref_nll=2.0, cand_nll=1.9)]) == pytest.approx(math.exp(-0.1) - 1)


# ---- the interval over chunks ---------------------------------------------------------------------------------------

def population_draw(rng: random.Random, chunks: int = 21, tokens: int = 20):
    """Chunks whose tokens share their context: each chunk's KL level is its own (log-normal around 0.04), the
    tokens scatter little around it. Returns the chunks and every token's KL."""
    drawn, token_kl = [], []
    for _ in range(chunks):
        level = 0.04 * math.exp(rng.gauss(0, 0.6) - 0.18)  # E[level] = 0.04
        kls = [level * math.exp(rng.gauss(0, 0.1) - 0.005) for _ in range(tokens)]
        drawn.append(ChunkFigures("t", tokens, math.fsum(kls), tokens, 2.0 * tokens, 2.0 * tokens))
        token_kl += kls
    return drawn, token_kl


def test_the_interval_over_chunks_covers_the_mean_where_one_over_tokens_would_not():
    """Tokens of a chunk are correlated: a bootstrap over 420 tokens as if independent is several times too narrow
    and misses the mean most of the time (20% of 40 trials); resampling whole chunks covers it 82% (89% of 100
    trials: a percentile bootstrap of 21 skewed chunks covers a little less than it claims)."""
    rng, true_mean, trials = random.Random(7), 0.04, 40
    by_chunk = by_token = 0
    for trial in range(trials):
        chunks, token_kl = population_draw(rng)
        _, low, high = paired_bootstrap_ci(chunks, mean_kl, resamples=400, seed=trial)
        by_chunk += low <= true_mean <= high
        _, low, high = paired_bootstrap_ci(token_kl, resamples=400, seed=trial)
        by_token += low <= true_mean <= high
    assert by_chunk / trials >= 0.8, by_chunk
    assert by_token / trials <= 0.4, by_token


# ---- against the accepted figures ---------------------------------------------------------------------------------

def noisy_chunks(scale: float, seed: int, count: int = 21) -> list[ChunkFigures]:
    rng = random.Random(seed)
    return [chunk(0.04 * scale * math.exp(rng.gauss(0, 0.1)), source=f"{i}") for i in range(count)]


def test_the_rise_over_accepted_figures_pairs_the_chunks():
    accepted = noisy_chunks(1.0, seed=1)
    assert kl_rise(accepted, accepted) == (0.0, 0.0, 0.0)  # a rerun on the accepting machine
    point, low, high = kl_rise(accepted, [ChunkFigures(c.source, c.tokens, c.kl * 1.6, c.top1, c.reference_nll,
                                                       c.candidate_nll) for c in accepted])
    assert point == pytest.approx(0.6) and low == pytest.approx(0.6) and high == pytest.approx(0.6)
    assert kl_rise([chunk(0.0)], [chunk(0.1)]) is None  # nothing to be relative to


@pytest.mark.parametrize("scale, status", [(1.0, Status.PASS), (1.5, Status.INCONCLUSIVE), (2.0, Status.FAIL)])
def test_max_corpus_kl_rise_decides_on_its_interval(scale, status):
    accepted = noisy_chunks(1.0, seed=1)
    current = result(noisy_chunks(scale, seed=2)).with_accepted(accepted, "golden/x/cpu-int8.corpus.json")
    policy = ResolvedPolicy.given(parse_policy({"max_corpus_kl_rise": 0.5}))
    decision = decide_corpus(current, policy)
    assert decision.status == status, decision
    assert current.summary["accepted_mean_kl"] == pytest.approx(mean_kl(accepted))


def test_a_rise_asked_for_without_accepted_figures_is_undecided_and_under_the_default_a_note():
    why = "no corpus figures accepted at golden/cpu-int8.corpus.json: accept them with --infergate-update-golden"
    none = result(noisy_chunks(1.0, seed=1)).with_accepted(None, why)
    asked = decide_corpus(none, ResolvedPolicy.given(parse_policy({"max_corpus_kl": 0.1, "max_corpus_kl_rise": 0.5})))
    assert asked.status == Status.INCONCLUSIVE
    assert asked.undecided == ["max_corpus_kl_rise: kl_rise was not measured (check(policy=...)): no corpus figures "
                               "accepted at golden/cpu-int8.corpus.json: accept them with --infergate-update-golden"]
    default = decide_corpus(none, ResolvedPolicy().for_corpus("int8"))
    assert default.status == Status.PASS and not default.notes  # the default sets no rise


# ---- the decision under the corpus keys -----------------------------------------------------------------------------

# int8 and nf4 of the embedded model over the built-in corpus as measured (Intel Xeon, 2026-12-05)
INT8 = {"chunks": 21, "tokens": 10109, "mean_kl": 0.03945, "mean_kl_ci": [0.02964, 0.0506], "top1": 0.9,
        "top1_ci": [0.8915, 0.9082], "delta_ppl_rel": 0.032, "delta_ppl_rel_ci": [0.024, 0.039], "p99_kl": 0.348,
        "p999_kl": 0.675}
NF4 = {"chunks": 21, "tokens": 10109, "mean_kl": 0.5802, "mean_kl_ci": [0.4389, 0.7329], "top1": 0.6514,
       "top1_ci": [0.6281, 0.672], "delta_ppl_rel": 0.647, "delta_ppl_rel_ci": [0.44, 0.89], "p99_kl": 3.93,
       "p999_kl": 6.11}


def measured(summary: dict, precision: str) -> CorpusResult:
    return CorpusResult(precision, "fp32", "built-in", "d", 512, [], dict(summary), 28.0)


def test_the_default_corpus_policy_passes_int8_and_fails_nf4_as_measured():
    int8 = decide_corpus(measured(INT8, "int8"), ResolvedPolicy().for_corpus("int8"))
    assert int8.status == Status.PASS and not int8.undecided
    nf4 = decide_corpus(measured(NF4, "nf4"), ResolvedPolicy().for_corpus("nf4"))
    assert nf4.problems == [
        "min_corpus_top1: top1 = 0.6514 (95% CI 0.6281-0.672) lies wholly below 0.85 (default policy for nf4)",
        "max_corpus_kl: mean_kl = 0.5802 (95% CI 0.4389-0.7329) lies wholly above 0.1 (default policy for nf4)"]
    assert ResolvedPolicy().for_corpus("nf4").decided_by(("max_corpus_kl", "min_corpus_top1")) == (
        "default policy for nf4 (4-bit class): min_corpus_top1=0.85, max_corpus_kl=0.1")


def test_a_straddling_interval_is_inconclusive_and_says_how_many_chunks_would_decide():
    decision = decide_corpus(measured(INT8, "int8"), ResolvedPolicy.given(parse_policy({"min_corpus_top1": 0.9})))
    assert decision.status == Status.INCONCLUSIVE
    (why,) = decision.undecided
    assert why.startswith("min_corpus_top1: top1 = 0.9 (95% CI 0.8915-0.9082) straddles 0.9")
    assert "no number of chunks decides" in why
    decision = decide_corpus(measured(INT8, "int8"), ResolvedPolicy.given(parse_policy({"max_corpus_kl": 0.045})))
    (why,) = decision.undecided
    assert "chunks would decide (21 now)" in why and MORE_CHUNKS in why


def test_percentiles_decide_on_the_point_and_say_so():
    decision = decide_corpus(measured(INT8, "int8"), ResolvedPolicy.given(parse_policy({"max_corpus_p99_kl": 0.5})))
    assert decision.status == Status.PASS
    assert decision.notes == ["max_corpus_p99_kl: p99_kl = 0.348 <= 0.5 (check(policy=...)), decided on the point "
                              "(p99_kl has no interval)"]
    failing = decide_corpus(measured(INT8, "int8"), ResolvedPolicy.given(parse_policy({"max_corpus_p99_kl": 0.3})))
    assert failing.status == Status.FAIL


def test_corpus_keys_are_their_own_gate_and_leave_checks_default_in_place():
    assert parse_policy({"max_corpus_delta_ppl": 0.05}) == {"max_corpus_delta_ppl": 0.05}
    with pytest.raises(QualityPolicyError, match="min_corpus_top1=1.5 can never be met: top1 is a fraction"):
        parse_policy({"min_corpus_top1": 1.5})
    only_corpus = ResolvedPolicy.given(parse_policy({"max_corpus_kl": 0.2}))
    assert only_corpus.for_reference("int8").default  # check() still decides under its default
    assert only_corpus.for_corpus("int8").rules == {"max_corpus_kl": 0.2}  # the corpus keys replace theirs whole
    only_check = ResolvedPolicy.given(parse_policy({"min_top1": 0.5}))
    assert only_check.for_corpus("int8").rules == {"min_top1": 0.5, "min_corpus_top1": 0.85, "max_corpus_kl": 0.1}


# ---- the accepted file ----------------------------------------------------------------------------------------------

def test_accepted_figures_round_trip_beside_the_golden_outputs(tmp_path):
    path = corpus_path(tmp_path / "SmolLM2" / "74de9d807e6fc828" / "cpu-int8.jsonl")
    assert path.name == "cpu-int8.corpus.json"
    measured_now = result(noisy_chunks(1.0, seed=3)).with_accepted(None, "accepted now")
    write_accepted(path, AcceptedCorpus.of(measured_now, "Intel(R) Xeon(R) Processor"))
    back = read_accepted(path)
    assert back.chunks == measured_now.chunks and back.machine == "Intel(R) Xeon(R) Processor"
    assert back.comparable(measured_now) == ""
    other = CorpusResult("int8", "fp32", "mine.txt", "0th3r", 512, measured_now.chunks, {}, 1.0)
    assert "accepted over other tokens" in back.comparable(other)
    against_bf16 = CorpusResult("int8", "bf16", "x", "d1g35t", 512, measured_now.chunks, {}, 1.0)
    assert "accepted against fp32, this run against bf16" in back.comparable(against_bf16)
    path.write_text("{}")
    with pytest.raises(Exception, match="not a corpus figures file of schema 1.*--infergate-update-golden"):
        read_accepted(path)


# ---- the record in every output -------------------------------------------------------------------------------------

def test_the_record_travels_through_json_and_reads_in_the_terminal_and_the_report():
    from pytest_infergate.report import render

    corpus = result(noisy_chunks(1.0, seed=4)).with_accepted(noisy_chunks(1.0, seed=5), "golden/cpu-int8.corpus.json "
                                                             "(accepted 2026-12-05 10:00 UTC on Intel Xeon)")
    record = CorpusRecord("suites/test_golden.py::test_corpus[int8]", Status.PASS, corpus,
                          {"max_corpus_kl": 0.1}, decided_by="default policy for int8 (8-bit class): max_corpus_kl=0.1")
    back = record_from_dict(json.loads(json.dumps(record.to_dict())))
    assert isinstance(back, CorpusRecord) and back.to_dict() == record.to_dict()
    assert dict(record.key_figures())["corpus.mean_kl"] == round(corpus.summary["mean_kl"], 4)
    run = RunResults(records=[back])
    text = "\n".join(line.text for line in summary_lines(run))
    assert "corpus PASS       int8 vs fp32 (12.5 s): 2,100 tokens in 21 chunks: mean KL 0.04" in text
    assert "mean KL vs accepted" in text and "under the default policy for int8" in text
    assert "against accepted: golden/cpu-int8.corpus.json (accepted 2026-12-05" in text
    html = render(run)
    assert "Quality over a text corpus" in html and "2,100 tokens in 21 chunks of 512" in html


# ---- the corpus ---------------------------------------------------------------------------------------------------

class Letters:
    """A tokenizer of one token per character."""

    def __call__(self, text, add_special_tokens=False, verbose=False):
        return {"input_ids": [ord(c) for c in text]}


def test_chunks_never_span_two_texts_and_a_piece_that_predicts_nothing_is_left_out():
    chunks = corpus_chunks(Letters(), [("a.txt", "abcdefg"), ("b.txt", "hij")], chunk_tokens=3)
    assert chunks == [("a.txt", [97, 98, 99]), ("a.txt", [100, 101, 102]), ("b.txt", [104, 105, 106])]
    assert chunks_digest(chunks) != chunks_digest(chunks[:2]) and len(chunks_digest(chunks)) == 16


def test_the_built_in_corpus_is_public_domain_text_with_its_source_and_ships_in_the_wheel(tmp_path):
    name, texts = corpus_texts()
    assert name == "built-in: alice.txt, constitution.txt"
    assert sum(len(text) for _, text in texts) > 40_000  # about 10,100 tokens of the embedded model's tokenizer
    readme = (CORPUS_DIR / "README.md").read_text()
    assert readme.count("public domain") >= 2 and "wordcloud" in readme and "eBook #11" in readme
    package_data = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    assert '"quality/corpus/*.txt"' in package_data and '"quality/corpus/README.md"' in package_data
    (tmp_path / "mine.txt").write_text("our own text")
    assert corpus_texts(tmp_path) == (f"{tmp_path}: mine.txt", [("mine.txt", "our own text")])
    with pytest.raises(Exception, match="no such file or folder"):
        corpus_texts(tmp_path / "missing")


@pytest.mark.embedded
def test_the_built_in_corpus_is_over_10000_tokens_of_the_embedded_models_tokenizer(cache_dir):
    from pytest_infergate.models import load_tokenizer, resolve_model

    chunks = corpus_chunks(load_tokenizer(resolve_model("smollm2-135m", cache_dir)), corpus_texts()[1])
    predicted = sum(len(ids) - 1 for _, ids in chunks)  # a chunk's first token predicts nothing
    assert (len(chunks), predicted) == (21, 10_109)

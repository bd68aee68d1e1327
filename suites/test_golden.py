"""Sampled output quality (guide, best practice 6: "对输出质量做抽样回归"): each precision against the reference
precision under the quality policy, against its own accepted golden outputs (the changed answers listed as near-ties
or drift; int8 and nf4 judged by their quality against fp32 compared with the figures accepted with the outputs, fp32
by its tokens), and against itself in other batches, so a library upgrade that changes answers is caught even where
the precision was already known to differ from the reference, and answers that change with the batch are measured,
not hidden.

Per category, the policy (suites/conftest.py) fails a category that loses nearly all of its task answers against
the reference (`min_category_task_ratio=0.3` for int8 and nf4) and shows smaller per-category losses as notes beside
the gate. With 6 samples a category (3-6 that the fp32 reference answers), one answer is a third of a category, and
the accepted outputs of three machines (Intel Xeon AVX-512, AMD EPYC AVX2, AMD EPYC AVX-512) measured int8 'chat' at
1-2 of the reference's 3 answers and nf4 'format' at 1-2 of 3. The nf4 'format' loss (JSON and list answers at
0.33-0.67 of fp32's) is a known limit of 4-bit weights on a 135M model, the guide's warning against aggressive
quantization where outputs must stay stable ("任务对输出稳定性要求极高" ... "最后再评估 4bit 是否值得"): the suite
expects it and shows it; losing every answer of a category is a collapse, and fails.

int8's and nf4's tokens are not reproduced on another machine (kernels, CPU model), nor across a library upgrade on
this one: the gate decides on this run's quality against its own fp32 reference compared per sample with the figures
recorded when the outputs were accepted (pytest_infergate/quality/travel.py); fp32 compares token for token. Accepted
files that record no figures (the AMD EPYC AVX2 files shipped here) keep the token rule on their own machine, saying
so, until they are accepted again."""

# Batch invariance runs on part of the sample set (every variant but the fixed-composition run is generated again,
# the samples alone one by one: 57% of the golden suite's CPU time with 12 samples): the 6 long-form samples, whose
# long answers give batch numerics the most tokens to tip (measured with 12 long-form and code samples: int8 12/12,
# nf4 6/12, fp32 0/12 batch-variant; the long-form ones alone: int8 6/6, nf4 5/6, fp32 0/6).
BATCH_INVARIANCE_CATEGORIES = ("long-form",)
# The first 4 of them: the alone runs (one sample at a time, 96 tokens) were 253 of the 406 s batch invariance took
# with 6 on a 2-core AVX2 CPU, where int8 and nf4 decode at 5-6 tokens/s.
BATCH_INVARIANCE_SAMPLES = 4
# Each compared on its first 32 tokens (of 85-96): the alone and rotated runs generate a third as many, and the
# fixed-composition run is cut there (batch-variant on the first 48 on an AVX-512 Xeon: fp32 0/4, int8 4/4, nf4 2/4).
BATCH_INVARIANCE_TOKENS = 32
# Gated at 0 where measured invariant (fp32 on the CPU, 0 of 48 samples); int8 (LLM.int8 picks its outlier columns
# over every row of the batch) and nf4 (bf16 activations round last-bit differences) are reported, not gated.
BATCH_INVARIANT = {"cpu": {"fp32"}, "cuda": set()}


def test_against_reference(infergate_golden, not_the_reference):
    infergate_golden.check()


def test_corpus(infergate_golden, not_the_reference):
    """Teacher-forced over the built-in corpus (about 10,100 tokens of public-domain prose; int8 28 s, nf4 35 s on a
    2-core Xeon), as llama-perplexity --kl-divergence: mean KL, top-1 and Δ perplexity with intervals over chunks,
    and the mean KL's rise over the figures accepted beside the golden outputs."""
    infergate_golden.check_corpus()


def test_against_accepted_golden(infergate_golden):
    infergate_golden.check_regression()


def test_batch_invariance(infergate_golden, infergate_precision, suite_device):
    """Skipped for an endpoint (a server batches requests its own way). A policy given here replaces the ini's."""
    gate = {"max_batch_variant_share": 0} if infergate_precision in BATCH_INVARIANT[suite_device] else None
    infergate_golden.check_batch_invariance(categories=BATCH_INVARIANCE_CATEGORIES, limit=BATCH_INVARIANCE_SAMPLES,
                                            policy=gate, max_new_tokens=BATCH_INVARIANCE_TOKENS)

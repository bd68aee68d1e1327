"""The corpus check on the embedded model: what `check_corpus()` costs and the figures it reports, per precision
against fp32 over the built-in corpus (llama-perplexity --kl-divergence's figures, with intervals over chunks).

    python benchmarks/corpus_kl.py [--precisions int8,nf4] [--chunk-tokens 512] [--json PATH] [--noise 0.01,0.03]
    python benchmarks/corpus_kl.py --model tiny-random-llama --chunks 4 --chunk-tokens 128 --layer 1   # a smoke run

Per precision: the wall and process CPU seconds of the comparison alone (both models' forwards over every chunk,
the KL and the bootstrap; the models are loaded before the clock starts, as a session's pool has them), and the
figures. On a shared machine the CPU time / threads is the steadier estimate of a quiet run's wall time.

With --noise, the power of the relative gate: the candidate changed on purpose (seeded Gaussian noise on layer 15's
post-attention RMSNorm weight, scaled to its mean magnitude, as benchmarks/golden_gate.py noise does), scored again,
and its mean KL's rise over the unchanged candidate's (the accepted figures) with its interval over paired chunks,
decided under max_corpus_kl_rise=0.5 (the suite's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--precisions", default="int8,nf4")
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=None, help="score only the first N chunks (default: all)")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--noise", default="", help="comma list of noise scales (0.03: 3%%) for the power figures")
    parser.add_argument("--layer", type=int, default=15)
    args = parser.parse_args()

    import torch

    from pytest_infergate.environment import cpu_model
    from pytest_infergate.models import load_model, resolve_model
    from pytest_infergate.quality.corpus_scoring import corpus_chunks, corpus_texts, score_corpus

    cache = Path(os.environ.get("INFERGATE_CACHE_DIR", Path.home() / ".cache" / "infergate"))
    source = resolve_model(args.model, cache)
    reference = load_model(source, "fp32")
    name, texts = corpus_texts()
    chunks = corpus_chunks(reference.tokenizer, texts, args.chunk_tokens)[:args.chunks]
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; corpus {name}: "
          f"{sum(len(ids) for _, ids in chunks):,} tokens in {len(chunks)} chunks of {args.chunk_tokens}", flush=True)
    out = {}
    for precision in args.precisions.split(","):
        candidate = load_model(source, precision)
        wall, cpu = time.perf_counter(), time.process_time()
        result = score_corpus(reference, candidate, name, chunks, args.chunk_tokens)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        s = result.summary
        print(f"{precision} vs fp32: {wall:.1f} s wall, {cpu:.1f} s CPU ({cpu / torch.get_num_threads():.1f} s CPU "
              f"per thread), load average {os.getloadavg()[0]:.1f}\n    {result.line()}\n"
              f"    perplexity {s['reference_ppl']:.3f} -> {s['candidate_ppl']:.3f}, KL max {s['max_kl']:.3g}",
              flush=True)
        out[precision] = {"wall_s": wall, "cpu_s": cpu, "summary": s}
        for scale in [float(x) for x in args.noise.split(",") if x]:
            out[f"{precision} noise {scale:g}"] = changed(candidate, result, scale, args.layer, reference, name, chunks,
                                                        args.chunk_tokens)
        del candidate
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def changed(candidate, accepted, scale: float, layer: int, reference, name, chunks, chunk_tokens) -> dict:
    """`candidate` with noise on one norm weight against the reference, and its rise over `accepted`."""
    import torch

    from pytest_infergate.quality.corpus_figures import decide_corpus
    from pytest_infergate.quality.corpus_scoring import score_corpus
    from pytest_infergate.quality.policy import ResolvedPolicy

    weight = candidate.model.model.layers[layer].post_attention_layernorm.weight
    original = weight.data.clone()
    generator = torch.Generator().manual_seed(1)
    weight.data = original + scale * original.abs().mean() * torch.randn(original.shape, generator=generator)
    try:
        result = score_corpus(reference, candidate, name, chunks, chunk_tokens)
    finally:
        weight.data = original
    result = result.with_accepted(accepted.chunks, "the unchanged candidate")
    decision = decide_corpus(result, ResolvedPolicy.given({"max_corpus_kl_rise": 0.5}))
    print(f"  noise {scale:g} on layer {layer}: {decision.status.value.upper()} under max_corpus_kl_rise=0.5\n"
          f"    {result.line()}", flush=True)
    return {"status": decision.status.value, "summary": result.summary}


if __name__ == "__main__":
    main()

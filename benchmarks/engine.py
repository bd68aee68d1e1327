"""Engine throughput and latency against the alternatives, on one workload, in one process.

    python benchmarks/engine.py                 # the full workload: 64 chat requests, embedded model, fp32
    python benchmarks/engine.py --requests 16   # a quicker look
    python benchmarks/engine.py --model random-llama-0.5b --device cuda   # on a GPU (fp16 there by default)

Prints each figure and the ratios the engine issue sets as targets. Useful output tokens are the tokens a
request asked for: up to its own EOS or its own max_new_tokens (a static batch generating past them is waste).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_infergate.engine import Engine, EngineConfig, Request  # noqa: E402
from pytest_infergate.environment import cpu_model  # noqa: E402
from pytest_infergate.models import load_model, resolve_model  # noqa: E402
from pytest_infergate.options import default_cache_dir  # noqa: E402
from pytest_infergate.workloads import chat_workload, with_poisson_arrivals  # noqa: E402
from pytest_infergate.workloads.request import render_prompt  # noqa: E402


def useful(tokens: list[int], max_new: int, eos: set[int]) -> int:
    for index, token in enumerate(tokens[:max_new]):
        if token in eos:
            return index + 1
    return min(len(tokens), max_new)


def run_engine(loaded, requests, **config) -> tuple[float, list, Engine]:
    engine = Engine(loaded.model, loaded.tokenizer, EngineConfig(**config))
    start = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - start
    engine.close()
    return wall, results, engine


@torch.inference_mode()
def run_hf_static(loaded, requests, batch_size, eos) -> tuple[float, int]:
    tok = loaded.tokenizer
    total_useful = 0
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first:first + batch_size]
        encoded = [render_prompt(tok, r) for r in batch]
        width = max(map(len, encoded))
        device = loaded.model.device
        ids = torch.tensor([[tok.pad_token_id] * (width - len(e)) + e for e in encoded], device=device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
        out = loaded.model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=tok.pad_token_id,
                                    max_new_tokens=max(r.max_new_tokens for r in batch))
        for row, request in zip(out[:, width:].tolist(), batch):
            total_useful += useful(row, request.max_new_tokens, eos)
    return time.perf_counter() - start, total_useful


@torch.inference_mode()
def run_hf_sequential(loaded, requests, eos) -> tuple[float, int]:
    tok = loaded.tokenizer
    total_useful = 0
    start = time.perf_counter()
    for request in requests:
        ids = torch.tensor([render_prompt(tok, request)], device=loaded.model.device)
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    pad_token_id=tok.pad_token_id, max_new_tokens=request.max_new_tokens)
        total_useful += useful(out[0, ids.shape[1]:].tolist(), request.max_new_tokens, eos)
    return time.perf_counter() - start, total_useful


@torch.inference_mode()
def run_hf_generate_batch(loaded, requests, eos, max_batch) -> tuple[float, int]:
    """transformers' own continuous batching (ContinuousBatchingManager), each request with its own limit."""
    from transformers import GenerationConfig

    tok = loaded.tokenizer
    model = loaded.model
    config = GenerationConfig(do_sample=False, eos_token_id=sorted(eos), pad_token_id=tok.pad_token_id,
                              max_batch_tokens=2048, max_new_tokens=max(r.max_new_tokens for r in requests))
    start = time.perf_counter()
    outputs = {}
    with model.continuous_batching_context_manager(generation_config=config, block=True, timeout=30) as manager:
        ids = [manager.add_request(render_prompt(tok, r), max_new_tokens=r.max_new_tokens) for r in requests]
        while len(outputs) < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                outputs[result.request_id] = result
    wall = time.perf_counter() - start
    total = sum(useful(outputs[i].generated_tokens, r.max_new_tokens, eos) for i, r in zip(ids, requests))
    return wall, total


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="max batch size (engine) = static batch size (HF)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", help="default: fp32 on the CPU, fp16 on CUDA")
    parser.add_argument("--skip", default="", help="comma list of alternatives to skip: static,cb,sequential,poisson")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    # on a shared machine the absolute figures move with what else runs: say how busy it was, before and after
    print(f"{datetime.date.today()}: {cpu_model()}, {os.cpu_count()} cores, load average (1/5/15 min) "
          + "/".join(f"{v:.1f}" for v in os.getloadavg()))
    precision = args.precision or ("fp16" if args.device.startswith("cuda") else "fp32")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here (torch {torch.__version__})")
    loaded = load_model(resolve_model(args.model, default_cache_dir()), precision, device=args.device,
                        reference=precision)
    tok = loaded.tokenizer
    eos = {tok.eos_token_id, loaded.model.generation_config.eos_token_id} - {None}
    requests = chat_workload(tok, args.requests)
    lengths = [len(render_prompt(tok, r)) for r in requests]
    print(f"model {args.model} {precision} on {args.device}, torch threads {torch.get_num_threads()}, "
          f"{args.requests} chat requests, "
          f"prompts {min(lengths)}-{max(lengths)} tokens, "
          f"max_new_tokens {min(r.max_new_tokens for r in requests)}-{max(r.max_new_tokens for r in requests)}")

    # warm-up: one short request through each path, not measured
    run_engine(loaded, chat_workload(tok, 2, max_new_tokens=(4, 4), seed=99), max_batch_size=args.batch)

    # the self-check every Engine runs on construction (its probe against the model's own attention)
    checks = []
    for _ in range(5):
        with Engine(loaded.model, tok, EngineConfig(max_batch_size=args.batch)) as engine:
            checks.append(engine.self_check)
    costs = sorted(c.seconds * 1000 for c in checks)
    print(f"engine self-check on construction: median {statistics.median(costs):.0f} ms, best {costs[0]:.0f} ms of 5 "
          f"({checks[0].num_tokens} probe tokens vs {checks[0].reference!r}; max logit diff {checks[0].max_diff:.2g} "
          f"of scale {checks[0].logit_scale:.3g}, attention {checks[0].attention_diff:.2g})")

    figures = {}
    wall, results, engine = run_engine(loaded, requests, max_batch_size=args.batch, max_batched_tokens=2048)
    tokens = sum(r.num_output_tokens for r in results)
    figures["continuous"] = tokens / wall
    print(f"engine continuous      : {tokens:5d} useful tokens in {wall:7.1f} s = {tokens / wall:6.1f} tok/s")
    print(f"  CUDA graphs {engine.cuda_graphs.describe()}")
    big = [s for s in engine.steps if s.batch_size >= args.batch]
    if big:
        outside = 1 - sum(s.forward_s for s in big) / sum(s.step_s for s in big)
        print(f"  steps at batch {args.batch}: {len(big)}, time outside the model forward {outside:.1%} of step time")
    else:
        print(f"  (no step reached batch {args.batch})")
    if engine.cuda_graphs.enabled:  # the same run with every step eager: what the graphs bring
        wall, results, _ = run_engine(loaded, requests, max_batch_size=args.batch, max_batched_tokens=2048,
                                      cuda_graphs=False)
        eager = sum(r.num_output_tokens for r in results) / wall
        figures["continuous_eager"] = eager
        print(f"engine continuous, no CUDA graphs: {eager:6.1f} tok/s (graphs x{figures['continuous'] / eager:.2f})")

    # the same workload with prefix caching: the chat template and the passage the questions are about are shared
    # prefixes (as a system prompt or a document asked several questions are in real traffic)
    wall, results, engine = run_engine(loaded, requests, max_batch_size=args.batch, max_batched_tokens=2048,
                                       prefix_caching=True)
    tokens = sum(r.num_output_tokens for r in results)
    figures["continuous+prefix"] = tokens / wall
    cached = sum(r.num_cached_tokens for r in results)
    print(f"engine + prefix caching: {tokens:5d} useful tokens in {wall:7.1f} s = {tokens / wall:6.1f} tok/s "
          f"({cached} of {sum(r.num_prompt_tokens for r in results)} prompt tokens from the cache)")

    if "static" not in skip:
        wall, tokens = run_hf_static(loaded, requests, args.batch, eos)
        figures["hf_static"] = tokens / wall
        print(f"HF generate, static {args.batch:2d} : {tokens:5d} useful tokens in {wall:7.1f} s = "
              f"{tokens / wall:6.1f} tok/s")
    if "cb" not in skip:
        wall, tokens = run_hf_generate_batch(loaded, requests, eos, args.batch)
        figures["hf_generate_batch"] = tokens / wall
        print(f"HF generate_batch (CB) : {tokens:5d} useful tokens in {wall:7.1f} s = {tokens / wall:6.1f} tok/s")
    if "sequential" not in skip:
        wall, tokens = run_hf_sequential(loaded, requests, eos)
        figures["hf_sequential"] = tokens / wall
        print(f"HF generate, sequential: {tokens:5d} useful tokens in {wall:7.1f} s = {tokens / wall:6.1f} tok/s")

    # batch-1 decode: same prompt, 128 tokens, engine vs model.generate, alternated 3 times, best of each
    one = Request(prompt_token_ids=render_prompt(tok, requests[0])[:32], max_new_tokens=128, ignore_eos=True)
    # on CUDA also against generate with a static cache (the batch-1 target)
    caches = [None, "static"] if args.device.startswith("cuda") else [None]
    engine_times, hf_times = [], {cache: [] for cache in caches}
    for _ in range(3):
        engine_times.append(run_engine(loaded, [one], max_batch_size=1)[0])
        for cache in caches:
            with torch.inference_mode():
                ids = torch.tensor([one.prompt_token_ids], device=loaded.model.device)
                extra = {"cache_implementation": cache} if cache else {}
                start = time.perf_counter()
                loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, min_new_tokens=128,
                                      max_new_tokens=128, pad_token_id=tok.pad_token_id, **extra)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                hf_times[cache].append(time.perf_counter() - start)
    engine_b1, hf_b1 = 128 / min(engine_times), 128 / min(hf_times[None])
    print(f"batch-1, 32-token prompt + 128 tokens (best of 3): engine {engine_b1:.1f} tok/s, "
          f"model.generate {hf_b1:.1f} tok/s")
    if "static" in hf_times:
        static_b1 = 128 / min(hf_times["static"])
        print(f"  model.generate with a static cache {static_b1:.1f} tok/s: engine x{engine_b1 / static_b1:.2f} "
              "(target >= 0.9)")

    if "poisson" not in skip:
        subset = chat_workload(tok, min(32, args.requests), seed=1)
        capacity = len(subset) / run_engine(loaded, subset, max_batch_size=args.batch)[0]
        rate = 0.7 * capacity
        ttft = {}
        for mode, extra in (("continuous", {}), ("dynamic", {"window_ms": 50.0})):
            stream = with_poisson_arrivals(chat_workload(tok, len(subset), seed=1), rate, seed=2)
            _, results, _ = run_engine(loaded, stream, batching=mode, max_batch_size=args.batch, **extra)
            ttft[mode] = [r.timings.ttft_s for r in results]
        print(f"Poisson arrivals at {rate:.2f} req/s (70% of measured capacity {capacity:.2f} req/s), "
              f"{len(subset)} requests:")
        for mode, values in ttft.items():
            print(f"  {mode:10s}: TTFT p50 {pct(values, 50) * 1000:7.0f} ms, p90 {pct(values, 90) * 1000:7.0f} ms")
        ratio = statistics.median(ttft["continuous"]) / statistics.median(ttft["dynamic"])
        print(f"  continuous p50 TTFT / dynamic p50 TTFT = {ratio:.2f} (target <= 0.33)")

    print("ratios (useful output tokens per second):")
    targets = {"hf_static": 2.0, "hf_generate_batch": 3.0, "hf_sequential": 5.0}
    for engine_name in ("continuous", "continuous+prefix"):
        for name, target in targets.items():
            if name in figures:
                ratio = figures[engine_name] / figures[name]
                print(f"  {engine_name:17s} / {name:18s} = {ratio:5.2f}x  (target >= {target}x)")
    print(f"  batch-1 engine / model.generate    = {engine_b1 / hf_b1:5.2f}x  (target >= 0.9x)")
    if "hf_generate_batch" in figures:
        print("  (generate_batch shares prefix blocks by default, allow_block_sharing=True: the like-for-like "
              "comparison with it is continuous+prefix)")
    print("load average at the end (1/5/15 min) " + "/".join(f"{v:.1f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

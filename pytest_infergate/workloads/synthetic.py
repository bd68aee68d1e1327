"""Synthetic but realistic workloads: chat requests with controlled prompt lengths, and arrival processes.

Deterministic for a given seed, so two runs (or a baseline and a candidate) see the same requests.
"""

from __future__ import annotations

import random

from pytest_infergate.workloads.request import Request, render_prompt

QUESTIONS = [
    "Summarize the text above in two sentences.",
    "What is the main idea of the text above?",
    "List three facts from the text above.",
    "Explain the text above to a ten-year-old.",
    "Write a short poem inspired by the text above.",
    "What question would you ask the author of the text above?",
    "Give the text above a title and explain your choice.",
    "Is the text above optimistic or pessimistic? Why?",
]

PASSAGE = (
    "Large language models generate text one token at a time. Each new token attends to every token before it, "
    "so an inference server keeps the keys and values of earlier tokens in a cache instead of computing them "
    "again. The cache grows with the context and with the number of requests served together. Batching many "
    "requests keeps the accelerator busy, but requests finish at different times, and a naive batch makes short "
    "answers wait for long ones. Quantization stores weights in eight or four bits, which saves memory and can "
    "allow larger batches, although on some hardware the low-bit kernels are slower than the full-precision ones. "
    "Operators measure time to first token, time per output token, throughput and peak memory, and they compare "
    "sampled outputs with a reference to make sure the answers did not get worse. Rivers carve valleys over "
    "millions of years, and the light of distant stars left them long before the first cities were built. "
    "Bakers know that dough rises faster in a warm kitchen, and gardeners plant tomatoes after the last frost. "
)


def _render(tokenizer, text: str) -> list[int]:
    return render_prompt(tokenizer, Request(messages=[{"role": "user", "content": text}]))


def chat_prompt_with_length(tokenizer, target_tokens: int, question: str) -> str:
    """A user message (passage + question) whose chat-rendered prompt has about `target_tokens` tokens."""
    words = (PASSAGE * 20).split()
    low, high = 0, len(words)
    while low < high:  # longest passage prefix that keeps the rendered prompt within the target
        mid = (low + high + 1) // 2
        if len(_render(tokenizer, " ".join(words[:mid]) + "\n\n" + question)) <= target_tokens:
            low = mid
        else:
            high = mid - 1
    passage = " ".join(words[:low])
    return (passage + "\n\n" + question) if passage else question


def chat_workload(tokenizer, num_requests: int = 64, prompt_tokens: tuple[int, int] = (20, 400),
                  max_new_tokens: tuple[int, int] = (16, 256), seed: int = 0, fixed_output: bool = False
                  ) -> list[Request]:
    """Chat requests whose prompts the tokenizer sizes within `prompt_tokens`; answers capped at a length drawn
    from `max_new_tokens`, or with `fixed_output` exactly that long (`ignore_eos`, which the engine and the
    servers gated here honour: what serving benchmarks measure)."""
    rng = random.Random(seed)
    requests = []
    for index in range(num_requests):
        target = rng.randint(*prompt_tokens)
        question = QUESTIONS[index % len(QUESTIONS)]
        text = chat_prompt_with_length(tokenizer, target, question)
        requests.append(Request(messages=[{"role": "user", "content": text}],
                                max_new_tokens=rng.randint(*max_new_tokens), request_id=f"w{seed}-{index}",
                                ignore_eos=fixed_output))
    return requests


def with_poisson_arrivals(requests: list[Request], rate_per_s: float, seed: int = 0) -> list[Request]:
    """Set `arrival_s` from a Poisson process of `rate_per_s` requests per second."""
    return with_gamma_arrivals(requests, rate_per_s, burstiness=1.0, seed=seed)


def gamma_arrival_offsets(count: int, rate_per_s: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """`count` arrival times (seconds from the start) with gamma-distributed gaps of mean 1/rate (as
    `vllm bench serve --burstiness`): 1.0 is Poisson, below 1 burstier, above 1 more regular."""
    if not rate_per_s > 0 or not burstiness > 0:
        raise ValueError(f"rate_per_s and burstiness must be positive, got {rate_per_s} and {burstiness}")
    rng = random.Random(seed)
    clock, offsets = 0.0, []
    for _ in range(count):
        offsets.append(clock)
        clock += rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))
    return offsets


def with_gamma_arrivals(requests: list[Request], rate_per_s: float, burstiness: float = 1.0,
                        seed: int = 0) -> list[Request]:
    """Set `arrival_s` from gamma_arrival_offsets."""
    for request, offset in zip(requests, gamma_arrival_offsets(len(requests), rate_per_s, burstiness, seed)):
        request.arrival_s = offset
    return requests


def with_burst_arrivals(requests: list[Request], burst_size: int, gap_s: float) -> list[Request]:
    """Groups of `burst_size` requests arriving together, `gap_s` apart."""
    for index, request in enumerate(requests):
        request.arrival_s = (index // burst_size) * gap_s
    return requests

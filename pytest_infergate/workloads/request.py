"""The request a user asks for, as the reference engine and a served endpoint both take it: the `Request` record
(prompt text, chat messages or token ids, and how to generate), checked where it is built, and how its prompt
reaches a model: rendered with the tokenizer's chat template, or as a plain transcript for a base model; and the
latencies of its answer (TTFT, ITL, TPOT, end to end), derived alike for the engine and an endpoint. Synthetic
but realistic workloads of them too: chat requests with controlled prompt lengths, and arrival processes,
deterministic for a given seed, so two runs (or a baseline and a candidate) see the same requests."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pytest_infergate.errors import InfergateError, check_bool, check_int, check_number, check_str, check_token_ids
from pytest_infergate.workloads.transcript import has_chat_template, plain_text


class RequestError(InfergateError, ValueError):
    """A request that can never be served as given (empty prompt, bad limits, unknown stop token...)."""


@dataclass
class Request:
    """One generation request.

    Give exactly one of `prompt` (text), `messages` (chat, rendered with the tokenizer's chat template) or
    `prompt_token_ids`. `temperature == 0` is greedy. `arrival_s` is when the request arrives, in seconds after
    the workload starts (used by `Engine.generate` to replay an arrival stream); `deadline_s` is counted from
    arrival.
    """

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    prompt_token_ids: list[int] | None = None
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    top_logprobs: int = 0  # record the log-probabilities of this many most likely tokens at each generated token
    seed: int | None = None
    deadline_s: float | None = None
    arrival_s: float = 0.0
    request_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # fields for a served model's JSON body (`min_tokens`, `top_k`, any vendor key); the engine ignores them (it
    # honours ignore_eos above). Sent by the endpoint gates after the fields they set themselves
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        given = [name for name in ("prompt", "messages", "prompt_token_ids") if getattr(self, name) is not None]
        if len(given) != 1:
            raise RequestError("a Request needs exactly one of prompt, messages, prompt_token_ids "
                               f"(got {given or 'none'})")
        check_str(RequestError, "Request.prompt", self.prompt, optional=True)
        if self.messages is not None:
            check_messages(self.messages)
        if self.prompt_token_ids is not None:
            self.prompt_token_ids = list(check_token_ids(RequestError, "Request.prompt_token_ids",
                                                         self.prompt_token_ids))
        self.max_new_tokens = check_int(RequestError, "Request.max_new_tokens", self.max_new_tokens, 1,
                                        rule="at least 1 (an int)")
        self.temperature = check_number(RequestError, "Request.temperature (0 is greedy)", self.temperature,
                                        minimum=0)
        self.top_p = check_number(RequestError, "Request.top_p", self.top_p, minimum=0, exclusive_minimum=True,
                                  maximum=1)
        self.top_k = check_int(RequestError, "Request.top_k (0 disables it)", self.top_k, 0)
        self.top_logprobs = check_int(RequestError, "Request.top_logprobs (0: none recorded)", self.top_logprobs, 0)
        self.seed = check_int(RequestError, "Request.seed", self.seed, 0, optional=True)
        self.deadline_s = check_number(RequestError, "Request.deadline_s", self.deadline_s, minimum=0,
                                       exclusive_minimum=True, optional=True)
        self.arrival_s = check_number(RequestError, "Request.arrival_s", self.arrival_s, minimum=0)
        self.stop_token_ids = check_token_ids(RequestError, "Request.stop_token_ids", self.stop_token_ids)
        if isinstance(self.stop_strings, str):
            raise RequestError(f"Request.stop_strings must be a list of strings, got the string {self.stop_strings!r}")
        self.stop_strings = tuple(self.stop_strings)
        for stop in self.stop_strings:
            if not isinstance(stop, str) or not stop:
                raise RequestError(f"Request.stop_strings must hold non-empty strings, got {stop!r}")
        check_bool(RequestError, "Request.ignore_eos", self.ignore_eos)
        check_str(RequestError, "Request.request_id", self.request_id, optional=True)
        if not isinstance(self.metadata, dict):
            raise RequestError(f"Request.metadata must be a dict, got {type(self.metadata).__name__}")
        if not isinstance(self.extra_body, dict) or not all(isinstance(k, str) for k in self.extra_body):
            raise RequestError(f"Request.extra_body must be a dict of JSON fields by name, got {self.extra_body!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def check_messages(messages: Any) -> None:
    """Chat messages are a list of dicts, each with a string `role` and a `content`."""
    if not isinstance(messages, (list, tuple)):
        raise RequestError(f"Request.messages must be a list of chat messages, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"Request.messages[{index}] must be a dict with 'role' and 'content', got "
                               f"{type(message).__name__}")
        missing = [key for key in ("role", "content") if key not in message]
        if missing:
            raise RequestError(f"Request.messages[{index}] has no {' and no '.join(repr(k) for k in missing)}: each "
                               f"chat message needs 'role' and 'content' (got keys {sorted(message)})")
        if not isinstance(message["role"], str):
            raise RequestError(f"Request.messages[{index}]['role'] must be a string, got {message['role']!r}")
        if message["content"] is None:  # a chat template would fail on it deep inside jinja2
            raise RequestError(f"Request.messages[{index}]['content'] is None: give the message's text (\"\" for "
                               "an empty one)")


def render_prompt(tokenizer, request: Request) -> list[int]:
    """The prompt as the model sees it: token ids as given, chat messages rendered with the tokenizer's chat
    template (and the generation prompt) or, for a base model without one, as a plain transcript (plain_text),
    or text with the tokenizer's special tokens."""
    if request.prompt_token_ids is not None:
        ids = list(request.prompt_token_ids)
    elif request.messages is not None:
        if not request.messages:
            raise RequestError("request.messages is empty: give at least one chat message")
        if not has_chat_template(tokenizer):
            return _nonempty(tokenizer(plain_text(request.messages), add_special_tokens=True)["input_ids"])
        ids = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
    else:
        if not request.prompt:
            raise RequestError("request.prompt is empty: give some text, messages or prompt_token_ids")
        ids = tokenizer(request.prompt, add_special_tokens=True)["input_ids"]
    return _nonempty(ids)


def _nonempty(ids: list[int]) -> list[int]:
    if not ids:
        raise RequestError("the prompt tokenized to zero tokens: give a non-empty prompt")
    return list(ids)


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


def default_chat_workload(tokenizer, num_requests: int | None = None) -> list[Request]:
    """The chat workload a bench call that names none measures on the engine: 6 short chat requests (prompts of
    20-80 tokens, answers of 12-24). benchmarks/figure_power.py measures the gate's power on this workload (on
    tiny-random-llama: an unchanged run passes, a x2 or +30% change fails), and a repetition of it takes a few
    seconds on the embedded model on one CPU thread, so a stored comparison's 5-12 repetitions fit in a CI minute."""
    return chat_workload(tokenizer, num_requests or 6, prompt_tokens=(20, 80), max_new_tokens=(12, 24), seed=4)


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

"""Requests, their per-request state inside the engine (Sequence), and the Result every request ends with."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from pytest_infergate.engine.validate import check_bool, check_int, check_number, check_str, check_token_ids
from pytest_infergate.errors import InfergateError


class RequestError(InfergateError, ValueError):
    """A request that can never be served as given (empty prompt, bad limits, unknown stop token...)."""


class FinishReason(str, enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def is_success(self) -> bool:
        return self in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)


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


# how a base model (a tokenizer without a chat template) is sent chat messages: a plain transcript
_SPEAKERS = {"user": "User", "assistant": "Assistant", "system": ""}


def has_chat_template(tokenizer) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def plain_text(messages) -> str:
    """Chat messages as a base model reads them: the system message as a plain paragraph, each turn as "User: ..."
    or "Assistant: ...", ending with "Assistant:" for the answer (the same content as the chat prompt, without a
    template the base model never saw)."""
    lines = []
    for message in messages:
        speaker = _SPEAKERS.get(message["role"], message["role"].capitalize())
        content = str(message["content"]).strip()
        lines.append(f"{speaker}: {content}" if speaker else content)
    return "\n\n".join(lines + ["Assistant:"])


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


@dataclass
class RequestTimings:
    """Wall-clock instants (perf_counter seconds) and the derived latencies of one request: for the engine, the
    HF generate backend, or a client of a served model (`arrival` when it was sent, `token_times` when each
    streamed chunk came, `num_output_tokens` the tokens they carried if a chunk can carry several)."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    num_output_tokens: int | None = None  # None: one token per entry of token_times

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT)."""
        count = len(self.token_times) if self.num_output_tokens is None else self.num_output_tokens
        if count < 2 or self.first_token is None or not self.token_times:
            return None
        return (self.token_times[-1] - self.first_token) / (count - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    def to_dict(self) -> dict[str, Any]:
        return {"queue_wait_s": self.queue_wait_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s, "itl_s": self.itl_s}


@dataclass
class Result:
    request_id: str
    finish_reason: FinishReason
    reason: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    timings: RequestTimings
    num_preemptions: int = 0
    is_warmup: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (not computed)
    # with Request.top_logprobs: per generated token, (token ids, log-probabilities), most likely first, as the
    # forward that generated it computed them (in its batch)
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.finish_reason.is_success

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


_sequence_ids = itertools.count()


class SequenceStatus(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """The engine's state for one admitted request: tokens, progress, blocks, timings."""

    def __init__(self, request: Request, prompt_token_ids: list[int], arrival: float, request_id: str):
        self.seq_id = next(_sequence_ids)
        self.request = request
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_top_logprobs: list[tuple[list[int], list[float]]] = []
        self.max_new_tokens = request.max_new_tokens  # may be clamped by the engine's limits
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.block_keys: list[tuple] = []  # prefix-cache keys of its full, computed blocks, in order
        self.num_cached_tokens = 0  # prompt tokens taken from the prefix cache instead of computed
        self.timings = RequestTimings(arrival=arrival)
        self.finish_reason: FinishReason | None = None
        self.reason = ""
        self.num_preemptions = 0
        self.cancel_requested = False
        self.generator = None  # torch.Generator for seeded sampling, created by the runner
        self.stop_text_tail = ""

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token lacks cached K/V: the prompt (or, after a preemption, everything) is still being
        prefilled. A decode step feeds exactly the one token sampled last."""
        return self.num_uncomputed_tokens > 1

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.max_new_tokens

    def finish(self, reason: FinishReason, detail: str, now: float) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.reason = detail
        self.timings.finished = now

    def result(self, text: str) -> Result:
        """The Result of a finished sequence; `text` is its output decoded."""
        return Result(self.request_id, self.finish_reason, self.reason, self.prompt_token_ids,
                      list(self.output_token_ids), text, self.timings, self.num_preemptions,
                      bool(self.request.metadata.get("warmup")), self.num_cached_tokens,
                      list(self.output_top_logprobs))

"""The request a user asks for, as the reference engine and a served endpoint both take it: the `Request` record
(prompt text, chat messages or token ids, and how to generate), checked where it is built, and how its prompt
reaches a model: rendered with the tokenizer's chat template, or as a plain transcript for a base model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_infergate.errors import InfergateError, check_bool, check_int, check_number, check_str, check_token_ids


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

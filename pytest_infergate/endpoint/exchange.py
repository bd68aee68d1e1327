"""What goes to an OpenAI-compatible server and what comes back: the endpoint's configuration, one request, and
one request's result as the client saw it (every instant on the client's clock). Token-exact synthetic prompts are
built here too, without a local tokenizer: the server tokenizes the text itself (`POST /tokenize`, which llama.cpp,
vLLM and SGLang serve beside `/v1`) and each prompt goes as token ids through the completions API, so the server
reads exactly the number of tokens asked for; a server without `/tokenize` is a clear error, never an approximation."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from pytest_infergate.errors import InfergateError, OptionError
from pytest_infergate.workloads.timings import RequestTimings
from pytest_infergate.workloads.transcript import plain_text

SET_BY_THE_LOAD_GENERATOR = frozenset({"model", "stream", "messages", "prompt"})


def check_extra_body(fields: dict, where: str) -> None:
    """Extra JSON fields for a served model: JSON values, none of the fields the load generator sets itself."""
    clash = sorted(set(fields) & SET_BY_THE_LOAD_GENERATOR)
    if clash:
        raise OptionError(f"{where} may not set {', '.join(clash)}: the load generator sets them; give the others "
                          "(e.g. ignore_eos, min_tokens, top_k)")
    try:
        json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OptionError(f"{where}: every field must be a JSON value ({exc})") from None


ENDPOINT_APIS = ("chat", "completions")


def check_endpoint_settings(url: str, timeout_s: float, max_concurrency: int, api: str,
                            flag: str = "--infergate-endpoint") -> None:
    """The endpoint options (also EndpointConfig's fields), each with the option that sets it (`flag`: the
    option that gave `url`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OptionError(f"{flag} {url!r} is not an http(s) URL; give the server's base URL, e.g. "
                          "http://127.0.0.1:8000/v1")
    if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise OptionError("--infergate-endpoint-timeout must be positive (a finite number of seconds), got "
                          f"{timeout_s}")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise OptionError(f"--infergate-endpoint-concurrency must be at least 1 (an integer), got {max_concurrency}")
    if api not in ENDPOINT_APIS:
        raise OptionError(f"--infergate-endpoint-api {api!r} is not one of {', '.join(ENDPOINT_APIS)}")


class EndpointError(InfergateError):
    """The endpoint cannot be used at all (unreachable, no model served, wrong URL)."""


@dataclass(frozen=True)
class EndpointConfig:
    url: str  # base URL, with or without the trailing /v1
    model: str | None = None  # served model name; None: the first one /v1/models lists
    api_key: str | None = None
    timeout_s: float = 60.0  # whole request, first byte to last
    max_concurrency: int = 64
    api: str = "chat"
    metrics_url: str | None = None  # Prometheus /metrics; None: /metrics at the server's root
    option: str = "--infergate-endpoint"  # the option that names this server, for messages

    def __post_init__(self):
        check_endpoint_settings(self.url, self.timeout_s, self.max_concurrency, self.api, self.option)
        if self.metrics_url is not None:
            check_endpoint_settings(self.metrics_url, self.timeout_s, self.max_concurrency, self.api,
                                    flag="--infergate-endpoint-metrics-url")

    @property
    def base_url(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"

    @property
    def prometheus_url(self) -> str:
        """Where the server's Prometheus metrics are: vLLM, SGLang, TGI and llama.cpp all serve /metrics at the
        root, beside /v1 (a deployment behind a router may name another with --infergate-endpoint-metrics-url)."""
        if self.metrics_url:
            return self.metrics_url
        parts = urlsplit(self.base_url)
        root = parts.path[:-len("/v1")] if parts.path.endswith("/v1") else parts.path
        return urlunsplit((parts.scheme, parts.netloc, root.rstrip("/") + "/metrics", "", ""))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class EndpointRequest:
    """What is sent: chat `messages` or a completions `prompt`, greedy unless temperature > 0."""

    messages: list[dict[str, str]] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int = 0  # top logprobs per token (0: none)
    request_id: str = ""
    arrival_s: float = 0.0  # offset in the arrival schedule of a load run
    # vendor fields merged into the JSON body last (`ignore_eos`, `min_tokens`, `top_k`, ...): a fixed output
    # length, as serving benchmarks use, is {"ignore_eos": True} with max_tokens (vLLM, SGLang, llama.cpp)
    extra_body: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_engine_request(cls, request, api: str = "chat") -> EndpointRequest:
        """The same request as the reference engine's `Request` (prompt text, chat messages or token ids)."""
        common = dict(max_tokens=request.max_new_tokens, temperature=request.temperature, top_p=request.top_p,
                      seed=request.seed, stop=tuple(request.stop_strings), request_id=request.request_id or "",
                      arrival_s=request.arrival_s,
                      # a fixed output length: the servers gated here (vLLM, SGLang, llama.cpp) take ignore_eos
                      extra_body={**({"ignore_eos": True} if request.ignore_eos else {}),
                                  **request.extra_body})
        if request.messages is not None:
            if api == "chat":
                return cls(messages=request.messages, **common)
            # a base model's server (no chat template): the same transcript the engine sends a base model
            return cls(prompt=plain_text(request.messages), **common)
        prompt = request.prompt if request.prompt is not None else list(request.prompt_token_ids)
        if api == "chat":
            if not isinstance(prompt, str):
                raise OptionError("a request given as token ids needs --infergate-endpoint-api completions")
            return cls(messages=[{"role": "user", "content": prompt}], **common)
        return cls(prompt=prompt, **common)

    @classmethod
    def coerce(cls, request, api: str = "chat") -> EndpointRequest:
        """An EndpointRequest as is; the reference engine's `Request` translated; anything else a clear error."""
        if isinstance(request, cls):
            return request
        if hasattr(request, "max_new_tokens") and hasattr(request, "prompt_token_ids"):
            return cls.from_engine_request(request, api)
        raise TypeError(f"an endpoint load run takes EndpointRequest or engine Request objects, not "
                        f"{type(request).__name__}")

    def body(self, model: str, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                                "top_p": self.top_p, "stream": stream}
        if self.messages is not None:
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if self.logprobs:
            if self.messages is not None:
                body["logprobs"], body["top_logprobs"] = True, self.logprobs
            else:
                body["logprobs"] = self.logprobs
        check_extra_body(self.extra_body, "EndpointRequest.extra_body")
        body.update(self.extra_body)
        return body

    @property
    def path(self) -> str:
        return "/chat/completions" if self.messages is not None else "/completions"


@dataclass
class EndpointResult(RequestTimings):
    """One request as the client saw it: its timings (RequestTimings, as the engine's: `arrival` when it started
    to go out, `token_times` when each chunk that carried text came, `num_output_tokens` from the server's usage,
    else the number of text chunks; `decode_end` the end of the stream where it succeeded) and its answer. `error`
    is None on success."""

    request_id: str
    sent_on_wire: bool = False  # `arrival` is the instant the request started to go out (its connect, else its
    # headers: httpcore's trace), not the fallback, just before it was built
    text: str = ""
    finish_reason: str | None = None
    status: int | None = None  # HTTP status of the answer; None when none came
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server sends it
    usage_reported: bool = False
    error: str | None = None  # http_<status>, timeout, connect, transport, malformed_stream, incomplete_stream,
    # inconsistent_usage, server_error
    error_detail: str = ""
    logprobs: list[dict] = field(default_factory=list)  # [{"token": str, "logprob": float, "top": {str: float}}]

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("logprobs")
        out.update(ttft_ms=_ms(self.ttft_s), tpot_ms=_ms(self.tpot_s), e2e_ms=_ms(self.e2e_s))
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def choice_text(choice: dict) -> str:
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    if "message" in choice:
        return choice["message"].get("content") or ""
    return choice.get("text") or ""


def choice_logprobs(choice: dict) -> list[dict]:
    """Both shapes: chat (`logprobs.content[]`) and completions (`tokens`, `token_logprobs`, `top_logprobs`)."""
    lp = choice.get("logprobs")
    if not lp:
        return []
    if isinstance(lp.get("content"), list):
        return [{"token": c["token"], "logprob": c["logprob"],
                 "top": {t["token"]: t["logprob"] for t in c.get("top_logprobs") or []}} for c in lp["content"]]
    tops = lp.get("top_logprobs") or [None] * len(lp.get("tokens", []))
    return [{"token": token, "logprob": logprob, "top": dict(top or {})}
            for token, logprob, top in zip(lp.get("tokens", []), lp.get("token_logprobs", []), tops)]


# token-exact prompts, as `vllm bench serve --dataset-name random` and guidellm's synthetic data build them
# with a local tokenizer; here the server tokenizes
FILLER = ("The river carved a valley over many years while the city grew along its banks. Travellers wrote "
          "letters about the bridges, the markets and the weather, and the letters were kept in a small museum. ")


def tokenize_url(config: EndpointConfig) -> str:
    parts = urlsplit(config.base_url)
    root = parts.path[:-len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urlunsplit((parts.scheme, parts.netloc, root.rstrip("/") + "/tokenize", "", ""))


def server_tokenize(config: EndpointConfig, text: str, model: str | None = None) -> list[int]:
    """The server's token ids of `text` (no special tokens added). Raises EndpointError naming the URL and the fix
    when the server has no tokenize endpoint or answers something else."""
    url = tokenize_url(config)
    # llama.cpp reads `content`; vLLM and SGLang read `prompt` (and `model`); each ignores the other's fields
    body = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
    if model or config.model:
        body["model"] = model or config.model
    try:
        response = httpx.post(url, json=body, headers=config.headers(), timeout=min(config.timeout_s, 30.0))
    except httpx.TransportError as exc:
        raise EndpointError(f"POST {url} failed ({type(exc).__name__}: {exc}): is the server up?") from None
    tokens = None
    if response.status_code == 200:
        try:
            tokens = response.json().get("tokens")
        except (ValueError, AttributeError):
            tokens = None
    if not isinstance(tokens, list) or not all(isinstance(t, (int, dict)) for t in tokens):
        raise EndpointError(f"POST {url} answered HTTP {response.status_code} without a token list: this server has "
                            "no /tokenize endpoint (llama.cpp, vLLM and SGLang have one), so token-exact prompts "
                            "cannot be built for it; give prompts as text, or size them with a local tokenizer "
                            "(--infergate-model naming the served model)")
    return [t["id"] if isinstance(t, dict) else t for t in tokens]  # llama.cpp with_pieces returns objects


def token_exact_requests(config: EndpointConfig, num_requests: int, input_tokens: int | tuple[int, int],
                         output_tokens: int | tuple[int, int], seed: int = 0,
                         model: str | None = None) -> list[EndpointRequest]:
    """`num_requests` completions requests whose prompts are exactly `input_tokens` of the server's tokens (a
    fixed count, or a (low, high) range drawn per request) and whose answers are exactly `output_tokens` long
    (`ignore_eos`, which vLLM, SGLang and llama.cpp honour). Deterministic for a seed."""
    if config.api != "completions":
        raise EndpointError("token-exact prompts are token ids, which only the completions API takes: run with "
                            "--infergate-endpoint-api=completions")
    rng = random.Random(seed)

    def pick(spec: int | tuple[int, int]) -> int:
        value = spec if isinstance(spec, int) else rng.randint(*spec)
        if value < 1:
            raise EndpointError(f"token counts must be at least 1, got {spec!r}")
        return value

    sizes = [(pick(input_tokens), pick(output_tokens)) for _ in range(num_requests)]
    longest = max((n for n, _ in sizes), default=0)
    text = FILLER
    tokens = server_tokenize(config, text, model)
    if not tokens:
        raise EndpointError(f"POST {tokenize_url(config)} returned no tokens for a non-empty text")
    while len(tokens) < 2 * longest:  # room to start each prompt at its own offset
        text += FILLER
        tokens = server_tokenize(config, text, model)
    requests = []
    for index, (n_in, n_out) in enumerate(sizes):
        start = rng.randrange(0, len(tokens) - n_in + 1)  # different prompts: a shared prefix would be cached
        requests.append(EndpointRequest(prompt=tokens[start:start + n_in], max_tokens=n_out,
                                        request_id=f"exact{seed}-{index}", extra_body={"ignore_eos": True}))
    return requests

"""An OpenAI-compatible client that measures what a user of the server sees: TTFT, each chunk's arrival (ITL),
TPOT and end-to-end latency per request, measured on the client's clock, over SSE streaming.

Every request ends in one EndpointResult, successful or with an error kind (`http_503`, `timeout`, `connect`,
`malformed_stream`, `incomplete_stream`); nothing raises out of `send`, so a load run counts every request.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse

from pytest_infergate.errors import InfergateError, OptionError
from pytest_infergate.options import check_endpoint_settings


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

    def __post_init__(self):
        check_endpoint_settings(self.url, self.timeout_s, self.max_concurrency, self.api)

    @property
    def base_url(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"

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

    @classmethod
    def from_engine_request(cls, request, api: str = "chat") -> EndpointRequest:
        """The same request as the reference engine's `Request` (prompt text, chat messages or token ids)."""
        common = dict(max_tokens=request.max_new_tokens, temperature=request.temperature, top_p=request.top_p,
                      seed=request.seed, stop=tuple(request.stop_strings), request_id=request.request_id or "",
                      arrival_s=request.arrival_s)
        if request.messages is not None:
            if api == "chat":
                return cls(messages=request.messages, **common)
            raise OptionError("a chat request (messages) needs --infergate-endpoint-api chat; the completions API "
                              "takes a prompt")
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
        return body

    @property
    def path(self) -> str:
        return "/chat/completions" if self.messages is not None else "/completions"


@dataclass
class EndpointResult:
    """One request as the client saw it. Instants are perf_counter seconds; `error` is None on success."""

    request_id: str
    sent: float = 0.0
    first_token: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    finished: float | None = None
    text: str = ""
    finish_reason: str | None = None
    status: int | None = None  # HTTP status of the answer; None when none came
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # from the server's usage; else the number of text chunks
    usage_reported: bool = False
    error: str | None = None  # http_<status>, timeout, connect, transport, malformed_stream, incomplete_stream,
    # server_error
    error_detail: str = ""
    logprobs: list[dict] = field(default_factory=list)  # [{"token": str, "logprob": float, "top": {str: float}}]

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.sent

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1), as vLLM's benchmark defines it."""
        if not self.ok or not self.output_tokens or self.output_tokens < 2 or self.first_token is None:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("logprobs")
        out.update(ttft_ms=_ms(self.ttft_s), tpot_ms=_ms(self.tpot_s), e2e_ms=_ms(self.e2e_s))
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _choice_text(choice: dict) -> str:
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    if "message" in choice:
        return choice["message"].get("content") or ""
    return choice.get("text") or ""


def _choice_logprobs(choice: dict) -> list[dict]:
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


class EndpointClient:
    """One pooled async HTTP client for an endpoint. Use inside `async with`."""

    def __init__(self, config: EndpointConfig):
        self.config = config
        self.model = config.model
        # in-flight requests are capped by the load pattern's semaphore, not by the connection pool
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        # the read timeout bounds a stall between two chunks; the whole request is bounded in send()
        timeout = httpx.Timeout(config.timeout_s, connect=min(config.timeout_s, 10.0))
        self._http = httpx.AsyncClient(base_url=config.base_url, headers=config.headers(), limits=limits,
                                       timeout=timeout)

    async def __aenter__(self) -> EndpointClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def discover_model(self) -> str:
        """The served model name: --infergate-endpoint-model, else the first one GET /v1/models lists. Raises
        EndpointError with the URL and the fix when the server is down or answers something else."""
        url = self.config.base_url + "/models"
        try:
            response = await self._http.get("/models", timeout=min(self.config.timeout_s, 10.0))
        except httpx.TransportError as exc:
            raise EndpointError(f"endpoint {self.config.base_url} is not reachable ({type(exc).__name__}: {exc}): "
                                "start the server, or fix --infergate-endpoint") from None
        if response.status_code in (401, 403):
            raise EndpointError(f"GET {url} answered {response.status_code}: the server wants an API key; put it in "
                                "an environment variable and name it with --infergate-api-key-env")
        if response.status_code != 200:
            if self.model:  # some servers do not list models; the name given is enough
                return self.model
            raise EndpointError(f"GET {url} answered HTTP {response.status_code}; name the served model with "
                                "--infergate-endpoint-model")
        try:
            served = [m["id"] for m in response.json().get("data", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            raise EndpointError(f"GET {url} did not return an OpenAI model list; is this an OpenAI-compatible "
                                "server? Check --infergate-endpoint") from None
        if self.model:
            return self.model
        if not served:
            raise EndpointError(f"{url} lists no model; name it with --infergate-endpoint-model")
        self.model = served[0]
        return self.model

    async def send(self, request: EndpointRequest, stream: bool = True) -> EndpointResult:
        """Send one request; never raises for a server-side problem (the result says what went wrong)."""
        import asyncio

        body = request.body(self.model or "", stream)  # outside the try: a bad request is our bug, not the server's
        result = EndpointResult(request.request_id)
        result.sent = time.perf_counter()
        try:
            await asyncio.wait_for(self._exchange_once_more_if_stale(request.path, body, stream, result),
                                   timeout=self.config.timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            self._fail(result, "timeout", f"no complete answer within {self.config.timeout_s:g}s "
                                          "(--infergate-endpoint-timeout)")
        except httpx.TransportError as exc:
            self._fail(result, "connect" if isinstance(exc, httpx.ConnectError) else "transport",
                       f"{type(exc).__name__}: {exc}")
        except (SSEError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._fail(result, "malformed_stream", f"{type(exc).__name__}: {exc}")
        return result

    @staticmethod
    def _fail(result: EndpointResult, kind: str, detail: str) -> None:
        result.error, result.error_detail = kind, detail
        result.finished = time.perf_counter()

    async def _exchange_once_more_if_stale(self, path: str, body: dict, stream: bool,
                                           result: EndpointResult) -> None:
        try:
            await self._exchange(path, body, stream, result)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            if result.status is not None:
                raise
            # The server closed or reset a pooled keep-alive connection before any answer began (llama.cpp's
            # server does so after a request that failed mid-stream; which error the client sees depends on the
            # race): that is no verdict on this request, so it goes once more, on a fresh connection. Timeouts
            # and refused connections are verdicts and are not retried. `sent` stays: the client-side latency
            # includes the lost attempt.
            await self._exchange(path, body, stream, result)

    async def _exchange(self, path: str, body: dict, stream: bool, result: EndpointResult) -> None:
        if not stream:
            response = await self._http.post(path, json=body)
            result.status = response.status_code
            if response.status_code != 200:
                return self._fail(result, f"http_{response.status_code}", response.text[:300])
            data = response.json()
            result.first_token = result.finished = time.perf_counter()
            self._take_usage(data, result)
            choice = data["choices"][0]
            result.text, result.finish_reason = _choice_text(choice), choice.get("finish_reason")
            result.logprobs = _choice_logprobs(choice)
            if result.output_tokens is None:
                result.output_tokens = len(result.logprobs) or None
            return None
        async with aconnect_sse(self._http, "POST", path, json=body) as source:
            response = source.response
            result.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                return self._fail(result, f"http_{response.status_code}", response.text[:300])
            pieces: list[str] = []
            done = False
            async for event in source.aiter_sse():
                now = time.perf_counter()
                if event.data == "[DONE]":
                    done = True
                    break
                if not event.data:
                    continue
                data = json.loads(event.data)
                if "error" in data:
                    return self._fail(result, "server_error", str(data["error"])[:300])
                self._take_usage(data, result)
                for choice in data.get("choices") or []:
                    text = _choice_text(choice)
                    if text:
                        if result.first_token is None:
                            result.first_token = now
                        result.chunk_times.append(now)
                        pieces.append(text)
                    result.logprobs += _choice_logprobs(choice)
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
            result.finished = time.perf_counter()
            result.text = "".join(pieces)
            if result.finish_reason is None:  # OpenAI-compatible servers end every choice with one
                ended = "[DONE]" if done else "the end of the stream"
                return self._fail(result, "incomplete_stream", f"{ended} came before any finish_reason: the "
                                  "server cut the answer short")
            if result.output_tokens is None:
                result.output_tokens = len(result.chunk_times)
        return None

    @staticmethod
    def _take_usage(data: dict, result: EndpointResult) -> None:
        usage = data.get("usage")
        if usage:
            result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
            result.output_tokens = usage.get("completion_tokens", result.output_tokens)
            result.usage_reported = True

"""The client side of a load run: an OpenAI-compatible client that measures what a user of the server sees (TTFT,
each chunk's arrival (ITL), TPOT and end-to-end latency per request, on the client's clock, over SSE streaming), and
`drive`, which sends a run's items on their schedule: single requests, and multi-turn sessions whose every turn
carries the server's answers to the turns before it, at most `concurrency` in flight. Every request ends in one
EndpointResult, successful or with an error kind (`http_503`, `timeout`, `malformed_stream`, ...; `cancelled` and
`session_aborted` for what a stopped run did not finish): nothing raises out of `send`, so a run counts every request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx
from httpx_sse import SSEError, aconnect_sse

from pytest_infergate.endpoint.exchange import (
    EndpointConfig,
    EndpointError,
    EndpointRequest,
    EndpointResult,
    choice_logprobs,
    choice_text,
)
from pytest_infergate.workloads.traffic import Session

__all__ = ["EndpointClient", "EndpointConfig", "EndpointError", "EndpointRequest", "EndpointResult"]


# the error of a chat request refused for want of a chat template (EndpointClient._refused)
NO_CHAT_TEMPLATE = "no_chat_template"
# httpcore's trace events that start a request's clock, whichever comes first: a fresh connection's connect, or the
# headers on a kept-alive one (EndpointClient._on_the_wire)
_GOING_OUT = ("connect_tcp.started", "connect_unix_socket.started", "send_request_headers.started")


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
                                f"start the server, or fix {self.config.option}") from None
        if response.status_code in (401, 403):
            raise EndpointError(f"GET {url} answered {response.status_code}: the server wants an API key; put it in "
                                "an environment variable and name it with --infergate-api-key-env")
        if response.status_code != 200:
            if self.model:  # some servers do not list models; the name given is enough
                return self.model
            raise EndpointError(f"GET {url} answered HTTP {response.status_code}; name the served model with "
                                f"{self.config.option}-model")
        try:
            served = [m["id"] for m in response.json().get("data", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            raise EndpointError(f"GET {url} did not return an OpenAI model list; is this an OpenAI-compatible "
                                f"server? Check {self.config.option}") from None
        if self.model:
            return self.model
        if not served:
            raise EndpointError(f"{url} lists no model; name it with {self.config.option}-model")
        self.model = served[0]
        return self.model

    async def send(self, request: EndpointRequest, stream: bool = True) -> EndpointResult:
        """Send one request; never raises for a server-side problem (the result says what went wrong)."""
        body = request.body(self.model or "", stream)  # outside the try: a bad request is our bug, not the server's
        result = EndpointResult(request.request_id)
        result.arrival = time.perf_counter()
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
        if result.ok:  # TPOT runs to the end of the stream, as vLLM's benchmark defines it; a failure has none
            result.decode_end = result.finished
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
            # and refused connections are verdicts and are not retried. `arrival` stays: the client-side latency
            # includes the lost attempt.
            await self._exchange(path, body, stream, result)

    @staticmethod
    def _on_the_wire(result: EndpointResult):
        """httpcore's trace hook: the request's clock starts as it starts to go out, the body encoded: at the TCP
        connect of a connection it opens, else at its headers. Connecting is the server's latency as a user sees
        it: a server with a full accept queue drops the attempt and the client tries again a second later
        (docs/measurements.md). A retried attempt keeps the first one's instant: the lost attempt is latency too."""
        async def trace(event: str, info: dict) -> None:
            if event.endswith(_GOING_OUT) and not result.sent_on_wire:
                result.arrival, result.sent_on_wire = time.perf_counter(), True

        return {"trace": trace}

    async def _exchange(self, path: str, body: dict, stream: bool, result: EndpointResult) -> None:
        if not stream:
            response = await self._http.post(path, json=body, extensions=self._on_the_wire(result))
            result.status = response.status_code
            if response.status_code != 200:
                return self._refused(result, response, path)
            data = response.json()
            result.first_token = result.finished = time.perf_counter()
            self._take_usage(data, result)
            choice = data["choices"][0]
            result.text, result.finish_reason = choice_text(choice), choice.get("finish_reason")
            result.logprobs = choice_logprobs(choice)
            if result.num_output_tokens is None:
                result.num_output_tokens = len(result.logprobs) or None
            return None
        async with aconnect_sse(self._http, "POST", path, json=body, extensions=self._on_the_wire(result)) as source:
            response = source.response
            result.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                return self._refused(result, response, path)
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
                    text = choice_text(choice)
                    if text and result.finish_reason is not None:
                        return self._fail(result, "malformed_stream", "a content chunk came after the chunk with "
                                          f"finish_reason {result.finish_reason!r}: chunks out of order")
                    if text:
                        if result.first_token is None:
                            result.first_token = now
                        result.token_times.append(now)
                        pieces.append(text)
                    result.logprobs += choice_logprobs(choice)
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
            result.finished = time.perf_counter()
            result.text = "".join(pieces)
            if result.finish_reason is None:  # OpenAI-compatible servers end every choice with one
                ended = "[DONE]" if done else "the end of the stream"
                return self._fail(result, "incomplete_stream", f"{ended} came before any finish_reason: the "
                                  "server cut the answer short")
            if result.num_output_tokens is None:
                result.num_output_tokens = len(result.token_times)
            elif result.num_output_tokens < len(result.token_times):
                # every content chunk carries at least one token: fewer tokens than chunks is a usage figure that
                # lies or a chunk sent twice, and tokens/s from either would be wrong
                return self._fail(result, "inconsistent_usage", "usage.completion_tokens is "
                                  f"{result.num_output_tokens} but {len(result.token_times)} content chunks arrived")
        return None

    def _refused(self, result: EndpointResult, response: httpx.Response, path: str) -> None:
        """A non-200 answer, recorded. A chat request refused because the model has no chat template (a base
        model: vLLM answers 400 "... must provide a chat template ...") says so and names the fix."""
        detail = self._refusal(response)
        if path == "/chat/completions" and "chat template" in response.text.lower():
            return self._fail(result, NO_CHAT_TEMPLATE, (
                f"{self.config.base_url} has no chat template for its model (a base model): run with "
                "--infergate-endpoint-api completions, which sends chat workloads and golden samples as a "
                f"plain-text transcript, as the engine sends a base model them (the server said: {detail})"))
        return self._fail(result, f"http_{response.status_code}", detail)

    @staticmethod
    def _refusal(response: httpx.Response) -> str:
        """The answer of a non-200 response, with its Retry-After (429, 503): the request is recorded as refused,
        not re-sent, so the load generator's schedule stays the one asked for."""
        retry = response.headers.get("Retry-After")
        return (f"Retry-After: {retry}; " if retry else "") + response.text[:300]

    @staticmethod
    def _take_usage(data: dict, result: EndpointResult) -> None:
        usage = data.get("usage")
        if usage:
            result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
            result.num_output_tokens = usage.get("completion_tokens", result.num_output_tokens)
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                result.cached_tokens = int(details["cached_tokens"])
            result.usage_reported = True


# drive: a session holds its place between turns, as a user in a chat does; a run stops early (a capacity point
# that can no longer pass) or at a deadline (the search's time budget)
CANCELLED = "cancelled"
SESSION_ABORTED = "session_aborted"
NOT_SENT = (CANCELLED,)  # outcomes of requests the run itself stopped: not a verdict on the server


def item_ids(item: EndpointRequest | Session) -> list[str]:
    return [item.turn_id(i) for i in range(len(item.turns))] if isinstance(item, Session) else [item.request_id]


def session_request(session: Session, index: int, answers: list[str], api: str) -> EndpointRequest:
    """A session's turn `index` after the server's `answers`: chat messages, or under the completions API (a base
    model's server) the conversation as one plain-text transcript."""
    return EndpointRequest.from_engine_request(session.request(index, answers), api)


def warmup_request(item: EndpointRequest | Session, api: str = "chat") -> EndpointRequest:
    """A short request like `item` (a session's first turn), sent before a run and not counted."""
    first = item if isinstance(item, EndpointRequest) else session_request(item, 0, [], api)
    return replace(first, max_tokens=min(first.max_tokens, 8))


@dataclass
class DriveOutcome:
    results: list[EndpointResult]  # every request of every item, in item order
    duration_s: float
    stopped: str = ""  # "", "stopped early", "deadline"
    started: float = 0.0  # the perf_counter instant the offsets count from


class _Item:
    """One item's requests as they end; `close` gives the ones that never ended a counted outcome."""

    def __init__(self, item: EndpointRequest | Session):
        self.item = item
        self.ids = item_ids(item)
        self.results: list[EndpointResult] = []
        self.failed: EndpointResult | None = None

    def close(self) -> list[EndpointResult]:
        now = time.perf_counter()
        for request_id in self.ids[len(self.results):]:
            result = EndpointResult(request_id, arrival=now, finished=now)
            if self.failed is not None:
                result.error = SESSION_ABORTED
                result.error_detail = f"turn {self.failed.request_id} failed ({self.failed.error}): not sent"
            else:
                result.error, result.error_detail = CANCELLED, "the load run stopped before this request ended"
            self.results.append(result)
        return self.results


async def drive(client: EndpointClient, items: list, offsets: list[float], concurrency: int, stream: bool = True,
                stop: Callable[[list[EndpointResult], int], bool] | None = None,
                deadline: float | None = None) -> DriveOutcome:
    """Send `items` (EndpointRequest or Session) at `offsets` seconds from now, at most `concurrency` at once.
    `stop(results so far, requests in flight)` true, or the perf_counter `deadline` passed: what is in flight is
    cancelled. A stop is told what is still in flight: the requests that end first are the fast ones, and a
    verdict on them alone would be a survivor's."""
    gate = asyncio.Semaphore(concurrency)
    finished: list[EndpointResult] = []
    stop_now = asyncio.Event()
    start = time.perf_counter()
    states = [_Item(item) for item in items]
    in_flight = 0

    async def send(state: _Item, request: EndpointRequest) -> EndpointResult:
        nonlocal in_flight
        in_flight += 1
        try:
            result = await client.send(request, stream)
        finally:
            in_flight -= 1
        state.results.append(result)
        finished.append(result)
        if stop is not None and stop(finished, in_flight):
            stop_now.set()
        return result

    async def one(state: _Item, offset: float) -> None:
        try:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                if isinstance(state.item, EndpointRequest):
                    await send(state, state.item)
                    return
                await _converse(client, state, send)
        except asyncio.CancelledError:
            pass  # the run stopped; close() counts what is left

    tasks = [asyncio.create_task(one(state, offset)) for state, offset in zip(states, offsets)]
    everything = asyncio.ensure_future(asyncio.gather(*tasks))
    stopper = asyncio.ensure_future(stop_now.wait())
    timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
    await asyncio.wait({everything, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    stopped = ""
    if not all(task.done() for task in tasks):  # a stop decided by the last request to end stopped nothing
        stopped = "stopped early" if stop_now.is_set() else "deadline"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(everything, return_exceptions=True)
    stopper.cancel()
    duration = time.perf_counter() - start
    return DriveOutcome([result for state in states for result in state.close()], duration, stopped, start)


async def _converse(client: EndpointClient, state: _Item, send) -> None:
    session: Session = state.item
    answers: list[str] = []
    for index in range(len(session.turns)):
        if index and session.think_time_s:
            await asyncio.sleep(session.think_time_s)
        result = await send(state, session_request(session, index, answers, client.config.api))
        if not result.ok:
            state.failed = result
            return
        answers.append(result.text)

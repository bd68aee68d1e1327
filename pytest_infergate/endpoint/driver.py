"""Sends a load run's items on their schedule: single requests, and multi-turn sessions whose every turn carries
the answers the server gave to the turns before it. At most `concurrency` items are in flight (a session holds
its place between turns, as a user in a chat does). A run can be stopped early (a capacity point that can no
longer pass) or at a deadline (the search's time budget); what it did not finish still ends in one counted
result each: `cancelled`, or `session_aborted` for the turns after a turn that failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pytest_infergate.endpoint.client import EndpointClient
from pytest_infergate.endpoint.exchange import EndpointRequest, EndpointResult
from pytest_infergate.workloads.traffic import Session

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
            result = EndpointResult(request_id, sent=now, finished=now)
            if self.failed is not None:
                result.error = SESSION_ABORTED
                result.error_detail = f"turn {self.failed.request_id} failed ({self.failed.error}): not sent"
            else:
                result.error, result.error_detail = CANCELLED, "the load run stopped before this request ended"
            self.results.append(result)
        return self.results


async def drive(client: EndpointClient, items: list, offsets: list[float], concurrency: int, stream: bool = True,
                stop: Callable[[list[EndpointResult]], bool] | None = None,
                deadline: float | None = None) -> DriveOutcome:
    """Send `items` (EndpointRequest or Session) at `offsets` seconds from now, at most `concurrency` at once.
    `stop(results so far)` true, or the perf_counter `deadline` passed: what is in flight is cancelled."""
    gate = asyncio.Semaphore(concurrency)
    finished: list[EndpointResult] = []
    stop_now = asyncio.Event()
    start = time.perf_counter()
    states = [_Item(item) for item in items]

    def record(state: _Item, result: EndpointResult) -> None:
        state.results.append(result)
        finished.append(result)
        if stop is not None and stop(finished):
            stop_now.set()

    async def one(state: _Item, offset: float) -> None:
        try:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                if isinstance(state.item, EndpointRequest):
                    record(state, await client.send(state.item, stream))
                    return
                await _converse(client, state, stream, record)
        except asyncio.CancelledError:
            pass  # the run stopped; close() counts what is left

    tasks = [asyncio.create_task(one(state, offset)) for state, offset in zip(states, offsets)]
    everything = asyncio.ensure_future(asyncio.gather(*tasks))
    stopper = asyncio.ensure_future(stop_now.wait())
    timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
    await asyncio.wait({everything, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    stopped = ""
    if not everything.done():
        stopped = "stopped early" if stop_now.is_set() else "deadline"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(everything, return_exceptions=True)
    stopper.cancel()
    duration = time.perf_counter() - start
    return DriveOutcome([result for state in states for result in state.close()], duration, stopped, start)


async def _converse(client: EndpointClient, state: _Item, stream: bool, record) -> None:
    session: Session = state.item
    answers: list[str] = []
    for index in range(len(session.turns)):
        if index and session.think_time_s:
            await asyncio.sleep(session.think_time_s)
        result = await client.send(session_request(session, index, answers, client.config.api), stream)
        record(state, result)
        if not result.ok:
            state.failed = result
            return
        answers.append(result.text)

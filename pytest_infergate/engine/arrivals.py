"""generate(): a workload's requests submitted at their arrival times (`Request.arrival_s`, replayed from the call's
start) and the engine stepped until every one has ended; every request checked before the first is queued."""

from __future__ import annotations

import time
from collections.abc import Iterable

from pytest_infergate.engine.sequence import Result
from pytest_infergate.workloads.request import Request, RequestError, render_prompt


def generate(engine, requests: Iterable[Request]) -> list[Result]:
    """Run `requests` on `engine` (an engine.engine.Engine) to completion and return their results in order. A
    request's `arrival_s` is replayed: it is submitted that many seconds after the call starts (0 = all at once)."""
    requests = list(requests)
    check_all(engine, requests)
    start = engine.now()
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    ids: list[str | None] = [None] * len(requests)
    cursor = 0
    while True:
        now = engine.now()
        while cursor < len(order) and start + requests[order[cursor]].arrival_s <= now:
            index = order[cursor]
            ids[index] = engine.submit(requests[index], arrival=start + requests[index].arrival_s)
            cursor += 1
        more = cursor < len(order)
        if engine.scheduler.num_unfinished == 0:
            if not more:
                break
            time.sleep(max(0.0, start + requests[order[cursor]].arrival_s - engine.now()))
            continue
        engine.step(more_arrivals=more)
        if not engine.scheduler.running:
            # a static/dynamic batch is still forming: wait a little for arrivals or the window to close
            time.sleep(0.001)
    return [engine.result(i) for i in ids]


def check_all(engine, requests: list[Request]) -> None:
    """Every request a generate() call would submit, checked before the first is queued: a bad one raises
    RequestError naming it and the engine is left as it was (nothing queued, no id taken)."""
    seen: set[str] = set()
    for index, request in enumerate(requests):
        try:
            engine.limits.check(request, render_prompt(engine.tokenizer, request))
        except RequestError as exc:
            raise RequestError(f"request {index}: {exc}; nothing of this generate() call was queued") from None
        rid = request.request_id
        if rid is not None and (rid in engine._sequences or rid in seen):
            raise RequestError(f"request {index}: request id {rid!r} is already in use; nothing of this "
                               "generate() call was queued")
        if rid is not None:
            seen.add(rid)

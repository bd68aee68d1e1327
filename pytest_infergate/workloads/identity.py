"""Which workload a measurement ran, as its fingerprint records it: a stored baseline's timings gate a run of the
same requests, so a workload that changed since the save is a change under test, named in the verdict
("workload.prompt_tokens 377 → 646") — not "nothing under test changed", which sends a reviewer to their code."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from pytest_infergate.environment import WORKLOAD_DIGEST
from pytest_infergate.workloads.request import Request, RequestError, render_prompt
from pytest_infergate.workloads.traffic import Session


def workload_identity(requests: list[Request | Session], tokenizer) -> dict[str, Any]:
    """How many requests (a session's turns each count), their prompt tokens as the model sees them (requests only:
    a later turn's prompt holds the answers before it), the tokens they may generate, and a digest of every field
    of every request (prompts, sampling, arrivals)."""
    turns = [turn for item in requests if isinstance(item, Session) for turn in item.turns]
    plain = [item for item in requests if isinstance(item, Request)]
    identity: dict[str, Any] = {"requests": len(plain) + len(turns)}
    if not turns:
        try:
            identity["prompt_tokens"] = sum(len(render_prompt(tokenizer, request)) for request in plain)
        except RequestError:
            pass  # the measurement says what is wrong with the request, in its own words
    identity["max_new_tokens"] = sum(r.max_new_tokens for r in plain) + sum(t.max_new_tokens for t in turns)
    text = json.dumps([asdict(item) | {"request_id": None} if isinstance(item, Request) else asdict(item)
                       for item in requests], sort_keys=True, default=str)
    identity[WORKLOAD_DIGEST] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return identity

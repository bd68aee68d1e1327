"""What crosses the pipe between a pytest run and its baseline environment's worker (perf.env_worker): requests,
sessions and engine configs as JSON, one message a line.

JSON and not pickle: the two sides run different library versions on purpose, and may run different versions of
pytest-infergate; a field one side does not know is named in an error instead of failing deep inside unpickling.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.errors import InfergateError
from pytest_infergate.workloads.request import Request
from pytest_infergate.workloads.traffic import Session, Turn

# Bumped whenever a message changes shape: both sides must speak the same one.
PROTOCOL = 2  # 2: prepare, and begin / step / finish for a step-locked A/B


class WireError(InfergateError):
    """A message one side cannot read (another pytest-infergate on the other side, a field it does not know)."""


def _known(cls, data: dict, what: str) -> dict:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise WireError(f"{what} fields {', '.join(unknown)} are unknown to this pytest-infergate: install the "
                        "same pytest-infergate in both environments")
    return data


def item_to_wire(item: Request | Session) -> dict[str, Any]:
    if isinstance(item, Session):
        return {"session": asdict(item)}
    if isinstance(item, Request):
        return {"request": asdict(item)}
    raise WireError(f"a workload item must be a Request or a Session, got {type(item).__name__}")


def item_from_wire(data: dict[str, Any]) -> Request | Session:
    if "session" in data:
        session = dict(_known(Session, data["session"], "Session"))
        session["turns"] = [Turn(**_known(Turn, turn, "Turn")) for turn in session["turns"]]
        return Session(**session)
    if "request" in data:
        return Request(**_known(Request, data["request"], "Request"))
    raise WireError(f"a workload item on the wire is a request or a session, got keys {sorted(data)}")


def config_to_wire(config: EngineConfig) -> dict[str, Any]:
    return config.to_dict()


def config_from_wire(data: dict[str, Any]) -> EngineConfig:
    return EngineConfig(**_known(EngineConfig, data, "EngineConfig"))


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, default=str) + "\n"


def decode(line: str, source: str) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WireError(f"{source} wrote a line that is not a protocol message ({exc}): {line[:200]!r}") from None
    if not isinstance(message, dict):
        raise WireError(f"{source} wrote {type(message).__name__} where a protocol message (an object) belongs")
    return message

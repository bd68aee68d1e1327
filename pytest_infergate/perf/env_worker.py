"""The baseline environment's side of `--infergate-baseline-python` (`python -m pytest_infergate.perf.env_worker`,
started with that interpreter): it loads the same model and runs one repetition of a workload, or one engine step of
it, each time the pytest run asks (perf.baseline_env, perf.lockstep); and the protocol both sides speak: requests,
sessions and engine configs as JSON, one message a line on stdin / stdout. JSON and not pickle: the two sides run
other library versions on purpose, so a field one side does not know is named in an error (`WireError`). Libraries'
prints go to stderr, which the pytest side quotes in its errors. The messages (`run`, `prepare`, `begin` / `step` /
`finish`, `forget`) and their replies: docs/guides/library-upgrade.md, 'What runs in the old environment'.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, TextIO

from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.errors import InfergateError
from pytest_infergate.requirements import import_torch
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


class Worker:
    def __init__(self):
        self.benches: dict[tuple, Any] = {}  # (model, precision, device, reference, backend) -> perf.local_bench.Bench
        self.measurements: dict[str, Any] = {}
        self.stepping: dict[str, Any] = {}  # id -> perf.lockstep.LocalSide of the repetition begun under that id

    def hello(self) -> dict[str, Any]:
        import pytest_infergate
        from pytest_infergate.environment import library_versions

        return {"protocol": PROTOCOL, "infergate": pytest_infergate.__version__, "versions": library_versions(),
                "python": sys.executable}

    def bench(self, message: dict[str, Any]):
        from pytest_infergate.engine.backends import choose_backend
        from pytest_infergate.models import load_model, resolve_model
        from pytest_infergate.perf.local_bench import Bench

        key = tuple(message[name] for name in ("model", "precision", "device", "reference", "backend"))
        if key not in self.benches:
            model, precision, device, reference, backend = key
            loaded = load_model(resolve_model(model, Path(message["cache_dir"])), precision, device, reference)
            loaded.use_backend(choose_backend(loaded.model, loaded.tokenizer, backend))
            self.benches[key] = Bench(loaded, device, calibrate=False)
        return self.benches[key]

    def _measurement(self, measurement_id: str):
        from pytest_infergate.measurement import Measurement

        return self.measurements.setdefault(measurement_id, Measurement(label="baseline environment"))

    def _measured(self, bench, measurement_id: str) -> dict[str, Any]:
        return {"ok": True, "measurement": self.measurements[measurement_id].to_dict(),
                "model": bench.loaded.record.to_dict()}

    def prepare(self, message: dict[str, Any]) -> dict[str, Any]:
        bench = self.bench(message)
        backend = bench.engine(config_from_wire(message["config"]))
        return {"ok": True, "backend": backend.name, "model": bench.loaded.record.to_dict()}

    def run(self, message: dict[str, Any]) -> dict[str, Any]:
        torch = import_torch()

        torch.set_num_threads(int(message["threads"]))
        bench = self.bench(message)
        bench.run_once([item_from_wire(item) for item in message["requests"]], config_from_wire(message["config"]),
                       int(message["warmup"]), self._measurement(message["id"]), probe=False)
        return self._measured(bench, message["id"])

    def begin(self, message: dict[str, Any]) -> dict[str, Any]:
        torch = import_torch()

        from pytest_infergate.perf.lockstep import LocalSide

        torch.set_num_threads(int(message["threads"]))
        self.abort(message["id"])
        side = LocalSide(self.bench(message), [item_from_wire(item) for item in message["requests"]],
                         config_from_wire(message["config"]), int(message["warmup"]))
        self._measurement(message["id"])
        side.begin()
        self.stepping[message["id"]] = side
        return {"ok": True}

    def _side(self, measurement_id: str):
        side = self.stepping.get(measurement_id)
        if side is None:
            raise KeyError(f"no repetition begun under {measurement_id!r}: send begin first")
        return side

    def step(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"ok": True, "running": self._side(message["id"]).step()}
        except Exception:
            self.abort(message["id"])
            raise

    def finish(self, message: dict[str, Any]) -> dict[str, Any]:
        side = self._side(message["id"])
        del self.stepping[message["id"]]
        side.finish(self.measurements[message["id"]])
        return self._measured(side.bench, message["id"])

    def abort(self, measurement_id: str) -> None:
        side = self.stepping.pop(measurement_id, None)
        if side is not None:
            side.abort()

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        handlers = {"prepare": self.prepare, "run": self.run, "begin": self.begin, "step": self.step,
                    "finish": self.finish}
        if op in handlers:
            return handlers[op](message)
        if op == "forget":
            self.abort(message.get("id"))
            self.measurements.pop(message.get("id"), None)
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r} (protocol {PROTOCOL})"}

    def close(self) -> None:
        for bench in self.benches.values():
            bench.close()


def serve(incoming: TextIO, outgoing: TextIO) -> None:
    worker = Worker()
    try:
        outgoing.write(encode(worker.hello()))
        outgoing.flush()
        for line in incoming:
            if not line.strip():
                continue
            try:
                reply = worker.handle(decode(line, "the pytest run"))
            except Exception as exc:  # reported to the pytest side, which names this environment in its error
                traceback.print_exc(file=sys.stderr)
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            outgoing.write(encode(reply))
            outgoing.flush()
    finally:
        worker.close()


def main() -> None:
    protocol_out = sys.stdout
    sys.stdout = sys.stderr  # a library's print must not land in the protocol stream
    serve(sys.stdin, protocol_out)


if __name__ == "__main__":
    main()

"""The baseline environment's side of `--infergate-baseline-python`: a process started with that interpreter
(`python -m pytest_infergate.perf.env_worker`) that loads the same model and runs one repetition of a workload, or
one engine step of it, each time the pytest run asks, so the two environments' repetitions can alternate
(perf.baseline_env, perf.lockstep). Messages are JSON lines (perf.env_wire) on stdin / stdout; whatever libraries
print goes to stderr, which the pytest side keeps for its error messages. The messages (`run`, `prepare`, `begin` /
`step` / `finish`, `forget`) and their replies: docs/guides/library-upgrade.md, 'What runs in the old environment'.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any, TextIO

from pytest_infergate.lazy import import_torch
from pytest_infergate.perf.env_wire import PROTOCOL, config_from_wire, decode, encode, item_from_wire


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

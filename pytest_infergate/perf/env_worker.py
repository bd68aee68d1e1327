"""The baseline environment's side of `--infergate-baseline-python`: a process started with that interpreter
(`python -m pytest_infergate.perf.env_worker`) that loads the same model and runs one repetition of a workload
each time the pytest run asks, so the two environments' repetitions can alternate (perf.baseline_env).

Messages are JSON lines (perf.env_wire) on stdin / stdout; everything libraries print goes to stderr, which the
pytest side keeps for its error messages. The first line out says who this is (protocol, library versions); then
one reply per request line:
- `{"op": "run", "id", "model", "precision", "device", "reference", "backend", "cache_dir", "threads",
  "config", "requests", "warmup"}`: one more repetition into the measurement named `id` (begun at the first
  request with that id), as `Bench.run_once` measures it in the pytest run; the reply holds the whole
  measurement so far and the loaded model's record.
- `{"op": "forget", "id"}`: that measurement is no longer needed.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any, TextIO

from pytest_infergate.perf.env_wire import PROTOCOL, config_from_wire, decode, encode, item_from_wire


class Worker:
    def __init__(self):
        self.benches: dict[tuple, Any] = {}  # (model, precision, device, reference, backend) -> perf.bench.Bench
        self.measurements: dict[str, Any] = {}

    def hello(self) -> dict[str, Any]:
        import pytest_infergate
        from pytest_infergate.environment import library_versions

        return {"protocol": PROTOCOL, "infergate": pytest_infergate.__version__, "versions": library_versions(),
                "python": sys.executable}

    def bench(self, message: dict[str, Any]):
        from pytest_infergate.engine.backends import choose_backend
        from pytest_infergate.models import load_model, resolve_model
        from pytest_infergate.perf.bench import Bench

        key = tuple(message[name] for name in ("model", "precision", "device", "reference", "backend"))
        if key not in self.benches:
            model, precision, device, reference, backend = key
            loaded = load_model(resolve_model(model, Path(message["cache_dir"])), precision, device, reference)
            loaded.use_backend(choose_backend(loaded.model, loaded.tokenizer, backend))
            self.benches[key] = Bench(loaded, device, calibrate=False)
        return self.benches[key]

    def run(self, message: dict[str, Any]) -> dict[str, Any]:
        import torch

        from pytest_infergate.perf.metrics import Measurement

        torch.set_num_threads(int(message["threads"]))
        bench = self.bench(message)
        measurement = self.measurements.setdefault(message["id"], Measurement(label="baseline environment"))
        bench.run_once([item_from_wire(item) for item in message["requests"]], config_from_wire(message["config"]),
                       int(message["warmup"]), measurement, probe=False)
        return {"ok": True, "measurement": measurement.to_dict(), "model": bench.loaded.record.to_dict()}

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "run":
            return self.run(message)
        if op == "forget":
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

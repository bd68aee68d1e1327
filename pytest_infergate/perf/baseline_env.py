"""`--infergate-baseline-python PYTHON`: the baseline is another Python environment (the venv with the torch,
transformers or bitsandbytes being upgraded from), measured now, repetition for repetition alternately with this
run, instead of numbers stored hours earlier: a library upgrade cannot be A/B-tested in one process, and a stored
baseline on a shared machine is at the mercy of the machine's speed between the two runs. The worker
(perf.env_worker) runs in the other environment, with pytest-infergate installed there; started once per pytest
process, it keeps each model it loaded and runs one repetition per request while this process waits (the two never
run at once). Why, with the measurements: docs/explanation/perf-gates.md, 'A library upgrade on a shared machine';
docs/measurements.md, 'Gate power against a stored baseline'.
"""

from __future__ import annotations

import os
import select
import subprocess
import tempfile
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from pytest_infergate import context
from pytest_infergate.errors import InfergateError
from pytest_infergate.measurement import Measurement
from pytest_infergate.options import BASELINE_PYTHON_FLAG as FLAG
from pytest_infergate.options import resolve_python
from pytest_infergate.perf import lockstep
from pytest_infergate.perf.env_worker import PROTOCOL, WireError, config_to_wire, decode, encode, item_to_wire
from pytest_infergate.perf.interleaved import by_repetition, evaluate_ab
from pytest_infergate.perf.outcome import Budget, PerfOutcome, Route

STDERR_TAIL = 2000  # characters of the worker's stderr quoted in an error


class BaselineEnvError(InfergateError):
    """The baseline environment's worker could not start or could not run a workload; the message says why."""


@dataclass(frozen=True)
class Workload:
    """What the worker needs to run the same workload as this process: the model as the user named it, the
    precision actually loaded here, where and on which backend, and the engine config."""

    model: str
    precision: str
    device: str
    reference: str
    backend: str
    cache_dir: str
    threads: int
    config: Any  # EngineConfig
    requests: list
    warmup: int

    @cached_property
    def _wired(self) -> dict[str, Any]:  # the same every repetition: serialized once
        return {"op": "run", "model": self.model, "precision": self.precision, "device": self.device,
                "reference": self.reference, "backend": self.backend, "cache_dir": self.cache_dir,
                "threads": self.threads, "config": config_to_wire(self.config),
                "requests": [item_to_wire(item) for item in self.requests], "warmup": self.warmup}

    def message(self, measurement_id: str, op: str = "run") -> dict[str, Any]:
        return {**self._wired, "op": op, "id": measurement_id}

    @property
    def doing(self) -> str:
        return f"running {self.model} in {self.precision} on {self.device}"


class BaselineEnv:
    """The worker process of one baseline environment."""

    def __init__(self, python: str, startup_timeout_s: float = 300.0):
        self.python = resolve_python(python)
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="infergate-baseline-env-")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            self._process = subprocess.Popen([self.python, "-m", "pytest_infergate.perf.env_worker"],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                             text=True, env=env)
        except OSError as exc:
            raise BaselineEnvError(f"{FLAG} {self.python}: cannot start it: {exc}") from None
        self.model_records: dict[str, dict] = {}  # precision -> the worker's LoadRecord of that model, as a dict
        context.report(f"starting the baseline environment's worker ({self.python}; up to "
                        f"{startup_timeout_s:g} s)")
        try:
            hello = self._read("starting", timeout_s=startup_timeout_s)
        except BaselineEnvError:
            self.close()  # a worker that wrote something else first may still be running
            raise
        if hello.get("protocol") != PROTOCOL:
            self.close()
            raise BaselineEnvError(f"{FLAG} {self.python}: its pytest-infergate {hello.get('infergate', '?')} speaks "
                                   f"protocol {hello.get('protocol')}, this one {PROTOCOL}: install the same "
                                   "pytest-infergate in both environments")
        self.versions: dict[str, str] = dict(hello.get("versions") or {})

    def _stderr_tail(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        text = self._stderr.read()
        self._stderr.seek(0, os.SEEK_END)
        return text[-STDERR_TAIL:].strip()

    def _read(self, doing: str, timeout_s: float | None = None) -> dict[str, Any]:
        if timeout_s is not None and not self._answers_within(timeout_s):
            self._process.kill()
            self._process.wait()
            raise BaselineEnvError(f"{FLAG} {self.python}: no answer after {timeout_s:g} s while {doing} (the "
                                   "interpreter hangs, or importing torch there is that slow): check that it runs "
                                   "`python -m pytest_infergate.perf.env_worker`, or raise "
                                   f"--infergate-baseline-python-timeout\n{self._stderr_tail()}")
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait()
            tail = self._stderr_tail()
            hint = (" — pytest-infergate is not installed there: install it in that environment (pip install -e "
                    "<this checkout>, or the same version as here)" if "No module named 'pytest_infergate'" in tail
                    else "")
            raise BaselineEnvError(f"{FLAG} {self.python}: the worker ended (exit code {code}) while {doing}"
                                   f"{hint}\n{tail}")
        try:
            return decode(line, f"the baseline environment's worker ({self.python})")
        except WireError as exc:
            raise BaselineEnvError(str(exc)) from None

    def _answers_within(self, timeout_s: float) -> bool:
        """Whether the worker writes (or ends) within `timeout_s`; nothing read yet, so the pipe has no buffer."""
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        return bool(ready)

    def ask(self, message: dict[str, Any], doing: str) -> dict[str, Any]:
        try:
            self._process.stdin.write(encode(message))
            self._process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._read(doing)  # the worker is gone: this raises with its exit code and stderr
        reply = self._read(doing)
        if not reply.get("ok"):
            raise BaselineEnvError(f"{FLAG} {self.python}: {doing} failed in the baseline environment: "
                                   f"{reply.get('error', 'no reason given')}")
        return reply

    def prepare(self, workload: Workload) -> str:
        """Load `workload`'s model there and build its backend; returns the backend's name ("engine", or HF
        generate where the engine refused the model in that environment)."""
        reply = self.ask(workload.message("", "prepare"), f"loading {workload.model} in {workload.precision}")
        self.model_records[workload.precision] = dict(reply.get("model") or {})
        return str(reply.get("backend", ""))

    def repetition(self, measurement_id: str, workload: Workload, into: Measurement) -> None:
        """One more repetition of `workload` in the baseline environment; `into` becomes the worker's measurement
        `measurement_id` so far (its label kept)."""
        self.adopt(self.ask(workload.message(measurement_id), workload.doing), workload, into)

    def adopt(self, reply: dict[str, Any], workload: Workload, into: Measurement) -> None:
        """A reply holding the worker's measurement so far: copied into `into` (its label kept)."""
        measured = Measurement.from_dict(reply["measurement"])
        for f in fields(Measurement):
            if f.name != "label":
                setattr(into, f.name, getattr(measured, f.name))
        self.model_records[workload.precision] = dict(reply.get("model") or {})

    def side(self, measurement_id: str, workload: Workload) -> EnvSide:
        """The baseline environment as one side of a step-locked A/B (perf.lockstep)."""
        return EnvSide(self, measurement_id, workload)

    def ab(self, measurement_id: str, workload: Workload, bench, budget: Budget, rounds: int
           ) -> tuple[Measurement, PerfOutcome, str, str]:
        """The workload here on `bench` (perf.local_bench.Bench: B) against this environment (A), alternately
        (step-locked where both sides can step), gated as an interleaved A/B on `budget` (perf.interleaved.evaluate_ab).
        Returns B's Measurement, the outcome, the backend A ran on, and why it is not step-locked ("" if it is)."""
        requests, config, warmup = workload.requests, workload.config, workload.warmup
        theirs = self.prepare(workload)
        refused = lockstep.refusal(requests, {"A": theirs, "B": bench.engine(config).name})
        if refused:
            run_round = by_repetition(lambda m: self.repetition(measurement_id, workload, m),
                                      lambda m: bench.run_once(requests, config, warmup, m, probe=False))
        else:
            run_round = lockstep.rounds(self.side(measurement_id, workload),
                                        lockstep.LocalSide(bench, requests, config, warmup))
        b, outcome = evaluate_ab(run_round, budget, rounds, route=Route.ENVIRONMENT)
        self.forget(measurement_id)
        return b, outcome, theirs, refused

    def forget(self, measurement_id: str) -> None:
        self.ask({"op": "forget", "id": measurement_id}, "forgetting a finished measurement")

    def differences(self, here: dict[str, str]) -> list[str]:
        """The libraries whose versions differ: `name <in the baseline environment> -> <here>`."""
        names = sorted(set(here) | set(self.versions))
        return [f"{name} {self.versions.get(name, 'not installed')} -> {here.get(name, 'not installed')}"
                for name in names if here.get(name) != self.versions.get(name)]

    def describe(self, here: dict[str, str]) -> str:
        changed = self.differences(here)
        return (f"baseline environment {self.python} (baseline -> this run: {', '.join(changed)})" if changed
                else f"baseline environment {self.python} (same library versions as this run)")

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for stream in (self._process.stdout, self._stderr):
            try:
                stream.close()
            except OSError:
                pass


class EnvSide:
    """One repetition in the baseline environment, driven step by step (a perf.lockstep.StepSide): the worker
    takes a step each time this process asks, so the two environments' steps take turns."""

    def __init__(self, env: BaselineEnv, measurement_id: str, workload: Workload):
        self.env, self.measurement_id, self.workload = env, measurement_id, workload

    @property
    def pid(self) -> int:
        """The worker's process: ours, not a co-tenant, when the round reads how busy the machine was."""
        return self.env._process.pid

    def begin(self) -> None:
        self.env.ask(self.workload.message(self.measurement_id, "begin"), self.workload.doing)

    def step(self) -> bool:
        return bool(self.env.ask({"op": "step", "id": self.measurement_id}, self.workload.doing)["running"])

    def finish(self, into: Measurement) -> None:
        reply = self.env.ask({"op": "finish", "id": self.measurement_id}, self.workload.doing)
        self.env.adopt(reply, self.workload, into)

    def abort(self) -> None:
        try:  # a failed round: the worker drops the repetition (and this measurement) if it still can
            self.env.ask({"op": "forget", "id": self.measurement_id}, "dropping a failed repetition")
        except BaselineEnvError:
            pass

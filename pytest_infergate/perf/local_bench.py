"""Run a workload on a loaded model's backend (the reference engine, or HF generate where the engine refused the
model: engine.backends) and turn what happened into a Measurement. The known regressions injected on purpose, to
check that a gate catches them, are perf.injections'."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

from pytest_infergate import context, process_meters
from pytest_infergate.engine import EngineConfig
from pytest_infergate.engine.backends import choice_for
from pytest_infergate.engine.sequence import Limits, Result
from pytest_infergate.measurement import LATENCY_METRICS, Measurement, add_request_latencies, note_per_repetition
from pytest_infergate.perf import calibration, interference, thread_speed
from pytest_infergate.perf.conversations import (
    PREFIX_CACHE_KEY,
    PrefixCacheUse,
    count_sessions,
    first_turn,
    fresh_items,
    planned_requests,
    run_items,
)
from pytest_infergate.process_meters import PeakMemory, PeakMemoryResult
from pytest_infergate.requirements import import_torch
from pytest_infergate.wait_clock import WaitClock
from pytest_infergate.workloads.request import Request
from pytest_infergate.workloads.traffic import Session

MIB = 1024 * 1024


def fresh_copies(requests: list[Request], run: int = 0) -> list[Request]:
    """Requests and sessions carry ids; a repetition needs new ones (`run` names a repetition's sessions)."""
    return fresh_items(requests, run)


def warmup_requests(requests: list[Request | Session], count: int) -> list[Request]:
    """Shortened copies of the first `count` items (a session's first turn), run before a repetition."""
    warm = [replace(first_turn(r), request_id=None, max_new_tokens=min(first_turn(r).max_new_tokens, 8),
                    arrival_s=0.0, metadata={"warmup": True}) for r in requests[:count]]
    return warm


class Bench:
    """Measures workloads for one loaded model on its backend (`choice_for(loaded)`). Repetitions reuse one
    backend per engine config."""

    def __init__(self, loaded, device: str = "cpu", calibrate: bool | None = None):
        """`calibrate`: run the calibration probe during every repetition (default: on a CPU device, when numpy is
        there), so a comparison with a stored baseline can be normalized for how fast the machine is now."""
        self.loaded = loaded
        self.device = device
        self.calibrate = calibration.available() and device == "cpu" if calibrate is None else calibrate
        self._engines: dict[str, object] = {}  # repr(config) -> Engine or HFGenerateBackend
        self._sampler: calibration.Sampler | None = None
        self._runs = itertools.count()  # names each repetition's sessions apart on an engine that remembers ids
        self._kv_budget_notes: dict[int, str] = {}  # id(engine) -> how its KV budget was chosen (Bench.sized)
        # what runs beside each repetition's workload, inside its memory and time region (held_allocation: memory
        # a change holds while serving, injected to prove the memory gate's power)
        self.beside_repetition: Callable[[], AbstractContextManager] = nullcontext

    def engine(self, config: EngineConfig, instance: int = 0):
        """The backend that runs `config` (OptionError under HF generate for what only the engine does).
        `instance` 1, 2, ...: another engine of the same config (its own cache and scheduler), for a step-locked
        A/B of a model against itself (perf.lockstep)."""
        key = repr(config) + (f"#{instance}" if instance else "")
        if key not in self._engines:
            self._engines[key] = choice_for(self.loaded).build(self.loaded.model, self.loaded.tokenizer,
                                                               replace(config))
        return self._engines[key]

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def sampler(self) -> calibration.Sampler | None:
        """The calibration probe's sampler process, started at the first calibrated repetition on the engine's
        number of threads; None if it cannot start (the repetitions are then not calibrated)."""
        if self._sampler is None:
            torch = import_torch()

            try:
                self._sampler = calibration.Sampler(threads=torch.get_num_threads())
            except OSError:
                return None
        return self._sampler

    def run_once(self, requests: list[Request | Session], config: EngineConfig, warmup: int,
                 into: Measurement, probe: bool | None = None) -> list[Result]:
        """One repetition: warm-up requests (not counted), then the workload, appended to `into`; with `probe`
        (default: `self.calibrate`) the calibration probe runs right before, during and right after the workload.
        Multi-turn `Session`s in the workload run turn by turn (perf/conversations.py). Returns the workload's
        results."""
        probe = self.calibrate if probe is None else probe
        sampler = self.sampler() if probe else None
        engine, workload = self.begin_repetition(requests, config, warmup)
        first = sampler.probe_now() if sampler is not None else None
        ours = [os.getpid()] + ([sampler.pid] if sampler is not None and sampler.pid else [])
        speed_before = thread_speed.probe_seconds() if self.device == "cpu" else None
        process_meters.release_free_memory()  # the peak below rises from what is live (before any timer starts)
        before = interference.snapshot(ours)
        # each request's own waiting for a CPU, where one thread computes on the CPU (wait_clock.WaitClock)
        clock = WaitClock.for_this_thread() if self.device == "cpu" and hasattr(engine, "use_clock") \
            and import_torch().get_num_threads() == 1 else None
        with PeakMemory(self.device) as peak, self.beside_repetition(), \
                engine.use_clock(clock) if clock is not None else nullcontext():
            # the load-free timer starts with the wall clock: what ran before (beside_repetition's set-up) is not
            # the workload's progress
            load_free = process_meters.LoadFreeTimer(engine, self.device)
            start = time.perf_counter()
            results = run_items(engine, workload)
            wall = time.perf_counter() - start
            seconds = load_free.seconds(wall)
        self._others_after(before, ours, into)
        # the repetition's reading: the geometric mean of the probes right before and right after, as the
        # calibration probe's
        speed = calibration.repetition_probe([speed_before, thread_speed.probe_seconds()]) \
            if speed_before is not None else None
        note_per_repetition(into.thread_probe_s, speed, into.repetitions)
        into.thread_probe = thread_speed.THREAD_PROBE if into.thread_probe_s else ""
        note_per_repetition(into.load_free_share, seconds / wall if seconds is not None and wall > 0 else None,
                            into.repetitions)
        into.load_free_by = load_free.by
        if probe:
            self._probe_after(sampler, first, into)
        self.record_repetition(into, engine, workload, results, wall, peak.result, clock)
        if clock is not None:
            clock.close()
        return results

    def sized(self, config: EngineConfig, requests: list[Request | Session]) -> tuple[EngineConfig, str]:
        """`config` with its KV budget sized from the workload when it sets none (engine.runner.
        workload_kv_shape), and how the budget was chosen, for the report beside the peak memory."""
        from pytest_infergate.engine.runner import workload_kv_shape
        from pytest_infergate.workloads.request import RequestError, render_prompt

        if config.kv_budget_bytes is not None or config.kv_budget_blocks is not None:
            return config, "set by the EngineConfig"
        if config.cache_mode == "none" or not choice_for(self.loaded).is_engine:
            return config, ""
        if any(isinstance(item, Session) for item in requests):
            return config, "the engine's default of 1 GiB: multi-turn sessions grow turn by turn, so not sized"
        limits = Limits.of(self.loaded.model, config)
        try:
            needs = [len(ids) + new for ids, new, rejected in
                     (limits.fit(r, render_prompt(self.loaded.tokenizer, r)) for r in requests) if not rejected]
        except RequestError:  # the engine names the bad request when it runs
            return config, ""
        concurrent, per_sequence = workload_kv_shape(needs, config)
        blocks = concurrent * per_sequence
        if self.device != "cpu":  # CUDA graphs are captured per context bucket up to max_model_len: room for it
            blocks = max(blocks, -(-limits.max_model_len // config.block_size))
        sized = replace(config, kv_budget_blocks=blocks, kv_sized_for_workload=self.device == "cpu")
        return sized, (f"sized from the workload: {concurrent} sequence(s) at once × its longest request "
                       f"({max(needs, default=0)} tokens), {blocks} blocks of {config.block_size}")

    def begin_repetition(self, requests: list[Request | Session], config: EngineConfig, warmup: int, instance: int = 0):
        """The start of one repetition driven step by step from outside (perf.lockstep): warm-up requests run,
        the engine cleared as run_once clears it. Returns the engine and this repetition's fresh workload."""
        config, note = self.sized(config, requests)
        engine = self.engine(config, instance)
        self._kv_budget_notes[id(engine)] = note  # per engine: the two sides of a lockstep round differ
        if warmup:
            engine.generate(warmup_requests(requests, warmup))
        engine.steps.clear()
        engine.peak_kv_blocks = 0
        engine.reset_prefix_cache()  # every repetition starts cold; the warm-up must not serve the workload
        return engine, fresh_copies(requests, next(self._runs))

    def _others_after(self, before, ours: list[int], into: Measurement) -> None:
        """What other processes took of the machine during the repetition; one repetition not measured leaves the
        whole measurement unmeasured (the gate then has no evidence either way)."""
        note_per_repetition(into.others_share, interference.others_share(before, interference.snapshot(ours)),
                            into.repetitions)

    def _probe_after(self, sampler, first, into: Measurement) -> None:
        """The machine's speed over a repetition: the probes from right before to right after it."""
        last = sampler.probe_now() if first is not None else None
        if last is not None:
            into.probe = calibration.PROBE
            into.probe_s.append(calibration.repetition_probe(sampler.between(first, last)))
            quiet = sampler.between(first, first) + sampler.between(last, last)
            if len(quiet) == 2:
                into.probe_quiet_s.append(calibration.repetition_probe(quiet))
        else:  # one repetition without its probe leaves the whole measurement uncalibrated
            into.probe, into.probe_s, into.probe_quiet_s = "", [], []

    def record_repetition(self, into: Measurement, engine, workload: list, results: list[Result], wall: float,
                          peak: PeakMemoryResult, clock: WaitClock | None = None) -> None:
        """One repetition's results into `into`: per-request latencies, throughput over `wall` seconds, memory
        (with `peak`, what serving raised the process's memory by), the engine's figures and step timeline."""
        samples = into.samples
        if self.device == "cpu":
            into.cpu_threads = max(into.cpu_threads, import_torch().get_num_threads())
        ok = [r for r in results if r.ok and not r.is_warmup]
        planned = planned_requests(workload)  # a session's turns after a failed one never ran: failed too
        into.num_requests += planned
        into.num_failed += planned - len(ok)
        before = {metric: len(samples.get(metric, [])) for metric in LATENCY_METRICS}
        for r in ok:
            t = r.timings
            add_request_latencies(samples, t.ttft_s, t.tpot_s, t.itl_s, t.e2e_s, t.queue_wait_s or 0.0)
        note_load_free_latencies(into, ok, clock, before)
        samples.setdefault("tokens_per_s", []).append(sum(r.num_output_tokens for r in ok) / wall)
        samples.setdefault("requests_per_s", []).append(len(ok) / wall)
        # Memory attributable to this model: weights + KV cache + what the process peak rose by while serving.
        # (The process's own peak also counts every other model loaded in it, e.g. the other precisions.)
        weights = self.loaded.record.weight_bytes
        kv_allocated = engine.kv_allocated_bytes
        kv_used = engine.peak_kv_blocks * engine.kv_bytes_per_token * engine.config.block_size
        rise = peak.delta_bytes
        # a CUDA graph pool is reserved when the engine is built and allocates nothing while replayed, so no
        # region's peak sees it; it is this model's memory all the same
        graphs = getattr(engine, "cuda_graphs", None)
        pool = graphs.pool_bytes if graphs is not None and graphs.enabled else 0
        attributable = weights + kv_allocated + rise + pool
        samples.setdefault("peak_mem_mb", []).append(attributable / MIB)
        samples.setdefault("kv_mem_mb", []).append(kv_used / MIB)
        into.memory = {"weights_mb": weights / MIB, "kv_allocated_mb": kv_allocated / MIB,
                       "kv_used_peak_mb": kv_used / MIB, "other_mb": rise / MIB, "cuda_graphs_mb": pool / MIB,
                       "peak_mb": attributable / MIB,
                       "process_peak_mb": peak.peak_bytes / MIB, "method": peak.method,
                       "kv_budget": self._kv_budget_notes.get(id(engine), "")}
        failed = dict(into.engine.get("failed_requests") or {})  # why requests failed, over every repetition
        for r in results:
            if not r.ok and not r.is_warmup:
                failed[r.finish_reason.value] = failed.get(r.finish_reason.value, 0) + 1
        into.engine = {**engine.config.to_dict(), "backend": engine.name, "failed_requests": failed,
                       "kv_bytes_per_token": engine.kv_bytes_per_token,
                       "degradations": [e.__dict__ for e in engine.events]}
        if graphs is not None:  # the HF generate backend has none
            into.engine["cuda_graphs"] = graphs.describe()
        reuse = PrefixCacheUse.of([r for r in results if not r.is_warmup], count_sessions(workload))
        into.engine[PREFIX_CACHE_KEY] = reuse.to_dict()
        if engine.config.prefix_caching:
            samples.setdefault("prefix_cache_hit_rate", []).append(reuse.hit_rate)
        into.steps = [s.to_dict() for s in engine.steps]
        into.end_repetition()

    def measure(self, requests: list[Request], config: EngineConfig | None = None, *, warmup: int = 2,
                repeats: int = 3, min_time_s: float = 0.0, max_repeats: int = 30, label: str = "",
                until: Callable[[Measurement], bool] | None = None,
                decided: Callable[[Measurement], str] | None = None,
                progress: context.Steps | None = None) -> Measurement:
        """Repeat the workload at least `repeats` times, until `min_time_s` has passed and `until` (asked after
        every repetition) says it is measured enough; at most `max_repeats` times. `decided` (asked after every
        repetition) says why the measurement already decides its gate (a failure beyond doubt: perf.stored), or "":
        then it stops, before `repeats` too, and says so. `progress`: the terminal's line counting the repetitions
        (a gate's names its test and its plan's bounds), else one of its own."""
        config = config or EngineConfig()
        measurement = Measurement(label=label)
        measurement.samples["load_s"] = [self.loaded.record.load_s]
        start = time.perf_counter()
        steps = progress or context.Steps(f"measuring {label or 'a workload'}", "repetition", repeats,
                                          most=max_repeats if until is not None else None)
        while measurement.repetitions < max_repeats:
            self.run_once(requests, config, warmup, measurement)
            timed = time.perf_counter() - start >= min_time_s
            why = decided(measurement) if decided is not None and timed else ""
            enough = until is None or until(measurement)
            planned_end = measurement.repetitions >= repeats and timed and enough
            done = bool(why) or planned_end
            steps.step(measurement.repetitions, finished=done)
            # "early" only before the plan's own end (a new user read it at repetition 12 of 12)
            if why and not planned_end and measurement.repetitions < max_repeats:
                # "so far": the gate decides next, and a failure is confirmed on a fresh block (PerfGate.confirm),
                # whose repetitions the final count includes
                context.report(f"{steps.subject}: stopped early, a failure beyond doubt so far: {why}; a failure is "
                               "confirmed on a fresh block")
            if done:
                break
        return measurement

    def extend(self, measurement: Measurement, requests: list[Request], config: EngineConfig | None = None, *,
               warmup: int = 2, repeats: int = 2, what: str = "") -> Measurement:
        """More repetitions into an existing measurement (an inconclusive verdict asks for them, a failure's fresh
        block confirms itself with them): each said on the terminal as the first ones were, or a failing run of a
        slow config goes quiet for minutes. `what`: the name the line gives it (a gate's: its test), else its label."""
        steps = context.Steps(f"measuring {what or measurement.label or 'a workload'} again", "repetition",
                              repeats)
        for done in range(1, repeats + 1):
            self.run_once(requests, config or EngineConfig(), warmup, measurement)
            steps.step(done, finished=done == repeats)
        return measurement


def note_load_free_latencies(into: Measurement, ok: list[Result], clock: WaitClock | None,
                             before: dict[str, int]) -> None:
    """This repetition's per-request latencies with each request's own waiting for a CPU taken out, into
    `into.load_free_samples` (parallel to its samples: `before`, their counts before this repetition); a repetition
    without a WaitClock leaves the whole measurement without them."""
    lf = into.load_free_samples
    if clock is None or any(len(lf.get(metric, [])) != count for metric, count in before.items()):
        lf.clear()
        return
    def at(instant: float | None) -> float | None:
        return None if instant is None else clock.load_free(instant)

    for r in ok:
        t = r.timings
        free = replace(t, arrival=at(t.arrival), first_token=at(t.first_token), finished=at(t.finished),
                       first_scheduled=at(t.first_scheduled), token_times=[at(x) for x in t.token_times],
                       decode_end=at(t.decode_end))
        add_request_latencies(lf, free.ttft_s, free.tpot_s, free.itl_s, free.e2e_s, free.queue_wait_s or 0.0)

"""The fault classes of issue #32 beyond bad inputs: two runs writing one output at once, a full or read-only disk,
an interrupt at every output write, and an endpoint that misbehaves mid-stream. Each check asserts the expected end
state: every entry landed, the earlier file intact and the error naming the path, every request classified once.
They run as rows of the table in tests/test_reliability.py (named check_*, so they run there only)."""

import errno
import json
import multiprocessing
import os
import re
import time

import pytest
from baseline_files import saved_run
from openai_servers import FaultyServer

from pytest_infergate import atomic
from pytest_infergate.endpoint import EndpointConfig, EndpointRequest, LoadPattern, run_load
from pytest_infergate.errors import ModelLoadError
from pytest_infergate.history.series import build_history
from pytest_infergate.history.store import append_run, load_runs
from pytest_infergate.measurement import Measurement
from pytest_infergate.models.cache import ensure_entry
from pytest_infergate.outputs import baseline_entries, save_run_as_baseline
from pytest_infergate.perf.baseline import BaselineEntry, load_baseline
from pytest_infergate.quality.golden_files import GoldenOutput, read_outputs, update_outputs, write_outputs
from pytest_infergate.report import write_report
from pytest_infergate.report.history_page import write_history
from pytest_infergate.results.run import RunResults

WRITERS = 6  # processes writing one output at once; unlocked, the read-merge-write of 6 loses entries every time
FORK = multiprocessing.get_context("fork")  # the writers are plain functions of this module; no torch in them


def _measurement(value: float = 1.0) -> Measurement:
    m = Measurement(samples={"ttft_ms": [value, value + 1]})
    m.end_repetition()
    return m


def _at_once(target, args: list[tuple]) -> None:
    """Run target(barrier, *a) in one process per args, all released together; each must exit 0."""
    barrier = FORK.Barrier(len(args))
    processes = [FORK.Process(target=target, args=(barrier, *a)) for a in args]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0] * len(args)


def _save_one(barrier, path, key, run_started):
    run = saved_run({key: BaselineEntry({"cpu": "x"}, _measurement())}, started=run_started)
    barrier.wait()
    save_run_as_baseline(path, run)


def _saved(path) -> list[str]:
    return sorted(load_baseline(path, baseline_entries))


def check_two_jobs_saving_one_baseline_at_once_keep_every_entry(tmp_path):
    path = tmp_path / "baseline.json"
    save_run_as_baseline(path, saved_run({"old::accepted": BaselineEntry({"cpu": "x"}, _measurement())},
                                  started=time.time() - 60))  # saved before the runs began
    started = time.time() + 1e-3
    time.sleep(0.01)
    _at_once(_save_one, [(path, f"test_{i}", started) for i in range(WRITERS)])
    # every concurrent run's measurement landed; the accepted file from before the runs was replaced, as a save does
    assert _saved(path) == [f"test_{i}" for i in range(WRITERS)]
    assert json.loads(path.read_text())["kind"] == "results"  # a baseline is a saved run
    assert not list(tmp_path.glob("*.tmp"))


def check_a_later_save_replaces_the_baseline_and_says_what_a_concurrent_one_kept(tmp_path):
    path = tmp_path / "baseline.json"
    started = time.time()
    save_run_as_baseline(path, saved_run({"a": BaselineEntry({"cpu": "x"}, _measurement())}, started=started - 10))
    # another run saved `a` after this run (started at `started - 20`) began: kept, and returned so it is said
    assert save_run_as_baseline(path, saved_run({"b": BaselineEntry({"cpu": "x"}, _measurement())},
                                         started=started - 20)) == ["a"]
    assert _saved(path) == ["a", "b"]
    # a run that began after that save replaces the file: `a` was accepted before it and is not its measurement
    assert save_run_as_baseline(path, saved_run({"c": BaselineEntry({"cpu": "x"}, _measurement())},
                                         started=time.time() + 1)) == []
    assert _saved(path) == ["c"]


def _update_one(barrier, path, index, known):
    output = GoldenOutput(f"s{index}", [index], f"text {index}", [])
    barrier.wait()
    update_outputs(path, {"precision": "int8"}, [output], known)


def check_two_runs_updating_one_golden_file_keep_each_others_samples(tmp_path):
    path = tmp_path / "golden" / "int8.jsonl"
    known = [f"s{i}" for i in range(WRITERS)]
    _at_once(_update_one, [(path, i, known) for i in range(WRITERS)])
    accepted = read_outputs(path)
    assert sorted(accepted.outputs) == known
    assert all(accepted.outputs[f"s{i}"].token_ids == [i] for i in range(WRITERS))


def check_a_golden_update_drops_samples_no_longer_in_the_sample_sets(tmp_path):
    path = tmp_path / "int8.jsonl"
    write_outputs(path, {"precision": "int8"}, [GoldenOutput(s, [1], s, []) for s in ("a", "b", "gone")])
    changes = update_outputs(path, {"precision": "int8"}, [GoldenOutput("a", [2], "a2", [])], ["a", "b"])
    assert sorted(read_outputs(path).outputs) == ["a", "b"]
    assert any(line.startswith("~ a") for line in changes) and "- gone: removed" in changes


def _append_one(barrier, folder, index):
    run = RunResults(started=1_000_000.0 + index)
    barrier.wait()
    append_run(folder, run, keep=100)


def check_two_runs_appending_to_one_history_both_land(tmp_path):
    _at_once(_append_one, [(tmp_path, i) for i in range(WRITERS)])
    runs, skipped = load_runs([tmp_path])
    assert len(runs) == WRITERS and not skipped


def _build_entry(barrier, root, log):
    def build(out):
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough that the other workers arrive while it builds
        (out / "weights.bin").write_bytes(b"w" * 64)
        return {}

    barrier.wait()
    entry, meta = ensure_entry(root, "model", build)
    assert (entry / "weights.bin").read_bytes() == b"w" * 64 and meta["files"]["weights.bin"]["size"] == 64


def check_workers_converting_one_model_the_first_time_build_it_once(tmp_path):
    log = tmp_path / "builds.log"
    _at_once(_build_entry, [(tmp_path / "cache", log)] * 4)
    assert len(log.read_text().split()) == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model", "model.lock"]


# --- a full or read-only disk: a clear error naming the path, earlier files intact ------------------------------

def disk_full(monkeypatch):
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)

        def write(text):
            raise OSError(errno.ENOSPC, "No space left on device")

        handle.write = write
        return handle

    monkeypatch.setattr(atomic.os, "fdopen", fdopen)


def read_only(monkeypatch):
    def mkstemp(prefix="", suffix="", dir=None):
        raise OSError(errno.EROFS, "Read-only file system", os.path.join(dir, prefix + "XXXX" + suffix))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)


DISK_FAULTS = {"disk full": (disk_full, "No space left on device"),
               "read-only": (read_only, "Read-only file system")}


def check_a_full_or_read_only_disk_leaves_the_previous_outputs(pytester, monkeypatch, fault):
    inject, reason = DISK_FAULTS[fault]
    pytester.makepyfile("def test_ok():\n    assert True\n")
    pytester.path.joinpath("results.json").write_text("the previous results\n")
    inject(monkeypatch)
    result = pytester.runpytest("--infergate-json=results.json", "-p", "no:cacheprovider")
    assert result.ret == 1  # the tests passed, but an output the run was asked for is missing
    result.stdout.fnmatch_lines([f"ERROR --infergate-json results.json was not written: *{reason}*"])
    assert pytester.path.joinpath("results.json").read_text() == "the previous results\n"
    assert not list(pytester.path.glob("results.json.*"))


def check_a_golden_update_on_a_read_only_disk_fails_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "int8.jsonl"
    write_outputs(path, {"precision": "int8"}, [GoldenOutput("a", [1], "a", [])])
    before = path.read_text()
    read_only(monkeypatch)
    with pytest.raises(OSError, match="Read-only file system"):
        update_outputs(path, {"precision": "int8"}, [GoldenOutput("a", [2], "a", [])], ["a"])
    assert path.read_text() == before


def check_a_model_cache_on_a_full_disk_names_the_cache_and_the_fix(tmp_path):
    ensure_entry(tmp_path, "built-before", lambda out: (out / "w").write_bytes(b"x") and {})

    def build(out):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "model.safetensors"))

    with pytest.raises(ModelLoadError, match=r"model cache .* could not be written while building new \(No space "
                                             r"left on device: .*model.safetensors\): free space there or set "
                                             r"--infergate-cache-dir"):
        ensure_entry(tmp_path, "new", build)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built-before", "built-before.lock", "new.lock"]
    assert (tmp_path / "built-before" / "w").read_bytes() == b"x"


# --- the endpoint misbehaving: every request ends classified, once, on the schedule asked for -----------------

MISBEHAVIOURS = [  # (server mode, error kind, what its detail says)
    ("killed", "transport", "ReadError|RemoteProtocolError"),  # connection reset mid-stream
    ("busy", "http_429", "Retry-After: 2"),
    ("unavailable", "http_503", "Retry-After: 2"),
    ("no_done", "incomplete_stream", "before any finish_reason"),
    ("stall", "timeout", "--infergate-endpoint-timeout"),  # accepts the connection, never answers in time
    ("duplicate_chunk", "inconsistent_usage", "completion_tokens is 6 but 7 content chunks"),
    ("usage_lie", "inconsistent_usage", "completion_tokens is 1 but 6 content chunks"),
    ("after_finish", "malformed_stream", "after the chunk with finish_reason 'length': chunks out of order"),
    ("finished_no_done", None, ""),  # finish_reason and usage arrived: the answer is whole without [DONE]
    ("no_usage", None, ""),  # tokens counted from the chunks, and the summary says usage was not reported
]

def _requests(count: int) -> list[EndpointRequest]:
    return [EndpointRequest(prompt="hi", max_tokens=6, request_id=f"r{i}") for i in range(count)]


def check_a_misbehaving_endpoint_ends_every_request_classified_once(mode, kind, detail):
    with FaultyServer(mode, stall_s=3.0) as server:
        run = run_load(EndpointConfig(server.url, timeout_s=1.0, api="completions"), _requests(4),
                       LoadPattern(concurrency=2), scrape=False)
        seen = len(server.httpd.bodies)
    assert sorted(r.request_id for r in run.results) == ["r0", "r1", "r2", "r3"]  # none lost, none twice
    assert [r.error for r in run.results] == [kind] * 4
    if kind is None:
        assert run.success_rate == 1 and all(r.num_output_tokens == 6 for r in run.results)
        assert run.summary()["usage_reported"] is (mode != "no_usage")
    else:
        assert run.errors == {kind: 4} and run.success_rate == 0
        assert all(re.search(detail, r.error_detail) for r in run.results), [r.error_detail for r in run.results]
    # a refusal is recorded, not re-sent (a reset after the answer began is a verdict too): each request once
    assert seen == 4


def check_refusals_keep_the_load_schedule():
    pattern = LoadPattern(rate_per_s=20.0, seed=3)
    requests = _requests(8)
    with FaultyServer("busy") as server:
        run = run_load(EndpointConfig(server.url, api="completions"), requests, pattern, scrape=False)
        seen = len(server.httpd.bodies)
    offsets = pattern.offsets_for(requests)
    late = {r.request_id: r.arrival - (run.started + offsets[int(r.request_id[1:])]) for r in run.results}
    # none early (a refusal did not pull the later arrivals forward), none re-sent after its Retry-After. The order
    # of two arrivals a few ms apart is not asserted: on a loaded runner the later one can leave first.
    assert all(delay >= -0.005 for delay in late.values()), late
    assert seen == 8 and json.loads(json.dumps(run.errors)) == {"http_429": 8}


# --- an interrupt at every output write: the previous file survives, no temporary file is left ------------------

OUTPUT_WRITERS = {
    "report": lambda path: write_report(RunResults(), path),
    "json results": lambda path: atomic.write_json_atomic(path, RunResults().to_dict()),
    "baseline": lambda path: save_run_as_baseline(
        path, saved_run({"t::x": BaselineEntry({"cpu": "x"}, _measurement())})),
    "golden outputs": lambda path: write_outputs(path, {"precision": "fp32"}, []),
    "history page": lambda path: write_history(build_history([]), path),
}
INTERRUPT_POINTS = ("while writing", "before the rename")


def check_an_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch, output, when):
    """A Ctrl-C while the new file's bytes are written, or just before it takes the old one's place."""
    target = tmp_path / "out" / "file"
    target.parent.mkdir()
    target.write_text("the accepted file\n")
    if when == "while writing":
        real_fdopen = os.fdopen

        def half_then_ctrl_c(fd, *args, **kwargs):
            handle = real_fdopen(fd, *args, **kwargs)
            real_write = handle.write

            def write(text):
                real_write(text[: len(text) // 2])
                raise KeyboardInterrupt

            handle.write = write
            return handle

        monkeypatch.setattr(atomic.os, "fdopen", half_then_ctrl_c)
    else:
        def ctrl_c(src, dst):
            raise KeyboardInterrupt

        monkeypatch.setattr(atomic.os, "replace", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        OUTPUT_WRITERS[output](target)
    assert target.read_text() == "the accepted file\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file"]  # no temporary file left behind


def check_an_interrupt_while_pytest_writes_junit_xml_leaves_the_previous_file(pytester):
    """pytest's own --junitxml writer, made to be interrupted half-way (in a subprocess: in-process, the interrupt
    would reach this session too); a run that completes replaces it whole."""
    pytester.makepyfile("def test_ok():\n    assert True\n")
    pytester.path.joinpath("junit.xml").write_text("<previous/>\n")
    pytester.makeconftest("""
import _pytest.junitxml

def interrupted(self):
    raise KeyboardInterrupt  # after the XML header was written to the file

_pytest.junitxml.LogXML._get_global_properties_node = interrupted
""")
    result = pytester.runpytest_subprocess("--junitxml=junit.xml", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert pytester.path.joinpath("junit.xml").read_text() == "<previous/>\n"
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith("junit")) == ["junit.xml"]
    pytester.path.joinpath("conftest.py").unlink()
    complete = pytester.runpytest_subprocess("--junitxml=junit.xml", "-p", "no:cacheprovider")
    assert complete.ret == 0
    complete.stdout.fnmatch_lines([f"*generated xml file: {pytester.path / 'junit.xml'}*"])
    assert 'name="test_ok"' in pytester.path.joinpath("junit.xml").read_text()

"""One store of runs (issue #57 point 3): a run saved by each writer the session has (--infergate-json,
--infergate-save-baseline, --infergate-history) is read back through history.store — by path, by history run id or
`latest`, as a baseline — and says what the run said; an older baseline file is read and migrated there too."""

import json

from baseline_files import older_baseline, perf_record

from pytest_infergate.history.store import (
    LATEST,
    load_run,
    load_runs,
    migrate_baseline,
    read_baseline,
    run_file,
)
from pytest_infergate.measurement import Measurement
from pytest_infergate.options import Options
from pytest_infergate.outputs import write_outputs
from pytest_infergate.results.run import RunResults

FINGERPRINT = {"cpu": "AMD EPYC", "cpu_count": 2, "platform": "linux", "torch_threads": 2, "device": "cpu",
               "model_fingerprint": "e9fecd7a5d8524a4", "precision": "fp32", "torch": "2.13.0"}


def measured(base: float) -> Measurement:
    m = Measurement(label="chat", samples={"ttft_ms": [base, base + 1.0, base + 2.0], "itl_ms": [5.0, 6.0]},
                    repetitions=1)
    m.steps = [{"step": 0, "tokens": 4}]  # the engine's timeline: a history's and a baseline's copies leave it out
    m.end_repetition()
    return m


def a_run(started: float = 1_700_000_000.0) -> RunResults:
    record = perf_record("test_gate.py::test_serving[fp32]", FINGERPRINT, measured(100.0))
    record.budget = {"ttft_ms_p95": 30_000, "max_regression": 0.1}
    return RunResults(started=started, finished=started + 60.0, records=[record], run_id="20231114T221320Z-abc123",
                      commit="abc1234")


def test_a_run_saved_by_each_writer_reads_back_through_the_store(tmp_path):
    results, saved, history = tmp_path / "results.json", tmp_path / "baseline.json", tmp_path / "history"
    run = a_run()
    written = write_outputs(run, Options(json=results, save_baseline=saved, history=history))
    assert not written.errors

    # --infergate-json: the run as it ended, read back by path (`infergate compare | summary | report`)
    as_written = json.loads(results.read_text())
    assert load_run(results).to_dict() == as_written
    assert as_written["run_id"] == run.run_id and as_written["records"][0]["measurement"]["steps"]

    # --infergate-history: the same run, one file in the folder, found by its id and as `latest`
    assert run_file(history, LATEST) == run_file(history, run.run_id) == history / f"{run.run_id}.json"
    (kept,), skipped = load_runs([history])
    assert skipped == [] and kept.run_id == run.run_id and kept.records[0].measurement.steps == []
    assert load_run(history / f"{run.run_id}.json").to_dict()["records"][0]["measurement"]["steps"] == []

    # --infergate-save-baseline: the same run, whose perf measurement later runs compare with
    baseline = load_run(saved)
    assert baseline.run_id == run.run_id and baseline.saved_baseline == str(saved)
    by_path, note = read_baseline(saved)
    by_history, _ = read_baseline(LATEST, history)
    assert note == "" and list(by_path) == list(by_history) == ["test_gate.py::test_serving[fp32]"]
    samples = run.records[0].measurement.samples
    for entries in (by_path, by_history):
        (entry,) = entries.values()
        assert entry.fingerprint == FINGERPRINT and entry.recorded == run.started
        assert entry.measurement.samples["ttft_ms"] == samples["ttft_ms"]
    # a saved baseline keeps per-token samples only where its gate compares them (perf.baseline.for_baseline)
    assert "itl_ms" not in by_path["test_gate.py::test_serving[fp32]"].measurement.samples
    assert by_history["test_gate.py::test_serving[fp32]"].measurement.samples["itl_ms"] == samples["itl_ms"]


def test_an_older_baseline_is_read_and_migrated_by_the_store(tmp_path):
    path = tmp_path / "old.json"
    (saved_entry,) = read_baseline_of(tmp_path, a_run()).values()
    path.write_text(json.dumps(older_baseline({"t::x": saved_entry}, version=3)))
    before, note = read_baseline(path)
    assert "schema version 3: read as 4" in note
    assert migrate_baseline(path, quiet=False) == [f"{path}: perf baseline, 1 entries, schema 3 → a results file "
                                                   "(a baseline is a saved run)"]
    after, note = read_baseline(path)
    assert note == "" and load_run(path).records[0].test == "t::x"
    assert after["t::x"].measurement.to_dict() == before["t::x"].measurement.to_dict()
    assert migrate_baseline(path, quiet=True) == []  # a results file now: nothing to migrate


def read_baseline_of(folder, run: RunResults) -> dict:
    saved = folder / "saved.json"
    assert not write_outputs(run, Options(save_baseline=saved)).errors
    return read_baseline(saved)[0]


def test_a_history_keeps_its_newest_runs(tmp_path):
    history = tmp_path / "history"
    ids = []
    for i in range(4):
        run = a_run(started=1_700_000_000.0 + i * 3600)
        run.run_id = f"2023111{i}T000000Z-abc12{i}"
        ids.append(run.run_id)
        assert not write_outputs(run, Options(history=history, history_keep=2)).errors
    runs, _ = load_runs([history])
    assert [r.run_id for r in runs] == ids[-2:] and run_file(history, LATEST).stem == ids[-1]

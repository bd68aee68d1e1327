"""One key for every accepted result (issue #33 point 4): perf baselines, accepted golden outputs and the history
split what they depend on the same way (environment.AcceptedKey: the machine, the change under test); older files are
read, say so once, and `infergate migrate` rewrites them under their lock."""

import json
from pathlib import Path

import pytest
from baseline_files import older_baseline, saved_run

from pytest_infergate.cli import main as cli_main
from pytest_infergate.environment import AcceptedKey
from pytest_infergate.errors import InfergateError
from pytest_infergate.measurement import Measurement
from pytest_infergate.outputs import baseline_entries, save_run_as_baseline
from pytest_infergate.perf import baseline
from pytest_infergate.perf.baseline import BaselineEntry, load_baseline
from pytest_infergate.perf.fingerprint import diff_fingerprints, machine_key
from pytest_infergate.project_files import migrate
from pytest_infergate.quality import golden_files
from pytest_infergate.quality.golden_files import GoldenOutput, golden_key, read_outputs
from pytest_infergate.quality.golden_machines import SAME_MACHINE, select_accepted
from pytest_infergate.results.run import SCHEMA_VERSION as RESULTS_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
PERF = {"cpu": "AMD EPYC", "cpu_count": 2, "platform": "linux", "torch_threads": 2, "device": "cpu",
        "model_fingerprint": "e9fecd7a5d8524a4", "precision": "fp32", "torch": "2.13.0",
        "engine_config": {"max_batch_size": 8}}
ENVIRONMENT = {"cpu": "AMD EPYC", "cpu_flags": ["avx2"], "gpu": None, "threads": 2, "torch": "2.13.0",
               "transformers": "5.24.0", "kernels": {"torch_cpu_capability": "AVX2"}}
HEADER = {"model": "m", "fingerprint": "e9fecd7a5d8524a4", "device": "cpu", "precision": "int8",
          "environment": ENVIRONMENT, "method": {"generation": "whole file"}, "compositions": {"s.jsonl": "ab"}}


def measured() -> Measurement:
    m = Measurement(samples={"itl_ms": [10.0, 11.0, 10.5]}, repetitions=1)
    m.end_repetition()
    return m


def test_perf_and_golden_split_machine_and_change_under_test_the_same_way():
    perf, golden = AcceptedKey.of(PERF), golden_key(HEADER)
    assert set(perf.machine) == {"cpu", "cpu_count", "platform", "torch_threads", "device"}
    assert set(perf.under_test) == {"model_fingerprint", "precision", "torch", "engine_config"}
    assert set(golden.machine) == {"cpu", "cpu_flags", "gpu", "threads", "kernels", "device"}
    assert set(golden.under_test) == {"torch", "transformers", "model_fingerprint", "precision", "method",
                                      "compositions"}
    assert golden.machine_id() == golden_key({**HEADER, "precision": "nf4"}).machine_id()  # one machine, one id
    assert machine_key(PERF) == perf.machine  # the history's series split
    # a field no list names is under test: gated and named, never ignored
    diff = diff_fingerprints({**PERF, "attention": "sdpa"}, {**PERF, "attention": "eager"})
    assert [c.describe() for c in diff.under_test] == ["attention eager → sdpa"] and not diff.machine


def test_a_saved_baseline_is_the_runs_results_file_and_is_read_back_keyed(tmp_path):
    # issue #42: a baseline is a saved run; each entry keyed as every accepted result is
    path = tmp_path / "base.json"
    save_run_as_baseline(path, saved_run({"t::x": BaselineEntry(dict(PERF), measured())}, started=1_700_000_000.0))
    data = json.loads(path.read_text())
    assert data["kind"] == "results" and data["schema_version"] == RESULTS_SCHEMA
    (record,) = data["records"]
    assert record["test"] == "t::x" and record["fingerprint"] == PERF
    entry = load_baseline(path, baseline_entries)["t::x"]
    assert entry.fingerprint == PERF and entry.key == AcceptedKey.of(PERF) and entry.recorded == 1_700_000_000.0
    assert baseline.schema_note(path) == ""


@pytest.mark.parametrize("version", [1, 3, 4])
def test_an_older_baseline_file_is_read_and_migrates_to_a_results_file_under_its_lock(tmp_path, capsys, version):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(older_baseline({"t::x": BaselineEntry(dict(PERF), measured(), 1_700_000_000.0)},
                                              version)))
    before = load_baseline(path)["t::x"]
    assert before.fingerprint == PERF and before.recorded == 1_700_000_000.0
    note = baseline.schema_note(path)
    if version < baseline.SCHEMA_VERSION:
        assert f"schema version {version}: read as 4" in note and f"infergate migrate {path}" in note
        assert "rewrites it as a results file" in note
    else:  # the older format's last version: read as it is, nothing said
        assert note == ""
    assert cli_main(["migrate", str(path)]) == 0
    assert f"perf baseline, 1 entries, schema {version} → a results file" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["kind"] == "results" and data["started"] == 1_700_000_000.0
    after = load_baseline(path, baseline_entries)["t::x"]
    assert after.fingerprint == PERF and after.recorded == before.recorded
    assert after.measurement.to_dict() == before.measurement.to_dict() and baseline.schema_note(path) == ""
    assert migrate(path) == [f"{path}: a results file: nothing to migrate (every version is read)"]


def test_an_older_golden_file_is_read_says_so_and_migrates_with_its_outputs_unchanged(tmp_path):
    folder = tmp_path / "golden" / "m" / "e9fecd7a5d8524a4"
    folder.mkdir(parents=True)
    path = folder / "cpu-int8.jsonl"
    output = {"id": "a", "token_ids": [1, 2, 3], "text": "x", "top_logprobs": [[[1, -0.1]]]}
    path.write_text(json.dumps({"schema_version": 1, **HEADER}) + "\n" + json.dumps(output) + "\n")
    (tmp_path / "golden" / "samples.jsonl").write_text(json.dumps({"id": "a", "prompt": "p"}) + "\n")
    (tmp_path / "golden" / "results.json").write_text(json.dumps({"records": []}))
    old = read_outputs(path)
    assert "schema version 1: read as 3" in golden_files.schema_note(path)
    assert select_accepted(path, ENVIRONMENT) == (path, SAME_MACHINE)

    assert migrate(tmp_path / "golden") == [f"{path}: accepted golden outputs, schema 1 → 3; its quality figures "
                                            "against the reference, which decide on other machines, come with the "
                                            "next --infergate-update-golden"]
    new = read_outputs(path)
    assert new.header["schema_version"] == 3 and new.header["key"] == golden_key(HEADER).to_dict()
    assert new.outputs == old.outputs and golden_files.schema_note(path) == ""
    assert select_accepted(path, ENVIRONMENT) == (path, SAME_MACHINE)  # picked by the key's machine now
    assert json.loads((tmp_path / "golden" / "samples.jsonl").read_text()) == {"id": "a", "prompt": "p"}
    assert migrate(tmp_path / "golden") == [f"{tmp_path / 'golden'}: no baseline or accepted golden file needed "
                                            "migrating"]


def test_a_golden_file_is_written_with_its_key(tmp_path):
    path = tmp_path / "cpu-fp32.jsonl"
    golden_files.write_outputs(path, {**HEADER, "key": {"machine": {}, "under_test": {}}},
                               [GoldenOutput("a", [1], "x", [])])
    header = read_outputs(path).header
    assert header["key"] == golden_key(HEADER).to_dict()  # from the header's fields, not a stale key passed in


@pytest.mark.parametrize("bad", [{"machine": []}, "x", {"under_test": {}}])
def test_a_malformed_golden_key_names_the_file_and_the_fix(tmp_path, bad):
    path = tmp_path / "cpu-fp32.jsonl"
    path.write_text(json.dumps({"schema_version": 2, **HEADER, "key": bad}) + "\n")
    with pytest.raises(golden_files.GoldenError, match=r"cpu-fp32.jsonl:1: header `key`.*--infergate-update-golden"):
        read_outputs(path)


def test_migrate_names_what_it_cannot_migrate(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"kind": "results", "records": []}))
    assert migrate(results) == [f"{results}: a results file: nothing to migrate (every version is read)"]
    assert cli_main(["migrate", str(tmp_path / "missing.json")]) == 2


def test_the_shipped_golden_files_are_in_the_current_schema():
    accepted = [path for path in sorted((ROOT / "golden").rglob("*.jsonl")) if path.parent.parent != ROOT / "golden"
                and "schema_version" in golden_files.header_line(path)]
    assert len(accepted) >= 6
    assert [path.name for path in accepted if golden_files.schema_note(path)] == []
    for path in accepted:
        header = read_outputs(path).header
        assert AcceptedKey.from_dict(header["key"]) == golden_key({k: v for k, v in header.items() if k != "key"})


def test_a_folder_migrates_what_it_can_and_names_what_it_cannot(tmp_path):
    good, bad = tmp_path / "cpu-fp32.jsonl", tmp_path / "cpu-int8.jsonl"
    good.write_text(json.dumps({"schema_version": 1, **HEADER}) + "\n" + json.dumps({"id": "a", "token_ids": [1]})
                    + "\n")
    bad.write_text(json.dumps({"schema_version": 7}) + "\n")
    with pytest.raises(InfergateError) as raised:
        migrate(tmp_path)
    message = str(raised.value)
    assert f"{good}: accepted golden outputs, schema 1 → 3" in message
    assert f"{bad}: not migrated:" in message and "schema version 7" in message
    assert golden_files.schema_note(good) == ""  # the good one was migrated all the same


def test_the_builtin_sample_set_is_used_without_one_and_init_golden_makes_it_the_projects(tmp_path, capsys):
    # issue #44: a project of its own (pip install) had no sample set at all
    from pytest_infergate.quality.golden_files import BUILTIN_SAMPLE_SET, GoldenError, find_sample_sets, load_samples

    assert len(load_samples(BUILTIN_SAMPLE_SET)) == 48
    assert find_sample_sets(tmp_path / "golden") == [BUILTIN_SAMPLE_SET]  # no folder: the built-in set
    with pytest.raises(GoldenError, match="golden directory .*missing does not exist: set --infergate-golden-dir"):
        find_sample_sets(tmp_path / "missing", explicit=True)  # a folder named and not there: a typo, said
    assert cli_main(["init-golden", str(tmp_path / "golden")]) == 0
    copied = tmp_path / "golden" / "default.jsonl"
    assert copied.read_bytes() == BUILTIN_SAMPLE_SET.read_bytes() and "wrote " in capsys.readouterr().out
    assert find_sample_sets(tmp_path / "golden") == [copied]  # now the project's own
    copied.write_text(copied.read_text().splitlines()[0] + "\n")  # edited: a second init leaves it alone
    assert cli_main(["init-golden", str(tmp_path / "golden")]) == 2
    assert "exists already" in capsys.readouterr().err and len(load_samples(copied)) == 1

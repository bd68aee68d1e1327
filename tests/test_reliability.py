"""Issue #32 as one table: every bad input that used to pass silently, lose a file, hang or say something unclear,
and every fault class (two runs writing one output, a full or read-only disk, an interrupt at each output write,
an endpoint misbehaving), each row with the behaviour it must show. A row's check lives beside the tests of its
area (named check_*, so it runs here, once); the parameters it needs are bound here.

The rule the rows hold (README, "Reliability"): a check that did not run is loud; an output either completes or
the previous one is untouched; a request ends answered or with a classified error, counted once."""

import inspect
import json
from dataclasses import dataclass
from functools import partial

import fault_checks as faults
import pytest
import test_bad_inputs as bad
import test_baseline_env as baseline_env
import test_engine_validation as engine_validation
from conftest import SLOW_FIXTURES

from pytest_infergate import atomic
from pytest_infergate.cli import main as cli_main
from pytest_infergate.cli import regression_fraction


def check_compare_refuses_a_max_regression_that_is_no_fraction(capsys, value, message):
    """Rows 9-11: nan read as "no regression", 10 read as +1000%, -1 made a run a regression of itself."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(["compare", "a.json", "b.json", "--max-regression", value])
    assert exit_.value.code == 2  # argparse's usage error, before any file is read
    assert message in capsys.readouterr().err
    assert regression_fraction("10%") == pytest.approx(0.10) and regression_fraction("0.1") == pytest.approx(0.10)


@dataclass(frozen=True)
class Row:
    row: str  # the issue's row number, or the fault class
    case: str  # the input or fault
    expected: str  # what the user must see
    check: object  # callable; its parameters are fixtures, or bound here with partial

    def fixtures(self) -> list[str]:
        """The check's parameters that partial did not bind (those show as keyword-only with a default)."""
        return [name for name, parameter in inspect.signature(self.check).parameters.items()
                if parameter.default is inspect.Parameter.empty]


ROWS = [
    Row("1", "Ctrl-C during --infergate-save-baseline over an accepted baseline",
        "the accepted file untouched, the terminal says so",
        bad.check_an_interrupted_save_leaves_the_accepted_baseline_untouched),
    Row("interrupt", "SIGTERM (a cancelled CI job) during --infergate-save-baseline", "ends as Ctrl-C: accepted "
        "file untouched, said so", partial(bad.check_an_interrupted_save_leaves_the_accepted_baseline_untouched,
                                           interrupt="SIGTERM")),
    Row("2", "--infergate-json and --infergate-report on one path", "usage error naming both",
        partial(bad.check_a_usage_error_names_the_input, case="json-and-report-one-path")),
    Row("3", "--infergate-save-baseline and --infergate-json on one path", "usage error naming both",
        partial(bad.check_a_usage_error_names_the_input, case="baseline-and-json-one-path")),
    Row("4", "a baseline saved from a run whose every request failed", "refused, naming the test, nothing written",
        bad.check_a_measurement_without_samples_is_not_saved_as_a_baseline),
    Row("5", "a baseline whose sample lists are empty", "error on load saying it holds nothing to compare with",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="empty-samples")),
    Row("5", "an older-format baseline whose sample lists are empty", "error on load naming the entry",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="older-empty-samples")),
    Row("6", "a baseline whose records are a mapping", "says records must be a list",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="records-a-mapping")),
    Row("6", "an older-format baseline whose entries is a list", "says entries must be a mapping",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="older-entries-a-list")),
    Row("nan", "a baseline with a NaN sample (#44)", "error on load naming the entry, the sample and the fix",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="nan-sample")),
    Row("nan", "an older-format baseline with a NaN sample", "error on load naming the entry and the sample",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="older-nan-sample")),
    Row("nan", "a baseline with a null sample", "error on load naming the entry and the sample",
        partial(bad.check_a_damaged_baseline_says_what_is_wrong, case="null-sample")),
    Row("7", "a quality-policy scope typo with only golden regression checks", "warning naming the line; strict fails",
        bad.check_policy_scope_matching_no_golden_gate_warns_and_fails_under_strict),
    Row("8", "quality policy min_top1=2", "usage error: top-1 is at most 1",
        partial(bad.check_a_usage_error_names_the_input, case="policy-top1-over-one")),
    Row("9", "infergate compare --max-regression nan", "usage error",
        partial(check_compare_refuses_a_max_regression_that_is_no_fraction, value="nan",
                message="'nan' must be a fraction from 0 to below 10")),
    Row("10", "infergate compare --max-regression 10 (meaning 10%)", "refused as the marker does; 10% accepted",
        partial(check_compare_refuses_a_max_regression_that_is_no_fraction, value="10",
                message="'10' must be a fraction from 0 to below 10 (0.10 = 10% slower tolerated), or a percentage")),
    Row("11", "infergate compare --max-regression -1", "usage error",
        partial(check_compare_refuses_a_max_regression_that_is_no_fraction, value="-1",
                message="'-1' must be a fraction from 0 to below 10")),
    Row("12", "--infergate-baseline-python an interpreter that hangs at start", "stopped after the timeout, named",
        baseline_env.check_an_interpreter_that_hangs_at_start_is_stopped_and_named),
    Row("13", "a binary workload file", "names the file and line",
        bad.check_a_binary_workload_file_names_the_file_and_line),
    Row("14", "a chat message with content None", "refused at the Request naming the message index",
        bad.check_a_chat_message_without_content_is_refused_at_the_request),
    Row("15", "generate() raising on a bad request mid-batch", "the engine left as it was",
        engine_validation.check_a_bad_request_in_a_batch_leaves_the_engine_as_it_was),
    Row("16", "infergate_bench(repeats=0) with a budget", "fails saying repeats must be at least 1",
        bad.check_zero_repeats_is_an_error_not_a_pass),
    Row("17", "every request rejected, with a latency budget", "fails saying every request was rejected and why",
        bad.check_every_request_rejected_fails_the_budget_saying_why),
    Row("18", "a prompt over the context window in infergate_bench", "the message alone, no plugin traceback",
        bad.check_a_prompt_over_the_context_in_a_workload_is_the_message_alone),
    Row("19", "a cached model file rotted with its size and mtime kept", "digest mismatch: rebuilt, not loaded",
        bad.check_cache_file_rotted_with_its_size_and_time_kept_is_rebuilt),
    Row("20", "an own model directory without tokenizer files", "error naming the missing files",
        bad.check_a_model_directory_without_tokenizer_files_names_them),
    Row("config", "an own model directory whose config.json is not JSON (#44)", "error naming the file and the JSON "
        "error", bad.check_a_model_directory_whose_config_is_not_json_names_the_config),
    Row("concurrent", "two jobs saving one baseline at once", "every entry lands, no torn file",
        faults.check_two_jobs_saving_one_baseline_at_once_keep_every_entry),
    Row("concurrent", "a save after a concurrent one", "kept entries are said; a later run replaces the file",
        faults.check_a_later_save_replaces_the_baseline_and_says_what_a_concurrent_one_kept),
    Row("concurrent", "two runs updating one accepted golden file", "each keeps the other's samples",
        faults.check_two_runs_updating_one_golden_file_keep_each_others_samples),
    Row("concurrent", "a golden update after samples left the sample set", "those are dropped, the rest kept",
        faults.check_a_golden_update_drops_samples_no_longer_in_the_sample_sets),
    Row("concurrent", "two runs appending to one history folder", "both runs land",
        faults.check_two_runs_appending_to_one_history_both_land),
    Row("concurrent", "xdist workers converting one model the first time", "built once, every worker gets it",
        faults.check_workers_converting_one_model_the_first_time_build_it_once),
    *[Row("disk", f"{fault} under --infergate-json", "error naming option and path, previous file intact, exit 1",
          partial(faults.check_a_full_or_read_only_disk_leaves_the_previous_outputs, fault=fault))
      for fault in faults.DISK_FAULTS],
    Row("disk", "read-only disk under --infergate-update-golden", "OSError naming the file, accepted file intact",
        faults.check_a_golden_update_on_a_read_only_disk_fails_naming_the_file),
    Row("disk", "full disk while building the model cache", "error naming the cache and the fix, entries intact",
        faults.check_a_model_cache_on_a_full_disk_names_the_cache_and_the_fix),
    *[Row("interrupt", f"Ctrl-C {when}: {output}", "the previous file survives, no temporary file",
          partial(faults.check_an_interrupted_write_leaves_the_previous_file, output=output, when=when))
      for output in faults.OUTPUT_WRITERS for when in faults.INTERRUPT_POINTS],
    *[Row("endpoint", f"server: {mode}", kind or "answered", partial(
          faults.check_a_misbehaving_endpoint_ends_every_request_classified_once, mode=mode, kind=kind, detail=detail))
      for mode, kind, detail in faults.MISBEHAVIOURS],
    Row("interrupt", "Ctrl-C while pytest writes --junitxml", "the previous XML survives, no temporary file",
        faults.check_an_interrupt_while_pytest_writes_junit_xml_leaves_the_previous_file),
    Row("endpoint", "429 with Retry-After under an arrival rate", "recorded, not re-sent; the schedule kept",
        faults.check_refusals_keep_the_load_schedule),
]
SLOW_CHECKS = {bad.check_cache_file_rotted_with_its_size_and_time_kept_is_rebuilt,  # builds a model in a fresh cache
               faults.check_workers_converting_one_model_the_first_time_build_it_once}


def _param(row: Row):
    slow = SLOW_FIXTURES & set(row.fixtures()) or getattr(row.check, "func", row.check) in SLOW_CHECKS
    ident = f"{row.row}-{row.case}".replace(" ", "_")
    return pytest.param(row, id=ident, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_reliability_table(row, request):
    row.check(**{name: request.getfixturevalue(name) for name in row.fixtures()})


def test_the_table_covers_every_row_of_the_issue():
    assert {row.row for row in ROWS} >= {str(n) for n in range(1, 21)} | {"concurrent", "disk", "interrupt",
                                                                         "endpoint"}


def test_a_completed_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    atomic.write_json_atomic(target, {"kind": "results", "n": 1})
    assert json.loads(target.read_text()) == {"kind": "results", "n": 1}

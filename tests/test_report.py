"""The HTML report and the `infergate` CLI, from the results of a real (tiny) run."""

import copy
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import needs_chromium, open_page

from pytest_infergate import units
from pytest_infergate.cli import main as cli_main
from pytest_infergate.history.compare import compare_runs
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.report import render as render_results
from pytest_infergate.results import RunResults
from pytest_infergate.results.markdown import summary_markdown as summary_of_results
from pytest_infergate.status import Status


def render(data: dict) -> str:
    return render_results(RunResults.from_dict(data))


def summary_markdown(data: dict) -> str:
    return summary_of_results(RunResults.from_dict(data))


QUALITY_TEST = '''
# tiny-random-llama's random weights: nf4 agrees with fp32 at top-1 ~0.26, far below the 4-bit default (0.9)
@pytest.mark.infergate_quality(min_top1=0.1, max_mean_kl=5)
def test_quality(infergate_golden):
    infergate_golden.check(limit=6)
'''

RUN = '''
import pytest
from pytest_infergate.engine import EngineConfig, Request

REQS = [Request(prompt_token_ids=[5 + i] * (6 + 9 * i), max_new_tokens=3 + 4 * i, ignore_eos=True) for i in range(4)]

@pytest.mark.parametrize("batching", ["continuous", "static"])
@pytest.mark.infergate_budget(tokens_per_s=0.01)
def test_speed(infergate_bench, batching):
    infergate_bench(REQS, EngineConfig(batching=batching, max_model_len=256, kv_budget_bytes=8 << 20), repeats=2,
                    warmup=1)

@pytest.mark.infergate_budget(ttft_ms=0.0001)
def test_too_slow(infergate_bench):
    infergate_bench(REQS[:2], EngineConfig(max_model_len=256, kv_budget_bytes=8 << 20), repeats=1, warmup=0)

''' + QUALITY_TEST


@pytest.fixture(scope="module")
def results(tmp_path_factory, cache_dir):
    """One real run (perf pass and fail, quality) in a subprocess; returns the results JSON."""
    root = tmp_path_factory.mktemp("run")
    (root / "test_run.py").write_text(RUN)
    shutil.copytree(Path(__file__).parents[1] / "golden", root / "golden", ignore=shutil.ignore_patterns("*/"))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--infergate-model=tiny-random-llama",
                    f"--infergate-cache-dir={cache_dir}", "--infergate-precisions=fp32,nf4",
                    "--infergate-json=r.json", "--infergate-report=r.html", "--infergate-history=hist"], cwd=root,
                   capture_output=True, timeout=600)
    data = json.loads((root / "r.json").read_text())
    data["_root"] = str(root)
    return data


def test_mixed_run_renders_everything(results):
    html = render(results)
    assert html.count("<svg") >= 3  # tokens/s, memory, TTFT, timeline
    for section in ('id="summary"', 'id="perf"', 'id="quality"', 'id="charts"', 'id="samples"'):
        assert section in html
    assert "test_too_slow" in html and ">fail<" in html and ">pass<" in html
    # issue #55: the report names the policy that decided each quality test
    assert "pass under the policy from marker infergate_quality(min_top1=0.1, max_mean_kl=5)" in html
    assert len(html.encode()) < 5 * 2**20
    assert Path(results["_root"], "r.html").read_text() != ""


def test_empty_passing_and_failing_runs_render():
    empty = {"schema_version": 1, "records": [], "outcomes": {}, "environment": {}, "models": {}}
    assert "No infergate results" in render(empty)


@pytest.mark.parametrize("keep", ["pass", "fail"])
def test_only_passing_or_only_failing(results, keep):
    data = copy.deepcopy(results)
    data["records"] = [r for r in data["records"] if r.get("status") == keep]
    html = render(data)
    assert data["records"] and ('class="bad"' in html) == (keep == "fail")


def test_model_output_is_shown_as_text(results):
    data = copy.deepcopy(results)
    quality = next(r for r in data["records"] if r["kind"] == "quality" and r["precision"] == "nf4")
    sample = next(s for s in quality["samples"] if not s["exact_match"])
    sample["candidate_text"] = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'
    html = render(data).replace('<mark class="div">', "").replace("</mark>", "")  # the divergence highlight
    assert "<script>document" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html


def with_two_verdicts(results, failing: dict, passing: dict):
    """A copy of the results whose first perf record has a failing tokens/s verdict (×2.5) and the second a passing
    one (×1.01), each with `failing` / `passing` merged in; returns (data, perf records)."""
    data = copy.deepcopy(results)
    perf = [r for r in data["records"] if r["kind"] == "perf"][:2]
    perf[0]["verdicts"] = [{"metric": "tokens_per_s", "status": "fail", "ratio": 2.5, "low": 2.1, "high": 2.9,
                            "threshold": 1.5, "percentile": None, "candidate": 40, "baseline": 100,
                            "samples": [5, 5], **failing}]
    perf[1]["verdicts"] = [{"metric": "tokens_per_s", "status": "pass", "ratio": 1.01, "low": 0.9, "high": 1.1,
                            "threshold": 1.5, "percentile": None, "candidate": 99, "baseline": 100,
                            "samples": [5, 5], **passing}]
    return data, perf


def test_verdicts_show_their_ci_and_whether_rounds_were_paired(results):
    # the second verdict was written before verdicts said whether they were paired
    data, _ = with_two_verdicts(results, {"paired": True}, {})
    html = render(data)
    # the comparison's own sentence (the change in words, the interval against the limit), its status, then the
    # baseline's figure beside the candidate's and how it was decided
    assert ("tokens/s 60% lower (time per token ×2.5 [2.1–2.9], limit ×1.5): FAIL -- tokens_per_s baseline 100 "
            "tok/s → now 40 tok/s, as measured, paired by round") in html
    assert ("tokens/s 0.99% lower (time per token ×1.01 [0.9–1.1], limit ×1.5): PASS -- tokens_per_s baseline 100 "
            "tok/s → now 99 tok/s, as measured<") in html


def test_one_figure_per_metric_with_the_verdicts_statistic_named_where_it_differs(results):
    # issue #45 point 5: the table showed the median tokens/s and the verdict the fastest repetitions'
    # figure for the same measurement, unnamed; now the cell names the statistic the verdict compared
    # the second verdict compared pooled samples: its figure is the table's own
    data, perf = with_two_verdicts(results, {"threshold": 1.1, "candidate": 41.5, "repetitions": True}, {})
    html = render(data)
    assert html.count("the figure the verdict compared with the baseline's") == 1  # the pooled one: no second figure
    assert "verdict: 41.5 tok/s (fastest repetitions: p90 of per-repetition values)" in html
    assert Verdict.from_dict(perf[0]["verdicts"][0]).sentence() in html


def test_render_is_fast(results):
    data = copy.deepcopy(results)
    data["records"] = data["records"] * 10  # a larger run than the suites produce
    start = time.perf_counter()
    render(data)
    assert time.perf_counter() - start < 30  # generous bound against hangs; the benchmark measures speed


def test_cli_report_compare_summary(results, tmp_path, monkeypatch, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(results))
    assert cli_main(["report", str(a), "-o", str(tmp_path / "out.html")]) == 0
    assert "pytest-infergate report" in (tmp_path / "out.html").read_text()

    assert cli_main(["compare", str(a), str(a)]) == 0
    assert "REGRESSION" not in capsys.readouterr().out  # a run against itself: a pass, or too few repetitions to say
    slower = copy.deepcopy(results)
    for record in slower["records"]:
        if record["kind"] == "perf":
            record["measurement"]["samples"]["ttft_ms"] = [v * 3 for v in record["measurement"]["samples"]["ttft_ms"]]
    b = tmp_path / "b.json"
    b.write_text(json.dumps(slower))
    assert cli_main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "ttft_ms" in out and "fail TTFT p50 ×3 slower (×3" in out
    # the sentences are the in-run gate's ('the save', 'this run'): the first line says which file each is
    assert out.splitlines()[0] == f"A = {a} (the accepted run: 'the save' below), B = {b} (the candidate: 'this run')"

    step_summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    assert cli_main(["summary", str(a), "--markdown"]) == 0
    assert "| precision | vs | verdict |" in step_summary.read_text()
    assert cli_main(["report", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare_lists_tests_present_in_one_run_only(results):
    fewer = copy.deepcopy(results)
    fewer["records"] = [r for r in fewer["records"] if "too_slow" not in r["test"]]
    rows, _, _ = compare_runs(RunResults.from_dict(results), RunResults.from_dict(fewer), 0.1)
    assert any(row[3] == "missing" for row in rows)
    assert "## pytest-infergate" in summary_markdown(results)


E_NOTATION = re.compile(r"\d\.?\d*e[+-]\d")


def _slow(data: dict) -> dict:
    """The run with TTFT samples in the tens of seconds and a throughput in the thousands."""
    data = copy.deepcopy(data)
    for record in data["records"]:
        if record["kind"] == "perf":
            samples = record["measurement"]["samples"]
            samples["ttft_ms"] = [16_800.0 + i for i in range(len(samples["ttft_ms"]))]
            samples["tokens_per_s"] = [1_051.0 * (1 + i / 100) for i in range(len(samples["tokens_per_s"]))]
    return data


def test_numbers_read_like_units_in_the_report_and_the_summaries(results, capsys, tmp_path):
    data = _slow(results)
    html = render(data)
    assert not E_NOTATION.search(html), E_NOTATION.search(html)
    assert "16.8 s" in html and "1,050 tok/s" in html
    histogram = html[html.index('aria-label="TTFT distribution"'):]
    histogram = histogram[:histogram.index("</svg>")]
    ticks = re.findall(r'text-anchor="middle" class="tk">(\d[^<]*)</text>', histogram)
    assert len(set(ticks)) == len(ticks) >= 3 and all(t.startswith("16.") for t in ticks), ticks  # in s, distinct
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(data))
    assert cli_main(["summary", str(path)]) == 0
    assert cli_main(["summary", str(path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert not E_NOTATION.search(out) and "ttft_ms_p50 16.8 s" in out and "| 16.8 s |" in out


@pytest.mark.parametrize("value, text", [(16_843.2, "16,800"), (4_540.1, "4,540"), (0.4213, "0.421"), (0, "0"),
                                         (1.2e-7, "1.2×10⁻⁷"), (float("inf"), "–"), (float("nan"), "–"),
                                         (None, "–"), (999.7, "1,000"), (12, "12")])
def test_number_format(value, text):
    assert units.number(value) == text


def test_units_and_round_ticks():
    assert units.duration_ms(16_843) == "16.8 s" and units.duration_ms(4_540) == "4,540 ms"
    assert units.mebibytes(1_160.4) == "1,160 MiB" and units.mebibytes(20_480) == "20 GiB"
    assert units.metric_value("ttft_ms_p95", 16_800) == "16.8 s" and units.change(-0.041) == "−4.1%"
    assert units.nice_ticks(0, 11_561) == [0, 5_000, 10_000, 15_000]
    assert units.nice_ticks(0, 1_160) == [0, 500, 1_000, 1_500]
    assert units.tick_labels(units.nice_ticks(16.80, 16.87)) == ["16.80", "16.82", "16.84", "16.86", "16.88"]


def test_perf_table_is_grouped_by_file_with_short_labels_and_verdicts_that_say_why(results):
    html = render(results)
    assert html.count('<h3 class="file"><code>test_run.py</code>') == 1
    assert '<td class="l" title="test_run.py::test_too_slow[nf4]"><details><summary>test_too_slow[nf4]' in html
    # which metric, measured vs the limit (the measured figure is timing: any number with its unit)
    assert re.search(r"ttft_ms [\d.,]+ (?:ms|s) &gt; budget 0\.0001 ms", html)
    assert "met: tokens_per_s ≥ 0.01 tok/s" in html


def test_memory_chart_shows_kv_used_beside_allocated(results):
    html = render(results)
    assert "KV used" in html and "KV allocated" in html and "KV used / allocated" in html


def test_one_quality_section_per_precision_pair_with_the_tests_that_used_it(results):
    data = copy.deepcopy(results)
    nf4 = next(r for r in data["records"] if r["kind"] == "quality" and r["precision"] == "nf4")
    data["records"].append({**copy.deepcopy(nf4), "test": "test_other.py::test_again[nf4]", "status": "fail",
                            "problems": ["min_top1: top1 = 0.257, policy >= 0.9"]})
    html = render(data)
    assert html.count("nf4 vs fp32 — ") == 1 and "used by 2 tests" in html
    assert "test_again[nf4]</code> <span class=\"fail\">fail" in html and "min_top1: top1 = 0.257" in html
    assert "The reference precision against itself" in html  # fp32 vs fp32: no table of ones
    changed = html.count("· nf4 vs fp32 · ROUGE-L")
    assert changed == sum(1 for s in nf4["samples"] if not s["exact_match"])  # each changed sample once


def test_undefined_task_ratio_says_why_and_never_reaches_json_as_infinity(results, capsys, tmp_path):
    data = copy.deepcopy(results)
    nf4 = next(r for r in data["records"] if r["kind"] == "quality" and r["precision"] == "nf4")
    nf4["summary"].update(task_ratio=float("inf"), reference_task=0.0, candidate_task=0.5)  # as version 2 wrote
    run = RunResults.from_dict(data)
    text = json.dumps(run.to_dict(), allow_nan=False)  # strict JSON: no Infinity, no NaN
    back = json.loads(text)
    summary = next(r for r in back["records"] if r["kind"] == "quality" and r["precision"] == "nf4")["summary"]
    assert summary["task_ratio"] is None and "reference passed no task check" in summary["task_ratio_undefined"]
    for html in (render(data), render(back)):
        assert "undefined (the reference passed no task check, the candidate 50%: no loss)" in html
        assert ">inf<" not in html
    path = tmp_path / "back.json"
    path.write_text(text)
    assert cli_main(["summary", str(path)]) == 0
    assert "task_ratio undefined (the reference passed no task check" in capsys.readouterr().out


def test_results_carry_run_id_commit_and_fingerprint_and_older_files_still_read(results):
    assert results["schema_version"] == 4 and re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", results["run_id"])
    assert len(results["fingerprint"]) == 12 and "commit" in results
    old = copy.deepcopy(results)
    for key in ("run_id", "commit", "fingerprint"):
        del old[key]
    old["schema_version"] = 2
    assert RunResults.from_dict(old).run_id == "" and "pytest-infergate report" in render(old)


def test_the_run_appended_itself_to_its_history_and_the_report_links_it(results):
    root = Path(results["_root"])
    runs = sorted(p.name for p in (root / "hist").glob("2*.json"))
    assert runs == [results["run_id"] + ".json"]
    assert 'href="hist/history.html"' in (root / "r.html").read_text()
    assert 'href="../r.html"' in (root / "hist" / "history.html").read_text()


@needs_chromium
def test_report_in_headless_chromium(results, tmp_path):
    data = _slow(results)
    quality = next(r for r in data["records"] if r["kind"] == "quality" and r["precision"] == "nf4")
    sample = next(s for s in quality["samples"] if not s["exact_match"])
    sample["candidate_text"] = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
    page = tmp_path / "report.html"
    page.write_text(render(data))
    check = open_page(page, width=1400)
    assert check.errors == []
    assert check.page_overflow == 0 and check.wide_tables == []  # fits 1400 px: no horizontal scrolling
    assert check.title.startswith("infergate report") and "pwned" not in check.title  # model output stays text
    assert '<script>document.title="pwned"</script>' in check.text and "passed" in check.text


def test_xdist_two_workers_one_complete_report(pytester, cache_dir):
    pytester.makepyfile(RUN.replace(QUALITY_TEST, ""))
    result = pytester.runpytest("-n", "2", "--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                "--infergate-precisions=fp32,int8", "--infergate-report=rep.html",
                                "--infergate-json=rep.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=2)
    data = json.loads((pytester.path / "rep.json").read_text())
    tests = [r["test"] for r in data["records"]]
    assert len(tests) == 6 == len(set(tests))
    html = (pytester.path / "rep.html").read_text()
    assert all(t.split("::")[-1] in html for t in tests)


def test_backend_and_self_check_cost_are_shown_and_older_files_without_them_read_as_the_engine(results):
    from pytest_infergate.results.summary import summary_lines

    run = RunResults.from_dict(results)
    assert {r.backend for r in run.records} == {"engine"} and run.models["fp32"]["self_check_s"] > 0
    text = "\n".join(line.text for line in summary_lines(run))
    assert re.search(r"fp32: load \S+ s, self-check \S+ s, weights", text) and "hf-generate" not in text
    assert "Run on HF generate" not in render(results)  # quiet on the engine

    old = copy.deepcopy(results)  # written before backends were recorded
    for record in [*old["records"], *old["models"].values()]:
        for key in ("backend", "backend_reason", "self_check_s"):
            record.pop(key, None)
    assert {r.backend for r in RunResults.from_dict(old).records} == {"engine"}
    assert "self-check" not in "\n".join(line.text for line in summary_lines(RunResults.from_dict(old)))

    hf = copy.deepcopy(results)
    why = "model family 'bloom' does not call transformers' attention interface"
    hf["models"]["fp32"].update(backend="hf-generate", backend_reason=why, self_check_s=0.2)
    perf = next(r for r in hf["records"] if r["kind"] == "perf" and r["precision"] == "fp32")
    perf.update(backend="hf-generate", backend_reason=why)
    lines = [line.text for line in summary_lines(RunResults.from_dict(hf))]
    assert f"         backend: hf-generate, because {why}" in lines
    assert any(line.startswith("  perf") and perf["test"] + " [backend: hf-generate]:" in line for line in lines)
    page = render(hf)
    assert "Run on HF generate, not the engine" in page and "for fp32 (1 result), because model family" in page


def test_cli_output_cut_short_by_a_pipe_and_history_help_have_no_papercuts(results, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**results, "records": results["records"] * 200}))
    cli = str(Path(sys.executable).with_name("infergate"))
    piped = subprocess.run(["bash", "-c", f"'{cli}' summary '{path}' | head -1"], capture_output=True, text=True,
                           timeout=120)
    assert piped.stdout.strip() and "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
    helped = subprocess.run([cli, "history", "--help"], capture_output=True, text=True, timeout=60)
    assert "+N% with its 95% CI" in " ".join(helped.stdout.split()) and "%%" not in helped.stdout


def test_checks_that_did_not_run_are_a_table_with_why_and_how(results):
    # issue #31 point 6: check, test, why, how to make it run; skipped golden checks included
    from pytest_infergate.results.run import not_run

    # issue #42 point 2: the rows are the findings as made (typed), never a message parsed back
    from pytest_infergate.status import Finding

    data = copy.deepcopy(results)
    golden_test = "suites/test_golden.py::test_against_accepted_golden[fp32]"
    missing = Finding("golden regression", golden_test, "golden regression check not run: no accepted golden "
                      "outputs at golden/m/f/cpu-fp32.jsonl", "review a run with --infergate-update-golden and "
                      "commit the file")
    data["findings"] = [missing.to_dict(), Finding("relative perf check", "suites/test_speed.py::test_chat[fp32]",
                                                   "relative check not run: the baseline file has no entry for "
                                                   "this measurement").to_dict()]
    server = Finding("endpoint check", "suites/test_endpoint.py::test_capacity", "needs a live server",
                     "pass --infergate-endpoint URL")
    data["skipped_findings"] = {golden_test: missing.to_dict(), server.test: server.to_dict()}
    data["skips"] = {"suites/test_limits.py::test_x[int8]": "the limits suite runs on the reference precision",
                     "suites/test_limits.py::test_x[nf4]": "the limits suite runs on the reference precision",
                     golden_test: missing.reason(), server.test: server.reason()}
    run = RunResults.from_dict(data)
    rows, by_design = not_run(run)
    golden, relative, endpoint = rows  # the golden check warned and skipped: one row
    assert golden == missing and relative.check == "relative perf check" and endpoint == server
    assert by_design == {"the limits suite runs on the reference precision": 2}
    # the file keeps them typed, and an older file's plain warning line is a row as it was written, not parsed
    assert RunResults.from_dict(run.to_dict()).findings == run.findings
    older = copy.deepcopy(results)
    older["warnings"] = [missing.text()]
    older.pop("findings", None)
    (row,), _ = not_run(RunResults.from_dict(older))
    assert (row.check, row.test, row.why, row.fix) == ("check", "", missing.text(), "")
    html = render(data)
    assert '<table class="not-run">' in html and "how to make it run" in html
    assert "Skipped by design: 2 × the limits suite runs on the reference precision" in html


def test_each_column_is_named_as_its_metric_defined_and_the_gated_figure_marked(results):
    # issue #31 point 4: one figure per metric, named as the metrics reference names it; the gate's figure marked
    html = render(copy.deepcopy(results))
    for name in ("ttft_ms p50", "ttft_ms p95", "tpot_ms p50", "tokens_per_s", "peak_mem_mb"):
        assert f">{name}</th>" in html
    assert "output tokens of completed requests / the repetition&#39;s wall time, median over repetitions" in html
    assert 'class="gated"' in html and "● marks a figure a gate checked" in html


def test_a_parameter_with_an_empty_id_reads_as_such():
    from pytest_infergate.report.template_context import split_test_id

    assert split_test_id("suites/t.py::test_chat_latency[]") == ("suites/t.py", "test_chat_latency[(empty id)]")
    assert split_test_id("suites/t.py::test_gain[-1]::long") == ("suites/t.py", "test_gain[-1]::long")
    assert split_test_id("test_bare[]") == ("", "test_bare[(empty id)]")


def test_a_measurement_no_gate_checked_says_so_instead_of_pass(results):
    # issue #45: a test with no budget and no reference read PASS, though nothing was checked
    data = copy.deepcopy(results)
    record = next(r for r in data["records"] if r["kind"] == "perf" and r["status"] == "pass")
    record["budget"] = {"max_regression": None}
    ungated = render(data)
    assert f'title="{record["test"]}"' in ungated
    row = ungated[ungated.index(f'title="{record["test"]}"'):]
    assert "<b>measured, not gated</b>" in row[:row.index("</tr>")]
    assert "<b>measured, not gated</b>" not in render(results)  # every measurement of the run had a budget


def test_a_test_failed_by_its_gate_is_one_reason_located_in_the_test(results):
    # issue #45: each failing test read twice (as the test and as its gate), its place a line of the plugin
    from pytest_infergate.results.run import run_verdict

    verdict = run_verdict(RunResults.from_dict(results))
    slow = [reason for reason in verdict.reasons if "test_too_slow" in reason.name]
    assert len(slow) == 2 and {reason.what for reason in slow} == {"perf gate"}  # fp32 and nf4, once each
    failures = {nodeid: message for nodeid, message in results["failures"].items() if "test_too_slow" in nodeid}
    assert len(failures) == 2 and all("(test_run.py:" in message for message in failures.values()), failures


def test_a_load_peak_below_the_weights_says_the_weights_are_mapped_from_their_file(results):
    """On the CPU, safetensors weights stay mapped from their file and are read in by the first forward pass, after
    the load: the process's load peak (SmolLM2: 363 MiB) lies below the weights (513 MiB), which the line explains."""
    from pytest_infergate.results.summary import model_lines

    mapped = copy.deepcopy(results)
    load = mapped["models"]["fp32"]
    load.update(weight_bytes=513 << 20, peak_mem_bytes=363 << 20, peak_mem_method="VmHWM + malloc in use")
    (line,) = [line.text for line in model_lines(RunResults.from_dict(mapped)) if "fp32: load" in line.text]
    assert "(process 363 MiB, VmHWM + malloc in use: the weights are mapped from their file and read in at first " \
           "use, after the load)" in line
    load.update(peak_mem_bytes=600 << 20)  # a peak that holds the weights needs no word
    (line,) = [line.text for line in model_lines(RunResults.from_dict(mapped)) if "fp32: load" in line.text]
    assert "mapped" not in line and "(process 600 MiB, VmHWM + malloc in use)" in line
    for unexplained in ({"peak_mem_bytes": 0}, {"peak_mem_bytes": 363 << 20, "device": "cuda:0"}):
        load.update(unexplained)  # no peak read, or a GPU's allocator: nothing mapped to explain
        assert not any("mapped" in line.text for line in model_lines(RunResults.from_dict(mapped)))


def _quality_run(*checks: tuple, rules: dict | None = None) -> RunResults:
    """A run of quality records only: per (test, precision, top1, mean_kl) one record against fp32 (each figure's
    interval ±0.02 and ±0.01) under `rules` (min_top1 0.9, max_mean_kl 0.05)."""
    from pytest_infergate.quality.metrics import QualityResult
    from pytest_infergate.quality.policy import ResolvedPolicy, decide_quality
    from pytest_infergate.results.records import QualityRecord

    run = RunResults()
    policy = ResolvedPolicy.given(rules or {"min_top1": 0.9, "max_mean_kl": 0.05})
    for test, precision, top1, kl in checks:
        summary = {"samples": 48, "top1": top1, "top1_ci": [top1 - 0.02, top1 + 0.02], "mean_kl": kl,
                   "mean_kl_ci": [kl - 0.01, kl + 0.01], "rougeL": 0.5}
        result = QualityResult(precision, "fp32", [], summary, {}, 1.0)
        decision = decide_quality(result, policy)
        run.records.append(QualityRecord(f"t.py::{test}[{precision}]", decision.status, result, policy.rules,
                                         decision.problems, undecided=decision.undecided,
                                         decided_by=policy.decided_by()))
    return run


def _compare_quality(a: RunResults, b: RunResults) -> tuple[dict, Status, list[str]]:
    rows, verdict, notes = compare_runs(a, b)
    return {(row[0].split(": ")[-1], row[1]): row[2:] for row in rows}, verdict, notes


def test_compare_decides_quality_as_a_change_from_a_to_b_and_names_what_one_side_lacks():
    """`infergate compare` on quality, each check matched by its test (a new user's findings, then a review's): a
    failure in B where A passed or had none is a regression, as is a failure of another threshold, of another test
    of the same precision, or one further than A's interval reaches; the same failure in both is no change (a file
    against itself said REGRESSION); a check on one side only is named (B's failed nf4 disappeared beside A's
    int8); only the thresholds B's policy sets are decided (every figure of a failed gate read 'fail'); the
    reference against itself is said, not compared."""
    nf4 = ("q", "nf4", 0.5, 0.3)
    int8, nf4_failing = _quality_run(("q", "int8", 0.95, 0.02)), _quality_run(nf4)
    rows, verdict, notes = _compare_quality(int8, nf4_failing)
    assert verdict == Status.FAIL
    assert rows[("t.py::q[int8]", "-")] == ["present", "missing", "not compared"]
    assert rows[("t.py::q[nf4]", "-")] == ["missing", "present", "fail in B's own run (not compared)"]
    assert "quality nf4 vs fp32: t.py::q[nf4]: failed its policy in B, absent from A" in notes

    rows, verdict, notes = _compare_quality(nf4_failing, nf4_failing)
    assert verdict == Status.PASS
    assert ("quality nf4 vs fp32: t.py::q[nf4]: failed min_top1, max_mean_kl in both runs, B no worse than A's "
            "interval: no change between them") in notes
    assert rows[("t.py::q[nf4]", "min_top1")][:2] == ["0.5", "0.5"]
    assert rows[("t.py::q[nf4]", "min_top1")][2].startswith("fail min_top1: top1 = 0.5")
    assert rows[("t.py::q[nf4]", "rougeL")][2] == "not gated by B's policy"

    assert _compare_quality(_quality_run(("q", "nf4", 0.95, 0.02)), nf4_failing)[1] == Status.FAIL
    assert _compare_quality(nf4_failing, _quality_run(("q", "nf4", 0.95, 0.02)))[1] == Status.PASS
    # another threshold fails in B (A failed top-1 only), or the same one much further: a regression
    kl_now = _quality_run(("q", "nf4", 0.95, 0.5))
    assert _compare_quality(_quality_run(("q", "nf4", 0.85, 0.02)), kl_now)[1] == Status.FAIL
    worse = _compare_quality(_quality_run(("q", "nf4", 0.85, 0.3)), _quality_run(("q", "nf4", 0.3, 0.3)))
    assert worse[1] == Status.FAIL and any("beyond A's interval" in note for note in worse[2])
    # two tests of one precision: test x failed in A, test y fails in B
    a, b = _quality_run(("x", "nf4", 0.5, 0.3), ("y", "nf4", 0.95, 0.02)), _quality_run(
        ("x", "nf4", 0.95, 0.02), ("y", "nf4", 0.5, 0.3))
    assert _compare_quality(a, b)[1] == Status.FAIL
    itself = _quality_run(("q", "fp32", 1.0, 0.0))
    rows, verdict, notes = _compare_quality(itself, itself)
    assert verdict == Status.PASS and not rows and notes == [
        "quality fp32 vs fp32: t.py::q[fp32]: the reference against itself, identical by construction: not compared"]

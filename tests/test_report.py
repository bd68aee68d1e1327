"""The HTML report and the `infergate` CLI, from the results of a real (tiny) run."""

import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_infergate.cli import compare_runs
from pytest_infergate.cli import main as cli_main
from pytest_infergate.report import render as render_results
from pytest_infergate.results import RunResults
from pytest_infergate.results.summary import summary_markdown as summary_of_results


def render(data: dict) -> str:
    return render_results(RunResults.from_dict(data))


def summary_markdown(data: dict) -> str:
    return summary_of_results(RunResults.from_dict(data))

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

def test_quality(infergate_golden):
    infergate_golden.check(limit=6)
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory, cache_dir):
    """One real run (perf pass and fail, quality) in a subprocess; returns the results JSON."""
    root = tmp_path_factory.mktemp("run")
    (root / "test_run.py").write_text(RUN)
    shutil.copytree(Path(__file__).parents[1] / "golden", root / "golden", ignore=shutil.ignore_patterns("*/"))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--infergate-model=tiny-random-llama",
                    f"--infergate-cache-dir={cache_dir}", "--infergate-precisions=fp32,nf4",
                    "--infergate-json=r.json", "--infergate-report=r.html"], cwd=root, capture_output=True, timeout=600)
    data = json.loads((root / "r.json").read_text())
    data["_root"] = str(root)
    return data


def test_mixed_run_renders_everything(results):
    html = render(results)
    assert html.count("<svg") >= 3  # tokens/s, memory, TTFT, timeline
    for section in ('id="summary"', 'id="perf"', 'id="quality"', 'id="charts"', 'id="samples"'):
        assert section in html
    assert "test_too_slow" in html and ">fail<" in html and ">pass<" in html
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


def test_verdicts_show_their_ci_and_whether_rounds_were_paired(results):
    data = copy.deepcopy(results)
    perf = [r for r in data["records"] if r["kind"] == "perf"][:2]
    perf[0]["verdicts"] = [{"metric": "tokens_per_s", "status": "fail", "ratio": 2.5, "low": 2.1, "high": 2.9,
                            "threshold": 1.5, "percentile": None, "candidate": 40, "baseline": 100,
                            "samples": [5, 5], "paired": True}]
    perf[1]["verdicts"] = [{"metric": "tokens_per_s", "status": "pass", "ratio": 1.01, "low": 0.9, "high": 1.1,
                            "threshold": 1.5, "percentile": None, "candidate": 99, "baseline": 100,
                            "samples": [5, 5]}]  # written before verdicts said whether they were paired
    html = render(data)
    assert "×2.5 vs baseline (CI 2.1–2.9) fail (paired by round)" in html
    assert "×1.01 vs baseline (CI 0.9–1.1) pass<" in html


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
    assert "no regression" in capsys.readouterr().out
    slower = copy.deepcopy(results)
    for record in slower["records"]:
        if record["kind"] == "perf":
            record["measurement"]["samples"]["ttft_ms"] = [v * 3 for v in record["measurement"]["samples"]["ttft_ms"]]
    b = tmp_path / "b.json"
    b.write_text(json.dumps(slower))
    assert cli_main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "ttft_ms" in out and "+200.0%" in out

    step_summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    assert cli_main(["summary", str(a), "--markdown"]) == 0
    assert "| precision | vs | verdict |" in step_summary.read_text()
    assert cli_main(["report", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare_lists_tests_present_in_one_run_only(results):
    fewer = copy.deepcopy(results)
    fewer["records"] = [r for r in fewer["records"] if "too_slow" not in r["test"]]
    rows, _ = compare_runs(RunResults.from_dict(results), RunResults.from_dict(fewer), 0.1)
    assert any(row[3] == "missing" for row in rows)
    assert "## pytest-infergate" in summary_markdown(results)


@pytest.mark.skipif(not shutil.which("chromedriver"), reason="needs Debian's chromium and chromium-driver")
def test_report_in_headless_chromium(results):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1300,1000"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(Path(results["_root"], "r.html").as_uri())
        summary = driver.find_element(By.ID, "summary")
        assert summary.is_displayed() and "passed" in summary.text
        chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")
        assert chart.is_displayed() and chart.size["height"] > 50
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()


def test_xdist_two_workers_one_complete_report(pytester, cache_dir):
    pytester.makepyfile(RUN.replace("def test_quality(infergate_golden):\n    infergate_golden.check(limit=6)\n", ""))
    result = pytester.runpytest("-n", "2", "--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                "--infergate-precisions=fp32,int8", "--infergate-report=rep.html",
                                "--infergate-json=rep.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=2)
    data = json.loads((pytester.path / "rep.json").read_text())
    tests = [r["test"] for r in data["records"]]
    assert len(tests) == 6 == len(set(tests))
    html = (pytester.path / "rep.html").read_text()
    assert all(t.split("::")[-1] in html for t in tests)

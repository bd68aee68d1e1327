"""`infergate init` (issue #45): a project's first gate, and its CI job's steps run as written, in order."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_infergate.cli import main
from pytest_infergate.errors import OptionError
from pytest_infergate.project_files import init_project


def test_init_writes_the_starter_files_and_leaves_existing_ones_alone(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"tests/test_inference_gate.py", "tests/conftest.py", "golden/default.jsonl",
                       ".github/workflows/infergate.yml"}
    out = capsys.readouterr().out
    assert "note: the CI job runs `pip install pytest-infergate`; until it is on PyPI" in out
    job = yaml.safe_load((tmp_path / ".github/workflows/infergate.yml").read_text())
    gate = next(step for step in job["jobs"]["gate"]["steps"] if step.get("name") == "gate")
    assert "--infergate-save-baseline=perf/baseline.json" in gate["run"] and "pytest tests " in gate["run"]
    summary = next(step for step in job["jobs"]["gate"]["steps"] if step.get("name") == "summary")
    assert "hashFiles('infergate-results.json')" in summary["if"]  # no second failure after a usage error
    saved = next(step for step in job["jobs"]["gate"]["steps"] if step.get("uses") == "actions/cache/save@v4")
    assert saved["if"].startswith("always()")  # the history is kept after a failing run too
    starter = (tmp_path / "tests/test_inference_gate.py").read_text()
    ast.parse(starter)
    # issue #55: no marker on its quality test, so the default policy of each precision's class decides: written out
    quality_test = starter[starter.index("def test_quantized_outputs"):]
    assert "#   floating point (fp32, fp16, bf16): min_top1=0.95, max_mean_kl=0.01" in quality_test
    assert "#   8-bit (int8): min_top1=0.9, max_mean_kl=0.05" in quality_test
    assert "#   4-bit (nf4): min_top1=0.9, max_mean_kl=0.05" in quality_test
    assert "infergate_quality(" not in starter[:starter.index("def test_quantized_outputs")]
    (tmp_path / "tests/conftest.py").write_text("# the project's own\n")
    again = init_project(tmp_path)
    assert [w.kept for w in again] == [True] * 4
    assert (tmp_path / "tests/conftest.py").read_text() == "# the project's own\n"

    gitlab = tmp_path / "gl"
    init_project(gitlab, ci="gitlab", tests="gates", install="./wheels/pytest_infergate-0.1.0-py3-none-any.whl")
    job = yaml.safe_load((gitlab / ".gitlab-ci.yml").read_text())["infergate"]
    assert any("pip install ./wheels/pytest_infergate-0.1.0-py3-none-any.whl" in line for line in job["script"])
    assert any("pytest gates " in line for line in job["script"]) and (gitlab / "gates/conftest.py").exists()
    with pytest.raises(OptionError, match="--ci 'jenkins' is not known"):
        init_project(tmp_path / "x", ci="jenkins")


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("recipe,kind", [("github-cpu.yml", "github"), ("github-gpu.yml", "github-gpu"),
                                         ("gitlab-ci.yml", "gitlab")])
def test_the_documented_ci_recipes_are_the_jobs_init_writes(recipe, kind):
    """docs/ci/ holds what `infergate init --ci KIND` writes, so the recipes run the steps the test below runs."""
    from pytest_infergate.project_files import ci_job

    assert (ROOT / "docs" / "ci" / recipe).read_text() == ci_job(kind)
    text = ci_job(kind)
    assert "--infergate-save-baseline=" in text and "--infergate-json=infergate-results.json" in text
    assert "--infergate-history=" in text and ("--infergate-strict" in text) == (kind == "github-gpu")


def gate_steps(project: Path, kind: str) -> dict[str, str]:
    """The shell of the job's gate and summary steps, as the CI would run them."""
    if kind == "gitlab":
        job = yaml.safe_load((project / ".gitlab-ci.yml").read_text())["infergate"]
        return {"gate": job["script"][1], "summary": job["after_script"][0]}
    job = yaml.safe_load((project / ".github/workflows/infergate.yml").read_text())
    return {step["name"]: step["run"] for step in job["jobs"]["gate"]["steps"] if step.get("name")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["github", "gitlab"])
def test_the_ci_jobs_gate_step_saves_the_baseline_then_compares_against_it(tmp_path, tiny_source, cache_dir, kind):
    """The job's gate step, run as written (its shell, in the project's folder) twice: the first run saves
    perf/baseline.json, the second compares with it; the summary step then reads the results. The workload
    fixture reads workloads/*.jsonl."""
    init_project(tmp_path, ci=kind)
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads/traffic.jsonl").write_text(
        "\n".join(f'{{"prompt": "Request {i}: say something about the sea.", "max_tokens": 8}}' for i in range(4)))
    steps = gate_steps(tmp_path, kind)
    bin_dir = tmp_path / "bin"  # `pytest` and `infergate` of this venv, on the project's tiny model
    bin_dir.mkdir()
    # its random int8 agrees with fp32 at top-1 ~0.88, below the starter's 8-bit default (0.9): a policy of its own
    (bin_dir / "pytest").write_text(f"#!/bin/sh\nexec {sys.executable} -m pytest -p no:cacheprovider -q "
                                    f"--infergate-model={tiny_source.path} --infergate-cache-dir={cache_dir} "
                                    "-o 'infergate_quality_policy=int8: min_top1=0.5, max_mean_kl=0.5' "
                                    "--infergate-precisions=fp32,int8 \"$@\"\n")
    (bin_dir / "infergate").write_text(f"#!/bin/sh\nexec {sys.executable} -m pytest_infergate.cli \"$@\"\n")
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}

    def step(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-ec", steps[name]], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)

    first = step("gate")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert (tmp_path / "perf/baseline.json").exists()
    assert "baseline: this run saved to perf/baseline.json, 2 perf measurements to compare with (later runs " \
        in first.stdout
    # the first run compared nothing, and its verdict line says so (not a bare PASS)
    first_verdict = next(line for line in first.stdout.splitlines() if line.startswith("infergate verdict:"))
    assert "on budgets only, nothing compared with a baseline" in first_verdict, first.stdout[-3000:]
    second = step("gate")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "baseline" in second.stdout and "infergate verdict:" in second.stdout
    second_verdict = next(line for line in second.stdout.splitlines() if line.startswith("infergate verdict:"))
    assert "nothing compared" not in second_verdict, second_verdict
    assert (tmp_path / "infergate-history").is_dir() and (tmp_path / "infergate-report.html").is_file()
    summary = step("summary")
    shown = summary.stdout if kind == "gitlab" else Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary.returncode == 0 and "test_serving" in shown
    if kind == "github":  # one summary: `--markdown` appends to $GITHUB_STEP_SUMMARY itself, the step adds nothing
        assert shown.count("## pytest-infergate") == 1, shown


def test_a_conftest_an_older_init_wrote_still_imports_its_workload_reader():
    # before 0.4 the starter conftest imported from_file from pytest_infergate.workload_files (now workloads)
    import importlib
    import sys

    sys.modules.pop("pytest_infergate.workload_files", None)
    with pytest.warns(DeprecationWarning, match="moved to pytest_infergate.workloads"):
        module = importlib.import_module("pytest_infergate.workload_files")
    from pytest_infergate.workloads import from_file
    assert module.from_file is from_file


def test_init_copies_a_built_wheel_into_the_project_and_the_job_installs_it_from_there(tmp_path):
    """Until the package is on PyPI: `infergate init --wheel PATH` puts the wheel where the job's install step finds
    it (wheels/, to commit); a path that is no pytest-infergate wheel says how to build one."""
    built = tmp_path / "dist/pytest_infergate-0.4.0-py3-none-any.whl"
    built.parent.mkdir()
    built.write_bytes(b"PK")
    project = tmp_path / "project"
    written = init_project(project, ci="github", wheel=built)
    copied = project / "wheels" / built.name
    assert written[0].path == copied and copied.read_bytes() == b"PK"
    job = (project / ".github/workflows/infergate.yml").read_text()
    assert f"pip install ./wheels/{built.name}" in job
    with pytest.raises(OptionError, match="not a pytest-infergate wheel file; build one in a checkout with"):
        init_project(tmp_path / "other", wheel=tmp_path / "missing.whl")


def test_the_gpu_job_is_strict_only_where_it_compares_with_a_baseline(tmp_path):
    """The first run saves the baseline and has nothing to compare: strict there would fail a busy runner's run
    although the baseline was written."""
    init_project(tmp_path, ci="github-gpu")
    job = yaml.safe_load((tmp_path / ".github/workflows/infergate-gpu.yml").read_text())
    steps = next(step["run"] for step in job["jobs"]["gate"]["steps"] if step.get("name") == "gate")
    compare, save = steps.split("else", 1)
    assert "--infergate-strict" in compare and "--infergate-baseline=" in compare
    assert "--infergate-strict" not in save.split("fi", 1)[0]
    assert steps.count("--infergate-strict") == 1

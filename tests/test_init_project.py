"""`infergate init` (issue #45): a project's first gate; its CI jobs are the documented recipes (their steps run in
order in tests/test_ci_recipes.py)."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pytest_infergate.ci_jobs import ci_job
from pytest_infergate.cli import main
from pytest_infergate.errors import OptionError
from pytest_infergate.project_files import init_project


def test_init_writes_the_starter_files_and_leaves_existing_ones_alone(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"pytest.ini", "tests/test_inference_gate.py", "tests/conftest.py", "golden/default.jsonl",
                       ".github/workflows/infergate.yml", "perf/requirements.txt", ".gitignore"}
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
    # every golden sample: a sample set is generated whole anyway, and 16 left the ini's nf4 example undecided
    assert "    infergate_golden.check()\n" in quality_test and "limit=" not in quality_test
    assert "infergate_quality(" not in starter[:starter.index("def test_quantized_outputs")]
    (tmp_path / "tests/conftest.py").write_text("# the project's own\n")
    again = init_project(tmp_path)
    assert [w.kept for w in again] == [True] * 7
    assert (tmp_path / "tests/conftest.py").read_text() == "# the project's own\n"

    gitlab = tmp_path / "gl"
    init_project(gitlab, ci="gitlab", tests="gates", install="./wheels/pytest_infergate-0.1.0-py3-none-any.whl")
    job = yaml.safe_load((gitlab / ".gitlab-ci.yml").read_text())["infergate"]
    assert job["script"][1] == "pip install -r perf/requirements.txt ./wheels/pytest_infergate-0.1.0-py3-none-any.whl"
    assert any("pytest gates " in line for line in job["script"]) and (gitlab / "gates/conftest.py").exists()
    with pytest.raises(OptionError, match="--ci 'jenkins' is not known"):
        init_project(tmp_path / "x", ci="jenkins")


def test_init_ignores_what_gate_runs_leave_and_names_the_lines_an_existing_gitignore_lacks(tmp_path, capsys):
    """Issue #56 trial: a baseline saved by a local try at the path the CI job commits blocked `git pull` of the
    job's commit. init's .gitignore lists the local try's files, the job's outputs and the venv, not the job's
    baseline (the job must `git add` it); an existing .gitignore is kept, with the lines it lacks named."""
    assert main(["init", str(tmp_path)]) == 0
    ignored = (tmp_path / ".gitignore").read_text().split()
    assert {"local-baseline.json", "report.html", "infergate-results.json", "infergate-history/", ".venv/",
            "__pycache__/"} <= set(ignored) and "perf/baseline.json" not in ignored
    said = capsys.readouterr().out
    assert "--infergate-save-baseline=local-baseline.json" in said
    assert "Traffic files go in tests/workloads/*.jsonl" in said  # where the starter's conftest reads them
    own = tmp_path / "own"
    own.mkdir()
    (own / ".gitignore").write_text(".venv/\nreport.html\n")
    kept = next(w for w in init_project(own) if w.path.name == ".gitignore")
    assert kept.kept and kept.note.startswith("add dist/, __pycache__/, local-baseline.json, infergate-results.json, "
                                              "infergate-report.html, infergate-history/, base-env/, "
                                              "base-requirements.txt to it")
    assert (own / ".gitignore").read_text() == ".venv/\nreport.html\n"


def test_the_starter_gates_the_speed_of_the_reference_precision_only_on_the_cpu(pytester, cache_dir, tmp_path):
    """Issue #56: bitsandbytes' CPU fallback kernels say nothing of int8's speed on a GPU and take the longest of a
    starter run; on the CPU the starter's serving gate skips them, saying why, while int8's outputs are gated."""
    init_project(pytester.path, ci="none")
    ini = pytester.path / "pytest.ini"  # tiny-random-llama's random weights: int8 agrees with fp32 by chance only
    ini.write_text(ini.read_text() + "infergate_quality_policy = int8: min_top1=0.01, max_mean_kl=1000\n")
    result = pytester.runpytest("tests", "--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                "-p", "no:cacheprovider", "-rs", f"--infergate-json={tmp_path / 'out.json'}")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*test_inference_gate.py*int8 speed is gated on a GPU (--infergate-gpu)*"])
    records = json.loads((tmp_path / "out.json").read_text())["records"]
    assert {(r["kind"], r["precision"]) for r in records} == {("perf", "fp32"), ("quality", "fp32"),
                                                              ("quality", "int8")}
    # its int8 serving test skips itself before measuring: `-k test_serving` loads no int8 weights
    serving = pytester.runpytest("tests", "--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                 "-p", "no:cacheprovider", "-k", "test_serving",
                                 f"--infergate-json={tmp_path / 's.json'}")
    serving.assert_outcomes(passed=1, skipped=1)
    assert set(json.loads((tmp_path / "s.json").read_text())["models"]) == {"fp32"}


ROOT = Path(__file__).resolve().parents[1]


def test_the_libraries_file_names_no_index_and_the_cpu_jobs_install_cpu_torch_first(tmp_path):
    """Issue #56 trial: perf/requirements.txt carried `--extra-index-url` of torch's CPU index, so every `pip install
    -r` asked that host for every package: where it is unreachable, ~550 s of retries. The file names no index (its
    comment gives the CPU torch line); the CPU jobs install torch first from the CPU index, at the file's pin, in
    their own venv and in the A/B's base-env, then the file from PyPI."""
    from pytest_infergate.ci_jobs import CPU_TORCH_INDEX, cpu_torch

    init_project(tmp_path)
    requirements = (tmp_path / "perf/requirements.txt").read_text()
    assert not [line for line in requirements.splitlines() if line.startswith("-")]  # no pip option at all
    torch_pin = next(line for line in requirements.splitlines() if line.startswith("torch"))
    # the libraries a model runs on in the gate, bitsandbytes too (the ini gates int8 and nf4 on it): an upgrade of
    # one is a change of this file, gated A/B (a new user found bitsandbytes unpinned)
    from importlib import metadata

    assert f"bitsandbytes=={metadata.version('bitsandbytes').split('+')[0]}" in requirements.splitlines()
    assert f'#   pip install "{torch_pin}" --index-url {CPU_TORCH_INDEX}' in requirements
    job = yaml.safe_load((tmp_path / ".github/workflows/infergate.yml").read_text())["jobs"]["gate"]["steps"]
    install = next(step for step in job if step.get("name") == "install")["run"].splitlines()
    assert install == [cpu_torch("perf/requirements.txt"), "pip install -r perf/requirements.txt pytest-infergate"]
    base = next(step for step in job if step.get("name") == "baseline environment")["run"]
    assert base.index(cpu_torch("base-requirements.txt", "base-env/bin/python -m pip")) < base.index(
        "-m pip install -r base-requirements.txt")
    gitlab = yaml.safe_load(ci_job("gitlab"))["infergate"]["script"]
    assert gitlab[0] == cpu_torch("perf/requirements.txt") and gitlab[1].startswith("pip install -r perf/")
    # the line picks the file's torch requirement, not a library whose name starts with it; any torch without one
    for lines, picked in ((["torchvision==0.1", "torch==2.13.0", "transformers"], "torch==2.13.0"),
                          (["torch>=2.4 ; python_version >= '3.10'"], "torch>=2.4 ; python_version >= '3.10'"),
                          (["transformers==5"], "torch")):
        (tmp_path / "r.txt").write_text("\n".join(lines) + "\n")
        shown = subprocess.run(["bash", "-c", cpu_torch("r.txt", "echo")], cwd=tmp_path, capture_output=True,
                               text=True, check=True).stdout
        assert shown == f"install {picked} --index-url {CPU_TORCH_INDEX}\n", shown



def test_init_sets_precisions_that_pass_their_default_policies_and_says_how_to_add_nf4(tmp_path):
    """Issue #56 trial: without an ini, every run (the CI job's first) adds nf4, which fails the 4-bit default
    policy on most models, so the first run failed and its baseline was never committed. init writes the precisions
    into pytest.ini, where the job's command picks them up; nf4 with a stated policy is shown, not set."""
    import configparser

    from pytest_infergate.options import Options

    init_project(tmp_path)
    ini = configparser.ConfigParser()
    ini.read(tmp_path / "pytest.ini")

    def resolved(ini_value):
        return Options.from_sources(lambda name: None, lambda name: ini_value if name == "precisions" else None)

    assert "nf4" in resolved(None).precisions  # the plugin's own default, which the first CI run would take
    assert resolved(ini["pytest"]["infergate_precisions"]).precisions == ("fp32", "int8")
    text = (tmp_path / "pytest.ini").read_text()
    assert "#   infergate_precisions = fp32,int8,nf4\n#   infergate_quality_policy = nf4: min_top1=" in text
    assert "--infergate-precisions" not in (tmp_path / ".github/workflows/infergate.yml").read_text()
    gpu = tmp_path / "gpu"
    init_project(gpu, ci="github-gpu")
    assert "--infergate-precisions=fp16,int8 " in (gpu / ".github/workflows/infergate-gpu.yml").read_text()

    # a project whose pytest settings live elsewhere keeps them (a pytest.ini beside them would replace them): init
    # names the line to add
    own = tmp_path / "own"
    own.mkdir()
    (own / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-q'\n")
    written = init_project(own)
    assert not (own / "pytest.ini").exists()
    assert written[0].path == own / "pyproject.toml" and written[0].kept
    assert 'add `infergate_precisions = "fp32,int8"`' in written[0].line()


@pytest.mark.parametrize("recipe,kind", [("github-cpu.yml", "github"), ("github-gpu.yml", "github-gpu"),
                                         ("gitlab-ci.yml", "gitlab")])
def test_the_documented_ci_recipes_are_the_jobs_init_writes(recipe, kind):
    """docs/ci/ holds what `infergate init --ci KIND` writes, so the recipes run the steps tests/test_ci_recipes.py
    runs."""
    from pytest_infergate.ci_jobs import ci_job

    assert (ROOT / "docs" / "ci" / recipe).read_text() == ci_job(kind)
    text = ci_job(kind)
    assert "--infergate-save-baseline=" in text and "--infergate-json=infergate-results.json" in text
    assert "--infergate-history=" in text and ("--infergate-strict" in text) == (kind == "github-gpu")


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
    assert f"pip install -r perf/requirements.txt ./wheels/{built.name}" in job
    with pytest.raises(OptionError, match="not a pytest-infergate wheel file; build one in a checkout with"):
        init_project(tmp_path / "other", wheel=tmp_path / "missing.whl")


def test_a_rerun_with_a_wheel_says_the_job_an_earlier_init_wrote_still_installs_from_pypi(tmp_path, capsys):
    """New-user trial (#56): `infergate init .` then, as its note says, `init . --wheel PATH`: the job written first
    is kept and still runs `pip install pytest-infergate`, so the rerun must not say the job installs the wheel; it
    says the job does not install it and how to write it anew. A rerun with the same install says nothing."""
    from pytest_infergate.cli import main

    built = tmp_path / "dist/pytest_infergate-0.4.0-py3-none-any.whl"
    built.parent.mkdir()
    built.write_bytes(b"PK")
    project = tmp_path / "project"
    assert main(["init", str(project)]) == 0
    # the rerun keeps every file that exists: the note says to delete the job first
    assert "delete .github/workflows/infergate.yml and rerun with --wheel" in capsys.readouterr().out
    assert main(["init", str(project), "--wheel", str(built)]) == 0
    out = capsys.readouterr().out
    assert f"does not install ./wheels/{built.name}: remove it and rerun `infergate init`" in out, out
    assert "the CI job installs it from there" not in out
    assert "rerun with --wheel" not in out, out  # the note asking for what this rerun did (a new-user trial read both)
    (project / ".github/workflows/infergate.yml").unlink()
    assert main(["init", str(project), "--wheel", str(built)]) == 0
    out = capsys.readouterr().out
    assert "the CI job installs it from there" in out and "does not install" not in out, out
    assert main(["init", str(project), "--wheel", str(built)]) == 0
    assert "does not install" not in capsys.readouterr().out


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


def test_init_without_a_ci_job_says_nothing_of_one(tmp_path, capsys):
    """New-user trial (stop 69): `infergate init proj --ci none --wheel W` printed that "the CI job's first run …
    commits its own perf/baseline.json" and "the CI job installs it from there", of a job it had not written."""
    from pytest_infergate.cli import main

    built = tmp_path / "dist/pytest_infergate-0.4.0-py3-none-any.whl"
    built.parent.mkdir()
    built.write_bytes(b"PK")
    assert main(["init", str(tmp_path / "project"), "--ci", "none", "--wheel", str(built)]) == 0
    out = capsys.readouterr().out
    assert "CI job" not in out, out
    assert "next: pytest tests --infergate-save-baseline=local-baseline.json" in out, out
    assert main(["init", str(tmp_path / "with-job"), "--wheel", str(built)]) == 0
    out = capsys.readouterr().out
    assert "the CI job's first run on your default branch saves and commits" in out
    assert "the CI job installs it from there" in out


def test_init_writes_the_model_it_was_given_where_every_run_reads_it(tmp_path, capsys):
    """New-user trial (stop 71): `infergate init` had no model option; a newcomer gating their own model typed
    --infergate-model on every command, and the CI job it wrote gated the embedded model. `--model` writes
    pytest.ini's infergate_model (the CPU jobs' commands read it), the GPU job's MODEL, and refuses a typo now."""
    import configparser

    from pytest_infergate.options import Options

    assert main(["init", str(tmp_path / "p"), "--model", "tiny-random-llama"]) == 0
    out = capsys.readouterr().out
    assert "(tiny-random-llama, the ini's infergate_model)" in out
    assert "note: tiny-random-llama has seeded random weights: its speed gates work" in out
    assert "the starter gates fp32 alone" in out
    ini = configparser.ConfigParser()
    ini.read(tmp_path / "p/pytest.ini")
    values = dict(ini["pytest"])
    options = Options.from_sources(lambda name: None, lambda name: values.get(f"infergate_{name}"))
    # a random-weight model's int8 fails the 8-bit quality default (new-user trial, stop 72: INCONCLUSIVE at 16
    # samples, FAIL at the 32 it asked for), which says nothing of quantization: its starter gates fp32 alone
    assert options.model == "tiny-random-llama" and options.precisions == ("fp32",)
    assert "--infergate-model" not in (tmp_path / "p/.github/workflows/infergate.yml").read_text()

    gguf = tmp_path / "models/mine.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    init_project(tmp_path / "gpu", ci="github-gpu", model=str(gguf))
    # a hosted runner cannot reach a file outside the project: said; the GPU job's own runner may (its MODEL)
    assert main(["init", str(tmp_path / "hosted"), "--model", str(gguf)]) == 0
    assert f"note: the CI job runs on a hosted runner, where {gguf} is not" in capsys.readouterr().out
    assert main(["init", str(tmp_path / "own-gpu"), "--ci", "github-gpu", "--model", str(gguf)]) == 0
    assert "hosted runner" not in capsys.readouterr().out
    job = yaml.safe_load((tmp_path / "gpu/.github/workflows/infergate-gpu.yml").read_text())
    assert job["jobs"]["gate"]["env"]["MODEL"] == str(gguf)
    assert init_project(tmp_path / "hub", ci="none", model="meta-llama/Llama-3.2-1B")  # a hub id: the run fetches it
    assert "infergate_precisions = fp32,int8\n" in (tmp_path / "hub/pytest.ini").read_text()  # a trained model's

    own = tmp_path / "own"
    own.mkdir()
    (own / "pyproject.toml").write_text('[tool.pytest.ini_options]\ninfergate_precisions = "fp32"\n')
    (kept, *_) = init_project(own, ci="none", model="tiny-random-llama")
    assert kept.kept and kept.note == 'add `infergate_model = "tiny-random-llama"` to its pytest settings'
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "setup.cfg").write_text("[tool:pytest]\n")
    (kept, *_) = init_project(bare, ci="none", model="tiny-random-llama")
    assert "add `infergate_precisions = fp32` and `infergate_model = tiny-random-llama`" in kept.note, kept.note

    with pytest.raises(OptionError, match=r"--model './modles/mine.gguf': no such file or directory.*"
                                          r"check the spelling or path"):
        init_project(tmp_path / "typo", model="./modles/mine.gguf")
    assert not (tmp_path / "typo").exists()  # refused before anything was written


@pytest.mark.parametrize("kind", ["github", "github-gpu", "gitlab"])
def test_init_names_the_baseline_file_its_job_commits(kind, tmp_path, capsys):
    """init said every job commits perf/baseline.json; the GPU job saves and commits perf/baseline-gpu.json."""
    from pytest_infergate.ci_jobs import BASELINE_FILES

    job = ci_job(kind)
    assert f"--infergate-save-baseline={BASELINE_FILES[kind]}" in job and f"git add {BASELINE_FILES[kind]}" in job
    assert main(["init", str(tmp_path), "--ci", kind]) == 0
    assert f"saves and commits its own {BASELINE_FILES[kind]} " in capsys.readouterr().out

"""Issue #56, point 4: each documented CI recipe run as written in a user's project. A scratch project made by
`infergate init --wheel` (the wheel built from this checkout) is pushed to a bare origin; the job's steps, read from
the recipe init wrote (tests/ci_emulation.py), run in order in a fresh clone per run, as the CI runs them: a first
run on the default branch (it saves the baseline and commits it to origin), then a compare (the GitHub job: a pull
request that changes perf/requirements.txt, gated A/B in a second venv of the base branch's libraries, then the next
push, against the committed baseline; the GitLab job: a branch that changes perf/requirements.txt, A/B, then the
next push). The project picks the tiny model through its own pytest.ini, as a user picks theirs; the recipes'
commands are unchanged."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
from ci_emulation import CacheStore, Run, Runner, evaluate, github_job, gitlab_job, run_github, run_gitlab

from pytest_infergate.cli import main
from pytest_infergate.project_files import init_project

REPO = Path(__file__).resolve().parents[1]
# the project's choice of model (the tiny one: each run in seconds) and of precisions, in its own ini
PYTEST_INI = "[pytest]\ninfergate_model = tiny-random-llama\ninfergate_precisions = fp32\n"
TRAFFIC = "\n".join(f'{{"prompt": "Request {i}: say something about the sea.", "max_tokens": 8}}' for i in range(3))
# a pull request that pins one more library: a change of perf/requirements.txt that this machine's packages satisfy
PIN = f"huggingface_hub=={metadata.version('huggingface_hub')}\n"
GITLAB_URL = "https://oauth2:test-token@gitlab.test/group/project.git"  # the push URL the GitLab job builds


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def scratch_project(tmp_path: Path, kind: str, wheel: Path, ini: str = PYTEST_INI) -> Path:
    """`infergate init` with the wheel, the project's ini and traffic; committed and pushed to a bare origin."""
    project = tmp_path / "project"
    assert main(["init", str(project), "--ci", kind, "--wheel", str(wheel)]) == 0
    (project / "pytest.ini").write_text(ini)
    (project / "workloads").mkdir()
    (project / "workloads/traffic.jsonl").write_text(TRAFFIC + "\n")
    git("init", "-q", "-b", "main", cwd=project)
    git("add", ".", cwd=project)
    git("commit", "-q", "-m", "infergate gate", cwd=project)
    origin = tmp_path / "origin.git"
    git("clone", "-q", "--bare", str(project), str(origin), cwd=tmp_path)
    return origin


def push_a_library_pin(project: Path, origin: Path) -> str:
    """A branch `pin-libraries` that changes perf/requirements.txt, pushed; the default branch's head."""
    git("pull", "-q", str(origin), "main", cwd=project)
    git("checkout", "-q", "-b", "pin-libraries", cwd=project)
    with (project / "perf/requirements.txt").open("a") as out:
        out.write(PIN)
    git("commit", "-q", "-am", "pin huggingface_hub", cwd=project)
    git("push", "-q", str(origin), "pin-libraries", cwd=project)
    return git("rev-parse", "main", cwd=origin)


def check_ab_run(run: Run, gate: str, origin: Path, head: str) -> None:
    """A change of perf/requirements.txt: gated A/B in a base-env venv of the base branch's libraries; nothing
    committed."""
    assert not run.failed, run.failed
    assert (run.workspace / "base-env/bin/python").is_file()
    assert "starting the baseline environment's worker (base-env/bin/python" in gate, gate[-3000:]
    assert perf_routes(run) == ["environment"]
    assert "had no baseline to compare with" not in run.verdict, run.verdict
    assert git("rev-parse", "main", cwd=origin) == head
    assert len(list((run.workspace / "infergate-history").glob("*.json"))) == 2  # the history cache came back


def perf_routes(run: Run) -> list[str]:
    """What each perf gate of the run compared with (perf.outcome.Route), from the results file the job kept."""
    results = json.loads((run.workspace / "infergate-results.json").read_text())
    return [record["route"] for record in results["records"] if record["kind"] == "perf"]


def check_first_run(run: Run, origin: Path) -> None:
    """Exit 0 everywhere; the baseline saved and committed to the default branch; the verdict says nothing was
    compared; the results, report and history written."""
    assert not run.failed, run.failed
    assert "had no baseline to compare with" in run.verdict, run.verdict
    assert perf_routes(run) == ["budget"]
    saved = run.workspace / "perf/baseline.json"
    assert json.loads(saved.read_text())["records"]
    assert git("show", "main:perf/baseline.json", cwd=origin) == saved.read_text()
    assert "first baseline" in git("log", "-1", "--format=%s", "main", cwd=origin)
    for name in ("infergate-results.json", "infergate-report.html"):
        assert (run.workspace / name).is_file(), name
    assert len(list((run.workspace / "infergate-history").glob("*.json"))) == 1


@pytest.mark.parametrize("kind", ["github", "github-gpu", "gitlab"])
def test_every_step_of_every_recipe_is_one_the_ci_test_runs_or_emulates(tmp_path, kind):
    """The fast tier's share: each recipe parses into steps the slow tests below can run (the GPU job's too, which
    runs only on CUDA), every key and action known, every condition evaluated for a push and a pull request."""
    init_project(tmp_path, ci=kind)
    if kind == "gitlab":
        job = gitlab_job(tmp_path / ".gitlab-ci.yml")
        assert [s.name for s in job.steps] == ["script[0]", "script[1]", "script[2]", "script[3]", "script[4]",
                                               "after_script[0]"]
        assert ".cache/infergate" in job.cache_paths and "perf/baseline.json" in job.artifact_paths
        return
    job = github_job(next((tmp_path / ".github/workflows").glob("*.yml")))
    for event in ("push", "pull_request"):
        context = {"github.event_name": event, "github.ref_name": "main",
                   "github.event.repository.default_branch": "main"}
        ran = [s.name for s in job.steps if evaluate(s.condition, context, tmp_path, failed=False)]
        assert ("commit the first baseline" in ran) == (event == "push")
        assert ("baseline environment" in ran) == (event == "pull_request" and kind == "github")
    with pytest.raises(ValueError, match="not one this emulation knows"):
        evaluate("contains(github.ref, 'main')", context, tmp_path, failed=False)


@pytest.mark.slow
def test_the_github_cpu_recipe_saves_and_commits_the_baseline_gates_a_library_change_ab_then_compares(
        tmp_path, wheel, cache_dir):
    origin = scratch_project(tmp_path, "github", wheel)
    job = github_job(tmp_path / "project/.github/workflows/infergate.yml")
    runner = Runner(tmp_path / "ci", cache_dir, CacheStore(tmp_path / "ci-cache"))

    first = run_github(runner, origin, job, 1, "push", "main")
    check_first_run(first, origin)
    assert [o.step.name for o in first.outcomes if not o.ran] == ["baseline environment"]  # a push: no A/B
    assert first.summary.count("## pytest-infergate") == 1, first.summary  # one summary: --markdown appends it
    assert "site-packages/pytest_infergate" in subprocess.run(  # the wheel the recipe installed, not this checkout
        [runner.root / "python-run1/bin/python", "-c", "import pytest_infergate; print(pytest_infergate.__file__)"],
        capture_output=True, text=True, env=runner.env(runner.root / "python-run1"), cwd=first.workspace).stdout
    assert "perf/baseline.json" in first.step("actions/upload-artifact@v4").emulated

    head = push_a_library_pin(tmp_path / "project", origin)
    second = run_github(runner, origin, job, 2, "pull_request", "pin-libraries")
    assert second.step("baseline environment").ran and not second.step("commit the first baseline").ran
    check_ab_run(second, second.step("gate").output, origin, head)
    assert second.summary.count("## pytest-infergate") == 1, second.summary

    third = run_github(runner, origin, job, 3, "push", "main")  # the next push: the committed baseline compared
    assert not third.failed, third.failed
    assert perf_routes(third) == ["stored"], third.step("gate").output[-3000:]
    assert "had no baseline to compare with" not in third.verdict, third.verdict
    assert git("rev-parse", "main", cwd=origin) == head  # nothing new to commit
    assert len(list((third.workspace / "infergate-history").glob("*.json"))) == 3


@pytest.mark.slow
def test_the_gitlab_recipe_saves_and_commits_the_baseline_gates_a_library_change_ab_then_compares(
        tmp_path, wheel, cache_dir):
    origin = scratch_project(tmp_path, "gitlab", wheel)
    job = gitlab_job(tmp_path / "project/.gitlab-ci.yml")
    runner = Runner(tmp_path / "ci", cache_dir, CacheStore(tmp_path / "ci-cache"))
    # the GitLab server the job pushes to with its INFERGATE_PUSH_TOKEN: the bare origin, by git's own URL rewrite
    (runner.home / ".gitconfig").write_text(f'[url "{origin}"]\n\tinsteadOf = {GITLAB_URL}\n')

    first = run_gitlab(runner, origin, job, 1, "main")
    check_first_run(first, origin)
    assert first.verdict in first.step("after_script[0]").output  # the summary, in the job's log

    head = push_a_library_pin(tmp_path / "project", origin)

    second = run_gitlab(runner, origin, job, 2, "pin-libraries")  # a branch pipeline: gated A/B
    check_ab_run(second, second.step("script[3]").output, origin, head)
    assert (second.workspace / "junit.xml").is_file()

    third = run_gitlab(runner, origin, job, 3, "main")  # the next push: the committed baseline compared
    assert not third.failed, third.failed
    assert perf_routes(third) == ["stored"], third.step("script[3]").output[-3000:]
    assert "had no baseline to compare with" not in third.verdict and git("rev-parse", "main", cwd=origin) == head


@pytest.mark.gpu
def test_the_github_gpu_recipe_saves_without_strict_then_compares_strictly(tmp_path, wheel, cache_dir):
    """On a CUDA machine only (benchmarks/gpu_check.sh; skipped elsewhere, `--infergate-gpu` being a usage error
    without CUDA). The job's env holds the runner's own paths: set here as a user sets them for their runner."""
    # the job's precisions are its own (fp16, int8); the tiny model's random weights agree with fp16 far less than a
    # real model's, so the project's ini sets the quality policy a user of such a model would
    origin = scratch_project(tmp_path, "github-gpu", wheel, PYTEST_INI + "infergate_quality_policy =\n"
                             "    int8: min_top1=0.5, max_mean_kl=0.5\n    nf4: min_top1=0.1, max_mean_kl=5\n")
    job = github_job(tmp_path / "project/.github/workflows/infergate-gpu.yml")
    assert set(job.env) == {"INFERGATE_CACHE_DIR", "INFERGATE_HISTORY", "MODEL"}
    job = replace(job, env={"INFERGATE_CACHE_DIR": str(cache_dir), "INFERGATE_HISTORY": str(tmp_path / "history"),
                            "MODEL": "tiny-random-llama"})
    runner = Runner(tmp_path / "ci", cache_dir, CacheStore(tmp_path / "ci-cache"))

    first = run_github(runner, origin, job, 1, "push", "main")  # the first save: not strict, whatever the runner
    assert not first.failed, first.failed
    assert "had no baseline to compare with" in first.verdict
    assert git("show", "main:perf/baseline-gpu.json", cwd=origin)
    assert first.summary.count("## pytest-infergate") == 1, first.summary

    second = run_github(runner, origin, job, 2, "push", "main")  # the compare: strict, against the committed file
    gate = second.step("gate")
    assert set(perf_routes(second)) == {"stored"}, gate.output[-3000:]
    assert "had no baseline to compare with" not in second.verdict, gate.output[-3000:]
    # strict: exit 0 where the verdict decided, 1 only where it is INCONCLUSIVE (what strict is for)
    assert gate.returncode == 0 or (gate.returncode == 1 and "INCONCLUSIVE" in second.verdict), gate.output[-3000:]

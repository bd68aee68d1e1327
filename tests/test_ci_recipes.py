"""Issue #56, point 4: each documented CI recipe run as written in a user's project. A scratch project made by
`infergate init --wheel` (the wheel built from this checkout) is pushed to a bare origin; the job's steps, read from
the recipe init wrote (tests/ci_emulation.py), run in order in a fresh clone per run, as the CI runs them: a first
run on the default branch (it saves the baseline and commits it to origin), then a compare (the GitHub job: a pull
request that changes perf/requirements.txt, gated A/B in a second venv of the base branch's libraries; the GitLab
job: the next push, against the committed baseline). The project picks the tiny model through its own pytest.ini,
as a user picks theirs; the recipes' commands are unchanged."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from ci_emulation import CacheStore, Job, Outcome, evaluate, expand, github_job, gitlab_job, run_shell

from pytest_infergate.cli import main

REPO = Path(__file__).resolve().parents[1]
# the project's choice of model (the tiny one: each run in seconds) and of precisions, in its own ini
PYTEST_INI = "[pytest]\ninfergate_model = tiny-random-llama\ninfergate_precisions = fp32\n"
TRAFFIC = "\n".join(f'{{"prompt": "Request {i}: say something about the sea.", "max_tokens": 8}}' for i in range(3))
# a pull request that pins one more library: a change of perf/requirements.txt that this machine's packages satisfy
PIN = f"huggingface_hub=={metadata.version('huggingface_hub')}\n"
PREINSTALLED = sysconfig.get_paths()["purelib"]  # this venv's packages: torch & co. as a runner has them
GITLAB_URL = "https://oauth2:test-token@gitlab.test/group/project.git"  # the push URL the GitLab job builds


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel a user builds in a checkout (`pip wheel --no-deps -w dist .`), once for the module."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("pytest_infergate-*.whl")
    return built


@dataclass
class Runner:
    """A fresh CI machine for each run: its Python (setup-python, or GitLab's python image) a venv whose
    pre-installed packages are this test venv's (torch & co.: nothing downloaded), after its own, so that what the
    recipe installs (the wheel, a base-env venv's libraries) wins as it would; the model cache a CI cache restores."""

    root: Path
    cache_dir: Path
    store: CacheStore

    def __post_init__(self):
        self.home = self.root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.preinstalled = self.root / "preinstalled"  # a sitecustomize on PYTHONPATH: every Python of the run
        self.preinstalled.mkdir(exist_ok=True)
        # right after a venv's own packages, before the base Python's (a base-env venv sees them as the runner's)
        (self.preinstalled / "sitecustomize.py").write_text(
            "import site\nimport sys\n\nown = site.getsitepackages()[0]\n"
            f"sys.path.insert(sys.path.index(own) + 1 if own in sys.path else len(sys.path), {PREINSTALLED!r})\n")

    def python(self, run: str) -> Path:
        venv = self.root / f"python-{run}"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        for name in ("pip", "pytest"):  # the console scripts of the pre-installed pip and pytest, as pip writes them
            (entry,) = metadata.entry_points(group="console_scripts", name=name)
            script = venv / "bin" / name
            script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom {entry.module} import {entry.attr}\n"
                              f"sys.exit({entry.attr}())\n")
            script.chmod(0o755)
        return venv

    def env(self, venv: Path, **extra: str) -> dict[str, str]:
        return {"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "CI": "true",
                "PYTHONPATH": str(self.preinstalled), "LANG": "C.UTF-8", **extra}

    def model_cache(self, path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.symlink_to(self.cache_dir)
        return f"{path}: the CI cache of the models, restored (this session's model cache)"


@dataclass
class Run:
    outcomes: list[Outcome]
    workspace: Path
    summary: str  # what the run wrote to $GITHUB_STEP_SUMMARY

    def step(self, name: str) -> Outcome:
        return next(o for o in self.outcomes if o.step.name == name)

    @property
    def failed(self) -> list[str]:
        return [f"{o.step.name}: exit {o.returncode}\n{o.output[-3000:]}" for o in self.outcomes if o.returncode]

    @property
    def verdict(self) -> str:
        gate = "\n".join(o.output for o in self.outcomes)
        return next(line for line in gate.splitlines() if line.startswith("infergate verdict:"))


def clone(origin: Path, ref: str, workspace: Path) -> None:
    subprocess.run(["git", "clone", "-q", "--branch", ref, str(origin), str(workspace)], check=True, timeout=60)


def run_github(runner: Runner, origin: Path, job: Job, run_id: int, event: str, ref: str) -> Run:
    workspace, venv = runner.root / f"run{run_id}", runner.python(f"run{run_id}")
    summary = runner.root / f"summary{run_id}.md"
    context = {"github.event_name": event, "github.ref_name": "1/merge" if event == "pull_request" else ref,
               "github.event.repository.default_branch": "main", "github.run_id": str(run_id)}
    env = runner.env(venv, GITHUB_ACTIONS="true", GITHUB_EVENT_NAME=event, GITHUB_REF_NAME=context["github.ref_name"],
                     GITHUB_BASE_REF="main" if event == "pull_request" else "", GITHUB_STEP_SUMMARY=str(summary),
                     GITHUB_WORKSPACE=str(workspace), GITHUB_OUTPUT=str(runner.root / f"output{run_id}"), **job.env)
    outcomes, failed = [], False
    for step in job.steps:
        if not evaluate(step.condition, context, workspace, failed):
            outcomes.append(Outcome(step, ran=False))
            continue
        if step.uses:
            outcomes.append(Outcome(step, ran=True, emulated=github_action(step, runner, origin, ref, workspace,
                                                                           venv, context)))
            continue
        start = time.monotonic()
        done = run_shell(expand(step.run, context), workspace, {**env, **step.env})
        outcomes.append(Outcome(step, ran=True, returncode=done.returncode, output=done.stdout + done.stderr,
                                seconds=time.monotonic() - start))
        failed |= done.returncode != 0
    return Run(outcomes, workspace, summary.read_text() if summary.exists() else "")


def github_action(step, runner: Runner, origin: Path, ref: str, workspace: Path, venv: Path, context) -> str:
    """What GitHub does for each action the recipes use; another action fails the test."""
    action, inputs = step.uses.split("@")[0], {k: expand(v, context) for k, v in step.inputs.items()}
    if action == "actions/checkout":
        clone(origin, ref, workspace)
        return f"a fresh clone of origin at {ref}"
    if action == "actions/setup-python":
        version = subprocess.run([venv / "bin/python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        return f"Python {version} (the recipe asks for {inputs['python-version']}) with pre-installed packages"
    if action == "actions/cache" and inputs["path"] == "~/.cache/infergate":
        return runner.model_cache(runner.home / ".cache/infergate")
    if action == "actions/cache/restore":
        return f"{inputs['path']} restored: {runner.store.restore(inputs['path'], workspace / inputs['path'])}"
    if action == "actions/cache/save":
        return f"{inputs['path']} saved: {runner.store.save(inputs['path'], workspace / inputs['path'])}"
    if action == "actions/upload-artifact":
        return "artifact: " + " ".join(p for p in inputs["path"].split() if (workspace / p).is_file())
    raise AssertionError(f"the recipe uses {step.uses}, which this test does not emulate: emulate or skip it")


def run_gitlab(runner: Runner, origin: Path, job: Job, run_id: int, branch: str) -> Run:
    """A branch pipeline of `branch`: the runner's clone, the job's caches restored, the script lines until one
    fails, the after_script whatever happened, the caches saved (`when: always`), the artifacts."""
    workspace, venv = runner.root / f"run{run_id}", runner.python(f"run{run_id}")
    clone(origin, branch, workspace)
    env = runner.env(venv, GITLAB_CI="true", CI_PROJECT_DIR=str(workspace), CI_DEFAULT_BRANCH="main",
                     CI_COMMIT_BRANCH=branch, CI_COMMIT_REF_NAME=branch, CI_SERVER_HOST="gitlab.test",
                     CI_PROJECT_PATH="group/project", INFERGATE_PUSH_TOKEN="test-token")
    for key, value in job.env.items():
        env[key] = expand_variables(value, env)
    outcomes: list[Outcome] = []
    for path in job.cache_paths:
        if path == ".cache/infergate":
            assert env["INFERGATE_CACHE_DIR"] == str(workspace / path)
            runner.model_cache(workspace / path)
        else:
            runner.store.restore(path, workspace / path)
    failed = False
    for step in job.steps:
        if failed and step.condition != "always()":
            outcomes.append(Outcome(step, ran=False))
            continue
        start = time.monotonic()
        done = run_shell(step.run, workspace, env)
        outcomes.append(Outcome(step, ran=True, returncode=done.returncode, output=done.stdout + done.stderr,
                                seconds=time.monotonic() - start))
        failed |= done.returncode != 0 and step.condition != "always()"
    for path in job.cache_paths:
        if path != ".cache/infergate":
            runner.store.save(path, workspace / path)
    return Run(outcomes, workspace, "")


def expand_variables(text: str, env: dict[str, str]) -> str:
    """A GitLab variable's value, its $NAME and ${NAME} expanded from the variables before it."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], text)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def scratch_project(tmp_path: Path, kind: str, wheel: Path) -> Path:
    """`infergate init` with the wheel, the project's ini and traffic; committed and pushed to a bare origin."""
    project = tmp_path / "project"
    assert main(["init", str(project), "--ci", kind, "--wheel", str(wheel)]) == 0
    (project / "pytest.ini").write_text(PYTEST_INI)
    (project / "workloads").mkdir()
    (project / "workloads/traffic.jsonl").write_text(TRAFFIC + "\n")
    git("init", "-q", "-b", "main", cwd=project)
    git("add", ".", cwd=project)
    git("commit", "-q", "-m", "infergate gate", cwd=project)
    origin = tmp_path / "origin.git"
    git("clone", "-q", "--bare", str(project), str(origin), cwd=tmp_path)
    return origin


def check_first_run(run: Run, origin: Path) -> None:
    """Exit 0 everywhere; the baseline saved and committed to the default branch; the verdict says nothing was
    compared; the results, report and history written."""
    assert not run.failed, run.failed
    assert "on budgets only, nothing compared with a baseline" in run.verdict, run.verdict
    saved = run.workspace / "perf/baseline.json"
    assert json.loads(saved.read_text())["records"]
    assert git("show", "main:perf/baseline.json", cwd=origin) == saved.read_text()
    assert "first baseline" in git("log", "-1", "--format=%s", "main", cwd=origin)
    for name in ("infergate-results.json", "infergate-report.html"):
        assert (run.workspace / name).is_file(), name
    assert len(list((run.workspace / "infergate-history").glob("*.json"))) == 1


@pytest.mark.slow
def test_the_github_cpu_recipe_saves_and_commits_the_baseline_then_gates_a_library_change_ab(
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

    project = tmp_path / "project"  # a pull request that changes the libraries the model runs on
    git("pull", "-q", str(origin), "main", cwd=project)
    git("checkout", "-q", "-b", "pin-libraries", cwd=project)
    with (project / "perf/requirements.txt").open("a") as out:
        out.write(PIN)
    git("commit", "-q", "-am", "pin huggingface_hub", cwd=project)
    git("push", "-q", str(origin), "pin-libraries", cwd=project)
    head = git("rev-parse", "main", cwd=origin)

    second = run_github(runner, origin, job, 2, "pull_request", "pin-libraries")
    assert not second.failed, second.failed
    assert second.step("baseline environment").ran and (second.workspace / "base-env/bin/python").is_file()
    gate = second.step("gate").output
    assert "starting the baseline environment's worker" in gate, gate[-3000:]
    assert "nothing compared" not in second.verdict, second.verdict
    assert not second.step("commit the first baseline").ran and git("rev-parse", "main", cwd=origin) == head
    assert second.summary.count("## pytest-infergate") == 1, second.summary
    assert len(list((second.workspace / "infergate-history").glob("*.json"))) == 2  # the history cache came back


@pytest.mark.slow
def test_the_gitlab_recipe_saves_and_commits_the_baseline_then_compares_with_it(tmp_path, wheel, cache_dir):
    origin = scratch_project(tmp_path, "gitlab", wheel)
    job = gitlab_job(tmp_path / "project/.gitlab-ci.yml")
    runner = Runner(tmp_path / "ci", cache_dir, CacheStore(tmp_path / "ci-cache"))
    # the GitLab server the job pushes to with its INFERGATE_PUSH_TOKEN: the bare origin, by git's own URL rewrite
    (runner.home / ".gitconfig").write_text(f'[url "{origin}"]\n\tinsteadOf = {GITLAB_URL}\n')

    first = run_gitlab(runner, origin, job, 1, "main")
    check_first_run(first, origin)
    assert first.verdict in first.step("after_script[0]").output  # the summary, in the job's log
    head = git("rev-parse", "main", cwd=origin)

    second = run_gitlab(runner, origin, job, 2, "main")  # the next push: the committed baseline is compared
    assert not second.failed, second.failed
    gate = second.step("script[2]").output
    assert "regression against the baseline (" in gate and not (second.workspace / "base-env").exists(), gate[-3000:]
    assert "nothing compared" not in second.verdict, second.verdict
    assert git("rev-parse", "main", cwd=origin) == head  # nothing new to commit
    assert (second.workspace / "perf/baseline.json").read_text() == git("show", "main:perf/baseline.json",
                                                                        cwd=origin)
    assert len(list((second.workspace / "infergate-history").glob("*.json"))) == 2  # the history cache came back
    assert (second.workspace / "junit.xml").is_file()

"""A CI job's steps read from the recipe `infergate init` wrote, and run in order as GitHub Actions or GitLab CI
would (tests/test_ci_recipes.py). The shell lines run as written, with bash and the variables the CI sets; the
conditions are evaluated; what only a CI service does (checkout, setup-python, caches, artifacts) is emulated by the
test, each by name, and a step this module does not know fails the test rather than being passed over."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import yaml

EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")
COMPARISON = re.compile(r"^(.+?)\s*(==|!=)\s*(.+)$")
HASH_FILES = re.compile(r"^hashFiles\('([^']+)'\)$")
CHECKOUT = Path(__file__).resolve().parents[1]
# this Python's packages (torch & co.) as a runner has them installed: its site-packages and the folders on
# PYTHONPATH (benchmarks/gpu_check.sh installs into one), but not this checkout, which the recipe's wheel replaces
PREINSTALLED = [sysconfig.get_paths()["purelib"]] + [
    p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != CHECKOUT]


@dataclass(frozen=True)
class Step:
    """One step of a job: a shell (`run`) or an action the CI service provides (`uses`)."""

    name: str
    run: str | None = None
    uses: str | None = None
    condition: str = "success()"
    env: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # an action's `with:`


@dataclass(frozen=True)
class Job:
    steps: list[Step]
    env: dict[str, str]  # the job's `env:` (GitHub) or `variables:` (GitLab)
    cache_paths: list[str]  # GitLab's `cache:` paths (GitHub's caches are steps)
    artifact_paths: list[str]  # GitLab's `artifacts: paths` (GitHub's upload is a step)


@dataclass(frozen=True)
class Outcome:
    step: Step
    ran: bool
    returncode: int = 0
    output: str = ""
    emulated: str = ""  # what the test did in the CI service's place, for an action
    seconds: float = 0.0


# what these recipes may hold: a key or an action this emulation does not know fails the parse (the recipe grew
# something the test must learn to run, emulate or skip by name)
WORKFLOW_KEYS = {"name", "on", "permissions", "jobs"}
GITHUB_JOB_KEYS = {"runs-on", "env", "steps"}
STEP_KEYS = {"name", "uses", "with", "run", "if", "env"}
EMULATED_ACTIONS = {"actions/checkout", "actions/setup-python", "actions/cache", "actions/cache/restore",
                    "actions/cache/save", "actions/upload-artifact"}
GITLAB_JOB_KEYS = {"image", "variables", "cache", "script", "after_script", "artifacts"}


def github_job(path: Path) -> Job:
    workflow = yaml.safe_load(path.read_text())
    workflow.setdefault("on", workflow.pop(True, None))  # YAML 1.1 reads the key `on` as True
    assert set(workflow) <= WORKFLOW_KEYS and list(workflow["jobs"]) == ["gate"], sorted(map(str, workflow))
    job = workflow["jobs"]["gate"]
    assert set(job) <= GITHUB_JOB_KEYS, sorted(job)
    for raw in job["steps"]:
        assert set(raw) <= STEP_KEYS, raw
        assert "uses" not in raw or raw["uses"].split("@")[0] in EMULATED_ACTIONS, raw["uses"]
    steps = [Step(name=raw.get("name") or raw.get("uses") or raw["run"].split("\n")[0], run=raw.get("run"),
                  uses=raw.get("uses"), condition=raw.get("if", "success()"),
                  env={k: str(v) for k, v in raw.get("env", {}).items()},
                  inputs={k: str(v) for k, v in raw.get("with", {}).items()}) for raw in job["steps"]]
    return Job(steps, {k: str(v) for k, v in job.get("env", {}).items()}, [], [])


def gitlab_job(path: Path, name: str = "infergate") -> Job:
    """A GitLab job: each `script` line a step, failing the job where it fails; `after_script` runs whatever the
    outcome (GitLab runs the lines of a script in one shell; none of these recipes carries a shell variable from one
    line to the next, so one shell a line is the same)."""
    jobs = yaml.safe_load(path.read_text())
    assert list(jobs) == [name], sorted(jobs)
    job = jobs[name]
    assert set(job) <= GITLAB_JOB_KEYS, sorted(job)
    steps = [Step(f"script[{i}]", run=line) for i, line in enumerate(job["script"])]
    steps += [Step(f"after_script[{i}]", run=line, condition="always()") for i, line in
              enumerate(job.get("after_script", []))]
    caches = [p for cache in job.get("cache", []) for p in cache["paths"]]
    return Job(steps, {k: str(v) for k, v in job.get("variables", {}).items()}, caches,
               list(job.get("artifacts", {}).get("paths", [])))


def evaluate(condition: str, context: dict[str, str], workspace: Path, failed: bool) -> bool:
    """A GitHub `if:` of the forms these recipes use: terms joined by &&, each a status function (always(),
    success()), `hashFiles('glob') != ''`, or a comparison of context values and quoted strings. Anything else is
    an error: the recipe grew a condition this emulation must learn."""
    result, status_given = True, False
    for term in (t.strip() for t in condition.split("&&")):
        if term in ("always()", "success()", "failure()"):
            status_given = True
            result &= {"always()": True, "success()": not failed, "failure()": failed}[term]
            continue
        match = COMPARISON.match(term)
        if not match:
            raise ValueError(f"condition term {term!r} of {condition!r}: not one this emulation knows")
        left, op, right = (value(match.group(1), context, workspace), match.group(2),
                           value(match.group(3), context, workspace))
        result &= (left == right) == (op == "==")
    return result and (status_given or not failed)


def value(term: str, context: dict[str, str], workspace: Path) -> str:
    term = term.strip()
    if term.startswith("'") and term.endswith("'"):
        return term[1:-1]
    hashed = HASH_FILES.match(term)
    if hashed:  # a hash where a file matches, '' where none does (pathlib's trailing ** matches folders only)
        pattern = hashed.group(1) + ("/*" if hashed.group(1).endswith("**") else "")
        return "h" if any(p.is_file() for p in workspace.glob(pattern)) else ""
    if term not in context:
        raise ValueError(f"{term!r}: not in the emulated context {sorted(context)}")
    return context[term]


def expand(text: str, context: dict[str, str]) -> str:
    """`${{ name }}` replaced from the context; an unknown name is an error."""
    def one(match: re.Match) -> str:
        if match.group(1) not in context:
            raise ValueError(f"${{{{ {match.group(1)} }}}}: not in the emulated context {sorted(context)}")
        return context[match.group(1)]

    return EXPRESSION.sub(one, text)


def run_shell(script: str, workspace: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """bash as GitHub runs a `run:` step (`bash --noprofile --norc -eo pipefail`); GitLab's runner sets the same."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=timeout)


@dataclass
class CacheStore:
    """The CI service's cache between runs: a folder per cached path, restored before a run and saved after."""

    root: Path

    def restore(self, path: str, target: Path) -> bool:
        kept = self.root / path
        if kept.exists():
            shutil.copytree(kept, target, dirs_exist_ok=True)
        return kept.exists()

    def save(self, path: str, source: Path) -> bool:
        if not source.exists():
            return False
        shutil.rmtree(self.root / path, ignore_errors=True)
        shutil.copytree(source, self.root / path)
        return True


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
            "import site\nimport sys\n\nown = site.getsitepackages()[0]\nat = sys.path.index(own) + 1\n"
            f"sys.path[at:at] = {PREINSTALLED!r}\n")

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
        return next((line for line in gate.splitlines() if line.startswith("infergate verdict:")), "no verdict line")


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
    if action == "actions/checkout":  # a pull request's merge commit: its head here, a branch on top of main
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

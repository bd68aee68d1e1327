"""A CI job's steps read from the recipe `infergate init` wrote, and run in order as GitHub Actions or GitLab CI
would (tests/test_ci_recipes.py). The shell lines run as written, with bash and the variables the CI sets; the
conditions are evaluated; what only a CI service does (checkout, setup-python, caches, artifacts) is emulated by the
test, each by name, and a step this module does not know fails the test rather than being passed over."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")
COMPARISON = re.compile(r"^(.+?)\s*(==|!=)\s*(.+)$")
HASH_FILES = re.compile(r"^hashFiles\('([^']+)'\)$")


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


def github_job(path: Path) -> Job:
    job = yaml.safe_load(path.read_text())["jobs"]["gate"]
    steps = [Step(name=raw.get("name") or raw.get("uses") or raw["run"].split("\n")[0], run=raw.get("run"),
                  uses=raw.get("uses"), condition=raw.get("if", "success()"),
                  env={k: str(v) for k, v in raw.get("env", {}).items()},
                  inputs={k: str(v) for k, v in raw.get("with", {}).items()}) for raw in job["steps"]]
    return Job(steps, {k: str(v) for k, v in job.get("env", {}).items()}, [], [])


def gitlab_job(path: Path, name: str = "infergate") -> Job:
    """A GitLab job: each `script` line a step, failing the job where it fails; `after_script` runs whatever the
    outcome (GitLab runs the lines of a script in one shell; none of these recipes carries a shell variable from one
    line to the next, so one shell a line is the same)."""
    job = yaml.safe_load(path.read_text())[name]
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

"""The CI jobs `infergate init --ci KIND` writes (docs/ci/ holds the same files; tests/test_init_project.py checks
they are identical, tests/test_ci_recipes.py runs their steps in order in a scratch project), and the libraries file
the CPU jobs install, `perf/requirements.txt`.

Every job: the first run on the default branch saves the baseline and a step commits it back (a run without one
compares nothing and its verdict says so); later runs compare with the committed file. The CPU jobs gate a change
of perf/requirements.txt A/B: the base branch's libraries in a second venv, measured in turn with the change's in
the same job (--infergate-baseline-python), which needs no baseline from another machine; hosted runners change
CPU model between runs, so a timing verdict against the stored file decides only on the same CPU model. Results,
the report and the history are kept whatever the outcome (the history cache is saved on failing runs too), and the
summary runs only where the results file was written (a usage error leaves none: one failure, not two)."""

from __future__ import annotations

from importlib import metadata

# The CPU jobs install torch first from its CPU index (PyPI's Linux torch is the CUDA build, gigabytes larger), at
# the version perf/requirements.txt pins, then that file from PyPI: the index is named in the job, where a hosted
# runner reaches it, never in the file, so `pip install -r perf/requirements.txt` elsewhere (a laptop, a sandbox
# whose pip has its own index) asks no other host (an unreachable extra index cost minutes of retries a package).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def cpu_torch(requirements: str, pip: str = "pip") -> str:
    """The shell line that installs the CPU build of the torch `requirements` pins (any torch where it pins none)."""
    return (f"{pip} install \"$(grep -m1 -E '^torch([^a-zA-Z0-9_.-]|$)' {requirements} || echo torch)\" "
            f"--index-url {CPU_TORCH_INDEX}")


# The first baseline goes back to the default branch from the job itself; GITHUB_TOKEN needs `contents: write`
# for it, and its pushes start no workflow (no second run).
GITHUB_COMMIT_STEP = '''      - name: commit the first baseline
        if: github.event_name == 'push' && github.ref_name == github.event.repository.default_branch
        run: |
          if [ -n "$(git status --porcelain -- BASELINE)" ]; then
            git config user.name "github-actions[bot]"
            git config user.email "41898282+github-actions[bot]@users.noreply.github.com"
            git add BASELINE && git commit -m "BASELINE: the gate's first baseline, saved by infergate"
            git push origin HEAD:"$GITHUB_REF_NAME"
          fi
'''

GITHUB_CPU = '''# GitHub Actions on a hosted CPU runner (written by `infergate init --ci github`): the gate tests on the
# embedded model (or the ini's infergate_model) with the libraries of perf/requirements.txt. A pull request that
# changes that file is gated A/B against its base branch's libraries, both measured in this job, so a slowdown
# fails on any runner; other runs compare with the committed perf/baseline.json, which decides timing only on the
# CPU model it was saved on (strict is off: elsewhere the verdict is inconclusive, not a failure).
name: infergate
on: [pull_request, push]
permissions:
  contents: write   # the first run on the default branch commits perf/baseline.json
jobs:
  gate:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - uses: actions/cache@v4
        with:
          path: ~/.cache/infergate
          key: infergate-models-v1
      - uses: actions/cache/restore@v4
        with:
          path: infergate-history
          key: infergate-history-${{ github.run_id }}
          restore-keys: infergate-history-
      - name: install
        run: |   # CPU torch from its own index first (PyPI's is the CUDA build), then the rest from PyPI
          CPU_TORCH
          pip install -r perf/requirements.txt INSTALL_SPEC
      - name: baseline environment
        if: github.event_name == 'pull_request'
        run: |   # the base branch's libraries, where this pull request changes them: the A side of an A/B
          git fetch --depth=1 origin "$GITHUB_BASE_REF"
          if git cat-file -e FETCH_HEAD:perf/requirements.txt && ! git diff --quiet FETCH_HEAD -- perf/requirements.txt
          then git show FETCH_HEAD:perf/requirements.txt > base-requirements.txt
            python -m venv --system-site-packages --without-pip base-env   # the runner's pip and libraries seen
            BASE_CPU_TORCH
            base-env/bin/python -m pip install -r base-requirements.txt INSTALL_SPEC   # what differs installed
          fi
      - name: gate
        run: |
          if [ -x base-env/bin/python ]; then baseline=--infergate-baseline-python=base-env/bin/python
          elif [ -f perf/baseline.json ]; then baseline=--infergate-baseline=perf/baseline.json
          else mkdir -p perf; baseline=--infergate-save-baseline=perf/baseline.json; fi
          pytest TESTS_DIR $baseline --infergate-json=infergate-results.json \\
            --infergate-report=infergate-report.html --infergate-history=infergate-history
      - name: summary
        if: always() && hashFiles('infergate-results.json') != ''
        run: infergate summary infergate-results.json --markdown   # appends to $GITHUB_STEP_SUMMARY itself
''' + GITHUB_COMMIT_STEP.replace("BASELINE", "perf/baseline.json") + '''      - uses: actions/cache/save@v4
        if: always() && hashFiles('infergate-history/**') != ''
        with:
          path: infergate-history
          key: infergate-history-${{ github.run_id }}
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: infergate
          path: |
            infergate-report.html
            infergate-results.json
            perf/baseline.json
          if-no-files-found: ignore
'''

GITHUB_GPU = '''# GitHub Actions, a self-hosted GPU runner (`infergate init --ci github-gpu`): your model in fp16 and
# int8 on one runner class, whose CUDA build of torch is installed; the model cache and the history stay on the
# runner's disk. To gate nf4 too, add it to --infergate-precisions and state the quality loss you accept for it in
# pytest.ini (`infergate_quality_policy = nf4: min_top1=0.75, max_mean_kl=0.35`): most models fail the 4-bit default.
# Strict is on where a baseline is compared: one runner class, so an inconclusive verdict is worth a look before
# merging; the first run, which saves the baseline, is not strict (it has nothing to compare).
name: infergate-gpu
on: [pull_request, push]
permissions:
  contents: write   # the first run on the default branch commits perf/baseline-gpu.json
jobs:
  gate:
    runs-on: [self-hosted, gpu]
    env:   # the runner's own paths: the model cache, the history and the model to gate
      INFERGATE_CACHE_DIR: /data/infergate-cache
      INFERGATE_HISTORY: /data/infergate-history
      MODEL: /data/models/production
    steps:
      - uses: actions/checkout@v4
      - name: install
        run: pip install INSTALL_SPEC
      - name: gate
        run: |
          if [ -f perf/baseline-gpu.json ]; then
            baseline="--infergate-baseline=perf/baseline-gpu.json --infergate-strict"
          else mkdir -p perf; baseline=--infergate-save-baseline=perf/baseline-gpu.json; fi
          pytest TESTS_DIR $baseline --infergate-gpu --infergate-model="$MODEL" \\
            --infergate-precisions=fp16,int8 --infergate-json=infergate-results.json \\
            --infergate-report=infergate-report.html --infergate-history="$INFERGATE_HISTORY"
      - name: summary
        if: always() && hashFiles('infergate-results.json') != ''
        run: infergate summary infergate-results.json --markdown   # appends to $GITHUB_STEP_SUMMARY itself
''' + GITHUB_COMMIT_STEP.replace("BASELINE", "perf/baseline-gpu.json") + '''      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: infergate-gpu
          path: |
            infergate-report.html
            infergate-results.json
            perf/baseline-gpu.json
          if-no-files-found: ignore
'''

GITLAB = '''# GitLab CI on a CPU runner (written by `infergate init --ci gitlab`): the gate tests with the libraries of
# perf/requirements.txt, the report and the results as artifacts, the JUnit properties in the merge request, the
# history cached even when the job fails. A branch that changes perf/requirements.txt is gated A/B against its
# target branch's libraries, both measured in this job; other runs compare with the committed perf/baseline.json.
# The first run on the default branch commits it when the CI variable INFERGATE_PUSH_TOKEN holds a project access
# token with write_repository (without it the job says so: commit the artifact's file).
infergate:
  image: python:3.11
  variables:
    INFERGATE_CACHE_DIR: "$CI_PROJECT_DIR/.cache/infergate"
  cache:
    - key: infergate-models
      paths: [.cache/infergate]
    - key: infergate-history
      paths: [infergate-history]
      when: always
  script:
    - CPU_TORCH   # from its own index first (PyPI's is the CUDA build)
    - pip install -r perf/requirements.txt INSTALL_SPEC
    - |   # the target branch's libraries, where this branch changes them: the A side of an A/B
      base_branch=${CI_MERGE_REQUEST_TARGET_BRANCH_NAME:-$CI_DEFAULT_BRANCH}
      if [ "$CI_COMMIT_BRANCH" != "$CI_DEFAULT_BRANCH" ] && git fetch --depth=1 origin "$base_branch" &&
        git cat-file -e FETCH_HEAD:perf/requirements.txt && ! git diff --quiet FETCH_HEAD -- perf/requirements.txt
      then git show FETCH_HEAD:perf/requirements.txt > base-requirements.txt
        python -m venv --system-site-packages --without-pip base-env   # the image's pip and libraries seen
        BASE_CPU_TORCH
        base-env/bin/python -m pip install -r base-requirements.txt INSTALL_SPEC   # what differs installed
      fi
    - |
      if [ -x base-env/bin/python ]; then baseline=--infergate-baseline-python=base-env/bin/python
      elif [ -f perf/baseline.json ]; then baseline=--infergate-baseline=perf/baseline.json
      else mkdir -p perf; baseline=--infergate-save-baseline=perf/baseline.json; fi
      pytest TESTS_DIR $baseline --infergate-json=infergate-results.json --junitxml=junit.xml \\
        --infergate-report=infergate-report.html --infergate-history=infergate-history
    - |   # the first run on the default branch commits its baseline ([skip ci]: no pipeline for that commit)
      if [ "$CI_COMMIT_BRANCH" = "$CI_DEFAULT_BRANCH" ] && [ -n "$(git status --porcelain -- perf/baseline.json)" ]
      then if [ -z "$INFERGATE_PUSH_TOKEN" ]; then
          echo "perf/baseline.json not committed: set INFERGATE_PUSH_TOKEN, or commit the artifact's file"
        else git add perf/baseline.json
          git -c user.name=infergate -c user.email=infergate@noreply.invalid commit \\
            -m "perf/baseline.json: the gate's first baseline, saved by infergate [skip ci]"
          git push "https://oauth2:${INFERGATE_PUSH_TOKEN}@${CI_SERVER_HOST}/${CI_PROJECT_PATH}.git" \\
            HEAD:"$CI_DEFAULT_BRANCH"
        fi
      fi
  after_script:
    - if [ -f infergate-results.json ]; then infergate summary infergate-results.json; fi
  artifacts:
    when: always
    paths: [infergate-report.html, infergate-results.json, perf/baseline.json]
    reports:
      junit: junit.xml
'''

CI_FILES = {"github": (".github/workflows/infergate.yml", GITHUB_CPU),
            "github-gpu": (".github/workflows/infergate-gpu.yml", GITHUB_GPU), "gitlab": (".gitlab-ci.yml", GITLAB)}
# the baseline file each job saves on its first run and commits, then compares with
BASELINE_FILES = {"github": "perf/baseline.json", "github-gpu": "perf/baseline-gpu.json",
                  "gitlab": "perf/baseline.json"}
# the jobs on a hosted CPU runner: a fresh machine each run, which reaches only what the project holds or fetches
HOSTED_JOBS = frozenset({"github", "gitlab"})
# the jobs that install perf/requirements.txt (a GPU runner has its CUDA build of torch already)
USES_REQUIREMENTS = HOSTED_JOBS
# what the CI job installs: the package name once it is on PyPI; until then `--install` names a wheel committed to
# the project (./wheels/pytest_infergate-….whl) or "git+URL" of this repository (the CLI says so)
DEFAULT_INSTALL = "pytest-infergate"
REQUIREMENTS_PATH = "perf/requirements.txt"
# the libraries a model runs on in the gate, pinned in perf/requirements.txt: a change of one is what the A/B gates
PINNED = ("torch", "transformers", "accelerate", "bitsandbytes")  # bitsandbytes: int8 and nf4 run on it


def requirements_head(torch: str) -> str:
    """The comment atop perf/requirements.txt, with the line that installs the CPU build of `torch` (a requirement)."""
    return f'''# The libraries the gate runs your model on (written by `infergate init`, pinned to those it
# ran beside): the CI job installs them, and a pull request that changes this file is gated A/B
# against its base branch's libraries, both measured in the same job (docs/guides/ci.md).
# No index is named here: `pip install -r` asks your pip's own. On a CPU machine install the
# CPU build of torch first, as the CI job does (PyPI's Linux torch is the CUDA build):
#   pip install "{torch}" --index-url {CPU_TORCH_INDEX}
'''


def ci_job(ci: str, tests: str = "tests", install: str = DEFAULT_INSTALL, model: str = "") -> str:
    """The CI job `ci` (a key of CI_FILES), running the gate tests of `tests` after installing `install`; `model`
    (init --model) is the GPU job's MODEL (the CPU jobs read it from pytest.ini)."""
    job = (CI_FILES[ci][1].replace("BASE_CPU_TORCH", cpu_torch("base-requirements.txt", "base-env/bin/python -m pip"))
           .replace("CPU_TORCH", cpu_torch("perf/requirements.txt")).replace("INSTALL_SPEC", install)
           .replace("TESTS_DIR", tests))
    return job.replace("MODEL: /data/models/production", f"MODEL: {model}") if model else job


def requirements_text() -> str:
    """perf/requirements.txt: each of PINNED at the version installed here (its local label, such as +cpu, left to
    the index), or unpinned where it is not installed."""
    lines = []
    for name in PINNED:
        try:
            lines.append(f"{name}=={metadata.version(name).split('+')[0]}")
        except metadata.PackageNotFoundError:
            lines.append(name)
    return requirements_head(lines[0]) + "\n".join(lines) + "\n"

"""All `--infergate-*` options in one table, and the `Options` object built from them once per session.

plugin.py turns the table into command-line options and ini keys; nothing here imports pytest.
A command-line value wins over the ini key, which wins over the default.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_infergate.endpoint.exchange import check_endpoint_settings
from pytest_infergate.engine.config import BACKENDS
from pytest_infergate.errors import OptionError
from pytest_infergate.requirements import check_precision, default_reference, parse_precisions


@dataclass(frozen=True)
class OptionSpec:
    name: str  # dest and ini key suffix: `--infergate-<name with dashes>`, ini `infergate_<name>`
    kind: str  # "bool", "str", "path" (read), "output" (written at the end of the run), "folder" (written into at
    # the end of the run), "float", "int"
    help: str
    default: Any = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--infergate-" + self.name.replace("_", "-")

    @property
    def ini_key(self) -> str:
        return "infergate_" + self.name


BASELINE_PYTHON_FLAG = "--infergate-baseline-python"
DEFAULT_CPU_THREADS = 1  # Options.torch_threads says why

OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("gpu", "bool", "run models on CUDA (without CUDA this is a usage error, never a CPU fallback); "
               "without it everything runs on the CPU", False),
    OptionSpec("model", "str", "model to gate: a built-in alias (smollm2-135m, tiny-random-llama, random-llama-0.5b), "
               "a local Hugging Face directory, a .gguf file, or a hub id ORG/NAME (default: smollm2-135m)",
               "smollm2-135m", "MODEL"),
    OptionSpec("precisions", "str", "comma list of precisions to test, from fp32, fp16, bf16, int8, nf4 "
               "(default: the reference precision, int8, nf4; with --infergate-endpoint: none, only the server, unless "
               "given - then they run beside it)", None, "LIST"),
    OptionSpec("backend", "str", "what runs the gates' workloads on a local model: auto (the infergate engine; "
               "transformers' own model.generate where the engine's self-check refuses the model), engine (a refused "
               "model fails its tests) or hf (model.generate always, e.g. to compare the two) (default auto)",
               "auto", "BACKEND"),
    OptionSpec("reference_precision", "str", "precision the others are compared with "
               "(default: fp16 with --infergate-gpu, fp32 on the CPU)", None, "PRECISION"),
    OptionSpec("cache_dir", "path", "where converted models and built-in models are kept "
               "(default: $INFERGATE_CACHE_DIR or ~/.cache/infergate)", None, "DIR"),
    OptionSpec("fallback", "bool", "if a precision fails to load, load the reference precision instead and mark "
               "every result of the run as 'fallback' (off by default: a failed load is a test error)", False),
    OptionSpec("save_baseline", "output", "save this run as the new accepted baseline: its results (what "
               "--infergate-json writes: every perf measurement with its environment fingerprint) to PATH", None,
               "PATH"),
    OptionSpec("baseline", "path", "compare perf measurements with the accepted run's results at PATH (a file "
               "written by --infergate-save-baseline or --infergate-json, or a baseline file of an older version), or "
               "with a run of --infergate-history (its run id, or `latest`) (noise-aware: confidence interval of the "
               "ratio against max_regression)", None, "PATH"),
    OptionSpec("baseline_python", "str", "measure the baseline now, in another Python environment (e.g. the venv "
               "with the torch / transformers / bitsandbytes being upgraded from, pytest-infergate installed there): "
               "every infergate_bench measurement with a max_regression runs there and here alternately, repetition "
               "by repetition, and is gated as an interleaved A/B - unlike a stored baseline, immune to the machine "
               "being faster or slower than when it was saved", None, "PYTHON"),
    OptionSpec("baseline_python_timeout", "float", "seconds the --infergate-baseline-python worker may take to start "
               "(import torch, transformers and pytest-infergate there) before the run stops with an error naming it "
               "(default 300)", 300.0, "SECONDS"),
    OptionSpec("strict", "bool", "fail on an environment-fingerprint mismatch with the baseline and on "
               "inconclusive verdicts (default: warn and report them)", False),
    OptionSpec("allow_model_change", "bool", "under --infergate-strict, compare with a stored baseline of another "
               "model (its name or architecture: a model upgrade on purpose); without it such a comparison is not "
               "made and strict fails", False),
    OptionSpec("compare_model", "str", "a second model for interleaved A/B perf gates (infergate_bench.ab): "
               "measured alternately with --infergate-model in the same run, same precision", None, "MODEL"),
    OptionSpec("golden_dir", "path", "folder of golden sample sets (*.jsonl) and accepted golden outputs "
               "(default: golden/ under the pytest rootdir)", None, "DIR"),
    OptionSpec("golden_max_len", "int", "context length (prompt + output tokens) of the engine that generates golden "
               "outputs (default 2048); a sample whose prompt does not fit is an error naming its file and line",
               2048, "TOKENS"),
    OptionSpec("update_golden", "bool", "regenerate the accepted golden outputs of every precision tested, print "
               "what changed, and pass the golden-regression checks (review the diff before committing it)", False),
    OptionSpec("endpoint", "str", "gate a live OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp) at this "
               "base URL "
               "instead of the reference engine, e.g. http://127.0.0.1:8000/v1", None, "URL"),
    OptionSpec("endpoint_model", "str", "model name to request from the endpoint (default: the first one its "
               "/v1/models lists)", None, "NAME"),
    OptionSpec("api_key_env", "str", "name of the environment variable that holds the endpoint's API key "
               "(sent as a Bearer token; the key itself never goes on the command line)", None, "VAR"),
    OptionSpec("endpoint_timeout", "float", "seconds one endpoint request may take, first byte to last "
               "(default 60); a request past it counts as a 'timeout' error", 60.0, "SECONDS"),
    OptionSpec("endpoint_concurrency", "int", "most endpoint requests in flight at once when a load pattern does not "
               "say (default 64)", 64, "N"),
    OptionSpec("endpoint_api", "str", "OpenAI API to call: chat (/v1/chat/completions) or completions "
               "(/v1/completions) (default chat)", "chat", "API"),
    OptionSpec("endpoint_metrics_url", "str", "the endpoint's Prometheus metrics, scraped around every load run "
               "(default: /metrics at the server's root)", None, "URL"),
    OptionSpec("reference_endpoint", "str", "a second server to compare --infergate-endpoint with (e.g. the fp16 "
               "deployment of a quantized one): infergate_golden.check() compares their greedy answers and "
               "infergate_bench.ab() / infergate_endpoint.ab() runs an interleaved A/B between them; no local "
               "model is needed", None, "URL"),
    OptionSpec("reference_endpoint_model", "str", "model name to request from the reference endpoint (default: "
               "the first one its /v1/models lists)", None, "NAME"),
    OptionSpec("reference_api_key_env", "str", "name of the environment variable that holds the reference "
               "endpoint's API key (default: the one of --infergate-api-key-env)", None, "VAR"),
    OptionSpec("report", "output", "write the HTML regression report of this run to PATH", None, "PATH"),
    OptionSpec("json", "output", "write the machine-readable results of this run to PATH", None, "PATH"),
    OptionSpec("history", "folder", "append this run's results to the history folder DIR (one file per run, the "
               "oldest removed beyond --infergate-history-keep), redraw DIR/history.html, and link it from the "
               "report; `infergate history DIR` reads it", None, "DIR"),
    OptionSpec("cpu_threads", "int", "torch threads that run a model on the CPU (default 1: one computing thread "
               "is what a busy runner's load can be taken out of exactly, where a team of threads stalls at every "
               "barrier a co-tenant lands on; 0: torch's own default, one per core, split between xdist workers)",
               None, "N"),
    OptionSpec("history_keep", "int", "runs kept in --infergate-history (default 100)", 100, "N"),
    OptionSpec("min_time", "float", "seconds each side of a stored comparison (a save, and a run compared with one) "
               "measures at least, however short a repetition (default 6: shared VMs run a thread up to twice as "
               "slow in spells of seconds, and the repetitions must span them; 0 in tests of the plugin's "
               "behaviour, not of speed)", 6.0, "SECONDS"),
)


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise OptionError(f"infergate_{name} = {value!r} is not a boolean: use true or false")


def _parse_number(spec: OptionSpec, value: Any) -> int | float:
    kind = int if spec.kind == "int" else float
    try:
        return kind(str(value).strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise OptionError(f"{spec.flag} / {spec.ini_key} = {value!r} is not {what}"
                          f" ({spec.metavar})") from None


@dataclass(frozen=True)
class Options:
    """The resolved infergate settings of one pytest session (or one REPL session)."""

    gpu: bool = False
    model: str = "smollm2-135m"
    precisions: tuple[str, ...] = ()
    reference_precision: str = ""
    backend: str = "auto"
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())
    fallback: bool = False
    save_baseline: Path | None = None
    baseline: Path | None = None
    baseline_python: str | None = None
    baseline_python_timeout: float = 300.0
    strict: bool = False
    allow_model_change: bool = False
    compare_model: str | None = None
    golden_dir: Path | None = None
    update_golden: bool = False
    golden_max_len: int = 2048
    report: Path | None = None
    json: Path | None = None
    history: Path | None = None
    history_keep: int = 100
    endpoint: str | None = None
    endpoint_model: str | None = None
    api_key_env: str | None = None
    endpoint_timeout: float = 60.0
    endpoint_concurrency: int = 64
    endpoint_api: str = "chat"
    endpoint_metrics_url: str | None = None
    reference_endpoint: str | None = None
    reference_endpoint_model: str | None = None
    reference_api_key_env: str | None = None
    precisions_given: bool = False  # --infergate-precisions / ini set explicitly (with an endpoint: run them too)
    gpu_index: int | None = None  # set per pytest-xdist worker: each worker is pinned to one GPU
    xdist_workers: int = 1  # the pytest-xdist workers of this run, set in each (their load is each other's)
    cpu_threads: int | None = None  # --infergate-cpu-threads; 0 becomes each xdist worker's share of the cores
    min_time: float = 6.0  # --infergate-min-time: perf.repetitions' time floor of a stored comparison's side

    def __post_init__(self):
        ref = check_precision(self.reference_precision or default_reference(self.device), "reference precision")
        object.__setattr__(self, "reference_precision", ref)
        if not self.precisions:
            object.__setattr__(self, "precisions", tuple(dict.fromkeys((ref, "int8", "nf4"))))
        if self.endpoint is not None:  # validated now, before any test runs
            check_endpoint_settings(self.endpoint, self.endpoint_timeout, self.endpoint_concurrency, self.endpoint_api)
        for flag, url in (("--infergate-endpoint-metrics-url", self.endpoint_metrics_url),
                          ("--infergate-reference-endpoint", self.reference_endpoint)):
            if url is not None:
                check_endpoint_settings(url, self.endpoint_timeout, self.endpoint_concurrency, self.endpoint_api, flag)
        if self.reference_endpoint is not None and self.endpoint is None:
            raise OptionError("--infergate-reference-endpoint is the reference of --infergate-endpoint: give the "
                              "candidate server with --infergate-endpoint URL too")
        if not (math.isfinite(self.baseline_python_timeout) and self.baseline_python_timeout > 0):
            raise OptionError("--infergate-baseline-python-timeout must be positive (a finite number of seconds), got "
                              f"{self.baseline_python_timeout}")
        if self.baseline_python is not None:
            self._check_baseline_python()
        if self.backend not in BACKENDS:
            raise OptionError(f"--infergate-backend / infergate_backend = {self.backend!r} is not a backend: choose "
                              f"from {', '.join(BACKENDS)} (auto: the engine, HF generate where it refuses the model)")
        if self.golden_max_len < 16:
            raise OptionError(f"--infergate-golden-max-len must be at least 16 tokens, got {self.golden_max_len}")
        if self.history is not None:
            check_folder_path(self.history, "--infergate-history")
        check_distinct_outputs(self)
        if self.cpu_threads is not None and self.cpu_threads < 0:
            raise OptionError(f"--infergate-cpu-threads must be 0 (torch's default) or a number of threads, got "
                              f"{self.cpu_threads}")
        if not (math.isfinite(self.min_time) and self.min_time >= 0):
            raise OptionError(f"--infergate-min-time must be 0 or a finite number of seconds, got {self.min_time}")
        if self.history_keep < 2:
            raise OptionError(f"--infergate-history-keep must keep at least 2 runs, got {self.history_keep}")
        if not str(self.model).strip():
            raise OptionError("--infergate-model is empty: give an alias (smollm2-135m, tiny-random-llama), "
                              "a directory, a .gguf file or a hub id")

    def _check_baseline_python(self) -> None:
        FLAG = BASELINE_PYTHON_FLAG  # noqa: N806 (the same name as in perf.baseline_env's messages)
        if self.baseline is not None:
            raise OptionError(f"{FLAG} and --infergate-baseline both name the baseline: give one (the stored file, "
                              "or the environment to measure it in now)")
        if self.endpoint is not None:
            raise OptionError(f"{FLAG} measures the local engine in another environment; an endpoint's baseline "
                              "is another server (--infergate-reference-endpoint) or a stored file")
        object.__setattr__(self, "baseline_python", resolve_python(self.baseline_python))

    @property
    def torch_threads(self) -> int | None:
        """The threads torch runs a model with in this session; None: torch's own default (one per core).
        On the CPU one by default: with one computing thread the time a co-tenant took is exactly the thread's
        run-queue wait, which process_meters.team_progress_s takes out, a slowdown kept whole under a co-tenant; a
        team of two stalls at every barrier a co-tenant lands on, which hides a slowdown. One thread costs some speed
        on a quiet machine (the figures: benchmarks/load_evidence.py, docs/measurements.md). On a GPU the host
        threads matter little: torch's."""
        if self.cpu_threads is None:
            return None if self.gpu else DEFAULT_CPU_THREADS
        return self.cpu_threads or None

    @property
    def device(self) -> str:
        if not self.gpu:
            return "cpu"
        return "cuda" if self.gpu_index is None else f"cuda:{self.gpu_index}"

    @classmethod
    def from_sources(cls, cli: Callable[[str], Any], ini: Callable[[str], Any]) -> Options:
        """Build from two lookups by option name: `cli` (None when not given) and `ini` (None or '' when unset)."""
        values: dict[str, Any] = {}
        for spec in OPTION_SPECS:
            raw = cli(spec.name)
            if raw is None or raw is False:
                from_ini = ini(spec.name)
                if from_ini not in (None, "", []):
                    raw = from_ini
            if raw is None:
                continue
            if spec.kind == "bool":
                values[spec.name] = _parse_bool(spec.name, raw)
            elif spec.kind in ("path", "output", "folder"):
                values[spec.name] = Path(os.path.expanduser(str(raw)))
            elif spec.kind in ("int", "float"):
                values[spec.name] = _parse_number(spec, raw)
            else:
                values[spec.name] = str(raw)
        if "precisions" in values:
            values["precisions"] = parse_precisions(values["precisions"])
            values["precisions_given"] = True
        return cls(**values)


def check_distinct_outputs(options: Options) -> None:
    """Two outputs given one path would leave only the one written last: refused before any test runs."""
    outputs = [(spec.flag, getattr(options, spec.name)) for spec in OPTION_SPECS
               if spec.kind in ("output", "folder") and getattr(options, spec.name, None) is not None]
    seen: dict[Path, str] = {}
    for flag, path in outputs:
        resolved = Path(path).expanduser().resolve()
        if resolved in seen:
            raise OptionError(f"{seen[resolved]} and {flag} both write {path}: one would overwrite the other; give "
                              "each output its own path")
        seen[resolved] = flag


def check_output_path(path: Path, flag: str) -> None:
    """An output written at the end of the run must be writable now: its folder exists or can be created, and
    nothing in the way is a regular file. Checked before any test runs, so no run ends without its outputs."""
    path = Path(path)
    if path.is_dir():
        raise OptionError(f"{flag} {path} is a directory; give a file path, e.g. {path / 'infergate.out'}")
    check_folder_path(path.parent, flag, of=path)


def check_folder_path(folder: Path, flag: str, of: Path | None = None) -> None:
    """`folder` exists as a writable directory, or can be created (its nearest existing ancestor is one)."""
    what = of or folder
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OptionError(f"{flag} {what}: {existing} is a file, so the folder {folder} cannot be created; "
                          "choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OptionError(f"{flag} {what}: {existing} is not writable; choose another path")


def default_cache_dir() -> Path:
    env = os.environ.get("INFERGATE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "infergate"


def resolve_python(value: str) -> str:
    """The interpreter `value` names (a path, or a command on PATH), or an OptionError saying what to give."""
    path = Path(os.path.expanduser(value))
    found = str(path) if path.is_file() and os.access(path, os.X_OK) else shutil.which(value)
    if not found:
        raise OptionError(f"{BASELINE_PYTHON_FLAG} {value!r} is not an executable Python: give the interpreter of "
                          "the baseline environment, e.g. /path/to/old-venv/bin/python (with pytest-infergate "
                          "installed there)")
    return found

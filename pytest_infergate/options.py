"""All `--infergate-*` options in one table, and the `Options` object built from them once per session.

plugin.py turns the table into command-line options and ini keys; nothing here imports pytest.
A command-line value wins over the ini key, which wins over the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pytest_infergate.errors import OptionError
from pytest_infergate.precision import check_precision, default_reference, parse_precisions


@dataclass(frozen=True)
class OptionSpec:
    name: str  # dest and ini key suffix: `--infergate-<name with dashes>`, ini `infergate_<name>`
    kind: str  # "bool", "str", "path", "float", "int"
    help: str
    default: Any = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--infergate-" + self.name.replace("_", "-")

    @property
    def ini_key(self) -> str:
        return "infergate_" + self.name


OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("gpu", "bool", "run models on CUDA (without CUDA this is a usage error, never a CPU fallback); "
               "without it everything runs on the CPU", False),
    OptionSpec("model", "str", "model to gate: a built-in alias (smollm2-135m, tiny-random-llama), a local Hugging Face "
               "directory, a .gguf file, or a hub id ORG/NAME (default: smollm2-135m)", "smollm2-135m", "MODEL"),
    OptionSpec("precisions", "str", "comma list of precisions to test, from fp32, fp16, bf16, int8, nf4 "
               "(default: the reference precision, int8, nf4; with --infergate-endpoint: none, only the server, unless "
               "given - then they run beside it)", None, "LIST"),
    OptionSpec("reference_precision", "str", "precision the others are compared with "
               "(default: fp16 with --infergate-gpu, fp32 on the CPU)", None, "PRECISION"),
    OptionSpec("cache_dir", "path", "where converted models and built-in models are kept "
               "(default: $INFERGATE_CACHE_DIR or ~/.cache/infergate)", None, "DIR"),
    OptionSpec("fallback", "bool", "if a precision fails to load, load the reference precision instead and mark "
               "every result of the run as 'fallback' (off by default: a failed load is a test error)", False),
    OptionSpec("save_baseline", "path", "write every perf measurement of this run, with an environment "
               "fingerprint, to PATH as the new accepted baseline", None, "PATH"),
    OptionSpec("baseline", "path", "compare perf measurements with the baseline file PATH "
               "(noise-aware: bootstrap confidence interval of the ratio against max_regression)", None, "PATH"),
    OptionSpec("strict", "bool", "fail on an environment-fingerprint mismatch with the baseline and on "
               "inconclusive verdicts (default: warn and report them)", False),
    OptionSpec("compare_model", "str", "a second model for interleaved A/B perf gates (infergate_bench.ab): "
               "measured alternately with --infergate-model in the same run, same precision", None, "MODEL"),
    OptionSpec("golden_dir", "path", "folder of golden sample sets (*.jsonl) and accepted golden outputs "
               "(default: golden/ under the pytest rootdir)", None, "DIR"),
    OptionSpec("update_golden", "bool", "regenerate the accepted golden outputs of every precision tested, print "
               "what changed, and pass the golden-regression checks (review the diff before committing it)", False),
    OptionSpec("endpoint", "str", "gate a live OpenAI-compatible server (vLLM, TGI, SGLang, llama.cpp) at this base URL "
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
    OptionSpec("report", "path", "write the HTML regression report of this run to PATH", None, "PATH"),
    OptionSpec("json", "path", "write the machine-readable results of this run to PATH", None, "PATH"),
)

BUILTIN_ALIASES = ("smollm2-135m", "tiny-random-llama")


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
        raise OptionError(f"{spec.flag} / {spec.ini_key} = {value!r} is not {'an integer' if kind is int else 'a number'}"
                          f" ({spec.metavar})") from None


@dataclass(frozen=True)
class Options:
    """The resolved infergate settings of one pytest session (or one REPL session)."""

    gpu: bool = False
    model: str = "smollm2-135m"
    precisions: tuple[str, ...] = ()
    reference_precision: str = ""
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())
    fallback: bool = False
    save_baseline: Path | None = None
    baseline: Path | None = None
    strict: bool = False
    compare_model: str | None = None
    golden_dir: Path | None = None
    update_golden: bool = False
    report: Path | None = None
    json: Path | None = None
    endpoint: str | None = None
    endpoint_model: str | None = None
    api_key_env: str | None = None
    endpoint_timeout: float = 60.0
    endpoint_concurrency: int = 64
    endpoint_api: str = "chat"
    precisions_given: bool = False  # --infergate-precisions / ini set explicitly (with an endpoint: run them too)
    gpu_index: int | None = None  # set per pytest-xdist worker: each worker is pinned to one GPU
    cpu_threads: int | None = None  # set per pytest-xdist worker on the CPU: its share of the cores

    def __post_init__(self):
        ref = check_precision(self.reference_precision or default_reference(self.device), "reference precision")
        object.__setattr__(self, "reference_precision", ref)
        if not self.precisions:
            object.__setattr__(self, "precisions", tuple(dict.fromkeys((ref, "int8", "nf4"))))
        if self.endpoint is not None:
            from pytest_infergate.endpoint.client import EndpointConfig

            EndpointConfig(self.endpoint, timeout_s=self.endpoint_timeout, max_concurrency=self.endpoint_concurrency,
                           api=self.endpoint_api)  # validates the URL and limits now, before any test runs
        if not str(self.model).strip():
            raise OptionError("--infergate-model is empty: give an alias (smollm2-135m, tiny-random-llama), "
                              "a directory, a .gguf file or a hub id")

    @property
    def device(self) -> str:
        if not self.gpu:
            return "cpu"
        return "cuda" if self.gpu_index is None else f"cuda:{self.gpu_index}"

    @classmethod
    def from_sources(cls, cli: Callable[[str], Any], ini: Callable[[str], Any]) -> "Options":
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
            elif spec.kind == "path":
                values[spec.name] = Path(os.path.expanduser(str(raw)))
            elif spec.kind in ("int", "float"):
                values[spec.name] = _parse_number(spec, raw)
            else:
                values[spec.name] = str(raw)
        if "precisions" in values:
            values["precisions"] = parse_precisions(values["precisions"])
            values["precisions_given"] = True
        return cls(**values)


def default_cache_dir() -> Path:
    env = os.environ.get("INFERGATE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "infergate"

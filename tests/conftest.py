import json
import os
from pathlib import Path

import _pytest.pytester
import pytest

# pytester's in-process runs drop the modules first imported inside them when they end. torch and friends load
# C extensions and register operators once per process: a second import of them crashes or fails. Keep them.
# The HTTP stack too: httpcore imports its anyio backend at the first connection, and httpx maps httpcore's
# exceptions through classes it cached; a backend imported afresh raises classes of a new httpcore generation
# that the map does not know, so a refused connection escaped as a raw httpcore.ConnectError (seen under -n 2).
# transformers >= 5.25 imports `kernels` on first use: its Flag enum re-imported is a second class, and
# `Mode.INFERENCE in mode` then raises "unsupported operand type(s) for 'in': 'Mode' and 'Mode'" at model load.
_NATIVE = ("torch", "transformers", "kernels", "huggingface_hub", "bitsandbytes", "safetensors", "tokenizers",
           "accelerate", "gguf", "numpy",
           "scipy", "sympy", "pytest_infergate", "jinja2", "markupsafe", "rouge_score", "nltk", "absl", "psutil",
           "httpx", "httpcore", "httpx_sse", "anyio", "h11", "sniffio", "idna", "certifi")
_original_snapshot_init = _pytest.pytester.SysModulesSnapshot.__init__


def _snapshot_init(self, preserve=None):
    def keep(name):
        return name.split(".")[0] in _NATIVE or (preserve is not None and preserve(name))

    _original_snapshot_init(self, preserve=keep)


_pytest.pytester.SysModulesSnapshot.__init__ = _snapshot_init

pytest_plugins = ["pytester"]


# Fixtures that load or build a model, run the plugin in a pytest of its own, or start a server: a test using one
# belongs to the slow tier. The rest (`pytest tests -m "not slow"`) is the fast tier: pure functions over records,
# measurements and files, run first in .ci/run.
SLOW_FIXTURES = frozenset({"pytester", "run", "project", "golden_project", "tiny_source", "tiny_fp32", "smollm2_fp32",
                           "llama_server", "requantized_gguf", "own_llama_server", "cache_dir", "endpoint_checkout"})


def pytest_collection_modifyitems(config, items):
    """Tests that need a model, a server or a pytester run are marked `slow`; tests marked `gpu` need CUDA and
    are skipped elsewhere with the reason."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("embedded"):
            item.add_marker(pytest.mark.slow)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA: run benchmarks/gpu_check.sh on a GPU machine")
        for item in gpu_tests:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_load_evidence(request, monkeypatch):
    """The kernel's evidence of a busy runner (perf.interference) turns a timing failure into an inconclusive one:
    right on a busy CI runner, and a flake for a test that asserts a failure. Every test reads the runner as
    quiet (not measured) unless marked `load_evidence`: tests/test_interference.py tests the evidence itself."""
    if request.node.get_closest_marker("load_evidence") is None:
        from pytest_infergate.perf import interference

        monkeypatch.setattr(interference, "snapshot", lambda pids: None)


CACHE_DIR = Path(os.environ.get("INFERGATE_CACHE_DIR", Path.home() / ".cache" / "infergate"))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The shared model cache: built-in models are built or converted once per machine, not per test."""
    return CACHE_DIR


@pytest.fixture
def run(pytester, cache_dir):
    """A pytester run of the plugin on tiny-random-llama, fp32 only (test_plugin.py keeps its own, all precisions),
    without the stored comparison's time floor: these tests check what the plugin does, not how fast."""
    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32", "--infergate-min-time=0", "-p", "no:cacheprovider",
                                  *args)

    return run


# four golden samples of four categories; the first with a task check no output passes
GOLDEN_SAMPLES = [
    {"id": f"q{i}", "category": cat, "messages": [{"role": "user", "content": text}], "max_new_tokens": 10,
     "expected": ["zzz-never"] if i == 0 else []}
    for i, (cat, text) in enumerate([("factual", "capital?"), ("code", "def f():"), ("multilingual", "春天"),
                                     ("chat", "hello there")])
]


@pytest.fixture
def golden_project(pytester, cache_dir):
    """A pytester project with GOLDEN_SAMPLES in golden/: (pytester, run), run(*args) runs it on tiny-random-llama's
    fp32 and nf4."""
    golden = pytester.mkdir("golden")
    (golden / "mine.jsonl").write_text("\n".join(json.dumps(s, ensure_ascii=False) for s in GOLDEN_SAMPLES) + "\n")

    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32,nf4", "-p", "no:cacheprovider", *args)

    return pytester, run


@pytest.fixture(scope="session")
def tiny_source(cache_dir):
    from pytest_infergate.models import resolve_model

    return resolve_model("tiny-random-llama", cache_dir)


@pytest.fixture(scope="session")
def tiny_fp32(tiny_source):
    from pytest_infergate.models import load_model

    return load_model(tiny_source, "fp32")


@pytest.fixture(scope="session")
def smollm2_fp32(cache_dir):
    from pytest_infergate.models import load_model, resolve_model

    return load_model(resolve_model("smollm2-135m", cache_dir), "fp32")


@pytest.fixture(scope="session")
def llama_server(cache_dir, tmp_path_factory):
    """llama.cpp's server (`llama-server`, 4 slots, /metrics on) serving the embedded model's GGUF on 127.0.0.1 at a
    free port. Not built, it fails the tests under CI and skips them elsewhere."""
    from openai_servers import LlamaServer, require_llama_server

    from pytest_infergate.models.sources import ensure_smollm2_gguf

    binary = require_llama_server()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with LlamaServer(ensure_smollm2_gguf(cache_dir), log_path=log, binary=binary) as server:
        yield server


@pytest.fixture(scope="session")
def requantized_gguf(cache_dir, tmp_path_factory):
    """The embedded model re-quantized from Q4_1 to Q4_0 with llama.cpp's llama-quantize: a second deployment of
    the same model whose answers differ a little."""
    from openai_servers import requantize, require_llama_server

    from pytest_infergate.models.sources import ensure_smollm2_gguf

    binary = require_llama_server()
    if not (binary.parent / "llama-quantize").is_file():
        pytest.skip(f"llama-quantize is not built beside {binary}: run `bash setup.sh test`")
    return requantize(binary.parent, ensure_smollm2_gguf(cache_dir),
                      tmp_path_factory.mktemp("gguf") / "smollm2-135m-q4_0.gguf")


@pytest.fixture
def own_llama_server(cache_dir, tmp_path):
    """A llama-server of this test's own (2 slots), to kill or to starve."""
    from openai_servers import LlamaServer, require_llama_server

    from pytest_infergate.models.sources import ensure_smollm2_gguf

    def start(gguf=None, **kwargs):
        return LlamaServer(gguf or ensure_smollm2_gguf(cache_dir), log_path=tmp_path / "server.log",
                           binary=require_llama_server(), **{"n_parallel": 2, "n_ctx": 1024, **kwargs})

    return start


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel a user builds in a checkout (`pip wheel --no-deps -w dist .`), once for the session."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(Path(__file__).resolve().parents[1]), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(out)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("pytest_infergate-*.whl")
    return built

import os
from pathlib import Path

import _pytest.pytester
import pytest

# pytester's in-process runs drop the modules first imported inside them when they end. torch and friends load
# C extensions and register operators once per process: a second import of them crashes or fails. Keep them.
_NATIVE = ("torch", "transformers", "bitsandbytes", "safetensors", "tokenizers", "accelerate", "gguf", "numpy",
           "scipy", "sympy", "pytest_infergate", "jinja2", "markupsafe", "rouge_score", "nltk", "absl", "psutil")
_original_snapshot_init = _pytest.pytester.SysModulesSnapshot.__init__


def _snapshot_init(self, preserve=None):
    def keep(name):
        return name.split(".")[0] in _NATIVE or (preserve is not None and preserve(name))

    _original_snapshot_init(self, preserve=keep)


_pytest.pytester.SysModulesSnapshot.__init__ = _snapshot_init

pytest_plugins = ["pytester"]


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA; elsewhere they are skipped with the reason."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA: run benchmarks/gpu_check.sh on a GPU machine")
        for item in gpu_tests:
            item.add_marker(skip)

CACHE_DIR = Path(os.environ.get("INFERGATE_CACHE_DIR", Path.home() / ".cache" / "infergate"))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The shared model cache: built-in models are built or converted once per machine, not per test."""
    return CACHE_DIR


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
    """llama-cpp-python's OpenAI-compatible server serving the embedded model's GGUF on 127.0.0.1 at a free port
    (`bash setup.sh test` installs it). Missing, it fails the tests under CI and skips them elsewhere."""
    from openai_servers import LlamaServer, llama_cpp_available

    from pytest_infergate.models.builtin import ensure_smollm2_gguf

    if not llama_cpp_available():
        message = "llama-cpp-python[server] is not installed: run `bash setup.sh test`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with LlamaServer(ensure_smollm2_gguf(cache_dir), log_path=log) as server:
        yield server

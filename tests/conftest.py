import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

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

"""The one place torch is imported on demand. Importing pytest_infergate happens in every pytest run of a project
that installs the plugin, so it must not load torch (about a second and hundreds of MiB) unless an infergate
fixture is used; the modules that need torch at run time take it from `import_torch()` here. The engine's own
modules, imported only when a model runs, import torch at their top as usual."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from pytest_infergate.errors import ModelLoadError

LOCAL_MODEL_STACK = ("torch", "transformers")


def require_local_model_stack(what: str) -> None:
    """Raise a clear error, naming the fix, when an install without torch (endpoint gating only) is asked for
    something that runs a model here."""
    missing = [name for name in LOCAL_MODEL_STACK if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelLoadError(
            f"{what} needs {' and '.join(missing)}, which this Python lacks: pytest-infergate was installed for "
            "endpoint gating only (`python -m pytest_infergate.requirements --endpoint`), which gates a served model "
            "(--infergate-endpoint) and sizes prompts with the server's /tokenize. Install the full plugin "
            "(`pip install pytest-infergate`, or `bash setup.sh` in a checkout) to run a model on this machine")


def import_torch() -> ModuleType:
    require_local_model_stack("a model loaded on this machine")
    return importlib.import_module("torch")

"""The one place torch is imported on demand. Importing pytest_infergate happens in every pytest run of a project
that installs the plugin, so it must not load torch (about a second and hundreds of MiB) unless an infergate
fixture is used; the modules that need torch at run time take it from `import_torch()` here. The engine's own
modules, imported only when a model runs, import torch at their top as usual."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_torch() -> ModuleType:
    return importlib.import_module("torch")

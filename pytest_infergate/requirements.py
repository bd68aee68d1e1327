"""The local model's stack (torch, transformers, accelerate, bitsandbytes, gguf, safetensors) is optional: an install
without it gates a served model (`--infergate-endpoint`) from a small runner. Here: that install's requirements, the
plugin's own less the stack, read from the installed package's metadata so they cannot drift from pyproject.toml
(`python -m pytest_infergate.requirements --endpoint | pip install -r /dev/stdin`; standard library only, as it runs
before the other dependencies are installed; docs/install.md); and the one place torch is imported on demand,
`import_torch()`: every pytest run of a project that installs the plugin imports pytest_infergate, which must not
load torch (a second, hundreds of MiB) unless an infergate fixture is used. (The engine imports it at its top.)"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from importlib import metadata
from types import ModuleType

from pytest_infergate.errors import ModelLoadError

DISTRIBUTION = "pytest-infergate"
# what only the local model uses (the engine, loading, quantization, the local tokenizer)
LOCAL_MODEL_STACK = frozenset({"torch", "transformers", "accelerate", "bitsandbytes", "gguf", "safetensors"})
# of those, what no local model runs without (the others come with a quantization or a file format)
LOCAL_MODEL_CORE = ("torch", "transformers")


def require_local_model_stack(what: str) -> None:
    """Raise a clear error, naming the fix, when an install without torch (endpoint gating only) is asked for
    something that runs a model here."""
    missing = [name for name in LOCAL_MODEL_CORE if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelLoadError(
            f"{what} needs {' and '.join(missing)}, which this Python lacks: pytest-infergate was installed for "
            "endpoint gating only (`python -m pytest_infergate.requirements --endpoint`), which gates a served model "
            "(--infergate-endpoint) and sizes prompts with the server's /tokenize. Install the full plugin "
            "(`pip install pytest-infergate`, or `bash setup.sh` in a checkout) to run a model on this machine")


def import_torch() -> ModuleType:
    require_local_model_stack("a model loaded on this machine")
    return importlib.import_module("torch")


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirements(endpoint_only: bool, requires: list[str] | None = None) -> list[str]:
    """The distribution's requirements (no extras); with `endpoint_only`, less LOCAL_MODEL_STACK."""
    requires = metadata.requires(DISTRIBUTION) if requires is None else requires
    base = [r for r in requires or [] if "extra ==" not in r.replace("extra==", "extra ==")]
    return [r for r in base if not (endpoint_only and _name(r) in LOCAL_MODEL_STACK)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_infergate.requirements",
                                     description="print pytest-infergate's requirements, one per line")
    parser.add_argument("--endpoint", action="store_true",
                        help="only what endpoint gating needs (no torch / transformers / bitsandbytes)")
    args = parser.parse_args(argv)
    try:
        lines = requirements(args.endpoint)
    except metadata.PackageNotFoundError:
        print(f"{DISTRIBUTION} is not installed in this Python ({sys.executable}): install it first, with "
              f"`pip install --no-deps {DISTRIBUTION}`", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The requirements of an install without torch, for gating a served model (`--infergate-endpoint`) from a small
runner: the plugin's own dependencies less the local model's stack (torch, transformers, accelerate, bitsandbytes,
gguf, safetensors), read from the installed package's metadata so that the list cannot drift from pyproject.toml:

    python -m pytest_infergate.requirements --endpoint | pip install -r /dev/stdin

Standard library only: this runs before the other dependencies are installed. The steps: docs/install.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata

DISTRIBUTION = "pytest-infergate"
# what only the local model uses (the engine, loading, quantization, the local tokenizer)
LOCAL_MODEL_STACK = frozenset({"torch", "transformers", "accelerate", "bitsandbytes", "gguf", "safetensors"})


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

"""pytest-infergate: gate LLM inference regressions (speed, memory, output quality) in CI.

Importing this package is cheap: torch and transformers are imported only by the modules that need them.
"""

__version__ = "0.1.0"

from pytest_infergate.errors import InfergateError, ModelLoadError, OptionError  # noqa: E402

__all__ = ["__version__", "InfergateError", "ModelLoadError", "OptionError"]

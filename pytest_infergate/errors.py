"""Error types. Each message says what was wrong and what to do about it."""


class InfergateError(Exception):
    """Base class of every error pytest-infergate raises on purpose."""


class OptionError(InfergateError, ValueError):
    """A command-line option, ini key or config field has a value we cannot use."""


class ModelLoadError(InfergateError):
    """A model could not be resolved, fetched, converted or loaded."""


class CacheCorrupted(InfergateError):
    """A cache entry exists but is incomplete or altered; callers rebuild it."""

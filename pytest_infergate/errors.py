"""Error types, each message saying what was wrong and what to do about it; and the type and range checks of the
fields of Request (workloads.request) and EngineConfig (engine.config), so that a bad value fails where it is given,
with a message naming the field, the value and what is allowed, not as a TypeError from deep inside the engine.
Booleans are not numbers here (`max_new_tokens=True` is a mistake, not 1), and floats must be finite."""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any


class InfergateError(Exception):
    """Base class of every error pytest-infergate raises on purpose."""


class OptionError(InfergateError, ValueError):
    """A command-line option, ini key or config field has a value we cannot use."""


class ModelLoadError(InfergateError):
    """A model could not be resolved, fetched, converted or loaded."""


class CacheCorrupted(InfergateError):
    """A cache entry exists but is incomplete or altered; callers rebuild it."""


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_int(error: type[Exception], field: str, value: Any, minimum: int, *, optional: bool = False,
              rule: str | None = None) -> int | None:
    """`value` is an integer (not a bool) >= minimum, or None when `optional`. Returns it as an int."""
    if value is None and optional:
        return None
    allowed = rule or f"an int >= {minimum}" + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{field} must be {allowed}, got {_show(value)}")
    if value < minimum:
        raise error(f"{field} must be {allowed}, got {value}")
    return int(value)


def check_number(error: type[Exception], field: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, exclusive_minimum: bool = False, optional: bool = False) -> float | None:
    """`value` is a finite real number (not a bool) in the given range, or None when `optional`. Returns it as a
    float."""
    if value is None and optional:
        return None
    low = "" if minimum is None else f"{'>' if exclusive_minimum else '>='} {minimum}"
    high = "" if maximum is None else f"<= {maximum}"
    allowed = "a finite number" + (f" {low}" if low else "") + (" and" if low and high else "") + \
        (f" {high}" if high else "") + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise error(f"{field} must be {allowed}, got {_show(value)}")
    too_low = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
    if too_low or (maximum is not None and value > maximum):
        raise error(f"{field} must be {allowed}, got {value}")
    return float(value)


def check_bool(error: type[Exception], field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise error(f"{field} must be True or False, got {_show(value)}")


def check_str(error: type[Exception], field: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise error(f"{field} must be a string{' or None' if optional else ''}, got {_show(value)}")


def check_token_ids(error: type[Exception], field: str, value: Any) -> tuple[int, ...]:
    """A sequence of ints (not bools); returned as a tuple."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise error(f"{field} must be a list of token ids (ints), got {_show(value)}")
    items = tuple(value)
    bad = [item for item in items if isinstance(item, bool) or not isinstance(item, numbers.Integral)]
    if bad:
        raise error(f"{field} must hold token ids (ints), got {_show(bad[0])} among them")
    return tuple(int(item) for item in items)


def unknown_keys(keys, allowed: list[str], what: str) -> str:
    """Every key of `keys` not in `allowed`, each with the closest allowed one ("did you mean"), in one message;
    "" when all are known. One message for all: a run that says one typo at a time costs a run per typo."""
    unknown = [key for key in keys if key not in allowed]
    if not unknown:
        return ""
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(named)}"

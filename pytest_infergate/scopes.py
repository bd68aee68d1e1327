"""Scoped ini lines, shared by perf budgets and quality policies, and the layering that picks the lines that apply.

A line reads `SCOPE: key=number, key=number`. SCOPE is `*` (every test), a precision (`int8`), or any other text,
which applies where it is a substring of the measurement key (test id plus label). For one measurement the layers
apply in that order, `*` first, so a more specific line overrides a more general one key by key; the test's own
markers come last.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_infergate.errors import OptionError

WILDCARD = "*"


@dataclass(frozen=True)
class ScopedLine:
    scope: str
    values: dict[str, float]
    where: str  # e.g. "infergate_budgets line 3", for messages that point at the line


def parse_scoped_lines(lines: list[str], option: str, error: type[OptionError] = OptionError
                       ) -> dict[str, ScopedLine]:
    """Lines by scope (blank lines and # comments skipped). Two lines of one scope merge; the same key with
    two values in one scope is an error naming both lines, never a silent override."""
    scoped: dict[str, ScopedLine] = {}
    number = 0
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        number += 1
        where = f"{option} line {number}"
        scope, sep, rest = line.partition(":")
        scope = scope.strip()
        if not sep or not scope:
            raise error(f"{where} {line!r} needs the form 'SCOPE: key=value, ...' (SCOPE: *, a precision, or part "
                        "of a test id)")
        values = _parse_values(rest, line, where, error)
        earlier = scoped.get(scope)
        if earlier is not None:
            for key, value in values.items():
                if key in earlier.values and earlier.values[key] != value:
                    raise error(f"{where} sets {key}={value:g} for scope {scope!r}, but {earlier.where} already "
                                f"set {key}={earlier.values[key]:g}: keep one of them")
            values = {**earlier.values, **values}
            where = f"{earlier.where} and {where}"
        scoped[scope] = ScopedLine(scope, values, where)
    return scoped


def _parse_values(text: str, line: str, where: str, error: type[OptionError]) -> dict[str, float]:
    values: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, number_text = item.partition("=")
        key = key.strip()
        try:
            number = float(number_text)
        except ValueError:
            number = None
        if not eq or not key or number is None:
            raise error(f"{where} {line!r}: {item!r} is not key=number")
        if not math.isfinite(number):
            raise error(f"{where} {line!r}: {key}={number_text.strip()} is not a finite number; a limit of "
                        "nan or inf would never be checked")
        values[key] = int(number) if number.is_integer() and key == "percentile" else number
    return values


def applicable_scopes(scopes: Iterable[str], precision: str, key: str) -> list[str]:
    """The scopes that apply to a measurement of `precision` keyed `key`, most general first."""
    scopes = list(scopes)
    ordered = [s for s in scopes if s == WILDCARD] + [s for s in scopes if s == precision]
    return ordered + [s for s in scopes if s not in (WILDCARD, precision) and s in key]

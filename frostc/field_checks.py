"""Field checks shared by the generic validation stage and every op's own checks.

Each check takes the field path and the raw value, appends a Problem naming the path, what
was found and what would be valid, and returns the value when it is good (None otherwise),
so that one bad field produces one problem and later checks can skip what depended on it.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from typing import Any

from frostc.description import key_path
from frostc.errors import Problem


def describe(value: Any) -> str:
    """A value with its type, as the user would have written it."""
    if isinstance(value, bool):
        return f"bool {str(value).lower()}"
    if isinstance(value, int):
        return f"int {value}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, tuple | list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML true is not 1


def is_number(value: Any) -> bool:
    return is_int(value) or isinstance(value, float)


def quoted(choices: Iterable[str]) -> str:
    return ", ".join(json.dumps(c) for c in choices)


def check_unknown_keys(
    prefix: str, extra: tuple[tuple[str, Any], ...], valid: tuple[str, ...], problems: list[Problem]
) -> None:
    for key, _ in extra:
        # Unknown keys are nearly always typos, so suggest the closest valid one.
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(Problem(key_path(prefix, key), f"unknown key {key!r}{hint}; valid keys: {', '.join(valid)}"))


def check_choice(
    path: str, value: Any, choices: tuple[str, ...], what: str, problems: list[Problem], *, required: bool
) -> str | None:
    """The value if it is one of `choices`; otherwise records a problem and returns None."""
    if value is None:
        if required:
            problems.append(Problem(path, f"missing; give the {what}, one of {quoted(choices)}"))
        return None
    if not isinstance(value, str):
        problems.append(Problem(path, f"expected a string, one of {quoted(choices)}; got {describe(value)}"))
        return None
    if value not in choices:
        problems.append(Problem(path, f"unknown {what} {json.dumps(value)}; valid: {quoted(choices)}"))
        return None
    return value


def check_bool(path: str, value: Any, problems: list[Problem]) -> bool | None:
    if value is not None and not isinstance(value, bool):
        problems.append(Problem(path, f"expected a bool (true or false), got {describe(value)}"))
        return None
    return value


def check_int(path: str, value: Any, minimum: int, what: str, problems: list[Problem]) -> int | None:
    """An optional int >= minimum (None when absent or bad)."""
    if value is None:
        return None
    if not is_int(value):
        problems.append(Problem(path, f"expected an int ({what}), got {describe(value)}"))
        return None
    if value < minimum:
        problems.append(Problem(path, f"must be at least {minimum} ({what}), got {value}"))
        return None
    return value


def check_positive_float(path: str, value: Any, what: str, problems: list[Problem]) -> float | None:
    """An optional finite number > 0 (None when absent or bad)."""
    if value is None:
        return None
    if not is_number(value):
        problems.append(Problem(path, f"expected a float, got {describe(value)}"))
        return None
    if not (math.isfinite(value) and value > 0):
        problems.append(Problem(path, f"must be finite and > 0, got {value}; {what}"))
        return None
    return float(value)


def check_int_list(path: str, value: Any, what: str, minimum: int, problems: list[Problem]) -> tuple[int, ...] | None:
    """An array of ints >= minimum, with a problem per bad entry at its index."""
    if not isinstance(value, tuple):
        problems.append(Problem(path, f"expected an array of {what} ints, got {describe(value)}"))
        return None
    ok = True
    for i, item in enumerate(value):
        if not is_int(item):
            problems.append(Problem(f"{path}[{i}]", f"expected a {what} int, got {describe(item)}"))
            ok = False
        elif item < minimum:
            problems.append(Problem(f"{path}[{i}]", f"must be {what}, got {item}"))
            ok = False
    return value if ok else None

"""The lists `zoo bench` and `zoo.benchmark` take (backends, precisions, devices, batch
sizes, lengths, scenarios), read one way for both: a comma-separated string or a
sequence, a single name or number as a list of one; every item once and none empty.

An empty item (`1,,2`) was skipped silently, and an item given twice was measured twice,
after which `--compare` failed at the end of the run ("measures ... twice"): both are
usage errors naming the option, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UsageError


def items(option: str, value: str | int | Sequence[Any], what: str, kind: type = str,
          key: Callable[[Any], Any] | None = None) -> list:
    """`value` as a list of `kind`: "a,b" and ["a", "b"] alike, "a" or 7 as a list of one.
    A `UsageError` naming `option` when it is empty, has an empty item, an item that is not
    a `kind`, or one item twice (the same under `key`, which also names it)."""
    if isinstance(value, str):
        if not value.strip():
            raise UsageError(f"{option} is empty: name at least one {what}")
        parts = [part.strip() for part in value.split(",")]
        if not all(parts):
            raise UsageError(f"{option} {value!r} has an empty item: separate the values with single commas")
    elif isinstance(value, int) and not isinstance(value, bool) and kind is int:
        parts = [value]
    elif isinstance(value, Sequence):
        parts = list(value)
        if not parts:
            raise UsageError(f"{option} is empty: name at least one {what}")
    else:
        raise UsageError(f"{option}: expected {_expected(kind)}, got {value!r}")
    result = [_as(kind, option, part, value) for part in parts]
    seen = set()
    for item in result:
        name = item if key is None else key(item)
        if name in seen:
            raise UsageError(f"{option} names {name} twice; give each value once")
        seen.add(name)
    return result


def _expected(kind: type) -> str:
    return "whole numbers separated by commas" if kind is int else "names separated by commas"


def _as(kind: type, option: str, part: Any, value: Any) -> Any:
    if kind is int:
        if isinstance(part, int) and not isinstance(part, bool):
            return part
        if isinstance(part, str):
            try:
                return int(part)
            except ValueError:
                pass
    elif isinstance(part, kind):
        return part
    raise UsageError(f"{option}: expected {_expected(kind)}, got {value!r}")

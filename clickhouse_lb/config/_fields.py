"""What every settings record shares (pure): its given values parsed field by field from a
table of parsers, and its millisecond fields read as seconds.

A record (``HealthSettings``, ``LagSettings`` ...) stores each setting once, under its
user-facing name and unit (milliseconds for the ``*_ms`` ones); what the pool computes with is
derived from it (:class:`InSeconds`), never stored a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, overload

__all__ = ["FieldParser", "InSeconds", "parse_fields"]

#: Parses one setting's value (a Python value or a URL's string) or raises ConfigurationError.
FieldParser = Callable[[str, object], object]


def parse_fields(
    values: Mapping[str, Any],
    parsers: Mapping[str, FieldParser],
    *,
    unknown: Callable[[str, Iterable[str]], Exception] | None = None,
    none_is_default: bool = True,
) -> dict[str, Any]:
    """The values given for ``parsers``' settings, each through its parser, in the order given;
    a None value is not given (the record's default, or its base's, stays) unless
    ``none_is_default`` is False (None is then parsed: some settings mean "none" by it). Another
    name: the error ``unknown(name, valid names)`` when given, else left for someone else (a
    statement's ``settings=`` holds the server's settings too)."""
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        parse = parsers.get(name)
        if parse is None:
            if unknown is not None:
                raise unknown(name, parsers)
        elif value is not None or not none_is_default:
            parsed[name] = parse(name, value)
    return parsed


class InSeconds:
    """A read-only attribute of a record: its millisecond field ``field`` in seconds."""

    __slots__ = ("_field",)

    def __init__(self, field: str) -> None:
        self._field = field

    @overload
    def __get__(self, record: None, owner: type) -> InSeconds: ...
    @overload
    def __get__(self, record: object, owner: type | None = None) -> float: ...

    def __get__(self, record: object, owner: type | None = None) -> float | InSeconds:
        if record is None:  # looked up on the class (documentation tools)
            return self
        return float(getattr(record, self._field)) / 1000.0


"""One parser per kind of value (pure): integers, seconds, booleans, priority lists.

Settings arrive as Python values from keyword arguments and as strings from DSNs and URLs;
each parser takes both and raises a :class:`ConfigurationError` naming the setting, the bad
value and what is expected.
"""

from __future__ import annotations

import math

from .errors import ConfigurationError

__all__ = ["as_bool", "as_int", "as_seconds", "parse_priorities"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def as_int(name: str, value: object, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"Bad {name} {value!r}: expected an integer")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            raise ConfigurationError(f"Bad {name} {text!r}: expected an integer") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ConfigurationError(f"Bad {name} {value!r}: expected an integer")
    if minimum is not None and value < minimum:
        raise ConfigurationError(f"Bad {name} {value!r}: must be >= {minimum}")
    return value


def as_seconds(name: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        text = value.strip()
        if allow_none and text.lower() in ("", "none", "0"):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ConfigurationError(f"Bad {name} {text!r}: expected a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"Bad {name} {value!r}: expected a number of seconds")
    if math.isnan(value) or value < 0:
        raise ConfigurationError(f"Bad {name} {value!r}: must be >= 0")
    if allow_none and value == 0:
        return None
    return float(value)


def as_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in (*_TRUE, *_FALSE):
        return value.strip().lower() in _TRUE
    raise ConfigurationError(f"Bad {name} {value!r}: expected true or false")


def parse_priorities(text: str) -> list[int]:
    """``"0,1,1"`` (one per host, or one for all) -> ``[0, 1, 1]``; negative allowed."""
    priorities = []
    for item in text.split(","):
        try:
            priorities.append(int(item.strip()))
        except ValueError:
            raise ConfigurationError(
                f"Bad priority {item.strip()!r} in priority={text!r}: expected integers, one per host"
            ) from None
    return priorities

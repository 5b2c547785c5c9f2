"""Retry-budget settings (``retry_budget_*``, see :mod:`clickhouse_lb.core.retry_budget`) as one
frozen record, parsed from keywords, a DSN's query or a URL (strings allowed)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clickhouse_lb._redact import shown
from clickhouse_lb.config._fields import InSeconds, parse_fields
from clickhouse_lb.config._values import LIMITS, bounded_float, bounded_int
from clickhouse_lb.errors import ConfigurationError

__all__ = ["DEFAULT_RETRY_BUDGET", "RETRY_BUDGET_SETTING_NAMES", "RetryBudgetSettings", "parse_retry_budget_settings"]


@dataclass(frozen=True)
class RetryBudgetSettings:
    """Stored in the units given (milliseconds for the window), as the other ``*_ms`` settings."""

    #: Extra requests allowed per statement started in the window (0.1: one per ten statements).
    retry_budget_ratio: float = 0.1
    #: Extra requests allowed per second of the window whatever the traffic (the floor).
    retry_budget_min_per_second: float = 10.0
    #: The sliding window, in milliseconds; 0: no budget (extra requests unlimited).
    retry_budget_window_ms: int = 10_000

    @property
    def ratio(self) -> float:
        return self.retry_budget_ratio

    @property
    def min_per_second(self) -> float:
        return self.retry_budget_min_per_second

    #: The window in seconds (0: no budget).
    window = InSeconds("retry_budget_window_ms")


RETRY_BUDGET_SETTING_NAMES: tuple[str, ...] = (
    "retry_budget_ratio",
    "retry_budget_min_per_second",
    "retry_budget_window_ms",
)

DEFAULT_RETRY_BUDGET = RetryBudgetSettings()


def _number(name: str, value: object) -> float:
    """A finite number within the setting's bounds (a decimal string is fine)."""
    accepted = LIMITS[name].describe()
    raw = value
    if isinstance(value, str):
        try:
            value = float(value.strip()) if len(value) <= 40 else math.nan
        except ValueError:
            raise ConfigurationError(f"Bad {name} {shown(raw)}: expected a number, {accepted}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"Bad {name} {shown(raw)}: expected a number, {accepted}")
    return bounded_float(name, value)


_PARSERS = {
    "retry_budget_ratio": _number,
    "retry_budget_min_per_second": _number,
    "retry_budget_window_ms": bounded_int,
}


def parse_retry_budget_settings(values: Mapping[str, Any]) -> RetryBudgetSettings:
    """The pool's retry budget from names and values; a missing or None value is the default."""
    return RetryBudgetSettings(**parse_fields(values, _PARSERS))

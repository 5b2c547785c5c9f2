"""Hedged-read settings (``use_hedged_requests``, ``receive_data_timeout_ms``) as one frozen policy."""

from __future__ import annotations

import math
from dataclasses import dataclass

from clickhouse_lb.config._values import bounded
from clickhouse_lb.errors import ConfigurationError

AUTO = "auto"


def parse_receive_data_timeout(value: object) -> float | None:
    """``receive_data_timeout_ms``: milliseconds (> 0) -> seconds, or ``"auto"`` -> None."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    raw = value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ConfigurationError(
            f"Bad receive_data_timeout_ms {raw!r}: expected a number of milliseconds > 0, or 'auto'"
        )
    return float(bounded("receive_data_timeout_ms", float(value)) or 0.0) / 1000.0


@dataclass(frozen=True)
class HedgePolicy:
    enabled: bool = False
    #: Seconds before hedging; None: adaptive ("auto").
    delay: float | None = None

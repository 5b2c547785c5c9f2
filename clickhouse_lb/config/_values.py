"""One parser per kind of value (pure): integers, seconds, booleans, priority lists, and the
one table of bounds every number is checked against (:data:`LIMITS`).

Settings arrive as Python values from keyword arguments and as strings from DSNs and URLs;
each parser takes both and raises a :class:`ConfigurationError` naming the setting, the bad
value (secrets masked, long values cut) and what is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clickhouse_lb._redact import shown
from clickhouse_lb.errors import ConfigurationError, did_you_mean

__all__ = [
    "LIMITS", "Bounds", "as_bool", "as_int", "as_seconds", "bounded", "bounded_float", "bounded_int",
    "parse_priorities",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: Integers beyond this are refused everywhere (the server's settings are 64-bit).
_INT64 = 2**63 - 1
_UINT64 = 2**64 - 1
_HOUR_MS = 3_600_000
_DAY = 86_400.0


@dataclass(frozen=True)
class Bounds:
    """What one numeric value accepts: ``kind`` is ``"int"`` or ``"seconds"`` (a finite float);
    ``low``/``high`` are inclusive; ``none_is_zero`` (seconds only): ``None``, ``""``, ``"none"``
    and 0 mean "no limit" (``None``)."""

    kind: str
    low: float
    high: float
    unit: str = ""
    none_is_zero: bool = False

    def describe(self) -> str:
        low = f"{self.low:g}" if self.kind == "seconds" else str(int(self.low))
        high = f"{self.high:g}" if self.kind == "seconds" else str(int(self.high))
        unit = f" {self.unit}" if self.unit else ""
        text = f"{low}..{high}{unit}"
        return f"{text}, or 0/None for no limit" if self.none_is_zero else text


#: The bounds of every number a pool takes (balancing settings, per-statement overrides and the
#: client options the pool checks), in one table: docs/configuration.md lists
#: these, and a new setting joins here. Timeouts are bounded so that a typo (10**15) is caught
#: and a value can always be handed to a socket; counts so that nothing allocates or loops
#: absurdly.
LIMITS: dict[str, Bounds] = {
    # balancing settings (clickhouse_lb.config.settings)
    "load_balancing_first_offset": Bounds("int", -_INT64 - 1, _UINT64, "(taken modulo the number of replicas)"),
    "distributed_replica_error_half_life": Bounds("seconds", 0.0, 1e10, "seconds (0: errors never stick)"),
    "distributed_replica_error_cap": Bounds("int", 1, 10**9, "errors"),
    "distributed_replica_max_ignored_errors": Bounds("int", 0, 10**9, "errors"),
    "connections_with_failover_max_tries": Bounds("int", 1, 1000, "tries per replica"),
    "connect_timeout_with_failover_ms": Bounds("int", 1, _HOUR_MS, "ms"),
    "failover_backoff_ms": Bounds("int", 0, _HOUR_MS, "ms"),
    "failover_timeout": Bounds("seconds", 1e-6, _DAY, "seconds", none_is_zero=True),
    "least_loaded_decay_time": Bounds("seconds", 0.001, _DAY, "seconds (decay time of least_loaded's latency average)"),
    # health probes (clickhouse_lb.core.health) and replica lag (clickhouse_lb.core.lag)
    "health_check_interval_ms": Bounds("int", 0, _HOUR_MS, "ms (0: probes off)"),
    "health_check_fast_interval_ms": Bounds("int", 1, _HOUR_MS, "ms"),
    "health_check_timeout_ms": Bounds("int", 1, _HOUR_MS, "ms"),
    "health_check_rise": Bounds("int", 1, 1000, "consecutive probes"),
    "health_check_fall": Bounds("int", 1, 1000, "consecutive probes"),
    "health_check_delay_interval_ms": Bounds("int", 0, 24 * _HOUR_MS, "ms (0: never)"),
    "max_replica_delay_for_distributed_queries": Bounds("int", 0, 10**9, "seconds (0: not checked)"),
    # discovery from system.clusters (clickhouse_lb.core.discovery)
    "shard": Bounds("int", 1, 2**32 - 1, "(a shard_num of system.clusters)"),
    "cluster_http_port": Bounds("int", 1, 65535, "(a TCP port)"),
    "cluster_discovery_interval_ms": Bounds("int", 0, 24 * _HOUR_MS, "ms (0: read once)"),
    # read-your-writes (clickhouse_lb.config.read_your_writes)
    "read_your_writes_window_ms": Bounds("int", 1, 24 * _HOUR_MS, "ms"),
    "read_your_writes_timeout_ms": Bounds("int", 1, _HOUR_MS, "ms"),
    # clickhouse-connect client options the pool checks before any I/O (clickhouse_lb.config.pool_config)
    "connect_timeout": Bounds("seconds", 0.001, 3600.0, "seconds"),
    "send_receive_timeout": Bounds("seconds", 0.001, 7 * _DAY, "seconds"),
    "query_limit": Bounds("int", 0, _INT64, "rows (0: no limit)"),
    "query_retries": Bounds("int", 0, 100, "retries"),
    "max_connection_age": Bounds("seconds", 0.001, 365 * _DAY, "seconds"),
    "pool_size": Bounds("int", 1, 10_000, "connections"),
    "connector_limit": Bounds("int", 1, 100_000, "connections"),
    "connector_limit_per_host": Bounds("int", 1, 100_000, "connections"),
    "keepalive_timeout": Bounds("seconds", 0.0, _DAY, "seconds"),
    # per-attempt timeouts, liveness checks and hedged reads (clickhouse_lb.config.attempt_settings);
    # the *_ms ones are fractional milliseconds, checked as finite numbers
    "send_timeout": Bounds("seconds", 0.001, 7 * _DAY, "seconds"),
    "receive_timeout": Bounds("seconds", 0.001, 7 * _DAY, "seconds"),
    "liveness_check_after_ms": Bounds("seconds", 1.0, _HOUR_MS, "ms (0: no liveness checks)"),
    "liveness_ping_timeout_ms": Bounds("seconds", 1.0, _HOUR_MS, "ms"),
    "liveness_check_interval_ms": Bounds("seconds", 1.0, _HOUR_MS, "ms"),
    "receive_data_timeout_ms": Bounds("seconds", 1.0, _HOUR_MS, "ms, or 'auto'"),
    # the retry budget of extra requests (clickhouse_lb.config.retry_budget); fractional numbers
    "retry_budget_ratio": Bounds("seconds", 0.0, 1.0, "extra requests per statement in the window"),
    "retry_budget_min_per_second": Bounds("seconds", 0.0, 1e6, "extra requests per second (the floor)"),
    "retry_budget_window_ms": Bounds("int", 0, _HOUR_MS, "ms (0: no budget)"),
}


def bounded(name: str, value: object) -> int | float | None:
    """``value`` parsed and checked against ``LIMITS[name]``."""
    bounds = LIMITS[name]
    if bounds.kind == "int":
        return as_int(name, value, minimum=int(bounds.low), maximum=int(bounds.high), accepted=bounds.describe())
    return as_seconds(
        name, value, allow_none=bounds.none_is_zero, minimum=bounds.low, maximum=bounds.high,
        accepted=bounds.describe(),
    )


def bounded_int(name: str, value: object) -> int:
    """:func:`bounded` for a setting whose bounds are integers (never None)."""
    return int(bounded(name, value) or 0)


def bounded_float(name: str, value: object) -> float:
    """:func:`bounded` for a fractional setting that has no "no limit" value (never None)."""
    return float(bounded(name, value) or 0.0)


def as_int(
    name: str,
    value: object,
    *,
    minimum: int | None = 0,
    maximum: int | None = _UINT64,
    accepted: str | None = None,
    where: str = "",
) -> int:
    """An integer (an integral float or a decimal string is fine), within ``minimum..maximum``.
    ``accepted``: the valid values as a message says them after "an integer" (default: the
    range); ``where``: said after the value (`` in priority='0,x'``)."""
    expected = accepted or f"{minimum if minimum is not None else ''}..{maximum if maximum is not None else ''}"
    if isinstance(value, bool):
        raise ConfigurationError(f"Bad {name} {shown(value)}{where}: expected an integer {expected}")
    if isinstance(value, str):
        text = value.strip()
        # ASCII digits only: int() also takes '¹²'-like digits of other scripts, and '1_000'.
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 25:
            raise ConfigurationError(f"Bad {name} {shown(text)}{where}: expected an integer {expected}")
        value = int(text)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise ConfigurationError(f"Bad {name} {shown(value)}{where}: expected an integer {expected}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigurationError(f"Bad {name} {shown(value)}{where}: expected {expected}")
    return value


def as_seconds(
    name: str,
    value: object,
    *,
    allow_none: bool = False,
    minimum: float = 0.0,
    maximum: float = 365 * _DAY,
    accepted: str | None = None,
) -> float | None:
    """A finite number of seconds within ``minimum..maximum``; with ``allow_none``, ``None``,
    ``""``, ``"none"`` and 0 mean "no limit" (``None``)."""
    expected = accepted or f"{minimum:g}..{maximum:g} seconds"
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        text = value.strip()
        if allow_none and text.lower() in ("", "none", "0"):
            return None
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            raise ConfigurationError(f"Bad {name} {shown(text)}: expected a number of seconds, {expected}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"Bad {name} {shown(value)}: expected a number of seconds, {expected}")
    if allow_none and value == 0:
        return None
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or not minimum <= seconds <= maximum:
        raise ConfigurationError(f"Bad {name} {shown(value)}: expected {expected}")
    return seconds


def as_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in (*_TRUE, *_FALSE):
        return value.strip().lower() in _TRUE
    raise ConfigurationError(
        f"Bad {name} {shown(value)}{did_you_mean(value, (*_TRUE, *_FALSE))}: "
        "expected true or false (1/0, yes/no, on/off)"
    )


#: Priorities are ClickHouse's ``<priority>`` (Int64 on the server); ours are bounded like it.
PRIORITY_BOUNDS = (-(2**63), 2**63 - 1)
#: What a priority may be, as error messages and docs/configuration.md say it.
PRIORITY_RANGE = "-2^63..2^63-1 (lower is preferred, negative allowed)"


def as_priority(value: object, where: str = "") -> int:
    """One replica priority: an integer in the 64-bit signed range (lower is preferred).
    ``where``: said after the value in an error (`` for replica 'ch-1'``)."""
    low, high = PRIORITY_BOUNDS
    return as_int("priority", value, minimum=low, maximum=high, accepted=PRIORITY_RANGE, where=where)


def parse_priorities(text: str) -> list[int]:
    """``"0,1,1"`` (one per host, or one for all) -> ``[0, 1, 1]``; negative allowed."""
    items = text.split(",")
    where = f" in priority={shown(text)}" if len(items) > 1 else ""
    return [as_priority(item, where) for item in items]

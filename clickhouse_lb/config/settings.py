"""How a pool balances: ClickHouse's balancing settings under their own names, and the ones
a statement may change for itself (pure; the replica list is in :mod:`clickhouse_lb.config.replicas`).

Values come in from keyword arguments, a DSN, a SQLAlchemy URL query or a statement's
``settings=``; they leave as one frozen :class:`BalancingSettings` (or a
:class:`StatementOverrides`) or as a :class:`ConfigurationError` that names the bad value and
the valid choices. Strings are accepted everywhere a number is, because URLs only carry strings.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from functools import partial
from typing import Any

from clickhouse_lb._redact import shown
from clickhouse_lb.config._fields import FieldParser, parse_fields
from clickhouse_lb.config._values import LIMITS, as_bool, bounded, bounded_int
from clickhouse_lb.config.attempt_settings import ATTEMPT_SETTING_NAMES, normalize_attempt_setting
from clickhouse_lb.config.liveness import LIVENESS_DEFAULTS
from clickhouse_lb.errors import CONFIGURATION_REFERENCE, ConfigurationError, did_you_mean

__all__ = [
    "BALANCING_SETTING_NAMES",
    "NO_OVERRIDES",
    "STATEMENT_SETTING_NAMES",
    "BalancingSettings",
    "LoadBalancing",
    "StatementOverrides",
    "parse_balancing_settings",
    "split_statement_settings",
    "unknown_name_error",
]

class LoadBalancing(str, Enum):
    """ClickHouse's ``load_balancing`` values (src/Core/SettingsEnums.h), plus ``least_loaded``.

    ``least_loaded`` is this library's extension (the server has no such value): errors and
    priority first as always, then power of two choices over in-flight statements and a latency
    average (:func:`clickhouse_lb.core.ordering.least_loaded_order`, :mod:`clickhouse_lb.core.load`).
    """

    RANDOM = "random"
    NEAREST_HOSTNAME = "nearest_hostname"
    HOSTNAME_LEVENSHTEIN_DISTANCE = "hostname_levenshtein_distance"
    HOSTNAME_LONGEST_COMMON_PREFIX = "hostname_longest_common_prefix"
    HOSTNAME_LONGEST_COMMON_SUFFIX = "hostname_longest_common_suffix"
    IN_ORDER = "in_order"
    FIRST_OR_RANDOM = "first_or_random"
    ROUND_ROBIN = "round_robin"
    #: Not a ClickHouse value: this library's load-aware extension.
    LEAST_LOADED = "least_loaded"

    @classmethod
    def parse(cls, value: object) -> LoadBalancing:
        """Case-insensitive, like the server; an unknown name lists the valid ones."""
        if isinstance(value, LoadBalancing):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        choices = [m.value for m in cls]
        raise ConfigurationError(
            f"Unknown load_balancing {shown(value)}{did_you_mean(value, choices)}; valid choices: {', '.join(choices)}"
        )

    @property
    def uses_hostnames(self) -> bool:
        return self in _HOSTNAME_STRATEGIES


_HOSTNAME_STRATEGIES = frozenset(
    {
        LoadBalancing.NEAREST_HOSTNAME,
        LoadBalancing.HOSTNAME_LEVENSHTEIN_DISTANCE,
        LoadBalancing.HOSTNAME_LONGEST_COMMON_PREFIX,
        LoadBalancing.HOSTNAME_LONGEST_COMMON_SUFFIX,
    }
)


@dataclass(frozen=True)
class BalancingSettings:
    """How a pool orders, counts and fails over. Names and defaults are ClickHouse's
    (src/Core/Settings.cpp), except the ``failover_*``, ``auto_*``, ``least_loaded_*`` and
    ``liveness_*`` options, which the server has no equivalent for."""

    load_balancing: LoadBalancing = LoadBalancing.RANDOM
    load_balancing_first_offset: int = 0
    local_hostname: str | None = None
    distributed_replica_error_half_life: float = 60.0
    distributed_replica_error_cap: int = 1000
    distributed_replica_max_ignored_errors: int = 0
    connections_with_failover_max_tries: int = 3
    connect_timeout_with_failover_ms: int = 1000
    #: Pause before each new pass over the replicas (exponential, with full jitter); 0: none.
    failover_backoff_ms: int = 0
    #: Total time budget of one statement's attempts in seconds; None: bounded by tries only.
    failover_timeout: float | None = None
    #: Add a stable ``insert_deduplication_token`` to inserts so that they can be retried safely.
    auto_insert_deduplication_token: bool = True
    #: Hedged reads (ClickHouse's name; off in the pool, see clickhouse_lb.core.hedging).
    use_hedged_requests: bool = False
    #: Hedge a read not answered within this many milliseconds, or "auto" (adaptive).
    receive_data_timeout_ms: float | str = "auto"
    #: Liveness-checked waits (clickhouse_lb.core.watch): ping a replica whose answer is this late
    #: (0: off), how long the ping may take, how often to ping again while it keeps working.
    liveness_check_after_ms: float = (LIVENESS_DEFAULTS.check_after or 0.0) * 1000  # None (off) is 0 here
    liveness_ping_timeout_ms: float = LIVENESS_DEFAULTS.ping_timeout * 1000
    liveness_check_interval_ms: float = LIVENESS_DEFAULTS.interval * 1000
    #: ``least_loaded`` only (no server equivalent): seconds, the time constant of each replica's
    #: latency average; an idle replica's average falls by half every ``0.69 *`` this.
    least_loaded_decay_time: float = 10.0


BALANCING_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(BalancingSettings))

#: Every numeric balancing setting has its bounds in :data:`clickhouse_lb.config._values.LIMITS`.
_NUMERIC_SETTINGS = frozenset(name for name in BALANCING_SETTING_NAMES if name in LIMITS)


#: An unknown-name error suggests at most this many names, the closest first.
_CLOSEST_NAMES = 5
#: A set of names this small is listed whole when none is close.
_LISTED_WHOLE = 8


def unknown_name_error(kind: str, name: str, valid: Iterable[str]) -> ConfigurationError:
    """An error for an unknown option: the name, at most five closest valid names (or a small
    set whole), and where every name is listed."""
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=_CLOSEST_NAMES, cutoff=0.6) if isinstance(name, str) else []
    if close:
        hint = f" Did you mean {', '.join(close)}?"
    elif len(valid) <= _LISTED_WHOLE:
        hint = f" Valid: {', '.join(valid)}."
    else:
        hint = ""
    return ConfigurationError(
        f"Unknown {kind} {shown(name)}.{hint} Every {kind} is in the configuration reference: {CONFIGURATION_REFERENCE}"
    )


def parse_local_hostname(value: object) -> str | None:
    """``local_hostname``: a host name of at most 253 printable characters, or None."""
    if value is None:
        return None
    text = value.strip() if isinstance(value, str) else None
    if not text or len(text) > 253 or not text.isprintable() or any(c.isspace() for c in text):
        raise ConfigurationError(
            f"Bad local_hostname {shown(value)}: expected a host name (1..253 printable characters)"
        )
    return text


def _load_balancing(name: str, value: object) -> LoadBalancing:
    return LoadBalancing.parse(value)


def _local_hostname(name: str, value: object) -> str | None:
    return parse_local_hostname(value)


#: Each balancing setting's parser: a number is checked against its bounds, unless it is one
#: of the attempt settings (kept as normalised there).
_BALANCING_PARSERS: dict[str, FieldParser] = {
    **dict.fromkeys(BALANCING_SETTING_NAMES, bounded),
    "load_balancing": _load_balancing,
    "local_hostname": _local_hostname,
    "auto_insert_deduplication_token": as_bool,
    **dict.fromkeys(ATTEMPT_SETTING_NAMES, normalize_attempt_setting),
}


def parse_balancing_settings(values: Mapping[str, Any]) -> BalancingSettings:
    """Validate balancing settings given by name (strings allowed); unknown names are errors."""
    unknown = partial(unknown_name_error, "balancing setting")
    parsed = parse_fields(values, _BALANCING_PARSERS, unknown=unknown, none_is_default=False)
    return BalancingSettings(**parsed)


#: Balancing settings a statement may change for itself through ``settings=``, as on the server.
_STATEMENT_PARSERS: dict[str, FieldParser] = {
    "load_balancing": _load_balancing,
    "load_balancing_first_offset": bounded_int,
    "distributed_replica_max_ignored_errors": bounded_int,
}
STATEMENT_SETTING_NAMES = frozenset(_STATEMENT_PARSERS)


@dataclass(frozen=True)
class StatementOverrides:
    """Balancing settings given for one statement (``None``: use the pool's)."""

    load_balancing: LoadBalancing | None = None
    load_balancing_first_offset: int | None = None
    distributed_replica_max_ignored_errors: int | None = None

    def __bool__(self) -> bool:
        return (
            self.load_balancing is not None
            or self.load_balancing_first_offset is not None
            or self.distributed_replica_max_ignored_errors is not None
        )


NO_OVERRIDES = StatementOverrides()


def split_statement_settings(
    settings: Mapping[str, Any] | None,
) -> tuple[StatementOverrides, Mapping[str, Any] | None]:
    """Take the balancing settings out of a statement's ``settings``; the rest go to the server
    (the same object when there is nothing to take out)."""
    if not settings or not any(key in STATEMENT_SETTING_NAMES for key in settings):
        return NO_OVERRIDES, settings
    rest = {k: v for k, v in settings.items() if k not in STATEMENT_SETTING_NAMES}
    return StatementOverrides(**parse_fields(settings, _STATEMENT_PARSERS)), rest

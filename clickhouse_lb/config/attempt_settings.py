"""How each attempt of a statement waits: timeouts, liveness checks, hedging (pure parsing).

Pool-wide values come from ``get_pool(...)`` keywords (or a DSN / URL query); a statement may
give its own in ``settings=`` (``{"receive_timeout": 0.5, "use_hedged_requests": 1}``), which
the pool takes out before the call reaches the server.

=============================  ==========  ==================================================
name                           default     meaning
=============================  ==========  ==================================================
``send_receive_timeout``       300         clickhouse-connect's: send and receive timeout, s
``receive_timeout``            300         ClickHouse's name: longest wait for an answer, s
``send_timeout``               300         ClickHouse's name: socket write timeout, s
``connect_timeout_with_        1000        ClickHouse's: connect timeout when other replicas
failover_ms``                              remain (ms)
``liveness_check_after_ms``    100         ping a replica whose answer is this late (0: off)
``liveness_ping_timeout_ms``   150         a replica that does not answer the ping is hung
``liveness_check_interval_ms`` 1000        ping again while a live replica keeps working
``use_hedged_requests``        0           hedged reads (ClickHouse's name; on by default in
                                           the server, off in the pool: see hedging.py)
``receive_data_timeout_ms``    ``"auto"``  hedge a read not answered within this (ms, or
                                           ``"auto"``: a bounded high percentile)
=============================  ==========  ==================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from clickhouse_lb.config._values import as_bool
from clickhouse_lb.config.hedging import HedgePolicy, parse_receive_data_timeout
from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.config.timeouts import (
    NO_TIMEOUTS,
    STATEMENT_TIMEOUT_NAMES,
    Timeouts,
    parse_seconds,
    split_statement_timeouts,
)
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "ATTEMPT_SETTING_NAMES",
    "CLIENT_TIMEOUT_OPTIONS",
    "NO_STATEMENT_SETTINGS",
    "STATEMENT_ATTEMPT_SETTING_NAMES",
    "AttemptSettings",
    "StatementAttemptSettings",
    "derive_attempt_settings",
    "normalize_attempt_setting",
    "split_statement_attempt_settings",
]

#: Pool settings of this module (besides the timeouts, which share clickhouse-connect's names).
ATTEMPT_SETTING_NAMES = (
    "use_hedged_requests",
    "receive_data_timeout_ms",
    "liveness_check_after_ms",
    "liveness_ping_timeout_ms",
    "liveness_check_interval_ms",
)
#: Timeout options the pool takes over from clickhouse-connect's (and ClickHouse's) names.
CLIENT_TIMEOUT_OPTIONS = ("send_receive_timeout", "receive_timeout", "send_timeout", "connect_timeout")
#: What a statement may give for itself in ``settings=``.
STATEMENT_ATTEMPT_SETTING_NAMES = STATEMENT_TIMEOUT_NAMES | {"use_hedged_requests", "receive_data_timeout_ms"}


class _Unset(Enum):
    """A statement's ``receive_data_timeout`` not given (None means "auto")."""

    UNSET = "unset"


_UNSET = _Unset.UNSET


def _flag(name: str, value: object) -> bool:
    """``use_hedged_requests``: what every boolean setting takes (:func:`as_bool`), refused in
    ClickHouse's words for this setting (0 or 1)."""
    try:
        return as_bool(name, value)
    except ConfigurationError:
        raise ConfigurationError(f"Bad {name} {value!r}: expected 0 or 1 (true or false)") from None


def _milliseconds(name: str, value: object, *, zero_is_off: bool = False) -> float | None:
    if zero_is_off and (value == 0 or (isinstance(value, str) and value.strip() == "0")):
        return None
    return parse_seconds(name, value, unit="ms")


def normalize_attempt_setting(name: str, value: object) -> object:
    """Validate one pool attempt setting where all settings are validated (``get_pool``, DSN,
    URL query): the value kept (a bool, milliseconds, or "auto"), or a ConfigurationError."""
    if name == "use_hedged_requests":
        return _flag(name, value)
    if name == "receive_data_timeout_ms":
        seconds = parse_receive_data_timeout(value)
        return "auto" if seconds is None else seconds * 1000.0
    if name == "liveness_check_after_ms":
        seconds = _milliseconds(name, value, zero_is_off=True)
        return 0.0 if seconds is None else seconds * 1000.0
    if name in ("liveness_ping_timeout_ms", "liveness_check_interval_ms"):
        return parse_seconds(name, value, unit="ms") * 1000.0
    raise ConfigurationError(f"Unknown attempt setting {name!r}; valid: {', '.join(ATTEMPT_SETTING_NAMES)}")


@dataclass(frozen=True)
class AttemptSettings:
    timeouts: Timeouts
    liveness: LivenessPolicy
    hedging: HedgePolicy
    #: Seconds from an attempt's start to its first wake-up without a deadline: the earlier of
    #: the receive timeout and the first liveness check (inf: neither). Computed from the fields.
    first_wake_after: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        waits = (self.timeouts.receive, self.liveness.check_after)
        object.__setattr__(self, "first_wake_after", min((w for w in waits if w is not None), default=math.inf))


@dataclass(frozen=True)
class StatementAttemptSettings:
    """What one statement changed (``None``: the pool's)."""

    timeouts: Timeouts = NO_TIMEOUTS
    use_hedged_requests: bool | None = None
    receive_data_timeout: float | _Unset | None = _UNSET  # seconds, None: "auto"

    def apply(self, pool: AttemptSettings) -> AttemptSettings:
        if self is NO_STATEMENT_SETTINGS:
            return pool
        hedging = pool.hedging
        if self.use_hedged_requests is not None:
            hedging = replace(hedging, enabled=self.use_hedged_requests)
        if not isinstance(self.receive_data_timeout, _Unset):
            hedging = replace(hedging, delay=self.receive_data_timeout)
        return AttemptSettings(pool.timeouts.override(self.timeouts), pool.liveness, hedging)


NO_STATEMENT_SETTINGS = StatementAttemptSettings()


class _AttemptValues(Protocol):
    """The balancing settings this module reads (:class:`~clickhouse_lb.config.settings.BalancingSettings`,
    which stores them once, in milliseconds, as normalised by :func:`normalize_attempt_setting`)."""

    @property
    def use_hedged_requests(self) -> bool: ...
    @property
    def receive_data_timeout_ms(self) -> float | str: ...
    @property
    def liveness_check_after_ms(self) -> float: ...
    @property
    def liveness_ping_timeout_ms(self) -> float: ...
    @property
    def liveness_check_interval_ms(self) -> float: ...


def derive_attempt_settings(settings: _AttemptValues, timeouts: Timeouts) -> AttemptSettings:
    """The pool's attempt settings, computed from the settings as stored (milliseconds) and the
    pool's timeouts: a derived value, never a second copy that could drift from its input."""
    check_after = settings.liveness_check_after_ms
    delay = settings.receive_data_timeout_ms
    liveness = LivenessPolicy(
        check_after=check_after / 1000.0 if check_after else None,
        ping_timeout=settings.liveness_ping_timeout_ms / 1000.0,
        interval=settings.liveness_check_interval_ms / 1000.0,
    )
    hedging = HedgePolicy(
        enabled=bool(settings.use_hedged_requests),
        delay=None if isinstance(delay, str) else float(delay) / 1000.0,
    )
    return AttemptSettings(timeouts, liveness, hedging)


def split_statement_attempt_settings(
    settings: Mapping[str, Any] | None,
) -> tuple[StatementAttemptSettings, Mapping[str, Any] | None]:
    """Take a statement's attempt settings out of its ``settings`` (same object when none)."""
    if not settings or not any(name in STATEMENT_ATTEMPT_SETTING_NAMES for name in settings):
        return NO_STATEMENT_SETTINGS, settings
    timeouts, rest = split_statement_timeouts(settings)
    remaining = {k: v for k, v in (rest or {}).items() if k not in ("use_hedged_requests", "receive_data_timeout_ms")}
    hedged = settings.get("use_hedged_requests")
    delay: float | _Unset | None = _UNSET
    if "receive_data_timeout_ms" in settings:
        delay = parse_receive_data_timeout(settings["receive_data_timeout_ms"])
    return (
        StatementAttemptSettings(
            timeouts=timeouts,
            use_hedged_requests=None if hedged is None else _flag("use_hedged_requests", hedged),
            receive_data_timeout=delay,
        ),
        remaining,
    )

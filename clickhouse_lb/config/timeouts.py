"""Connect, send and receive timeouts in (fractional) seconds, per pool and per statement (pure).

Names are ClickHouse's where one exists: ``connect_timeout_with_failover_ms`` (milliseconds),
``receive_timeout`` and ``send_timeout`` (seconds, floats accepted); clickhouse-connect's own
``send_receive_timeout`` and ``connect_timeout`` (seconds) are accepted as floats too, although
its constructor only takes whole seconds (the pool gives the client the rounded-up value and
then sets the exact one, see :mod:`clickhouse_lb.pools._transport`).

Where each one acts:

* the transport (urllib3's ``Timeout``, aiohttp's ``ClientTimeout``) gets the pool's values as
  ceilings: connect, and one socket timeout for reads and writes (neither library separates
  writes from reads, so it is the larger of send and receive);
* the attempt driver enforces the exact values of the statement: it stops waiting for an answer
  after ``receive_timeout`` (counted from the attempt's start, sending included), and every wait
  is cut to the statement's deadline (:mod:`clickhouse_lb.core.deadline`).

A statement gives its own values in ``settings=`` (``{"receive_timeout": 0.5}``); the pool takes
them out before the call reaches the server, like the balancing settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clickhouse_lb.config._values import LIMITS, bounded
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "CLICKHOUSE_CONNECT_DEFAULTS",
    "STATEMENT_TIMEOUT_NAMES",
    "Timeouts",
    "client_timeout_arguments",
    "pool_timeouts",
    "split_statement_timeouts",
]

#: clickhouse-connect's own defaults (seconds): used when the user gives nothing.
CLICKHOUSE_CONNECT_DEFAULTS = {"connect_timeout": 10.0, "send_receive_timeout": 300.0}

#: Timeouts a statement may give for itself through ``settings=``.
STATEMENT_TIMEOUT_NAMES = frozenset({"connect_timeout_with_failover_ms", "receive_timeout", "send_timeout"})


def parse_seconds(name: str, value: object, *, unit: str = "s") -> float:
    """A positive number of seconds (``unit="ms"``: milliseconds), strings allowed (URLs)."""
    raw = value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigurationError(
                f"Bad {name} {raw!r}: expected a number of {'milliseconds' if unit == 'ms' else 'seconds'}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ConfigurationError(
            f"Bad {name} {raw!r}: expected a number of {'milliseconds' if unit == 'ms' else 'seconds'} > 0"
        )
    number = float(value)
    if name in LIMITS:  # the range every setting is checked against
        number = float(bounded(name, number) or 0.0)
    return number / 1000.0 if unit == "ms" else number


@dataclass(frozen=True)
class Timeouts:
    """Seconds; ``None``: unbounded."""

    connect: float | None = None
    send: float | None = None
    receive: float | None = None

    @property
    def socket(self) -> float | None:
        """The one socket timeout the transports apply to reads and writes after connecting."""
        if self.send is None or self.receive is None:
            return None
        return max(self.send, self.receive)

    def override(self, other: Timeouts) -> Timeouts:
        """These timeouts with ``other``'s given values taking precedence (a statement's)."""
        return Timeouts(
            connect=self.connect if other.connect is None else other.connect,
            send=self.send if other.send is None else other.send,
            receive=self.receive if other.receive is None else other.receive,
        )

    def __bool__(self) -> bool:
        return self.connect is not None or self.send is not None or self.receive is not None


NO_TIMEOUTS = Timeouts()


def pool_timeouts(
    client_options: Mapping[str, Any],
    *,
    connect_timeout_with_failover_ms: float,
    replicas: int,
) -> tuple[Timeouts, dict[str, Any]]:
    """The pool's timeouts from its options, and the options left for clickhouse-connect (the
    timeout options are taken out: the pool gives each client its own, see
    :func:`client_timeout_arguments`). The connect timeout is ``connect_timeout_with_failover_ms``
    when other replicas remain to fail over to, as on the server; a one-replica pool keeps
    ``connect_timeout``."""
    rest = dict(client_options)
    both = rest.pop("send_receive_timeout", None)
    shared = parse_seconds("send_receive_timeout", both) if both is not None else None
    default = CLICKHOUSE_CONNECT_DEFAULTS["send_receive_timeout"]
    send = rest.pop("send_timeout", None)
    receive = rest.pop("receive_timeout", None)
    connect_option = rest.pop("connect_timeout", None)
    if replicas > 1:
        connect = connect_timeout_with_failover_ms / 1000.0
    elif connect_option is not None:
        connect = parse_seconds("connect_timeout", connect_option)
    else:
        connect = CLICKHOUSE_CONNECT_DEFAULTS["connect_timeout"]
    timeouts = Timeouts(
        connect=connect,
        send=parse_seconds("send_timeout", send) if send is not None else shared or default,
        receive=parse_seconds("receive_timeout", receive) if receive is not None else shared or default,
    )
    return timeouts, rest


def split_statement_timeouts(settings: Mapping[str, Any] | None) -> tuple[Timeouts, Mapping[str, Any] | None]:
    """Take a statement's own timeouts out of its ``settings`` (the same object when it has none)."""
    if not settings or not any(name in STATEMENT_TIMEOUT_NAMES for name in settings):
        return NO_TIMEOUTS, settings
    rest = {k: v for k, v in settings.items() if k not in STATEMENT_TIMEOUT_NAMES}
    connect = settings.get("connect_timeout_with_failover_ms")
    send = settings.get("send_timeout")
    receive = settings.get("receive_timeout")
    timeouts = Timeouts(
        connect=parse_seconds("connect_timeout_with_failover_ms", connect, unit="ms") if connect is not None else None,
        send=parse_seconds("send_timeout", send) if send is not None else None,
        receive=parse_seconds("receive_timeout", receive) if receive is not None else None,
    )
    return timeouts, rest


def client_timeout_arguments(timeouts: Timeouts) -> dict[str, int]:
    """What clickhouse-connect's constructor accepts: whole seconds, rounded up (never 0, which
    it would turn into an error); the exact values are set on the client afterwards."""
    arguments: dict[str, int] = {}
    if timeouts.connect is not None:
        arguments["connect_timeout"] = max(1, math.ceil(timeouts.connect))
    if timeouts.socket is not None:
        arguments["send_receive_timeout"] = max(1, math.ceil(timeouts.socket))
    return arguments



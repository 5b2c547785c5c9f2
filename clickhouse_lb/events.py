"""What a pool tells the application: logging under ``clickhouse_lb`` and a listener hook.

Logging: a failover at WARNING (which replica, what failed, where the statement goes next),
a replica returning to rotation at INFO, each attempt at DEBUG. Messages never contain
passwords or tokens, nor the statement's SQL (which may hold secrets of its own).

Listeners: subclass :class:`PoolListener` (or write any object with some of its methods) and
pass ``listeners=[...]`` to ``get_pool``, or call ``pool.add_listener``. A listener that raises
is logged and otherwise ignored: metrics must never break a statement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ErrorRecordedEvent",
    "FailoverEvent",
    "PoolListener",
    "ProbeEvent",
    "ReplicaDownEvent",
    "ReplicaRecoveredEvent",
    "logger",
]

logger = logging.getLogger("clickhouse_lb")


@dataclass(frozen=True)
class ErrorRecordedEvent:
    """An error was counted against ``address``; ``errors_count`` is the new (capped) count.
    ``kind``: what failed (a :class:`~clickhouse_lb.classify.Failure` kind such as ``connect``
    or ``timeout``, ``probe`` for a failed health probe, ``ping`` for a failed ``pool.ping()``,
    ``recorded`` for ``pool.record_error``)."""

    address: str
    errors_count: int
    error: str
    kind: str = "recorded"


@dataclass(frozen=True)
class FailoverEvent:
    """An attempt on ``address`` failed and the statement moves on to ``next_address``."""

    operation: str
    address: str
    attempt: int
    error: str
    next_address: str


@dataclass(frozen=True)
class ReplicaRecoveredEvent:
    """``address`` is back: its counts decayed to zero (``reason="decayed"``), an attempt on
    it succeeded after a failure (``reason="succeeded"``), or health probes re-admitted it
    and cleared its error count (``reason="probe"``)."""

    address: str
    reason: str


@dataclass(frozen=True)
class ProbeEvent:
    """A background health probe of ``address`` finished: answered (``ok``) or not, after
    ``latency`` seconds; ``error`` says why not."""

    address: str
    ok: bool
    latency: float
    error: str | None


@dataclass(frozen=True)
class ReplicaDownEvent:
    """Health probes marked ``address`` down (``health_check_fall`` consecutive failures)."""

    address: str
    error: str


class PoolListener:
    """Override any of these; each is called synchronously, outside the pool's lock."""

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        """An error was counted against a replica."""

    def on_failover(self, event: FailoverEvent) -> None:
        """A statement moved from a failed replica to the next one."""

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        """A replica returned to rotation."""

    def on_probe(self, event: ProbeEvent) -> None:
        """A background health probe finished (called from the probe worker)."""

    def on_replica_down(self, event: ReplicaDownEvent) -> None:
        """Health probes marked a replica down."""


class ListenerSet:
    """The listeners of one pool; dispatch never raises."""

    def __init__(self, listeners: Iterable[object] = ()) -> None:
        self._listeners: tuple[object, ...] = tuple(listeners)

    def add(self, listener: object) -> None:
        self._listeners = (*self._listeners, listener)

    def remove(self, listener: object) -> None:
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def emit(self, method: str, event: object) -> None:
        for listener in self._listeners:
            callback = getattr(listener, method, None)
            if callback is None:
                continue
            try:
                callback(event)
            except Exception:
                logger.exception("clickhouse_lb listener %r failed in %s", listener, method)

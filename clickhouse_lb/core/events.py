"""What a pool tells the application: logging under ``clickhouse_lb`` and a listener hook.

Logging: a failover at WARNING (which replica, what failed, where the statement goes next),
a replica returning to rotation at INFO, each attempt at DEBUG. Messages never contain
passwords or tokens, nor the statement's SQL (which may hold secrets of its own).

Listeners: subclass :class:`PoolListener` (or write any object with some of its methods: each
is a small protocol, :class:`ErrorRecordedListener`, :class:`FailoverListener`,
:class:`RecoveryListener`, :class:`ProbeListener`, :class:`DownListener`) and
pass ``listeners=[...]`` to ``get_pool``, or call ``pool.add_listener``. A listener that raises
is logged and otherwise ignored: metrics must never break a statement.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

from clickhouse_lb._redact import shown
from clickhouse_lb.core import _background_logs
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "DownListener",
    "ErrorRecordedEvent",
    "ErrorRecordedListener",
    "FailoverEvent",
    "FailoverListener",
    "Listener",
    "ListenerSet",
    "PoolListener",
    "ProbeEvent",
    "ProbeListener",
    "RecoveryListener",
    "ReplicaDownEvent",
    "ReplicaRecoveredEvent",
    "check_listeners",
    "log_failure",
    "logger",
]

logger = logging.getLogger("clickhouse_lb")
_background_logs.install()  # no tracebacks formatted on the pool's own threads and tasks


def log_failure(message: str, *args: object) -> None:
    """Log the exception being handled by a background thread or task: its type and message,
    never its traceback (formatting one there can start while the application formats its own,
    see clickhouse_lb.pools._leftovers)."""
    exc = sys.exc_info()[1]
    logger.error(message + ": %s: %s", *args, type(exc).__name__, exc)


@dataclass(frozen=True)
class ErrorRecordedEvent:
    """An error was counted against ``address``; ``errors_count`` is the new (capped) count.
    ``kind``: what failed (a :class:`~clickhouse_lb.core.classify.Failure` kind such as ``connect``
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


# Each protocol's method does nothing by default (a bare ``return``, not a docstring alone, which a
# type checker would take for abstract): PoolListener inherits all five as its no-op defaults.


@runtime_checkable
class ErrorRecordedListener(Protocol):
    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        """An error was counted against a replica."""
        return


@runtime_checkable
class FailoverListener(Protocol):
    def on_failover(self, event: FailoverEvent) -> None:
        """A statement moved from a failed replica to the next one."""
        return


@runtime_checkable
class RecoveryListener(Protocol):
    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        """A replica returned to rotation."""
        return


@runtime_checkable
class ProbeListener(Protocol):
    def on_probe(self, event: ProbeEvent) -> None:
        """A background health probe finished (called from the probe worker)."""
        return


@runtime_checkable
class DownListener(Protocol):
    def on_replica_down(self, event: ReplicaDownEvent) -> None:
        """Health probes marked a replica down (called from the probe worker)."""
        return


#: What ``listeners=[...]`` takes: any object with one or more of the five methods.
Listener = ErrorRecordedListener | FailoverListener | RecoveryListener | ProbeListener | DownListener


class PoolListener(ErrorRecordedListener, FailoverListener, RecoveryListener, ProbeListener, DownListener):
    """Override any of these; each is called synchronously, outside the pool's lock."""


@contextmanager
def _isolated(listener: object, method: str) -> Iterator[None]:
    """A listener that raises is logged and otherwise ignored."""
    try:
        yield
    except Exception:
        logger.exception("clickhouse_lb listener %r failed in %s", listener, method)


_METHODS = ("on_error_recorded", "on_failover", "on_replica_recovered", "on_probe", "on_replica_down")


def _takes(listener: object, method: str) -> bool:
    # Not isinstance(x, the runtime-checkable Protocol): that costs microseconds per check.
    return callable(getattr(listener, method, None))


def _is_listener(listener: object) -> TypeGuard[Listener]:
    return any(_takes(listener, method) for method in _METHODS)


def _checked(listener: object) -> Listener:
    if not _is_listener(listener):
        raise ConfigurationError(
            f"Bad listener {shown(listener)}: expected an object with on_error_recorded, on_failover, "
            "on_replica_recovered, on_probe and/or on_replica_down (see clickhouse_lb.PoolListener)"
        )
    return listener


def check_listeners(listeners: Iterable[Listener]) -> tuple[Listener, ...]:
    """``listeners=`` as given to a pool: an iterable of listener objects (checked before any
    I/O or shared-state lease)."""
    given: object = listeners
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ConfigurationError(
            f"Bad listeners {shown(listeners)}: expected a list of listeners (see clickhouse_lb.PoolListener)"
        )
    return tuple(_checked(x) for x in listeners)


class ListenerSet:
    """The listeners of one pool, sorted by the events they take; dispatch never raises.

    Thread-safe: ``add``/``remove`` swap the tuples under a lock (a dispatch in progress keeps
    the tuples it started with, and never takes the lock); an asyncio pool calls them from its
    loop, where the lock is never contended."""

    def __init__(self, listeners: Iterable[Listener] = ()) -> None:
        self._lock = threading.Lock()
        self._listeners: tuple[Listener, ...] = ()
        # What discard() could not remove at once: removed by whoever holds the lock next.
        self._discarded: collections.deque[Listener] = collections.deque()
        self._set(check_listeners(listeners))

    def _set(self, listeners: tuple[Listener, ...]) -> None:
        # Rebuilt (not mutated) on change, so a dispatch in progress keeps its own tuples; one
        # tuple per method, so that a dispatch walks only the listeners that take its event.
        self._listeners = listeners
        self._takers: dict[str, tuple[Listener, ...]] = {
            method: tuple(x for x in listeners if _takes(x, method)) for method in _METHODS
        }

    def add(self, listener: Listener) -> None:
        _checked(listener)
        self._lock.acquire()
        try:
            self._set((*self._listeners, listener))
            self._remove_discarded_locked()
        finally:
            self._unlock()

    def remove(self, listener: Listener) -> None:
        """Remove every registration of ``listener`` (by identity); unknown: nothing happens."""
        self._lock.acquire()
        try:
            self._set(tuple(x for x in self._listeners if x is not listener))
            self._remove_discarded_locked()
        finally:
            self._unlock()

    def discard(self, listener: Listener) -> None:
        """:meth:`remove` for a finalizer: it never waits for the lock.

        A finalizer runs wherever the garbage collector does, which can be inside this set's
        own ``add``/``remove`` on the same thread (their tuples are allocations); waiting for
        the lock there would deadlock that thread, and every thread after it that adds or
        removes a listener. So the listener is queued, and removed now if the lock is free,
        otherwise by the holder before it lets go. Until then a dispatch may still reach it."""
        self._discarded.append(listener)
        if self._lock.acquire(blocking=False):
            try:
                self._remove_discarded_locked()
            finally:
                self._unlock()

    def _remove_discarded_locked(self) -> None:
        while self._discarded:  # (_set allocates: a finalizer may queue more meanwhile)
            gone: list[Listener] = []
            with contextlib.suppress(IndexError):
                while True:
                    gone.append(self._discarded.popleft())
            ids = {id(x) for x in gone}  # (``gone`` keeps them alive: the ids stay theirs)
            self._set(tuple(x for x in self._listeners if id(x) not in ids))

    def _unlock(self) -> None:
        self._lock.release()
        # A discard() that found the lock held just before this release: do it now.
        while self._discarded and self._lock.acquire(blocking=False):
            try:
                self._remove_discarded_locked()
            finally:
                self._lock.release()

    def __len__(self) -> int:
        return len(self._listeners)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def _dispatch(self, method: str, event: object) -> None:
        for listener in self._takers[method]:
            with _isolated(listener, method):
                getattr(listener, method)(event)

    def error_recorded(self, event: ErrorRecordedEvent) -> None:
        self._dispatch("on_error_recorded", event)

    def failover(self, event: FailoverEvent) -> None:
        self._dispatch("on_failover", event)

    def replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        self._dispatch("on_replica_recovered", event)

    def probe(self, event: ProbeEvent) -> None:
        self._dispatch("on_probe", event)

    def replica_down(self, event: ReplicaDownEvent) -> None:
        self._dispatch("on_replica_down", event)

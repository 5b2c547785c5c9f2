"""Balancing state shared by every pool and engine of the process over the same replica set.

Applications such as Apache Superset, Airflow hooks, notebooks and serverless handlers build a
new SQLAlchemy engine (or a new pool) for each query. With one balancing state per pool, each
of them would start with fresh error counts and a fresh random round-robin position: a dead
replica would be tried first again and again, and round_robin would not rotate. Here, every
pool whose :func:`state_key` is equal shares one
:class:`~clickhouse_lb.core.state.ReplicaSetState` (error and slowdown counts, the decay clock, the
round-robin counter, last errors, the in-flight counts and latency averages of ``least_loaded``),
while each pool keeps its own clients and listeners.

The key (:class:`StateKey`) is what makes two pools "the same replica set, balanced the same
way, for the same user":

- the replicas, in their configured order, as ``(host, port, priority)`` (host lower-cased)
  and whether they are reached over TLS: the state is indexed by position, and ``priority``
  is part of the order;
- the settings that shape the order or the counts: ``load_balancing``,
  ``load_balancing_first_offset``, ``local_hostname``, ``distributed_replica_error_half_life``,
  ``distributed_replica_error_cap``, ``distributed_replica_max_ignored_errors``,
  ``least_loaded_decay_time``;
- ``username`` and ``database``: some replica failures are a user's or a database's, not the
  server's (TOO_MANY_SIMULTANEOUS_QUERIES under a per-user limit, TABLE_IS_READ_ONLY and
  KEEPER_EXCEPTION for the replicated tables of one database), so other users and databases
  must not inherit them.

Not in the key: the password and other secrets (a wrong password fails on every replica with an
authentication error, which counts nothing, and a key must never hold a secret), and the
settings that only govern one statement's attempts (``connections_with_failover_max_tries``,
``connect_timeout_with_failover_ms``, ``failover_backoff_ms``, ``failover_timeout``,
``auto_insert_deduplication_token``) or the client (timeouts, compression, server settings).

Lifetime: the registry counts the pools using each state. When the last one is closed or
garbage-collected, the state is kept *idle* for :attr:`StateRegistry.idle_ttl` seconds (600 by
default: the time a capped error count takes to decay at the default 60 s half-life), because
an engine-per-query application drops one query's engine before it creates the next one, and
the whole point is that the next one sees the same state. An idle state is dropped after that
time (at the registry's next use), and at most :attr:`StateRegistry.max_idle` idle states are
kept (the oldest go first), so an application that builds pools over ever-new replica sets
holds a bounded amount of memory. ``idle_ttl = 0`` frees a state as soon as nobody uses it.

**One health worker per replica set.** The shared value is a :class:`SharedReplicaSet`: the
state and, for sync pools with health probes on, one probe worker per set of health settings
(:meth:`SharedReplicaSet.probes`), started by the first statement of any pool over the set.
It lives as long as the shared value: closing a pool (say, the engine of one Superset query)
does not stop it, so the next pool finds replicas marked down and re-admitted meanwhile; when
the registry drops the value (idle longer than :attr:`StateRegistry.idle_ttl`, or
:meth:`StateRegistry.clear`), the worker is stopped with it. Async pools keep one worker (a
task on their loop) each: a task cannot outlive the loop of the pool that started it.

Opting out: ``share_state=False`` (``get_pool``, ``get_async_pool``), ``share_state=0`` in a
DSN or a ``clickhousedb+lb`` URL: the pool gets a state of its own.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from clickhouse_lb.config.retry_budget import RetryBudgetSettings
from clickhouse_lb.core.retry_budget import RetryBudget

if TYPE_CHECKING:
    from clickhouse_lb.config.pool_config import PoolConfig
    from clickhouse_lb.core.state import ReplicaSetState

__all__ = [
    "SharedReplicaSet",
    "StateKey",
    "StateLease",
    "StateRegistry",
    "acquire_state",
    "registry",
    "state_key",
]

V = TypeVar("V")
P = TypeVar("P", bound="_Stoppable")

DEFAULT_IDLE_TTL = 600.0
DEFAULT_MAX_IDLE = 256


@dataclass(frozen=True)
class StateKey:
    """Which pools share one balancing state (see the module documentation for why these)."""

    replicas: tuple[tuple[str, int, int], ...]
    secure: bool
    username: str
    database: str | None
    load_balancing: str
    load_balancing_first_offset: int
    local_hostname: str | None
    distributed_replica_error_half_life: float
    distributed_replica_error_cap: int
    distributed_replica_max_ignored_errors: int
    least_loaded_decay_time: float = 10.0


def state_key(config: PoolConfig) -> StateKey:
    """The sharing key of a pool configuration (pure: no I/O, no clock)."""
    options = config.client_options
    settings = config.settings
    database = options.get("database")
    return StateKey(
        replicas=tuple((r.host.lower(), r.port, r.priority) for r in config.replicas),
        secure=config.secure,
        # clickhouse-connect's default user, so that "no user" and "default" share.
        username=str(options.get("username") or options.get("user") or "default"),
        database=str(database) if database else None,
        load_balancing=settings.load_balancing.value,
        load_balancing_first_offset=settings.load_balancing_first_offset,
        local_hostname=settings.local_hostname,
        distributed_replica_error_half_life=float(settings.distributed_replica_error_half_life),
        distributed_replica_error_cap=settings.distributed_replica_error_cap,
        distributed_replica_max_ignored_errors=settings.distributed_replica_max_ignored_errors,
        least_loaded_decay_time=float(settings.least_loaded_decay_time),
    )


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class SharedReplicaSet:
    """What the pools over one replica set share: the balancing state, and the probe workers
    that live as long as it does (see the module documentation)."""

    __slots__ = ("_budgets", "_lock", "_probes", "state")

    def __init__(self, state: ReplicaSetState) -> None:
        self.state = state
        self._lock = threading.Lock()
        self._probes: dict[Hashable, Any] = {}
        self._budgets: dict[RetryBudgetSettings, RetryBudget] = {}

    def retry_budget(self, settings: RetryBudgetSettings) -> RetryBudget:
        """The retry budget shared by the pools with these budget settings, made once: pools
        built per query must not each get a fresh one (clickhouse_lb.core.retry_budget)."""
        with self._lock:
            budget = self._budgets.get(settings)
            if budget is None:
                budget = self._budgets[settings] = RetryBudget(settings)
            return budget

    def probes(self, key: Hashable, factory: Callable[[], P]) -> P:
        """The shared probes for ``key`` (the health settings), made by ``factory`` once."""
        with self._lock:
            probes = self._probes.get(key)
            if probes is None:
                probes = self._probes[key] = factory()
            return probes

    def stop(self) -> None:
        """The registry dropped this set: stop its workers (without waiting)."""
        with self._lock:
            probes, self._probes = list(self._probes.values()), {}
        for worker in probes:
            worker.stop()


def _stop(value: object) -> None:
    stop = getattr(value, "stop", None)
    if stop is not None:
        with contextlib.suppress(Exception):  # dropping a value must not fail a pool
            stop()


class _Entry:
    __slots__ = ("idle_since", "users", "value")

    def __init__(self, value: object) -> None:
        self.value = value
        self.users = 0
        self.idle_since: float | None = None


class StateLease(Generic[V]):
    """One user's hold on a shared value; :meth:`release` (idempotent) gives it back."""

    __slots__ = ("__weakref__", "_entry", "_registry", "_released", "key", "value")

    def __init__(self, registry: StateRegistry, key: Hashable, entry: _Entry, value: V) -> None:
        self._registry = registry
        self._entry = entry
        self._released = False
        self.key = key
        self.value = value

    def release(self) -> None:
        self._registry._release(self)

    def release_with(self, owner: object) -> Callable[[], object]:
        """Release when ``owner`` is garbage-collected (or when the returned finalizer is
        called, e.g. by ``close()``, whichever comes first)."""
        return weakref.finalize(owner, self.release)


class StateRegistry:
    """Process-wide values keyed by :class:`StateKey`, counted by user (thread-safe)."""

    def __init__(
        self,
        *,
        idle_ttl: float = DEFAULT_IDLE_TTL,
        max_idle: int = DEFAULT_MAX_IDLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: Seconds an unused state is kept for the next pool over the same replica set.
        self.idle_ttl = idle_ttl
        #: How many unused states are kept at most (the least recently used are dropped first).
        self.max_idle = max_idle
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}
        # Releases that could not take the lock: a lease's finalizer runs wherever the garbage
        # collector does, possibly inside this registry's own locked section on this very
        # thread (an allocation in acquire() can trigger it), where waiting would deadlock.
        # They are applied by the next operation that holds the lock.
        self._pending: collections.deque[StateLease[Any]] = collections.deque()

    def acquire(self, key: Hashable, factory: Callable[[], V]) -> StateLease[V]:
        """The value shared under ``key`` (made by ``factory`` when there is none), held until
        the lease is released."""
        with self._lock:
            self._drain_locked()
            self._purge_locked(self._clock())
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(factory())
            entry.users += 1
            entry.idle_since = None
            # One registry holds values of several types; a key names one of them (every caller
            # that passes the same key passes the same factory), so what it made is a V.
            value = cast(V, entry.value)
        return StateLease(self, key, entry, value)

    def _release(self, lease: StateLease[Any]) -> None:
        if not self._lock.acquire(blocking=False):
            self._pending.append(lease)  # see __init__; applied by the next locked operation
            return
        try:
            self._drain_locked()
            self._release_locked(lease)
        finally:
            self._lock.release()

    def _drain_locked(self) -> None:
        while self._pending:
            self._release_locked(self._pending.popleft())

    def _release_locked(self, lease: StateLease[Any]) -> None:
        if lease._released:
            return
        lease._released = True
        key, entry = lease.key, lease._entry
        if self._entries.get(key) is not entry:  # cleared meanwhile: another pool may own the key now
            return
        entry.users -= 1
        now = self._clock()
        if entry.users == 0:
            entry.idle_since = now
        self._purge_locked(now)

    def _purge_locked(self, now: float) -> None:
        idle = [(entry.idle_since, key) for key, entry in self._entries.items() if entry.idle_since is not None]
        if not idle:
            return
        idle.sort(key=lambda item: item[0])
        excess = len(idle) - max(0, self.max_idle)
        for i, (since, key) in enumerate(idle):
            if i < excess or now - since >= self.idle_ttl:
                _stop(self._entries.pop(key).value)

    def users(self, key: Hashable) -> int | None:
        """How many pools hold ``key``'s state (0: idle), or None when there is none."""
        with self._lock:
            self._drain_locked()
            self._purge_locked(self._clock())
            entry = self._entries.get(key)
            return None if entry is None else entry.users

    def __len__(self) -> int:
        with self._lock:
            self._drain_locked()
            self._purge_locked(self._clock())
            return len(self._entries)

    def clear(self) -> None:
        """Forget every state (pools keep theirs; the next pools start fresh)."""
        with self._lock:
            values = [entry.value for entry in self._entries.values()]
            self._entries.clear()
        for value in values:
            _stop(value)


#: The process-wide registry used by pools and engines.
registry = StateRegistry()


def acquire_state(config: PoolConfig, factory: Callable[[], ReplicaSetState]) -> StateLease[SharedReplicaSet]:
    """What the pools over ``config``'s replica set share (see :func:`state_key`): its
    balancing state (made by ``factory`` for the first) and probe workers."""
    return registry.acquire(state_key(config), lambda: SharedReplicaSet(factory()))

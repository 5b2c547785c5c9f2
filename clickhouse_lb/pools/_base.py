"""What the sync and async pools share: everything but the ``await``.

:class:`PoolBase` is a facade over the pool's replica set (:class:`ReplicaSetView`: balancer,
probe schedule, client slots) and its statement side (stats, retry budget, hedging window).
Its constructor only wires them, through named builders, and does no I/O, except the one named
step :func:`~clickhouse_lb.pools._discovery.read_discovered_config` when discovery is on and
the configuration still lists the seeds (it reads ``system.clusters`` from a seed). Neither
pool's transport leaks into the other here (the async one imports aiohttp, the sync one must
not). The clients' slots and options are :mod:`clickhouse_lb.pools._client_slot`, discovery's
side :mod:`clickhouse_lb.pools._discovery`, the pinned sessions :mod:`clickhouse_lb.pools._pinned_base`.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

from clickhouse_connect.driver.exceptions import ProgrammingError

from clickhouse_lb.config.lag import statement_lag_settings
from clickhouse_lb.config.pool_config import PoolConfig
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BalancingSettings, split_statement_settings
from clickhouse_lb.core._statements import PreparedCall, prepare_call
from clickhouse_lb.core.balancer import Balancer, ReplicaStatus, new_replica_set_state
from clickhouse_lb.core.events import Listener, ListenerSet, check_listeners
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.core.health import HealthMonitor, probe_statuses_off
from clickhouse_lb.core.hedging import LatencyWindow
from clickhouse_lb.core.lag import order_by_freshness
from clickhouse_lb.core.replica_set import ReplicaSetView
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.core.shared_state import SharedReplicaSet, acquire_state
from clickhouse_lb.core.stats import PoolStats, StatsSnapshot
from clickhouse_lb.pools._client_members import ClientChanges, ClientMembers
from clickhouse_lb.pools._client_slot import (
    ClientSlot,
    client_options_for,
    connect_failure,
    kill_query_sql,
    pin_options,
)
from clickhouse_lb.pools._discovery import (
    DiscoveryMembers,
    discovery_reader,
    needs_first_discovery,
    read_discovered_config,
)
from clickhouse_lb.pools._pinned_base import PinnedBase
from clickhouse_lb.pools._private_members import PrivateMembers
from clickhouse_lb.pools._session_mode import pool_session_id, pooled_client_options
from clickhouse_lb.probes._ping import ping_url

__all__ = [
    "ClientSlot",
    "PinnedBase",
    "PoolBase",
    "ReplicaSetView",
    "client_options_for",
    "connect_failure",
    "discovery_reader",
    "kill_query_sql",
    "pin_options",
]


class BalancerHold(NamedTuple):
    """A pool's balancer, and what it holds of the shared state (nothing when it was given one,
    or ``share_state=False``)."""

    balancer: Balancer
    #: What the pool shares with the others over its replica set (None: nothing).
    shared: SharedReplicaSet | None
    #: Gives the hold on the shared state back (close(), or the balancer garbage-collected).
    release: Callable[[], object] | None


def hold_balancer(config: PoolConfig, listeners: tuple[Listener, ...], balancer: Balancer | None) -> BalancerHold:
    """The pool's balancer: the one given, else one over the state every pool and engine of
    the process over the same replica set shares (clickhouse_lb.core.shared_state; unless
    share_state=False), held until close() or until the balancer is garbage-collected."""
    if balancer is not None:
        return BalancerHold(balancer, None, None)
    size, settings = len(config.replicas), config.settings
    lease = acquire_state(config, lambda: new_replica_set_state(size, settings)) if config.share_state else None
    state = lease.value.state if lease is not None else None
    balancer = Balancer(config.replicas, settings, listeners=listeners, state=state)
    if lease is None:
        return BalancerHold(balancer, None, None)
    return BalancerHold(balancer, lease.value, lease.release_with(balancer))


def _detach(listeners: ListenerSet, own: tuple[Listener, ...]) -> None:
    """Take a pool's own listeners off its balancer (which may outlive it: the async SQLAlchemy
    dialect shares one balancer between the pools of successive event loops)."""
    for listener in own:
        listeners.discard(listener)  # (a finalizer: it must never wait for a lock)


class PoolBase(PrivateMembers, ClientMembers, DiscoveryMembers):
    """The balancing side of a pool; subclasses add the clients and the statements. The
    Client members that are not statements (``database``, ``server_version``, ...) come from
    :class:`~clickhouse_lb.pools._client_members.ClientMembers`."""

    #: Position of ``settings`` in each statement method of the pool's client class.
    _settings_position: ClassVar[Mapping[str, int | None]] = {}

    def __init__(
        self,
        config: PoolConfig,
        *,
        listeners: Iterable[Listener] = (),
        balancer: Balancer | None = None,
    ) -> None:
        if needs_first_discovery(config):
            config = read_discovered_config(config)  # the one I/O step (see the module documentation)
        self.config = config
        hold = hold_balancer(config, check_listeners(listeners), balancer)
        self._shared, self._release_state = hold.shared, hold.release
        self._closed = False
        self._init_statement_side()
        hold.balancer.listeners.add(self._stats)
        #: The health monitor decides the background probes (None when
        #: health_check_interval_ms=0); the pools add the worker that sends them, and the slots.
        self._view = ReplicaSetView(
            hold.balancer, HealthMonitor(hold.balancer, config.health) if config.health.enabled else None, ()
        )
        self._init_discovery()
        #: Called by close(), or when the pool is garbage-collected unclosed.
        self._detach_listeners = weakref.finalize(self, _detach, hold.balancer.listeners, (self._stats,))
        self._init_client_side()

    def _init_statement_side(self) -> None:
        """What statements count and spend: stats, hedges, the adaptive hedge delay's window,
        the retry budget (shared with the pools sharing the state)."""
        #: Recent read latencies: the adaptive hedge delay (receive_data_timeout_ms="auto").
        self._latencies = LatencyWindow()
        self._hedges = 0
        self._hedges_lock = threading.Lock()
        self._stats = PoolStats()
        #: Limits the requests the pool sends on its own (shared with the pools sharing its state).
        self._budget = RetryBudget.of_pool(self.config.retry_budget, self._shared)

    def _init_client_side(self) -> None:
        """What every client of the pool gets beyond its options: the user's changes on the
        pool (replayed on every client made later), the reference replica of the server facts,
        the session of ``session_id=`` (clickhouse_lb.pools._session_mode)."""
        self._changes = ClientChanges()
        self._reference = None
        self._session_id = pool_session_id(self.config.client_options)
        self._pooled_options = pooled_client_options(self._session_id)

    @property
    def _balancer(self) -> Balancer:
        return self._view.balancer

    @property
    def _health(self) -> HealthMonitor | None:
        return self._view.health

    @property
    def _clients(self) -> tuple[Any, ...]:
        return self._view.slots

    @property
    def settings(self) -> BalancingSettings:
        """The pool's balancing settings."""
        return self._balancer.settings

    @property
    def balancer(self) -> Balancer:
        """The balancer of the pool's current replica set (discovery may replace it)."""
        return self._view.balancer

    @property
    def addresses(self) -> list[str]:
        """``["host:port", ...]`` in the configured order."""
        return list(self._balancer.addresses)

    @property
    def replicas(self) -> list[ReplicaStatus]:
        """Per replica: host, port, errors_count, slowdowns_count, estimated_recovery_time,
        last_error, is_up ... (named like ``system.clusters``), and what the health probes
        saw: probe_state, last_probe_time, probe_latency, last_probe_error."""
        view = self._view
        statuses = view.balancer.statuses()
        probes = view.health.statuses() if view.health else probe_statuses_off(len(statuses))
        return [
            dataclasses.replace(status, **probe._asdict()) for status, probe in zip(statuses, probes)
        ]

    @property
    def stats(self) -> StatsSnapshot:
        """Running totals: statements, failovers, failures by kind, probes."""
        return self._stats.snapshot()

    @property
    def hedged_requests(self) -> int:
        """Hedges started since the pool was created: the extra reads hedging cost (each is a
        second copy of a read sent to another replica)."""
        return self._hedges

    def _count_hedge(self, index: int) -> None:
        with self._hedges_lock:
            self._hedges += 1

    def plan(self, load_balancing: str | None = None) -> list[str]:
        """``["host:port", ...]``: the order the next statement would try the replicas
        (optionally under another strategy), lagging replicas last. A look only: it does not
        advance ``round_robin``."""
        overrides, _ = split_statement_settings({"load_balancing": load_balancing} if load_balancing else None)
        order = self._fresh_first(self._balancer.plan_indices(overrides, advance=False))
        return [self._balancer.addresses[i] for i in order]

    def record_error(self, address: str | Replica, reason: str = "recorded by the application") -> int:
        """Count an error against a replica, as a failed attempt would (for application-level
        checks such as stale data). Returns the replica's new errors_count."""
        return self._balancer.record_error(self._balancer.index_of(address), reason)

    def record_slowdown(self, address: str | Replica) -> int:
        """Count a slowdown against a replica: it then ranks after its peers with equal errors
        (as under hedged requests) until the count decays. Returns the new slowdowns_count."""
        return self._balancer.record_slowdown(self._balancer.index_of(address))

    def _release_shared_state(self) -> None:
        """Give back this pool's hold on the shared balancing state (on close)."""
        if self._release_state is not None:
            self._release_state()

    def add_listener(self, listener: Listener) -> None:
        """Receive failover, error-recorded and replica-recovered events (see ``PoolListener``).
        Listeners are called synchronously (on the event loop for the async pool): keep them quick."""
        self._balancer.listeners.add(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._balancer.listeners.remove(listener)

    # -- for the drivers -------------------------------------------------------------------

    def _closed_error(self) -> ProgrammingError:
        return ProgrammingError(f"This {type(self).__name__} is closed")

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _client_arguments(
        self, index: int, options: Mapping[str, Any], extra: Mapping[str, Any], view: ReplicaSetView | None = None
    ) -> dict[str, Any]:
        replica = (view or self._view).balancer.replicas[index]
        return {"host": replica.host, "port": replica.port, **options, **extra}

    def _prepare(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PreparedCall:
        return prepare_call(
            method, args, kwargs, self._settings_position.get(method),
            auto_token=self._view.balancer.settings.auto_insert_deduplication_token,
        )

    def _started(self) -> None:
        """Every statement (and ping, and pinned session): count it, and make sure the health
        probes run (in this process; a forked child starts its own)."""
        self._stats.count_statement()
        if self._prober is not None:
            self._prober.ensure_started()

    def _fresh_first(
        self, order: list[int], statement_settings: Mapping[str, Any] | None = None, view: ReplicaSetView | None = None
    ) -> list[int]:
        """The plan with replicas lagging ``max_replica_delay_for_distributed_queries`` or more
        moved last (or left out), as the server does; the statement's own settings win. Free
        while no replica is known to lag that much."""
        view = view or self._view
        health = view.health
        if health is None:
            return order
        worst = health.schedule.worst_delay()
        if not worst:
            return order
        lag = statement_lag_settings(statement_settings, self.config.lag)
        limit = lag.max_replica_delay_for_distributed_queries
        if not limit or worst < limit:
            return order
        return order_by_freshness(order, health.schedule.delays(), lag, view.balancer.addresses)

    def _attempts(
        self,
        operation: str,
        order: list[int],
        *,
        retry_after_send: bool = True,
        write: bool = True,
        view: ReplicaSetView | None = None,
        statement: PreparedCall | None = None,
    ) -> StatementAttempts:
        """The attempts of one statement (counted as started). ``statement``: its ``write``
        and ``retry_after_send`` are decided from it when a failure asks."""
        self._stats.count_statement()  # self._started(), inlined: this runs for every statement
        if self._prober is not None:
            self._prober.ensure_started()
        balancer = (view or self._view).balancer
        return StatementAttempts(
            balancer, order, operation=operation, retry_after_send=retry_after_send, write=write, statement=statement,
            budget=self._budget,
        )

    def _ping_url(self, index: int) -> str:
        return ping_url(self.config.replicas[index].address, self.config.client_options)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._balancer.settings.load_balancing.value} over "
            f"{', '.join(self._balancer.addresses)}{' (closed)' if self._closed else ''}>"
        )

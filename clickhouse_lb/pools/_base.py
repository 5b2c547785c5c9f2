"""What the sync and async pools share: everything but the ``await``.

Configuration, status, plan, recording errors and listeners (:class:`PoolBase`); how each
replica's client is created once and how a failed creation is shared with the callers that
waited for it (:class:`ClientSlot`); the options every client gets; preparing a statement and
its attempts; the pinned session's forwarding and failure handling (:class:`PinnedBase`).
No I/O and no client class here, so neither pool's transport leaks into the other (the async
one imports aiohttp, the sync one must not).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

from clickhouse_connect.driver.exceptions import ProgrammingError

from clickhouse_lb.config.attempt_settings import NO_STATEMENT_SETTINGS
from clickhouse_lb.config.discovery import DiscoveryError
from clickhouse_lb.config.lag import statement_lag_settings
from clickhouse_lb.config.pool_config import PoolConfig
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BalancingSettings, split_statement_settings
from clickhouse_lb.config.timeouts import client_timeout_arguments
from clickhouse_lb.core._statements import PreparedCall, prepare_call
from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.balancer import Balancer, ReplicaStatus, new_replica_set_state
from clickhouse_lb.core.classify import classify
from clickhouse_lb.core.discovery import InFlight, ReplicaSetChange, diff_replicas
from clickhouse_lb.core.events import Listener, ListenerSet, check_listeners, logger
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.core.health import HealthMonitor, probe_statuses_off
from clickhouse_lb.core.hedging import LatencyWindow
from clickhouse_lb.core.lag import order_by_freshness
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.core.shared_state import SharedReplicaSet, acquire_state
from clickhouse_lb.core.stats import PoolStats, StatsSnapshot
from clickhouse_lb.errors import ReplicaConnectError, SessionLostError
from clickhouse_lb.pools._client_members import ClientChanges, ClientMembers, unknown_attribute_message
from clickhouse_lb.pools._private_members import PrivateMembers
from clickhouse_lb.pools._session_mode import SESSION_OPTIONS, pool_session_id, pooled_client_options
from clickhouse_lb.probes._discovery_query import ClusterReader

__all__ = [
    "ClientSlot",
    "PinnedBase",
    "PoolBase",
    "ReplicaSetView",
    "client_options_for",
    "connect_failure",
    "kill_query_sql",
]


def kill_query_sql(query_id: str) -> str:
    """``KILL QUERY`` for one query id (best effort; ASYNC: the pool does not wait for it)."""
    quoted = query_id.replace("\\", "\\\\").replace("'", "\\'")
    return f"KILL QUERY WHERE query_id = '{quoted}' ASYNC"

C = TypeVar("C")


def client_options_for(config: PoolConfig, *, whole_seconds: bool) -> dict[str, Any]:
    """Options given to every replica's client: the user's, plus the pool's defaults and
    timeouts. ``whole_seconds``: the client takes its timeouts in whole seconds (the sync one,
    at construction; the pool sets the exact values on its transport afterwards, see
    :func:`clickhouse_lb.pools._transport.set_client_timeouts`); the async one takes floats."""
    # The session options are decided per client (clickhouse_lb.pools._session_mode).
    options = {k: v for k, v in config.client_options.items() if k not in SESSION_OPTIONS}
    # Failover is the pool's job: the client's own retries would only delay it on one replica.
    options.setdefault("query_retries", 0)
    timeouts = config.attempts.timeouts
    if whole_seconds:
        options.update(client_timeout_arguments(timeouts))
    else:
        options.update(connect_timeout=timeouts.connect, send_receive_timeout=timeouts.socket)
    return options


def connect_failure(address: str, exc: Exception) -> ReplicaConnectError | None:
    """A client creation that failed on a replica failure, as the error attempts share."""
    failure = classify(exc)
    if not failure.replica:
        return None
    error = ReplicaConnectError(address, failure.reason, failure.kind)
    error.__cause__ = exc
    return error


def discovered_config(config: PoolConfig) -> PoolConfig:
    """The configuration over the replicas of ``config.discovery.cluster``, read from the
    seeds (``config.replicas``). Its balancing state is the pool's own: the shared-state key
    is the ordered replica set, which a discovered pool changes at run time."""
    reader = discovery_reader(config)
    try:
        replicas = reader.replicas(config.replicas)
    finally:
        reader.close()
    return dataclasses.replace(config, replicas=replicas, seeds=tuple(config.replicas), share_state=False)


def discovery_reader(config: PoolConfig) -> ClusterReader:
    return ClusterReader(
        config.client_options, config.discovery,
        connect_timeout=config.settings.connect_timeout_with_failover_ms / 1000.0,
    )


def pin_options(session: bool) -> dict[str, Any]:
    """The client options of a pinned client: its own ClickHouse session, or none."""
    return {"session_id": str(uuid.uuid4())} if session else {"autogenerate_session_id": False}


class ClientSlot(Generic[C]):
    """A replica's shared client, created on first use, and the outcome of the last creation.
    The lock (a thread's or a task's) is the driver's; the bookkeeping is here."""

    __slots__ = ("client", "creations", "failure", "retired")

    def __init__(self) -> None:
        self.client: C | None = None
        self.failure: ReplicaConnectError | None = None
        self.creations = 0
        #: The replica left the discovered set: no new client is created here.
        self.retired = False

    def raise_if_retired(self, address: str) -> None:
        """A statement that started before discovery removed the replica, and fails over to it
        after its client was closed: a connect failure, so it moves on to the next replica."""
        if self.retired:
            raise ReplicaConnectError(address, "removed from the cluster by discovery")

    def raise_shared_failure(self, seen: int) -> None:
        """Another caller's creation failed while this one waited for the lock: share its
        outcome rather than wait out the same timeout again."""
        if self.creations != seen and self.failure is not None:
            raise self.failure

    @contextmanager
    def creating(self, address: str) -> Iterator[None]:
        """Around one creation: a replica failure becomes the ReplicaConnectError the waiters
        share; the count moves when it ends, so that they know it did."""
        self.failure = None
        try:
            yield
        except Exception as exc:
            self.failure = connect_failure(address, exc)
            if self.failure is None:
                raise
            raise self.failure from exc
        finally:
            self.creations += 1


def _detach(listeners: ListenerSet, own: tuple[Listener, ...]) -> None:
    """Take a pool's own listeners off its balancer (which may outlive it: the async SQLAlchemy
    dialect shares one balancer between the pools of successive event loops)."""
    for listener in own:
        listeners.remove(listener)


class _Prober(Protocol):
    """The pool's probe worker (a thread for the sync pool, a task for the async one)."""

    def ensure_started(self) -> None: ...

    def stop(self) -> None: ...

    def retarget(self, monitor: HealthMonitor, addresses: tuple[str, ...]) -> None: ...


class ReplicaSetView(NamedTuple):
    """A pool's replica set with everything indexed by position in it: the balancer (and its
    counts), the probe schedule, the clients' slots. Replaced whole when discovery changes the
    set; a statement keeps the view it started with, so positions never mix across sets."""

    balancer: Balancer
    health: HealthMonitor | None
    slots: tuple[Any, ...]


class PoolBase(PrivateMembers, ClientMembers):
    """The balancing side of a pool; subclasses add the clients and the statements. The
    Client members that are not statements (``database``, ``server_version``, ...) come from
    :class:`~clickhouse_lb.pools._client_members.ClientMembers`."""

    #: The health-probe worker, set by the driver when probing is on.
    _prober: _Prober | None = None

    #: Position of ``settings`` in each statement method of the pool's client class.
    _settings_position: ClassVar[Mapping[str, int | None]] = {}

    def __init__(
        self,
        config: PoolConfig,
        *,
        listeners: Iterable[Listener] = (),
        balancer: Balancer | None = None,
    ) -> None:
        if config.discovery.enabled and not config.seeds:
            config = discovered_config(config)
        self.config = config
        listeners = check_listeners(listeners)
        # -- shared balancing state (clickhouse_lb.core.shared_state) --------------------------------
        # A pool given no balancer shares its counts with the other pools and engines of the
        # process over the same replica set (unless share_state=False); the hold is given back
        # on close() or when the balancer is garbage-collected.
        self._release_state: Callable[[], object] | None = None
        #: What this pool shares with the others over its replica set (None: nothing).
        self._shared: SharedReplicaSet | None = None
        if balancer is None:
            size, settings = len(config.replicas), config.settings
            lease = acquire_state(config, lambda: new_replica_set_state(size, settings)) if config.share_state else None
            balancer = Balancer(
                config.replicas, settings, listeners=listeners, state=lease.value.state if lease is not None else None
            )
            if lease is not None:
                self._shared = lease.value
                self._release_state = lease.release_with(balancer)
        # -------------------------------------------------------------------------------------
        self._closed = False
        #: Recent read latencies: the adaptive hedge delay (receive_data_timeout_ms="auto").
        self._latencies = LatencyWindow()
        self._hedges = 0
        self._hedges_lock = threading.Lock()
        self._stats = PoolStats()
        balancer.listeners.add(self._stats)
        #: Limits the requests the pool sends on its own (shared with the pools sharing its state).
        self._budget = RetryBudget.of_pool(config.retry_budget, self._shared)
        #: The health monitor decides the background probes (None when
        #: health_check_interval_ms=0); the pools add the worker that sends them, and the slots.
        self._view = ReplicaSetView(
            balancer, HealthMonitor(balancer, config.health) if config.health.enabled else None, ()
        )
        #: Statements running per view: the clients of replicas that discovery removed are
        #: closed once the last statement that may use them is done.
        self._in_flight: InFlight[ReplicaSetView] = InFlight()
        #: Only discovery replaces the view: without it, statements need not be counted in flight.
        self._track_views = config.discovery.enabled
        self._discovery_lock = threading.Lock()
        own: tuple[Listener, ...] = (self._stats,)
        #: Called by close(), or when the pool is garbage-collected unclosed.
        self._detach_listeners = weakref.finalize(self, _detach, self._balancer.listeners, own)
        # What the user changed on the pool's clients (replayed on every client made later),
        # and which replica's client the server facts are read from.
        self._changes = ClientChanges()
        self._reference = None
        #: ``session_id=``: every statement in that one session (clickhouse_lb.pools._session_mode).
        self._session_id = pool_session_id(config.client_options)
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
        return self._balancer

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

    # -- discovery -------------------------------------------------------------------------

    def _new_slot(self) -> ClientSlot[Any]:
        raise NotImplementedError

    @contextmanager
    def _view_in_use(self, view: ReplicaSetView) -> Iterator[None]:
        """Count a statement or ping on ``view`` in flight while it runs (only under discovery,
        the one thing that replaces a view; the statement path tests ``_track_views`` itself)."""
        if not self._track_views:
            yield
            return
        self._in_flight.acquire(view)
        try:
            yield
        finally:
            self._in_flight.release(view)

    def _close_retired(self, slots: list[ClientSlot[Any]]) -> None:
        """Close the clients of replicas that left the set (their statements are done)."""
        raise NotImplementedError

    def _discovery_seeds(self) -> list[Replica]:
        """Who to ask: the seeds, then the replicas discovered last time (so the pool still
        refreshes when every seed is gone but the cluster lives on)."""
        seeds = list(self.config.seeds)
        known = {seed.address.lower() for seed in seeds}
        return seeds + [r for r in self._view.balancer.replicas if r.address.lower() not in known]

    def _read_cluster(self) -> list[Replica] | None:
        """The cluster's replicas now (blocking I/O), or None when no one answered: the set
        is kept as it is, and the next refresh tries again."""
        reader = discovery_reader(self.config)
        try:
            return reader.replicas(self._discovery_seeds())
        except DiscoveryError as exc:
            logger.warning("discovery of cluster %r failed; keeping the current replicas: %s",
                           self.config.discovery.cluster, exc)
            return None
        finally:
            reader.close()

    def _apply_discovered(self, replicas: list[Replica]) -> ReplicaSetChange | None:
        """Replace the view when the discovered set differs from the current one: kept replicas
        keep their counts, probe state and client; added ones start clean; removed ones' clients
        are closed once the statements running on the old view are done."""
        with self._discovery_lock:
            if self._closed:
                return None
            old = self._view
            change = diff_replicas(old.balancer.replicas, replicas)
            if change.unchanged:
                return None
            size = len(change.replicas)
            balancer = Balancer(
                change.replicas, old.balancer.settings, state=old.balancer.state.carried_over(change.kept, size)
            )
            balancer.listeners = old.balancer.listeners
            health = None
            if old.health is not None:
                health = HealthMonitor(balancer, old.health.settings)
                health.schedule.carry_over(old.health.schedule, change.kept)
            slots: list[Any] = [None] * size
            for before, after in change.kept.items():
                slots[after] = old.slots[before]
            for index in change.added:
                slots[index] = self._new_slot()
            self._view = ReplicaSetView(balancer, health, tuple(slots))
            self.config = dataclasses.replace(self.config, replicas=list(change.replicas))
            if self._prober is not None and health is not None:
                self._prober.retarget(health, balancer.addresses)
        removed = [old.slots[i] for i in change.removed]
        logger.info(
            "cluster %r: replicas now %s (added %s, removed %s)", self.config.discovery.cluster,
            ", ".join(balancer.addresses), [balancer.addresses[i] for i in change.added] or "none",
            [old.balancer.addresses[i] for i in change.removed] or "none",
        )
        for slot in removed:
            slot.retired = True
        self._in_flight.retire(old, lambda: self._close_retired(removed))
        return change

    def _statement_plan(self, attempts: StatementAttempts, call: PreparedCall) -> StatementPlan:
        """How the statement's attempts wait (timeouts, liveness checks, deadline, hedging)."""
        balancer = self._view.balancer
        own = call.attempt_settings
        return StatementPlan(
            settings=self.config.attempts if own is NO_STATEMENT_SETTINGS else own.apply(self.config.attempts),
            deadline=attempts.deadline,
            addresses=balancer.addresses,
            statement=call,
            window=self._latencies,
            # A run that failed while the other of a hedged race went on uses up its place in
            # the schedule, as a failed attempt does.
            count_failure=attempts.run_failed,
            count_slowdown=balancer.record_slowdown,
            hedge_candidate=attempts.hedge_candidate,
            count_hedge=self._count_hedge,
            query_id=call.query_id,
            budget=self._budget,
        )

    def _ping_url(self, index: int) -> str:
        return f"{'https' if self.config.secure else 'http'}://{self.config.replicas[index].address}/ping"

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self._balancer.settings.load_balancing.value} over "
            f"{', '.join(self._balancer.addresses)}{' (closed)' if self._closed else ''}>"
        )


class PinnedBase(Generic[C]):
    """A client pinned to one replica of a pool: statements run there only. A replica failure
    counts an error against it (as in the pool) and becomes a SessionLostError; query failures
    pass through unchanged. Everything that is not a statement is the client's own."""

    _settings_position: ClassVar[Mapping[str, int | None]] = {}

    def __init__(self, pool: PoolBase, index: int, client: C, balancer: Balancer | None = None) -> None:
        # ``balancer``: the one of the view the session was pinned from (discovery may have
        # replaced the pool's since).
        self._balancer = balancer or pool.balancer
        self._index = index
        self.client = client
        self.address = self._balancer.addresses[index]
        get_setting = getattr(client, "get_client_setting", None)
        self.session_id: str | None = get_setting("session_id") if get_setting is not None else None

    def _prepare(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PreparedCall:
        return prepare_call(method, args, kwargs, self._settings_position.get(method), auto_token=False)

    def _lost(self, exc: Exception, write: bool = True) -> SessionLostError | None:
        """The error for a failed statement: None for a query failure (raise it unchanged)."""
        failure = self._balancer.count_failure(self._index, exc)
        if not failure.replica:
            return None
        return SessionLostError(self.address, failure.reason, may_have_been_applied=failure.sent and write)

    def __getattr__(self, name: str) -> Any:
        # Everything that is not a statement (server_tz, create_query_context, ...) is the
        # pinned client's own: there is only one replica to ask.
        if name.startswith("__") or name == "client":
            raise AttributeError(name)
        return getattr(self.client, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The client's members are the client's own too (session.database = "x" changes it);
        # anything else would be read by nothing.
        if name.startswith("_") or name in ("client", "address", "session_id") or hasattr(type(self), name):
            object.__setattr__(self, name, value)
        elif hasattr(self.client, name):
            setattr(self.client, name, value)
        else:
            raise AttributeError(unknown_attribute_message(type(self).__name__, name, dir(self.client)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} on {self.address}>"

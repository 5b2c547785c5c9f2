"""ReplicaPool: one Client-like object over N replicas, balanced per statement.

For every statement the pool asks the :class:`~clickhouse_lb.core.balancer.Balancer` in which
order ClickHouse would try the replicas right now, runs the call on the first through a
clickhouse-connect client of that replica, and fails over (see :mod:`clickhouse_lb.core.failover`).
Everything but the blocking calls is shared with the async pool (:mod:`clickhouse_lb.pools._base`).

Each replica's clickhouse-connect client is created on first use (creating one talks to the
server); ``get_pool`` creates one at once, in plan order, to check credentials and database as
``get_client`` does, so a pool over partly-down replicas constructs fine and a replica that is
down at first use is just a failed attempt. Pooled clients carry no session id, so one client serves
many threads; state that must stay on one server goes through :meth:`ReplicaPool.session`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, cast

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.query import QueryResult

from clickhouse_lb.config.pool_config import sync_client_option_names
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import NO_OVERRIDES, StatementOverrides
from clickhouse_lb.core._statements import settings_positions
from clickhouse_lb.core.failover import run_sync, sync_policy
from clickhouse_lb.core.shared_state import SharedReplicaSet
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.pools._base import ClientSlot, ReplicaSetView, client_options_for, kill_query_sql
from clickhouse_lb.pools._client_api import STATEMENT_METHODS, SyncClientAPI, statement
from clickhouse_lb.pools._drive_sync import SyncDriver
from clickhouse_lb.pools._factory_arguments import factory_arguments, pool_factory
from clickhouse_lb.pools._leftovers import settled
from clickhouse_lb.pools._liveness import SyncLiveness
from clickhouse_lb.pools._pinned import PinnedSteps
from clickhouse_lb.pools._pool_steps import PoolSteps
from clickhouse_lb.pools._read_your_writes import ReadYourWritesMember
from clickhouse_lb.pools._steps import close_quietly, drive
from clickhouse_lb.pools._transport import (
    current_attempt,
    quiet_transport,
    release_pool_manager,
    set_client_timeouts,
    tracking_pool_manager,
)
from clickhouse_lb.pools._watchdog import Watchdog
from clickhouse_lb.probes._shared import Forwarder, SharedProbes
from clickhouse_lb.probes.workers import ProbeWorker

__all__ = ["PinnedSession", "ReplicaPool", "get_pool"]

ClientFactory = Callable[..., Client]

_SETTINGS_POSITION = settings_positions(Client, list(STATEMENT_METHODS))


class _Slot(ClientSlot[Client]):
    __slots__ = ("lock",)

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def take(self) -> Client | None:
        """The client, taken out (after a creation in progress has placed it)."""
        with self.lock:
            client, self.client = self.client, None
        return client


class PinnedSession(SyncClientAPI, PinnedSteps[Client]):
    """A client pinned to one replica of a pool (``pool.session()``).

    Statements run on that replica only. A replica failure counts an error against it (as in
    the pool) and raises :class:`~clickhouse_lb.errors.SessionLostError`; query failures pass
    through unchanged.
    """

    _settings_position = _SETTINGS_POSITION

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return drive(self._call_steps(method, args, kwargs))

    def ping(self, timeout: float | None = None) -> bool:
        return drive(self._ping_steps(timeout))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> PinnedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplicaPool(ReadYourWritesMember, SyncClientAPI, PoolSteps):
    """A Client-like pool over ClickHouse replicas with ClickHouse's load balancing and failover.

    Create it with :func:`get_pool`. Statements (``query``, ``command``, ``insert``, ``query_df``,
    ``query_arrow``, ``raw_query``, the streaming variants ...) take clickhouse-connect's
    arguments and return its types. Thread-safe.
    """

    _settings_position = _SETTINGS_POSITION
    _pinned_class = PinnedSession
    _lock_class = threading.Lock

    _prober: ProbeWorker | None

    def _set_up(self, client_factory: ClientFactory | None) -> None:
        self._factory: ClientFactory = client_factory or clickhouse_connect.get_client
        self._drive, self._run_attempts = drive, run_sync
        self._options = client_options_for(self.config, whole_seconds=True)
        # Connections an abandoned attempt can be cut off on (where the pool can build the
        # transport clickhouse-connect would; see clickhouse_lb.pools._transport). Not for a client
        # factory of the caller's own: its clients may not take a pool manager.
        self._manager = tracking_pool_manager(self._options, owner=self) if client_factory is None else None
        if self._manager is not None:
            self._options["pool_mgr"] = self._manager
        self._policy, self._driver, self._liveness = sync_policy(), SyncDriver(), SyncLiveness(self._options)
        # Attempts that are not hedged run on the caller's thread under a watchdog where their
        # connections can be shut down from outside (or the clients are the caller's own: a
        # test's fakes); otherwise on the driver's worker threads, which the statement can
        # leave behind.
        watched = self._manager is not None or client_factory is not None
        self._watchdog = Watchdog(self._replica_alive, self._kill_query) if watched else None
        if self._health is not None and self._shared is not None:
            self._share_probes(self._shared)
        else:
            self._prober = self._own_prober(ProbeWorker)

    def _share_probes(self, shared: SharedReplicaSet) -> None:
        """Use the one worker of the shared replica set (made by the first pool over it, with
        its health settings), and receive its events while this pool is open."""
        config, state = self.config, self._balancer.state
        probes = shared.probes(
            config.health,
            lambda: SharedProbes(config.replicas, config.settings, config.health, state, self._options),
        )
        self._view = self._view._replace(health=probes.monitor)
        self._prober = probes.worker
        self._prober_shared = True
        forwarder = Forwarder(self._balancer.listeners)
        probes.listeners.add(forwarder)
        self._detach_forwarder = weakref.finalize(self, probes.listeners.discard, forwarder)

    # -- the I/O of the shared bodies (clickhouse_lb.pools._pool_steps) ----------------------

    def _plan(self, overrides: StatementOverrides = NO_OVERRIDES, view: ReplicaSetView | None = None) -> list[int]:
        return (view or self._view).balancer.plan_indices(overrides)

    def _new_client(self, index: int, view: ReplicaSetView | None = None, **extra: Any) -> Client:
        return cast(Client, drive(self._new_client_steps(index, view, extra)))

    def _client(self, index: int, view: ReplicaSetView | None = None) -> Client:
        view = view or self._view
        client: Client | None = view.slots[index].client
        return client if client is not None else cast(Client, drive(self._client_steps(index, view)))

    def _configured(self, client: Any) -> None:
        set_client_timeouts(client, self.config.attempts.timeouts)

    def _creation_abandoned(self) -> bool:
        attempt = current_attempt()
        return attempt is not None and attempt.abandoned

    def _close_all(self, clients: list[Any]) -> None:
        for client in clients:
            drive(close_quietly(client))

    def _close_transport(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
        if self._manager is not None:
            release_pool_manager(self._manager)
        self._liveness.close()

    # -- clients ---------------------------------------------------------------------------

    def client(self, address: str | Replica) -> Client:
        """The shared clickhouse-connect client of one replica (no balancing, no failover)."""
        return self._client(self._balancer.index_of(address))

    def connect(self) -> ReplicaPool:
        """Make sure some replica answers with the pool's credentials and database, as
        ``clickhouse_connect.get_client`` does at creation: replicas are tried in plan order
        (failing over like a read) until one's client is created. Raises what that creation
        raises (an authentication or unknown-database error unchanged, as ``get_client`` would),
        or :class:`~clickhouse_lb.errors.AllReplicasUnavailableError` with every replica's
        reason. Does nothing once a replica has answered. ``get_pool`` calls it unless
        ``connect_on_create=False``."""
        return drive(self._connect_steps())

    def _reference_client(self) -> Client:
        client = self._reference_or_none()
        if client is None:
            self.connect()
            client = self._reference_or_none()
        assert client is not None
        return cast(Client, client)

    # -- statements ------------------------------------------------------------------------

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._in_session is not None:  # session_id=: one replica, one ClickHouse session
            return self._in_session.call(method, args, kwargs)
        if self._closed:
            raise self._closed_error()
        view = self._view
        call, attempts, ryw = self._begin(method, args, kwargs, view)

        def run(index: int, query_id: str | None) -> Any:
            client = view.slots[index].client or self._client(index, view)  # made already (the usual case), else now
            if query_id is None:
                result = getattr(client, method)(*call.args, **call.kwargs)
            else:
                args, kwargs = call.with_query_id(query_id)
                result = getattr(client, method)(*args, **kwargs)
            return settled(result) if isinstance(result, QueryResult) else result  # (no call for a command's)

        watchdog = self._watchdog
        # Not hedged (hedging off, or a write): on this thread under the watchdog, with no plan
        # built unless the attempt outlives its first wake-up (StatementAttempts.plan).
        if watchdog is not None and not (attempts.settings.hedging.enabled and not call.write):
            attempt: Callable[[int], Any] = partial(watchdog.run_at, attempts, run)  # (a C call: no frame of its own)
        else:
            def attempt(index: int) -> Any:
                outcome = self._driver.run_planned(attempts.plan, index, run, self._replica_alive, self._kill_query)
                return self._raced(attempts, index, outcome)

        if ryw is not None:
            attempt = ryw.guard_sync(attempt, attempts, partial(self._catch_up, view))
        if not self._track_views:
            return run_sync(attempts, attempt, self._policy)
        with self._view_in_use(view):
            return run_sync(attempts, attempt, self._policy)

    def _replica_alive(self, index: int, timeout: float) -> bool | PingReading:
        """A liveness check: ``/ping`` on a separate connection, within ``timeout`` seconds."""
        if self._manager is not None:
            return self._liveness.ping(self._ping_url(index), self.config.replicas[index].address, timeout)
        client = self._clients[index].client
        if client is None:
            return True  # nothing to ask it with: leave the attempt to its timeouts
        try:
            return bool(client.ping(timeout))
        except Exception:
            return False

    def _kill_query(self, index: int, query_id: str) -> None:
        with quiet_transport():
            self._client(index).command(kill_query_sql(query_id))

    def _call_read(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return drive(self._read_steps(method, args, kwargs))

    create_insert_context = statement(Client.create_insert_context, "_call_read")

    def close_connections(self) -> None:
        """Close the idle HTTP connections of every replica's client; the pool stays usable."""
        for client in self._existing_clients():
            client.close_connections()

    def ping(self, timeout: float | None = None) -> bool:
        """True when some replica answers ``/ping`` (tried in plan order); each replica that
        does not answer gets an error counted, as a failed attempt would."""
        return drive(self._ping_steps(timeout))

    # -- sessions --------------------------------------------------------------------------

    def pin(self, *, session: bool = True) -> PinnedSession:
        """A client pinned to one replica chosen by the strategy (trying the next ones, in plan
        order, while a replica cannot be reached). ``session``: give it a ClickHouse session id
        (temporary tables, SET). Close it when done; :meth:`session` does that for you."""
        return cast(PinnedSession, drive(self._pin_steps(session)))

    @contextmanager
    def session(self) -> Iterator[PinnedSession]:
        """``with pool.session() as client:`` runs every statement of the block on one replica,
        in one ClickHouse session (temporary tables, SET, USE). If that replica fails inside
        the block, :class:`~clickhouse_lb.errors.SessionLostError` is raised: the session is
        never moved silently to another replica without its state."""
        pinned = self.pin(session=True)
        try:
            yield pinned
        finally:
            pinned.close()

    # -- discovery, lifecycle --------------------------------------------------------------

    def _new_slot(self) -> _Slot:
        return _Slot()

    def _close_retired(self, slots: list[ClientSlot[Any]]) -> None:
        self._close_all(self._taken(slots))

    def close(self) -> None:
        """Close every replica client and stop this pool's probes (a worker shared with other pools
        runs on while their shared state is kept: docs/health.md). Statements after this raise
        ProgrammingError."""
        drive(self._close_steps())

    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pool_factory
def get_pool(hosts: Any = None, **arguments: Any) -> ReplicaPool:
    """A :class:`ReplicaPool` over ``hosts`` (``["ch-1:8123", ...]``, ``"ch-1:8123,ch-2:8123"``,
    :class:`~clickhouse_lb.Replica` objects) or a ``dsn``
    (``clickhouse://user:pw@ch-1:8123,ch-2:8123/db?load_balancing=in_order``).

    Balancing settings keep ClickHouse's names and defaults: ``load_balancing="random"``,
    ``load_balancing_first_offset=0``, ``distributed_replica_error_half_life=60`` (seconds),
    ``distributed_replica_error_cap=1000``, ``distributed_replica_max_ignored_errors=0``,
    ``connections_with_failover_max_tries=3``, ``connect_timeout_with_failover_ms=1000``;
    ``local_hostname`` defaults to this machine's canonical name. Ours: ``failover_backoff_ms=0``
    (pause before each new pass), ``failover_timeout=None`` (total seconds per statement),
    ``auto_insert_deduplication_token=True``, ``least_loaded_decay_time=10`` (seconds: the time
    constant of the latency average of ``load_balancing="least_loaded"``, our extension beyond
    ClickHouse's eight strategies). Background health probes (``GET /ping``):
    ``health_check_interval_ms=1000`` (0 turns them off), ``health_check_fast_interval_ms=200``,
    ``health_check_timeout_ms=500``, ``health_check_rise=2``, ``health_check_fall=1``. Replica
    lag, as the server: ``max_replica_delay_for_distributed_queries=300`` (seconds; 0: not
    checked), ``fallback_to_stale_replicas_for_distributed_queries=True``. A value left as
    ``None`` comes from the DSN, or is the default.

    Discovery: ``cluster="lb_cluster"`` makes ``hosts`` the seeds: the pool reads the
    cluster's replicas from ``system.clusters`` on the first seed that answers (optionally one
    ``shard=N``; ``cluster_http_port``: the HTTP port of every replica, else 9000 -> 8123,
    9440 -> 8443, any other port as listed) and re-reads them every
    ``cluster_discovery_interval_ms=30000`` (0: once) through the health worker (see
    :mod:`clickhouse_lb.core.discovery`). A discovered pool keeps its balancing state to itself.

    ``read_your_writes=1`` (off by default): a read that follows a write of the same thread or task
    goes to a replica known to have it, for ``read_your_writes_window_ms=5000``; when that replica
    fails, another is first made to catch up, waiting at most ``read_your_writes_timeout_ms=5000``
    (see docs/read-your-writes.md; also per statement, and ``with pool.read_your_writes():``).

    ``share_state=True`` (the default; ``share_state=0`` in a DSN): the error counts, decay
    clock and round-robin counter are shared with every other pool and engine of the process
    over the same replicas, settings, user and database (see :mod:`clickhouse_lb.core.shared_state`),
    so pools built per request still balance. ``False``: this pool keeps its own.

    Hung and slow replicas (see :mod:`clickhouse_lb.config.attempt_settings`): ``failover_timeout``
    is a real deadline; ``send_receive_timeout``, ``receive_timeout`` and ``send_timeout`` take
    fractional seconds; liveness-checked waits (``liveness_check_after_ms=100``,
    ``liveness_ping_timeout_ms=150``, ``liveness_check_interval_ms=1000``) abandon an attempt on
    a replica that stopped answering ``/ping``; ``use_hedged_requests=0`` and
    ``receive_data_timeout_ms="auto"`` for hedged reads.

    Every other keyword (``username``, ``password``, ``database``, ``secure``, ``compress``,
    ``send_receive_timeout``, ``settings``, ...) goes to each replica's
    ``clickhouse_connect.get_client`` (``user=``, ``interface=``, ``generic_args=`` and a
    single-host DSN in clickhouse-connect's own form are understood as ``get_client`` does;
    ``host``/``port`` are refused with what to use; ``session_id=`` runs every statement in that
    one session on one replica, see :mod:`clickhouse_lb.pools._session_mode`). Bad names and values raise
    :class:`~clickhouse_lb.errors.ConfigurationError` here, before any I/O.

    ``connect_on_create=True`` (the default), like ``get_client``: the pool then checks that
    some replica answers with these credentials and database (:meth:`ReplicaPool.connect`),
    raising what ``get_client`` would when none does; replicas that are down are skipped.
    ``connect_on_create=False`` builds the pool without any I/O (each replica's client is
    created on first use): for applications that start before the cluster does.
    """
    given = factory_arguments(hosts, arguments)
    config = given.config(sync_client_option_names())
    pool = ReplicaPool(config, listeners=given.listeners)
    if given.connect_on_create:
        try:
            pool.connect()
        except BaseException:
            pool.close()
            raise
    return pool

"""AsyncReplicaPool: the asyncio twin of :class:`~clickhouse_lb.ReplicaPool`.

One AsyncClient-like object over N replicas, balanced per statement with exactly the sync
pool's semantics: the same :class:`~clickhouse_lb.core.balancer.Balancer` (ordering, error
accounting, decay), the same failure classification and the same failover rules, driven by
tenacity's ``AsyncRetrying`` (:func:`clickhouse_lb.core.failover.run_async`).

asyncio specifics:

* Building a pool does no I/O and needs no running loop. Each replica's clickhouse-connect
  ``AsyncClient`` (native aiohttp) is created on first use, under an ``asyncio.Lock`` per
  replica; when creating it fails with a replica failure, the tasks that were waiting for
  that creation fail over at once instead of each waiting out the same timeout in turn.
* Nothing blocks the loop: the only blocking lookup of the balancing core (this machine's
  canonical host name, for the hostname strategies) runs once in a worker thread.
* Cancellation (``task.cancel()``, ``asyncio.timeout``) is not a replica failure: it counts
  nothing and stops the statement where it is; no attempt is left running behind it.
* A pool belongs to the event loop it is first used on (its aiohttp sessions do).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import clickhouse_connect
from clickhouse_connect.driver.asyncclient import AsyncClient
from clickhouse_connect.driver.exceptions import ProgrammingError

from clickhouse_lb.config.pool_config import (
    async_client_option_names,
)
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import NO_OVERRIDES, StatementOverrides
from clickhouse_lb.core._statements import settings_positions
from clickhouse_lb.core.failover import async_policy, run_async
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools._base import (
    ClientSlot,
    ReplicaSetView,
    client_options_for,
    kill_query_sql,
)
from clickhouse_lb.pools._client_api import STATEMENT_METHODS, AsyncClientAPI, async_statement, make_async_methods
from clickhouse_lb.pools._drive_async import AsyncDriver
from clickhouse_lb.pools._factory_arguments import factory_arguments, pool_factory
from clickhouse_lb.pools._liveness import async_reading
from clickhouse_lb.pools._pinned import PinnedSteps
from clickhouse_lb.pools._pool_steps import PoolSteps
from clickhouse_lb.pools._read_your_writes import ReadYourWritesMember
from clickhouse_lb.pools._steps import close_quietly, drive_async
from clickhouse_lb.probes._ping import ping_once
from clickhouse_lb.probes._route import Route
from clickhouse_lb.probes.workers import AsyncProbeWorker

__all__ = ["AsyncPinnedSession", "AsyncReplicaPool", "get_async_pool"]

AsyncClientFactory = Callable[..., Awaitable[AsyncClient]]

#: The first clickhouse-connect whose AsyncClient is native (aiohttp) rather than a sync client
#: in a thread pool; the async pool is built on that client's options and behaviour.
MIN_CLICKHOUSE_CONNECT = (1, 10)


def require_native_async_client(installed: str | None = None) -> None:
    """Refuse, with the fix, a clickhouse-connect too old for the async pool (e.g. the 0.x
    line that Apache Superset pins), instead of failing later in an obscure way."""
    from clickhouse_connect.common import version

    text = installed if installed is not None else version()
    parts = tuple(int(p) for p in text.split(".")[:2] if p.isdigit())
    if parts < MIN_CLICKHOUSE_CONNECT:
        needed = ".".join(map(str, MIN_CLICKHOUSE_CONNECT))
        raise ConfigurationError(
            f"The async pool needs clickhouse-connect >= {needed} (its native async client); "
            f"{text} is installed: install the async extra (pip install '.[async]' in a checkout of "
            "clickhouse-lb, or 'clickhouse-lb[async] @ git+https://github.com/clickhouse-lb/clickhouse-lb')"
        )


_SETTINGS_POSITION = settings_positions(AsyncClient, list(STATEMENT_METHODS))
make_async_methods(AsyncClient)


class _Slot(ClientSlot[AsyncClient]):
    __slots__ = ("_lock",)

    def __init__(self) -> None:
        super().__init__()
        self._lock: asyncio.Lock | None = None

    @property
    def lock(self) -> asyncio.Lock:
        # Made on first use, inside the running loop: a pool may be built outside one.
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def take(self) -> AsyncClient | None:
        """The client, taken out (a creation in progress sees the pool closed, and closes its own)."""
        client, self.client = self.client, None
        return client


class AsyncPinnedSession(AsyncClientAPI, PinnedSteps[AsyncClient]):
    """A client pinned to one replica of an async pool (``pool.session()``): see
    :class:`~clickhouse_lb.pools.pool.PinnedSession`; cancellation passes through unchanged too."""

    _settings_position = _SETTINGS_POSITION

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await drive_async(self._call_steps(method, args, kwargs))

    async def ping(self, timeout: float | None = None) -> bool:
        return await drive_async(self._ping_steps(timeout))

    async def close(self) -> None:
        await drive_async(close_quietly(self.client))

    async def __aenter__(self) -> AsyncPinnedSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReplicaPool(ReadYourWritesMember, AsyncClientAPI, PoolSteps):
    """An AsyncClient-like pool over ClickHouse replicas with ClickHouse's load balancing and
    failover. Create it with :func:`get_async_pool`.

    Statements (``await pool.query(...)``, ``command``, ``insert``, ``query_df``,
    ``query_arrow``, ``raw_query``, the streaming variants ...) take clickhouse-connect's
    ``AsyncClient`` arguments and return its types. Safe under any number of concurrent tasks
    of one event loop.
    """

    _settings_position = _SETTINGS_POSITION
    _pinned_class = AsyncPinnedSession
    _lock_class = asyncio.Lock

    _prober: AsyncProbeWorker | None
    _connect_hint = "create the pool with `pool = await get_async_pool(...)` (or `await pool.connect()`)"

    def _set_up(self, client_factory: AsyncClientFactory | None) -> None:
        self._factory: AsyncClientFactory = client_factory or clickhouse_connect.get_async_client
        #: Liveness pings on sessions of their own (see _replica_alive), where the pool makes
        #: clickhouse-connect's clients and so knows how they reach a replica.
        self._ping_apart = client_factory is None
        self._drive, self._run_attempts = drive_async, run_async
        # The async client takes fractional timeouts natively.
        self._options = client_options_for(self.config, whole_seconds=False)
        self._route: Route | None = None  # the liveness pings' (built at the first: its TLS context once)
        self._policy = async_policy()
        self._driver = AsyncDriver()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hostname_resolved = self.config.settings.local_hostname is not None
        self._closing: set[asyncio.Task[None]] = set()
        self._prober = self._own_prober(AsyncProbeWorker)
        #: Whether ``await pool`` checks that a replica answers (get_async_pool's connect_on_create).
        self._connect_on_await = True

    # -- loop, ordering --------------------------------------------------------------------

    def _check_open(self) -> None:
        super()._check_open()
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise ProgrammingError(
                "This AsyncReplicaPool is used on another event loop than the one it started on; "
                "create one pool per event loop"
            )

    async def _resolve_hostname(self) -> None:
        """Look up this machine's canonical name (a blocking DNS call) off the loop, once."""
        if not self._hostname_resolved:
            await asyncio.to_thread(getattr, self._balancer, "local_hostname")
            self._hostname_resolved = True

    async def _plan(
        self, overrides: StatementOverrides = NO_OVERRIDES, view: ReplicaSetView | None = None
    ) -> list[int]:
        """The replica order for one statement (advances ``round_robin``)."""
        balancer = (view or self._view).balancer
        if (overrides.load_balancing or balancer.settings.load_balancing).uses_hostnames:
            await self._resolve_hostname()
        return balancer.plan_indices(overrides)

    # -- the I/O of the shared bodies (clickhouse_lb.pools._pool_steps) ----------------------

    async def _client(self, index: int, view: ReplicaSetView | None = None) -> AsyncClient:
        view = view or self._view
        client = view.slots[index].client
        return client if client is not None else await drive_async(self._client_steps(index, view))

    async def _close_all(self, clients: list[Any]) -> None:
        await asyncio.gather(*(drive_async(close_quietly(client)) for client in clients))

    def _off_loop(self, function: Callable[[], Any]) -> Callable[[], Any]:
        return partial(asyncio.to_thread, function)

    # -- clients ---------------------------------------------------------------------------

    async def client(self, address: str | Replica) -> AsyncClient:
        """The shared clickhouse-connect AsyncClient of one replica (no balancing, no failover)."""
        self._check_open()
        return await self._client(self._balancer.index_of(address))

    async def connect(self) -> AsyncReplicaPool:
        """Make sure some replica answers with the pool's credentials and database, as
        ``await clickhouse_connect.get_async_client(...)`` does: see :meth:`ReplicaPool.connect
        <clickhouse_lb.pools.pool.ReplicaPool.connect>`. ``pool = await get_async_pool(...)``
        calls it (awaiting the pool is this call)."""
        return await drive_async(self._connect_steps())

    def __await__(self) -> Generator[Any, None, AsyncReplicaPool]:
        # ``pool = await get_async_pool(...)``: the drop-in for ``await get_async_client(...)``.
        return (self.connect() if self._connect_on_await else self._itself()).__await__()

    async def _itself(self) -> AsyncReplicaPool:
        return self

    def _reference_client(self) -> AsyncClient:
        client = self._reference_or_none()
        if client is None:
            raise ProgrammingError(
                "No replica of this AsyncReplicaPool has answered yet, so there is no server to read "
                "this from: create it with `pool = await get_async_pool(...)` (or `await pool.connect()`)"
            )
        return cast(AsyncClient, client)

    # -- statements ------------------------------------------------------------------------

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._in_session is not None:  # session_id=: one replica, one ClickHouse session
            return await self._in_session.call(method, args, kwargs)
        if self._closed:
            raise self._closed_error()
        view = self._view
        call = None
        if not self._hostname_resolved:  # the strategy may order by host names: look first
            call = self._prepare(method, args, kwargs)
            if (call.overrides.load_balancing or view.balancer.settings.load_balancing).uses_hostnames:
                await self._resolve_hostname()
        call, attempts, ryw = self._begin(method, args, kwargs, view, call)
        plan = attempts.plan

        async def run(index: int, query_id: str | None) -> Any:
            args, kwargs = call.with_query_id(query_id)
            client = await self._client(index, view)
            return await getattr(client, method)(*args, **kwargs)

        async def attempt(index: int) -> Any:
            outcome = await self._driver.run_planned(plan, index, run, self._replica_alive, self._kill_query)
            return self._raced(attempts, index, outcome)

        if ryw is not None:
            attempt = ryw.guard_async(attempt, attempts, partial(self._catch_up, view))
        if not self._track_views:
            return await run_async(attempts, attempt, self._policy)
        with self._view_in_use(view):
            return await run_async(attempts, attempt, self._policy)

    async def _replica_alive(self, index: int, timeout: float) -> bool | PingReading:
        """A liveness check: ``/ping`` within ``timeout`` seconds (see
        :func:`~clickhouse_lb.pools._liveness.async_reading`), on a session of its own, as the
        sync pool pings on connections of its own: the client's session queues requests beyond
        its per-host limit (``connector_limit_per_host``), and a ping queued behind that many
        running statements took a busy replica for a hung one; a replica without a client is
        asked apart too (its client's creation is what waits). The client's own ``ping`` only for
        a client factory of the caller's."""
        client = self._clients[index].client
        address = self.config.replicas[index].address
        if self._ping_apart or client is None:
            route = self._route = self._route or Route(self._options)
            return await async_reading(partial(ping_once, route, self._ping_url(index)), address, timeout)
        return await async_reading(client.ping, address, timeout)

    async def _kill_query(self, index: int, query_id: str) -> None:
        client = await self._client(index)
        await client.command(kill_query_sql(query_id))

    async def _call_read(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await drive_async(self._read_steps(method, args, kwargs))

    create_insert_context = async_statement(AsyncClient.create_insert_context, "_call_read")

    async def close_connections(self) -> None:
        """Close the idle HTTP connections of every replica's client; the pool stays usable."""
        await asyncio.gather(*(client.close_connections() for client in self._existing_clients()))

    async def ping(self, timeout: float | None = None) -> bool:
        """True when some replica answers ``/ping``: see :meth:`ReplicaPool.ping
        <clickhouse_lb.pools.pool.ReplicaPool.ping>`."""
        return await drive_async(self._ping_steps(timeout))

    # -- sessions --------------------------------------------------------------------------

    async def pin(self, *, session: bool = True) -> AsyncPinnedSession:
        """A client pinned to one replica chosen by the strategy: see :meth:`ReplicaPool.pin
        <clickhouse_lb.pools.pool.ReplicaPool.pin>`."""
        return cast(AsyncPinnedSession, await drive_async(self._pin_steps(session)))

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncPinnedSession]:
        """``async with pool.session() as client:``: every statement of the block on one
        replica, in one ClickHouse session (see :meth:`ReplicaPool.session
        <clickhouse_lb.pools.pool.ReplicaPool.session>`)."""
        pinned = await self.pin(session=True)
        try:
            yield pinned
        finally:
            await pinned.close()

    # -- discovery, lifecycle --------------------------------------------------------------

    def _new_slot(self) -> _Slot:
        return _Slot()

    def _close_retired(self, slots: list[ClientSlot[Any]]) -> None:
        """Runs on the loop (a statement's end, or the refresh): the closing is a task."""
        clients = self._taken(slots)
        if clients:
            task = asyncio.get_running_loop().create_task(self._close_all(clients))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Stop the pool's health probes (an async pool's worker is its own) and close every
        replica client. Statements after this raise ProgrammingError."""
        await drive_async(self._close_steps())

    async def __aenter__(self) -> AsyncReplicaPool:
        await self._resolve_hostname()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@pool_factory
def get_async_pool(hosts: Any = None, **arguments: Any) -> AsyncReplicaPool:
    """An :class:`AsyncReplicaPool`: the same arguments as :func:`clickhouse_lb.get_pool`
    (hosts or a DSN, ClickHouse's balancing settings, ``listeners``), and every other keyword
    goes to each replica's ``clickhouse_connect.get_async_client`` (``username``,
    ``password``, ``database``, ``send_receive_timeout``, ``connector_limit_per_host``, ...).

    A plain function: building the pool does no I/O (clients connect on first use), so it may
    be called outside a running loop; with ``cluster=`` (discovery) it reads
    ``system.clusters`` from a seed once, synchronously, before returning. Bad names and values raise
    :class:`~clickhouse_lb.errors.ConfigurationError` here. Awaiting the pool,
    ``pool = await get_async_pool(...)`` (the drop-in for ``await get_async_client(...)``),
    also checks that some replica answers, as ``get_async_client`` does
    (:meth:`AsyncReplicaPool.connect`), unless ``connect_on_create=False``.

    >>> pool = get_async_pool(["ch-1:8123", "ch-2:8123"], load_balancing="in_order")
    >>> pool.plan()
    ['ch-1:8123', 'ch-2:8123']
    """
    require_native_async_client()
    given = factory_arguments(hosts, arguments)
    config = given.config(async_client_option_names())
    pool = AsyncReplicaPool(config, listeners=given.listeners)
    pool._connect_on_await = given.connect_on_create
    return pool

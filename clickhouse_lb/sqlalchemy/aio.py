"""``clickhousedb+lb_async``: clickhouse-connect's asyncio SQLAlchemy dialect with load balancing.

The asyncio twin of ``clickhousedb+lb`` (:mod:`clickhouse_lb.sqlalchemy.dialect`), for
``create_async_engine``::

    from sqlalchemy.ext.asyncio import create_async_engine
    engine = create_async_engine("clickhousedb+lb_async://user:pw@ch-1,ch-2,ch-3:8123/db?load_balancing=in_order")

Everything SQL (types, compiler, DDL, reflection) and the asyncio plumbing (greenlet adaptation,
execute mutex, its connection pool) is clickhouse-connect's own
:class:`~clickhouse_connect.cc_sqlalchemy.asyncio.ClickHouseAsyncDialect` (``clickhousedb+async``);
this subclass changes only where connections come from, as the sync dialect does:

- one balancing state (one :class:`~clickhouse_lb.AsyncReplicaPool`'s balancer) per engine, so
  the error counts are shared by all of the engine's connections; the state itself is the
  process-wide one of its replica set (:mod:`clickhouse_lb.core.shared_state`), shared with the sync
  dialect's engines and the pools over it;
- each DB-API connection wraps an :class:`~clickhouse_lb.AsyncPinnedSession`, pinned by
  :meth:`AsyncReplicaPool.pin() <clickhouse_lb.AsyncReplicaPool.pin>` to the replica the
  strategy picks when the connection is created; it is handed to clickhouse-connect's DB-API
  through its ``async_creator_fn`` hook, in place of a plain ``AsyncClient``;
- a replica failure on a connection is a disconnect (:meth:`ClickHouseLBAsyncDialect.is_disconnect`).

The URL is read by the sync dialect's :func:`~clickhouse_lb.sqlalchemy.url.engine_args_from_url`
(same forms, same parameters, same errors); only the client options differ, because the async
client takes a few of its own (``connector_limit``, ``connector_limit_per_host``,
``keepalive_timeout``) and not the sync one's ``pool_mgr``.

Requires clickhouse-connect's async dialect: SQLAlchemy >= 2.0.44 and ``greenlet``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, cast

from clickhouse_connect.common import get_setting

from clickhouse_lb.config.pool_config import async_client_option_names, sync_client_option_names
from clickhouse_lb.sqlalchemy._shared import ENGINE_ARGS, is_replica_failure
from clickhouse_lb.sqlalchemy._url_form import give_percent_free_url
from clickhouse_lb.sqlalchemy.url import EngineArgs, engine_args_from_url

try:
    from clickhouse_connect.cc_sqlalchemy.asyncio import ClickHouseAsyncDialect

    from clickhouse_lb.pools.aio import AsyncPinnedSession, AsyncReplicaPool
except ImportError as exc:  # greenlet or aiohttp missing, SQLAlchemy too old
    raise ImportError(
        "clickhousedb+lb_async is built on clickhouse-connect's async SQLAlchemy dialect and "
        f"clickhouse_lb's async pool, which cannot be imported here: {exc} (they need SQLAlchemy >= 2.0.44, "
        "greenlet and aiohttp: the sqlalchemy and async extras, pip install '.[sqlalchemy,async]' in a "
        "checkout of clickhouse-lb, or 'clickhouse-lb[sqlalchemy,async] @ git+https://github.com/clickhouse-lb/clickhouse-lb')"
    ) from exc

if TYPE_CHECKING:
    from sqlalchemy.engine import URL
    from sqlalchemy.engine.interfaces import ConnectArgsType, DBAPIConnection, DBAPIModule
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["ClickHouseLBAsyncDialect", "get_async_replica_pool", "pinned_session"]

class ClickHouseLBAsyncDialect(ClickHouseAsyncDialect):
    """The ``clickhousedb+lb_async://`` dialect (see :mod:`clickhouse_lb.sqlalchemy.aio`)."""

    driver = "lb_async"
    # Set on this class too: SQLAlchemy warns about a dialect class that does not say.
    supports_statement_cache = False

    @classmethod
    def import_dbapi(cls) -> DBAPIModule:
        """clickhouse-connect's async DB-API adapter (its exception classes, and the connection
        adapter :meth:`connect` hands each pinned session to). Defined on this class: SQLAlchemy
        looks for ``import_dbapi`` in the dialect class's own namespace and otherwise falls back
        to the inherited legacy ``dbapi()``, which is clickhouse-connect's *sync* DB-API."""
        return ClickHouseAsyncDialect.import_dbapi()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # One balancing state per engine; one AsyncReplicaPool over it per event loop (a pool
        # belongs to the loop it is first used on, and an engine may outlive a loop).
        self._replica_pool: AsyncReplicaPool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._pool_lock = threading.Lock()
        self._session: bool | None = None

    @classmethod
    def engine_created(cls, engine: Any) -> None:
        """The engine's URL in a form without ``%`` (see :mod:`clickhouse_lb.sqlalchemy._url_form`)."""
        give_percent_free_url(engine)

    # -- connecting ------------------------------------------------------------------------

    def create_connect_args(self, url: URL) -> ConnectArgsType:
        """Validate the URL (at ``create_async_engine``, before any I/O): a bad host, port,
        strategy, balancing parameter or client option raises
        :class:`~clickhouse_lb.errors.ConfigurationError`."""
        args = engine_args_from_url(
            url,
            default_session=bool(get_setting("autogenerate_session_id")),
            client_option_names=async_client_option_names(),
            other_client_option_names=sync_client_option_names(),
            scheme="clickhousedb+lb_async",
        )
        return [], {ENGINE_ARGS: args}

    def connect(self, *cargs: Any, **cparams: Any) -> DBAPIConnection:
        """A DB-API connection pinned to the replica the strategy picks now (the next ones in
        plan order while a replica cannot be reached). Runs inside SQLAlchemy's greenlet, on
        the engine's event loop."""
        args: EngineArgs = cparams.pop(ENGINE_ARGS)
        pool = self._pool_for(args, cparams)
        session = self._session
        assert session is not None

        async def pinned() -> AsyncPinnedSession:
            return await pool.pin(session=session)

        # clickhouse-connect's DB-API adapts the awaited client (its execute mutex, cursors,
        # greenlet bridge, terminate); here that client is the pinned session.
        connection = self.loaded_dbapi.connect(async_creator_fn=pinned)
        return cast("DBAPIConnection", connection)

    def _pool_for(self, args: EngineArgs, connect_args: dict[str, Any]) -> AsyncReplicaPool:
        """The engine's pool for the running loop, made on the engine's first connection from
        the URL and ``connect_args`` (SQLAlchemy passes the same ones on every call)."""
        loop = asyncio.get_running_loop()
        with self._pool_lock:
            pool = self._replica_pool
            if pool is not None and self._pool_loop is loop:
                return pool
            if pool is None:
                merged = args.with_connect_args(connect_args)
                self._session = merged.session
                pool = AsyncReplicaPool(merged.config)
            else:
                # Another event loop: a new pool over the same balancer (the same error counts).
                pool = AsyncReplicaPool(pool.config, balancer=pool.balancer)
            self._replica_pool, self._pool_loop = pool, loop
            return pool

    @property
    def replica_pool(self) -> AsyncReplicaPool | None:
        """The engine's :class:`~clickhouse_lb.AsyncReplicaPool` (``plan()``, ``replicas``,
        listeners); ``None`` until the engine's first connection. See :func:`get_async_replica_pool`."""
        return self._replica_pool

    # -- failures --------------------------------------------------------------------------

    def is_disconnect(self, e: Exception, connection: Any, cursor: Any) -> bool:
        """A replica failure means this connection's replica is gone (with its session):
        SQLAlchemy then invalidates the connection instead of returning it to its pool. A
        closed client is one too, as in clickhouse-connect's dialect."""
        if is_replica_failure(e):
            return True
        return bool(super().is_disconnect(cast(Any, e), connection, cursor))


def pinned_session(dbapi_connection: Any) -> AsyncPinnedSession:
    """The :class:`~clickhouse_lb.AsyncPinnedSession` behind a ``clickhousedb+lb_async`` DB-API
    connection (``address``, ``session_id``), e.g. from
    ``(await conn.get_raw_connection()).driver_connection`` or ``conn.connection.dbapi_connection``
    inside ``run_sync``."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    if not isinstance(driver, AsyncPinnedSession):
        raise TypeError(f"{dbapi_connection!r} is not a clickhousedb+lb_async connection")
    return driver


async def get_async_replica_pool(engine: AsyncEngine) -> AsyncReplicaPool:
    """The balancing state behind a ``clickhousedb+lb_async`` engine: ``pool.replicas`` (error
    counts per replica), ``pool.plan()``, ``pool.add_listener(...)``. Opens the engine's first
    connection if none was made yet (or none on this event loop)."""
    dialect = engine.sync_engine.dialect
    if not isinstance(dialect, ClickHouseLBAsyncDialect):
        raise TypeError(f"{engine!r} does not use the clickhousedb+lb_async dialect")
    if dialect.replica_pool is None or dialect._pool_loop is not asyncio.get_running_loop():
        async with engine.connect():
            pass
    pool = dialect.replica_pool
    assert pool is not None
    return pool

"""``clickhousedb+lb``: clickhouse-connect's SQLAlchemy dialect with ClickHouse's load balancing.

Everything SQL (types, compiler, DDL, reflection, Alembic support) is clickhouse-connect's own
:class:`~clickhouse_connect.cc_sqlalchemy.dialect.ClickHouseDialect`; this subclass changes
only where connections come from:

- one :class:`~clickhouse_lb.ReplicaPool` per engine (a dialect instance belongs to one
  engine), so the error counts are shared by all of the engine's connections; its balancing
  state is the process-wide one of its replica set (:mod:`clickhouse_lb.core.shared_state`), shared
  with the other engines and pools over it, so applications that make an engine per query
  (Superset) still balance (``share_state=0`` in the URL: a state of the engine's own);
- each DB-API connection is pinned to the replica the strategy picks when it is created (its
  statements, ClickHouse session and temporary tables stay together);
- a replica failure on a connection is a disconnect: SQLAlchemy invalidates the connection
  (with ``pool_pre_ping=True`` before it is handed out) and the next one is pinned to a
  healthy replica.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from clickhouse_connect.cc_sqlalchemy.dialect import ClickHouseDialect
from clickhouse_connect.common import get_setting

from clickhouse_lb.pools.pool import ReplicaPool
from clickhouse_lb.sqlalchemy import _compat
from clickhouse_lb.sqlalchemy import dbapi as _dbapi
from clickhouse_lb.sqlalchemy._shared import ENGINE_ARGS, is_replica_failure
from clickhouse_lb.sqlalchemy._url_form import give_percent_free_url
from clickhouse_lb.sqlalchemy.dbapi import PinnedConnection
from clickhouse_lb.sqlalchemy.url import EngineArgs, engine_args_from_url

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine
    from sqlalchemy.engine.interfaces import ConnectArgsType, DBAPIConnection

__all__ = ["ClickHouseLBDialect", "get_replica_pool"]

class ClickHouseLBDialect(ClickHouseDialect):
    """The ``clickhousedb+lb://`` dialect (see :mod:`clickhouse_lb.sqlalchemy`)."""

    driver = "lb"
    # Set on this class too: SQLAlchemy warns about a dialect class that does not say.
    supports_statement_cache = False
    inspector = _compat.Inspector

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        """The DB-API module, :mod:`clickhouse_lb.sqlalchemy.dbapi`: clickhouse-connect's
        exception classes (connections come from :meth:`connect`)."""
        return _dbapi

    # SQLAlchemy 1.4 asks the dialect class for ``dbapi()`` (2.x for ``import_dbapi()``, and then
    # sets ``dbapi`` on the instance): without this, 1.4 would take clickhouse-connect's module.
    @classmethod
    def dbapi(cls) -> ModuleType:  # type: ignore[override]
        return cls.import_dbapi()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._replica_pool: ReplicaPool | None = None
        self._pool_lock = threading.Lock()
        self._session: bool | None = None

    @classmethod
    def engine_created(cls, engine: Engine) -> None:
        """Give the engine its URL in a form without ``%`` (Alembic's configparser reads
        ``engine.url.render_as_string(hide_password=False)``; see
        :mod:`clickhouse_lb.sqlalchemy._url_form`)."""
        give_percent_free_url(engine)

    # -- connecting ------------------------------------------------------------------------

    def create_connect_args(self, url: URL) -> ConnectArgsType:
        """Validate the URL (at ``create_engine``, before any I/O): a bad host, port, strategy
        or balancing parameter raises :class:`~clickhouse_lb.errors.ConfigurationError`."""
        args = engine_args_from_url(url, default_session=bool(get_setting("autogenerate_session_id")))
        return [], {ENGINE_ARGS: args}

    def connect(self, *cargs: Any, **cparams: Any) -> DBAPIConnection:
        """A DB-API connection pinned to the replica the strategy picks now (the next ones in
        plan order while a replica cannot be reached)."""
        args: EngineArgs = cparams.pop(ENGINE_ARGS)
        pool = self._pool_for(args, cparams)
        assert self._session is not None
        return cast("DBAPIConnection", PinnedConnection(pool.pin(session=self._session)))

    def _pool_for(self, args: EngineArgs, connect_args: dict[str, Any]) -> ReplicaPool:
        """The engine's pool, made on its first connection from the URL and ``connect_args``
        (the same on every call: SQLAlchemy passes the engine's connect arguments each time)."""
        pool = self._replica_pool
        if pool is None:
            with self._pool_lock:
                pool = self._replica_pool
                if pool is None:
                    merged = args.with_connect_args(connect_args)
                    self._session = merged.session
                    pool = ReplicaPool(merged.config)
                    self._replica_pool = pool
        return pool

    @property
    def replica_pool(self) -> ReplicaPool | None:
        """The engine's :class:`~clickhouse_lb.ReplicaPool` (``plan()``, ``replicas``, listeners);
        ``None`` until the engine's first connection. See :func:`get_replica_pool`."""
        return self._replica_pool

    # -- failures --------------------------------------------------------------------------

    def is_disconnect(self, e: Exception, connection: Any, cursor: Any) -> bool:
        """A replica failure means this connection's replica is gone (with its session):
        SQLAlchemy then invalidates the connection instead of returning it to its pool."""
        return is_replica_failure(e)


def get_replica_pool(engine: Engine) -> ReplicaPool:
    """The balancing state behind a ``clickhousedb+lb`` engine: ``pool.replicas`` (error counts
    per replica), ``pool.plan()``, ``pool.add_listener(...)``. Opens the engine's first
    connection if none was made yet."""
    dialect = engine.dialect
    if not isinstance(dialect, ClickHouseLBDialect):
        raise TypeError(f"{engine!r} does not use the clickhousedb+lb dialect")
    if dialect.replica_pool is None:
        with engine.connect():
            pass
    pool = dialect.replica_pool
    assert pool is not None
    return pool

"""Alembic over ``clickhousedb+lb://``: one migration state for the whole replica set (the public
entry is :mod:`clickhouse_lb.alembic`, which a stock env.py imports).

clickhouse-connect's :class:`~clickhouse_connect.cc_sqlalchemy.alembic.ClickHouseImpl` keeps the
version table as a plain ``MergeTree`` table on whatever server the connection reaches. Through a
balancing engine every Alembic command could reach another replica, each with a version table of
its own. :class:`ClickHouseLBImpl` takes its place for the ``clickhousedb`` dialect name (for
``clickhousedb://`` engines it is ClickHouseImpl unchanged) and, for ``clickhousedb+lb://``:

* **the URL names the cluster** (``cluster=``): the version table is created ``ON CLUSTER``, as a
  ``ReplicatedMergeTree``, so every replica has the one table; each run starts with
  ``SYSTEM SYNC REPLICA`` of it on its connection's replica (caught up with the others' writes
  before Alembic reads the current revision). The migrations' own DDL is the user's to write
  ``ON CLUSTER``.
* **otherwise**: every Alembic run is pinned to the URL's first replica (in the URL's order,
  whatever ``load_balancing`` says), and fails with a :class:`~alembic.util.CommandError`
  naming it while it is down instead of running against another replica, whose migration state
  is a different one. The version table and the migrations' DDL exist on that replica only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from alembic.util import CommandError
from clickhouse_connect.cc_sqlalchemy.alembic import ClickHouseImpl
from clickhouse_connect.cc_sqlalchemy.ddl.tableengine import ReplicatedMergeTree
from clickhouse_connect.driver.binding import quote_identifier
from sqlalchemy import Column, MetaData, String, Table, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.dml import Insert, Update

from clickhouse_lb._redact import brief
from clickhouse_lb.core.failover import run_sync
from clickhouse_lb.errors import AllReplicasUnavailableError
from clickhouse_lb.pools._base import pin_options
from clickhouse_lb.pools.pool import PinnedSession, ReplicaPool
from clickhouse_lb.sqlalchemy.dbapi import PinnedConnection
from clickhouse_lb.sqlalchemy.dialect import ClickHouseLBDialect

__all__ = ["ON_CLUSTER", "ClickHouseLBImpl"]

#: ``Table.info`` key: the cluster a ``CREATE TABLE`` of that table runs ``ON CLUSTER``.
ON_CLUSTER = "clickhouse_lb_on_cluster"


@compiles(CreateTable, "clickhousedb")
def _create_table(element: CreateTable, compiler: Any, **kw: Any) -> str:
    sql: str = compiler.visit_create_table(element, **kw)
    cluster = element.element.info.get(ON_CLUSTER)
    if not cluster:
        return sql
    # Another replica may have made it already: ON CLUSTER runs everywhere.
    head, columns, rest = sql.partition(" (")
    if " IF NOT EXISTS " not in head:
        head = head.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
    return f"{head} ON CLUSTER {quote_identifier(cluster)}{columns}{rest}"


def _dbapi_connection(connection: Any) -> Any:
    fairy = connection.connection  # SQLAlchemy's pooled connection
    return getattr(fairy, "dbapi_connection", None) or fairy.connection


def _pin_first_replica(pool: ReplicaPool, session: bool) -> PinnedSession:
    """A pinned session on the URL's first replica, with no failover."""
    view = pool._view
    attempts = pool._attempts("migration", [0], retry_after_send=True, write=False, view=view)

    def connect(index: int) -> PinnedSession:
        return PinnedSession(pool, index, pool._new_client(index, view, **pin_options(session)), view.balancer)

    try:
        return run_sync(attempts, connect, pool._policy)
    except AllReplicasUnavailableError as exc:
        # Only the migration replica was tried: the error's list of every replica would show
        # the healthy others as unavailable ("not tried").
        address = view.balancer.addresses[0]
        error = exc.last_errors.get(address) or "not reached before the failover timeout"
        tries = f"{len(exc.failures)} attempt{'s' if len(exc.failures) != 1 else ''}"
        raise CommandError(
            f"The migration replica {address} (the URL's first host) is unavailable: {brief(error)} ({tries}). "
            "Without cluster= in the URL, Alembic's version table and migrations live on the URL's first replica "
            "only; the other replicas have another migration state, so none is used instead. Retry when it is "
            "back, or name the cluster (cluster=...) for a version table replicated over every replica."
        ) from exc


class ClickHouseLBImpl(ClickHouseImpl):
    """ClickHouseImpl with one version table for a ``clickhousedb+lb://`` engine's replicas."""

    __dialect__ = "clickhousedb"

    def __init__(self, dialect: Any, connection: Any, as_sql: bool, *args: Any, **kwargs: Any) -> None:
        self._lb_cluster: str | None = None
        if isinstance(dialect, ClickHouseLBDialect) and connection is not None and not as_sql:
            pool = dialect.replica_pool
            dbapi_connection = _dbapi_connection(connection)
            if pool is not None and isinstance(dbapi_connection, PinnedConnection):
                self._lb_cluster = pool.config.discovery.cluster or None
                if self._lb_cluster is None and dbapi_connection.address != pool.addresses[0]:
                    dbapi_connection.repin(_pin_first_replica(pool, session=dbapi_connection.session_id is not None))
        super().__init__(dialect, connection, as_sql, *args, **kwargs)
        if self._lb_cluster is not None:
            self._sync_version_table()

    def version_table_impl(self, *, version_table: str, version_table_schema: str | None,
                           version_table_pk: bool, **kw: Any) -> Table:
        if self._lb_cluster is None:
            return super().version_table_impl(
                version_table=version_table, version_table_schema=version_table_schema,
                version_table_pk=version_table_pk, **kw,
            )
        return Table(
            version_table,
            MetaData(),
            Column("version_num", String(32), nullable=False),
            ReplicatedMergeTree(order_by="version_num"),
            schema=version_table_schema,
            info={ON_CLUSTER: self._lb_cluster},
        )

    # -- the replicated version table's writes --------------------------------------------------
    # A revision written again (an upgrade after a downgrade) is the same block as before: a
    # replicated table would drop it as a duplicate, so these inserts are not deduplicated. The
    # DELETE waits for this replica only (mutations_sync = 1): waiting for every replica would
    # hang on one that is down; the next run's SYNC REPLICA catches its replica up.

    def _exec(self, construct: Any, execution_options: Any = None, multiparams: Any = None, params: Any = None) -> Any:
        version_insert = isinstance(construct, Insert) and self._is_version_table_construct(construct)
        if self._lb_cluster is not None and version_insert:
            return self._insert_version(construct)
        return super()._exec(construct, execution_options=execution_options, multiparams=multiparams, params=params)

    def _insert_version(self, construct: Insert | Update) -> Any:
        values = construct._values
        if not values:
            raise CommandError("ClickHouse Alembic version write is missing its value")
        value = self._compile_clause(next(iter(values.values())))
        return super()._exec(text(
            f"INSERT INTO {self._version_table_name} (version_num) SETTINGS insert_deduplicate = 0 VALUES ({value})"
        ))

    def _exec_version_update(self, construct: Update, execution_options: Any = None) -> Any:
        if self._lb_cluster is None:
            return super()._exec_version_update(construct, execution_options)
        where = self._compile_version_where(construct)
        self._insert_version(construct)
        super()._exec(text(f"ALTER TABLE {self._version_table_name} DELETE WHERE {where} SETTINGS mutations_sync = 1"))
        return SimpleNamespace(rowcount=1)

    def _exec_version_delete(self, construct: Any, execution_options: Any = None) -> Any:
        if self._lb_cluster is None:
            return super()._exec_version_delete(construct, execution_options)
        where = self._compile_version_where(construct)
        return super()._exec(
            text(f"ALTER TABLE {self._version_table_name} DELETE WHERE {where} SETTINGS mutations_sync = 1"),
            execution_options=execution_options,
        )

    def _sync_version_table(self) -> None:
        """Catch this replica's copy of the version table up with the other replicas' writes."""
        name = self._version_table_name
        assert self.connection is not None  # set: only a connected run gets here
        if self.connection.execute(text(f"EXISTS TABLE {name}")).scalar():
            self.connection.execute(text(f"SYSTEM SYNC REPLICA {name}"))

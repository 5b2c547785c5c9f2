"""``clickhousedb+lb_async`` against the test cluster: async Core, AsyncSession ORM, reflection,
balancing and failover.

The local replicas do not replicate to each other, so tables are created on every replica
(``cluster.on_all``) and the tests that look at data use ``load_balancing=in_order``: every
connection is pinned to the first replica while it is healthy.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import pytest
from clickhouse_connect.cc_sqlalchemy.ddl.tableengine import MergeTree
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, inspect, select, text
from sqlalchemy.dialects import registry
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from clickhouse_lb.errors import SessionLostError
from clickhouse_lb.pools.aio import AsyncPinnedSession
from clickhouse_lb.sqlalchemy.aio import get_async_replica_pool, pinned_session
from clickhouse_lb.testing import ClusterBase

# The pyproject entry point registers it once installed; registering here too keeps the tests
# independent of how the package was installed.
registry.register("clickhousedb.lb_async", "clickhouse_lb.sqlalchemy.aio", "ClickHouseLBAsyncDialect")

pytestmark = pytest.mark.integration

WHO = text("SELECT getMacro('replica')")


def url(cluster: ClusterBase, query: str = "load_balancing=in_order") -> str:
    """An engine URL for the cluster: its replicas as repeated ``host=`` parameters, in order."""
    password = quote(getattr(cluster, "password", ""), safe="")
    hosts = "&".join(f"host={h}" for h in cluster.hosts)
    return f"clickhousedb+lb_async://default:{password}@/default?{hosts}&{query}"


@asynccontextmanager
async def lb_engine(
    cluster: ClusterBase, query: str = "load_balancing=in_order", **engine_options: Any
) -> AsyncIterator[AsyncEngine]:
    """A ``clickhousedb+lb_async`` engine over the cluster, disposed (its connections closed) at the end."""
    engine = create_async_engine(url(cluster, query), **engine_options)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def engine(clickhouse_cluster: ClusterBase) -> AsyncIterator[AsyncEngine]:
    async with lb_engine(clickhouse_cluster) as engine:
        yield engine


@pytest.fixture
def table_name(clickhouse_cluster: ClusterBase) -> Iterator[str]:
    """A fresh MergeTree table ``(id UInt32, name String)`` on every replica."""
    name = f"sa_async_{uuid.uuid4().hex[:12]}"
    clickhouse_cluster.on_all(f"CREATE TABLE {name} (id UInt32, name String) ENGINE = MergeTree ORDER BY id")
    yield name
    clickhouse_cluster.on_all(f"DROP TABLE IF EXISTS {name}")


async def who(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str(await conn.scalar(WHO))


async def pinned(conn: AsyncConnection) -> AsyncPinnedSession:
    """The pinned session behind an async connection."""
    raw = await conn.get_raw_connection()
    return pinned_session(raw.dbapi_connection)


# -- Core, ORM, reflection -------------------------------------------------------------------


async def test_core_insert_and_select(clickhouse_cluster: ClusterBase, engine: AsyncEngine, table_name: str) -> None:
    table = Table(table_name, MetaData(), Column("id", Integer), Column("name", String))
    async with engine.begin() as conn:
        await conn.execute(insert(table), [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}])
        await conn.execute(insert(table).values(id=3, name="three"))
    async with engine.connect() as conn:
        rows = (await conn.execute(select(table.c.id, table.c.name).order_by(table.c.id))).all()
        assert [tuple(r) for r in rows] == [(1, "one"), (2, "two"), (3, "three")]
        assert await conn.scalar(WHO) == clickhouse_cluster.names[0]
        assert (await pinned(conn)).address == clickhouse_cluster.hosts[0]
    # in_order put every connection on the first replica: the others have no rows
    assert clickhouse_cluster.query(1, f"SELECT count() FROM {table_name}").strip() == "0"


class Base(DeclarativeBase):
    pass


async def test_async_session_orm_round_trip(engine: AsyncEngine, table_name: str) -> None:
    class Item(Base):
        __tablename__ = table_name
        __table_args__ = (MergeTree(order_by="id"),)
        id: Mapped[int] = mapped_column(Integer, primary_key=True)
        name: Mapped[str] = mapped_column(String)

    try:
        async with AsyncSession(engine) as session:
            session.add_all([Item(id=1, name="a"), Item(id=2, name="b")])
            await session.commit()
        async with AsyncSession(engine) as session:
            items = (await session.scalars(select(Item).order_by(Item.id))).all()
            assert [(i.id, i.name) for i in items] == [(1, "a"), (2, "b")]
            assert (await session.scalars(select(Item.name).where(Item.id == 2))).one() == "b"
    finally:
        Base.metadata.remove(Item.__table__)  # type: ignore[arg-type]


async def test_reflection_through_run_sync(engine: AsyncEngine, table_name: str) -> None:
    async with engine.connect() as conn:
        names = await conn.run_sync(lambda sync_conn: inspect(sync_conn).get_table_names())
        assert table_name in names
        columns = await conn.run_sync(lambda sync_conn: inspect(sync_conn).get_columns(table_name))
        assert {c["name"]: str(c["type"]) for c in columns} == {"id": "UInt32", "name": "String"}
        reflected = await conn.run_sync(lambda sync_conn: Table(table_name, MetaData(), autoload_with=sync_conn))
        assert [c.name for c in reflected.columns] == ["id", "name"]


async def test_url_settings_and_async_client_options(clickhouse_cluster: ClusterBase) -> None:
    """Server settings reach the server; the async client's own options (connector_limit ...)
    configure each pinned connection's client instead of being sent as settings."""
    query = "load_balancing=in_order&max_threads=3&ch_load_balancing=nearest_hostname&connector_limit=2"
    async with lb_engine(clickhouse_cluster, query) as engine, engine.connect() as conn:
        assert await conn.scalar(text("SELECT getSetting('max_threads')")) == 3
        assert await conn.scalar(text("SELECT getSetting('load_balancing')")) == "nearest_hostname"
        client = (await pinned(conn)).client
        assert client.get_client_setting("connector_limit") is None  # not a server setting
        assert client._session is not None
        assert client._session.connector is not None
        assert client._session.connector.limit == 2


# -- balancing -------------------------------------------------------------------------------


async def test_in_order_lands_on_the_first_replica(clickhouse_cluster: ClusterBase, engine: AsyncEngine) -> None:
    connections = [await engine.connect() for _ in range(3)]
    try:
        assert [await c.scalar(WHO) for c in connections] == [clickhouse_cluster.names[0]] * 3
    finally:
        for conn in connections:
            await conn.close()


async def test_round_robin_spreads_connections_with_their_temporary_tables(clickhouse_cluster: ClusterBase) -> None:
    """round_robin rotates per connection; each connection's statements (and its session's
    temporary table) stay on the replica it was pinned to."""
    async with lb_engine(clickhouse_cluster, "load_balancing=round_robin") as engine:
        connections = [await engine.connect() for _ in clickhouse_cluster.hosts]
        try:
            for n, conn in enumerate(connections):
                await conn.execute(text("CREATE TEMPORARY TABLE tmp (x UInt32)"))
                await conn.execute(text(f"INSERT INTO tmp VALUES ({n})"))
            seen = []
            for n, conn in enumerate(connections):
                replica = await conn.scalar(WHO)
                assert await conn.scalar(text("SELECT x FROM tmp")) == n
                assert await conn.scalar(WHO) == replica
                seen.append(replica)
        finally:
            for conn in connections:
                await conn.close()
        assert sorted(seen) == sorted(clickhouse_cluster.names)  # one connection per replica


# -- failover --------------------------------------------------------------------------------


async def pooled_connection_on_first_replica(engine: AsyncEngine, cluster: ClusterBase) -> AsyncPinnedSession:
    """Open one connection (pinned to replica 0 by in_order) and return it to the engine's pool."""
    async with engine.connect() as conn:
        assert await conn.scalar(WHO) == cluster.names[0]
        return await pinned(conn)


async def test_failover_with_pre_ping(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    async with lb_engine(cluster, pool_pre_ping=True) as engine:
        pooled = await pooled_connection_on_first_replica(engine, cluster)
        cluster.kill(0)
        async with engine.connect() as conn:  # the pre-ping finds replica 0 gone and reconnects
            assert await conn.scalar(WHO) == cluster.names[1]
            assert await pinned(conn) is not pooled
        assert (await get_async_replica_pool(engine)).replicas[0].errors_count >= 1


async def test_failover_without_pre_ping_after_one_invalidated_attempt(
    healthy_clickhouse_cluster: ClusterBase,
) -> None:
    cluster = healthy_clickhouse_cluster
    # Exact counts as on the server: decay only, no probes.
    async with lb_engine(cluster, "load_balancing=in_order&health_check_interval_ms=0") as engine:
        await pooled_connection_on_first_replica(engine, cluster)
        cluster.kill(0)
        async with engine.connect() as conn:
            with pytest.raises(OperationalError) as info:
                await conn.execute(WHO)
            assert info.value.connection_invalidated
            assert isinstance(info.value.orig, SessionLostError)
        pool = await get_async_replica_pool(engine)
        assert pool.replicas[0].errors_count == 1
        assert await who(engine) == cluster.names[1]
        assert await who(engine) == cluster.names[1]  # and stays there while replica 0 has errors

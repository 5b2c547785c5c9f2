"""``clickhousedb+lb`` against the test cluster: Core, ORM, reflection, pandas, URL forms, failover.

The local replicas do not replicate to each other, so tables are created on every replica
(``cluster.on_all``) and the tests that look at data use ``load_balancing=in_order``: every
connection is pinned to the first replica while it is healthy.
"""

from __future__ import annotations

import contextlib
import gc
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pandas as pd
import pytest
from clickhouse_connect.cc_sqlalchemy.ddl.tableengine import MergeTree
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, declarative_base

from clickhouse_lb.errors import SessionLostError
from clickhouse_lb.sqlalchemy import PinnedConnection, get_replica_pool
from clickhouse_lb.testing import ClusterBase

pytestmark = pytest.mark.integration

WHO = text("SELECT getMacro('replica')")


def url(cluster: ClusterBase, query: str = "load_balancing=in_order", authority: str = "") -> str:
    """An engine URL for the cluster: its replicas as repeated ``host=`` parameters, in order."""
    password = quote(getattr(cluster, "password", ""), safe="")
    hosts = "&".join(f"host={h}" for h in cluster.hosts) if not authority else ""
    params = "&".join(p for p in (hosts, query) if p)
    return f"clickhousedb+lb://default:{password}@{authority}/default?{params}"


@contextmanager
def lb_engine(
    cluster: ClusterBase, query: str = "load_balancing=in_order", authority: str = "", **engine_options: Any
) -> Iterator[Engine]:
    """A ``clickhousedb+lb`` engine over the cluster, disposed (its connections closed) at the end."""
    engine = create_engine(url(cluster, query, authority), **engine_options)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def engine(clickhouse_cluster: ClusterBase) -> Iterator[Engine]:
    with lb_engine(clickhouse_cluster) as engine:
        yield engine


@pytest.fixture
def table_name(clickhouse_cluster: ClusterBase) -> Iterator[str]:
    """A fresh MergeTree table ``(id UInt32, name String)`` on every replica."""
    name = f"sa_{uuid.uuid4().hex[:12]}"
    clickhouse_cluster.on_all(f"CREATE TABLE {name} (id UInt32, name String) ENGINE = MergeTree ORDER BY id")
    yield name
    clickhouse_cluster.on_all(f"DROP TABLE IF EXISTS {name}")


def who(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(WHO).scalar())


# -- Core, ORM, reflection, pandas ----------------------------------------------------------


def test_core_insert_and_select(clickhouse_cluster: ClusterBase, engine: Engine, table_name: str) -> None:
    table = Table(table_name, MetaData(), Column("id"), Column("name", String))
    with engine.begin() as conn:
        conn.execute(insert(table), [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}])
        conn.execute(insert(table).values(id=3, name="three"))
    with engine.connect() as conn:
        rows = conn.execute(select(table.c.id, table.c.name).order_by(table.c.id)).all()
        assert [tuple(r) for r in rows] == [(1, "one"), (2, "two"), (3, "three")]
        assert conn.execute(WHO).scalar() == clickhouse_cluster.names[0]
    # in_order put every connection on the first replica: the others have no rows
    assert clickhouse_cluster.query(1, f"SELECT count() FROM {table_name}").strip() == "0"


# declarative_base() rather than DeclarativeBase: the same test runs on SQLAlchemy 1.4 (Superset's) and 2.x.
Base: Any = declarative_base()


def test_orm_session_with_a_mapped_class(engine: Engine, table_name: str) -> None:
    class Item(Base):
        __tablename__ = table_name
        __table_args__ = (MergeTree(order_by="id"),)
        id = Column(Integer, primary_key=True)
        name = Column(String)

    try:
        with Session(engine) as session:
            session.add_all([Item(id=1, name="a"), Item(id=2, name="b")])
            session.commit()
        with Session(engine) as session:
            items = session.scalars(select(Item).order_by(Item.id)).all()
            assert [(i.id, i.name) for i in items] == [(1, "a"), (2, "b")]
            assert session.scalars(select(Item.name).where(Item.id == 2)).one() == "b"
    finally:
        Base.metadata.remove(Item.__table__)  # type: ignore[arg-type]


def test_reflection(engine: Engine, table_name: str) -> None:
    inspector = inspect(engine)
    assert table_name in inspector.get_table_names()
    columns = {c["name"]: str(c["type"]) for c in inspector.get_columns(table_name)}
    assert columns == {"id": "UInt32", "name": "String"}
    reflected = Table(table_name, MetaData(), autoload_with=engine)
    assert [c.name for c in reflected.columns] == ["id", "name"]


def test_pandas_read_sql(clickhouse_cluster: ClusterBase, engine: Engine, table_name: str) -> None:
    clickhouse_cluster.query(0, f"INSERT INTO {table_name} VALUES (1, 'x'), (2, 'y')")
    frame = pd.read_sql(text(f"SELECT id, name FROM {table_name} ORDER BY id"), engine)
    assert frame.to_dict("list") == {"id": [1, 2], "name": ["x", "y"]}
    frame = pd.read_sql_table(table_name, engine)
    assert sorted(frame["name"]) == ["x", "y"]


def test_temporary_tables_stay_with_their_connection(clickhouse_cluster: ClusterBase) -> None:
    """round_robin spreads connections over the replicas, but each connection's statements
    (and its session's temporary table) stay on the one replica it was pinned to."""
    with lb_engine(clickhouse_cluster, "load_balancing=round_robin") as engine:
        seen = set()
        connections = [engine.connect() for _ in clickhouse_cluster.hosts]
        for n, conn in enumerate(connections):
            conn.execute(text("CREATE TEMPORARY TABLE tmp (x UInt32)"))
            conn.execute(text(f"INSERT INTO tmp VALUES ({n})"))
        for n, conn in enumerate(connections):
            replica = conn.execute(WHO).scalar()
            for _ in range(3):
                assert conn.execute(text("SELECT x FROM tmp")).scalar() == n
                assert conn.execute(WHO).scalar() == replica
            seen.add(replica)
            conn.close()
        assert seen == set(clickhouse_cluster.names)  # one connection per replica


# -- URL forms -------------------------------------------------------------------------------


def test_url_with_repeated_host_parameters(clickhouse_cluster: ClusterBase) -> None:
    with lb_engine(clickhouse_cluster, "load_balancing=in_order&priority=1,0,1") as engine:
        assert who(engine) == clickhouse_cluster.names[1]  # priority outranks in_order


def test_url_with_alt_hosts(clickhouse_cluster: ClusterBase) -> None:
    first, *rest = clickhouse_cluster.hosts
    with lb_engine(
        clickhouse_cluster,
        f"alt_hosts={','.join(rest)}&load_balancing=first_or_random&load_balancing_first_offset=2",
        authority=first,
    ) as engine:
        assert who(engine) == clickhouse_cluster.names[2]
        assert get_replica_pool(engine).addresses == clickhouse_cluster.hosts


def test_url_with_one_shared_port(clickhouse_cluster: ClusterBase) -> None:
    """``h1,h2:PORT``. The test replicas listen on different ports, so the first host of the
    authority is an address where nothing listens on the first replica's port: connecting
    counts a refused connection against it and pins the connection to the live replica."""
    live_host, port = clickhouse_cluster.hosts[0].rsplit(":", 1)
    with lb_engine(
        clickhouse_cluster,
        "load_balancing=in_order&health_check_interval_ms=0",  # exact counts: no probes of the dead address
        authority=f"127.0.0.99,{live_host}:{port}",
    ) as engine:
        assert who(engine) == clickhouse_cluster.names[0]
        pool = get_replica_pool(engine)
        assert pool.addresses == [f"127.0.0.99:{port}", f"{live_host}:{port}"]
        assert [r.errors_count for r in pool.replicas] == [1, 0]


def test_url_settings_reach_the_server(clickhouse_cluster: ClusterBase) -> None:
    with (
        lb_engine(
            clickhouse_cluster, "load_balancing=in_order&max_threads=3&ch_load_balancing=nearest_hostname"
        ) as engine,
        engine.connect() as conn,
    ):
        assert conn.execute(text("SELECT getSetting('max_threads')")).scalar() == 3
        assert conn.execute(text("SELECT getSetting('load_balancing')")).scalar() == "nearest_hostname"


# -- failover --------------------------------------------------------------------------------


def pooled_connection_on_first_replica(engine: Engine, cluster: ClusterBase) -> PinnedConnection:
    """Open one connection (pinned to replica 0 by in_order) and return it to the engine's pool."""
    with engine.connect() as conn:
        assert conn.execute(WHO).scalar() == cluster.names[0]
        dbapi_connection = conn.connection.dbapi_connection
    assert isinstance(dbapi_connection, PinnedConnection)
    return dbapi_connection


def test_failover_with_pre_ping(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    with lb_engine(cluster, pool_pre_ping=True) as engine:
        pooled = pooled_connection_on_first_replica(engine, cluster)
        cluster.kill(0)
        with engine.connect() as conn:  # the pre-ping finds replica 0 gone and reconnects
            assert conn.execute(WHO).scalar() == cluster.names[1]
            assert conn.connection.dbapi_connection is not pooled
        assert get_replica_pool(engine).replicas[0].errors_count >= 1


def test_failover_without_pre_ping_after_one_invalidated_attempt(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    # Exact counts as on the server: decay only, no probes.
    with lb_engine(cluster, "load_balancing=in_order&health_check_interval_ms=0") as engine:
        pooled_connection_on_first_replica(engine, cluster)
        cluster.kill(0)
        with engine.connect() as conn, pytest.raises(OperationalError) as info:
            conn.execute(WHO)
        assert info.value.connection_invalidated
        assert isinstance(info.value.orig, SessionLostError)
        assert get_replica_pool(engine).replicas[0].errors_count == 1
        assert who(engine) == cluster.names[1]
        assert who(engine) == cluster.names[1]  # and stays there while replica 0 has errors


def test_error_counts_are_shared_by_the_engines_connections(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    # Exact counts as on the server: decay only, no probes.
    with lb_engine(cluster, "load_balancing=in_order&health_check_interval_ms=0") as engine:
        first, second = engine.connect(), engine.connect()
        assert first.execute(WHO).scalar() == second.execute(WHO).scalar() == cluster.names[0]
        cluster.kill(0)
        for conn in (first, second):
            with pytest.raises(OperationalError):
                conn.execute(WHO)
            conn.close()
        pool = get_replica_pool(engine)
        assert pool.replicas[0].errors_count == 2  # both connections counted into one state
        assert pool.plan()[0] != cluster.hosts[0]
        assert who(engine) == cluster.names[1]


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts sockets through /proc/self/fd (Linux)")
def test_engine_per_query_leaves_no_sockets_behind(clickhouse_cluster: ClusterBase) -> None:
    # Superset's way: an engine per query, disposed and dropped. Each engine's replica pool made a
    # urllib3 pool manager that clickhouse-connect's registry of managers kept, with its idle
    # connection, for the life of the process: one socket more per query.
    from clickhouse_connect.driver import httputil

    query = "load_balancing=in_order&health_check_interval_ms=0"
    with lb_engine(clickhouse_cluster, query) as warm, warm.connect() as conn:
        conn.execute(text("SELECT 1"))  # imports, the shared state and its first sockets, outside the count
    gc.collect()
    sockets, managers = _open_sockets(), len(httputil.all_managers)
    for _ in range(12):
        with lb_engine(clickhouse_cluster, query) as engine, engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
        del engine, conn
    gc.collect()
    assert len(httputil.all_managers) == managers
    assert _open_sockets() - sockets <= 2, "an engine dropped after use kept its sockets open"

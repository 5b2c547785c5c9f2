"""clickhouse-connect-style usage through a pool, against the real engine (3 local replicas):
``get_client(...)`` swapped for ``get_pool(...)`` with the same arguments, and the Client members
used as a clickhouse-connect user does: creation errors, client settings, a database switch,
contexts, server facts, insert/query round trips of many types.

The replicas of the local cluster are independent engines (no replication): a table or database
a test needs is made on each of them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from ipaddress import IPv4Address
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

import clickhouse_lb
from clickhouse_lb import AllReplicasUnavailableError, ReplicaPool
from clickhouse_lb.core.classify import error_code
from clickhouse_lb.errors import PoolMemberError
from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WHO = "SELECT getMacro('replica')"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


@pytest.fixture
def pool(cluster: ClusterBase) -> Iterator[ReplicaPool]:
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", send_receive_timeout=10) as pool:
        yield pool


def on_each_replica(pool: ReplicaPool, sql: str, **settings: Any) -> list[Any]:
    """``sql`` through the pool, once with each replica first (first_or_random + offset)."""
    return [
        pool.command(sql, settings={"load_balancing": "first_or_random", "load_balancing_first_offset": i, **settings})
        for i in range(len(pool.addresses))
    ]


def every_replica(pool: ReplicaPool, sql: str) -> None:
    for address in pool.addresses:
        pool.client(address).command(sql)


# -- creation: as get_client ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "code"),
    [({"user": "default", "password": "wrong"}, 516), ({"username": "nobody"}, 516), ({"database": "absent"}, 81)],
)
def test_creation_raises_what_get_client_raises(cluster: ClusterBase, options: dict[str, Any], code: int) -> None:
    host, _, port = cluster.hosts[0].rpartition(":")
    with pytest.raises(DatabaseError) as direct:
        clickhouse_connect.get_client(host=host, port=int(port), **options)
    with pytest.raises(type(direct.value)) as pooled:
        clickhouse_lb.get_pool(cluster.hosts, **options)
    assert error_code(direct.value) == error_code(pooled.value) == code


def test_creation_over_partly_down_replicas_works_and_all_down_names_each(cluster: ClusterBase) -> None:
    cluster.kill(0)
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order") as pool:
        assert pool.command(WHO) == "r2"
        assert pool.replicas[0].errors_count >= 1
    cluster.kill(1)
    cluster.kill(2)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        clickhouse_lb.get_pool(cluster.hosts, connections_with_failover_max_tries=1)
    assert all(address in str(caught.value) for address in cluster.hosts)
    lazy = clickhouse_lb.get_pool(cluster.hosts, connect_on_create=False)  # no I/O: builds fine
    lazy.close()


# -- members --------------------------------------------------------------------------------


def test_the_pool_has_every_public_member_of_a_real_client(cluster: ClusterBase, pool: ReplicaPool) -> None:
    client = pool.client(cluster.hosts[0])
    members = {n for n in (*dir(type(client)), *vars(client)) if not n.startswith("_")}
    assert {"server_version", "url", "database"} <= members
    assert members - set(dir(pool)) == set()


def test_client_settings_reach_every_replica(pool: ReplicaPool) -> None:
    pool.set_client_setting("max_threads", 3)
    assert pool.get_client_setting("max_threads") == "3"
    assert on_each_replica(pool, "SELECT getSetting('max_threads')") == [3, 3, 3]


def test_database_switch_moves_every_replica(pool: ReplicaPool) -> None:
    every_replica(pool, "CREATE DATABASE IF NOT EXISTS dropin_db")
    assert pool.database is None
    pool.database = "dropin_db"
    assert on_each_replica(pool, "SELECT currentDatabase()") == ["dropin_db"] * 3
    with pool.session() as session:  # a session made after the switch has it too
        assert session.command("SELECT currentDatabase()") == "dropin_db"
    pool.database = "default"
    assert on_each_replica(pool, "SELECT currentDatabase()") == ["default"] * 3


def test_query_limit_and_headers_apply_on_every_replica(pool: ReplicaPool) -> None:
    pool.query_limit = 2
    for offset in range(3):
        settings = {"load_balancing": "first_or_random", "load_balancing_first_offset": offset}
        assert len(pool.query("SELECT number FROM numbers(10)", settings=settings).result_rows) == 2
    pool.headers["X-Dropin"] = "yes"
    assert {pool.client(a).headers["X-Dropin"] for a in pool.addresses} == {"yes"}


def test_server_facts_come_from_one_replica_and_min_version_from_all(cluster: ClusterBase, pool: ReplicaPool) -> None:
    first = pool.client(cluster.hosts[0])  # in_order: the replica that answered at creation
    assert pool.server_version == first.server_version
    assert pool.server_tz == first.server_tz
    assert pool.protocol_version == first.protocol_version
    assert "max_threads" in pool.server_settings
    assert pool.min_version("1.0") is True
    assert pool.min_version("999.1") is False
    with pytest.raises(PoolMemberError, match="cannot be assigned"):
        pool.server_version = "1.0"
    # url/uri answer the reference replica's (clickhouse-connect's error scrubbing reads them).
    assert pool.url == first.url


def test_tz_mode_reads_datetimes_as_on_a_client_on_every_replica(cluster: ClusterBase, pool: ReplicaPool) -> None:
    host, _, port = cluster.hosts[0].rpartition(":")
    plain = clickhouse_connect.get_client(host=host, port=int(port))
    sql = "SELECT toDateTime('2024-01-02 03:04:05') AS t"
    before = plain.query(sql).result_rows[0][0]
    # clickhouse-connect 1.x names it tz_mode; 0.x utc_tz_aware
    name, value = ("tz_mode", "aware") if hasattr(plain, "tz_mode") else ("utc_tz_aware", True)
    setattr(plain, name, value)
    setattr(pool, name, value)
    expected = plain.query(sql).result_rows[0][0]
    assert before.tzinfo is None
    assert expected.tzinfo is not None
    assert expected.utcoffset() == dt.timedelta(0)
    for offset in range(3):
        settings = {"load_balancing": "first_or_random", "load_balancing_first_offset": offset}
        read = pool.query(sql, settings=settings).result_rows[0][0]
        assert (read, read.tzinfo) == (expected, expected.tzinfo)
    plain.close()


# -- contexts and round trips ---------------------------------------------------------------

COLUMNS = [
    ("u8", "UInt8", 255),
    ("i64", "Int64", -(2**62)),
    ("f64", "Float64", 1.5),
    ("s", "String", "héllo"),
    ("fs", "FixedString(3)", b"abc"),
    ("d", "Date", dt.date(2024, 2, 29)),
    ("ts", "DateTime", dt.datetime(2024, 1, 2, 3, 4, 5)),
    ("ts3", "DateTime64(3)", dt.datetime(2024, 1, 2, 3, 4, 5, 123000)),
    ("dec", "Decimal(18, 4)", Decimal("12345.6789")),
    ("id", "UUID", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("arr", "Array(Int32)", [1, -2, 3]),
    ("ns", "Nullable(String)", None),
    ("lc", "LowCardinality(String)", "low"),
    ("m", "Map(String, UInt64)", {"a": 1, "b": 2}),
    ("tup", "Tuple(Int32, String)", (7, "seven")),
    ("b", "Bool", True),
    ("ip", "IPv4", IPv4Address("10.1.2.3")),
    ("e", "Enum8('x' = 1, 'y' = 2)", "y"),
]


@pytest.fixture
def typed_table(pool: ReplicaPool) -> Iterator[str]:
    name = f"dropin_{uuid.uuid4().hex[:8]}"
    columns = ", ".join(f"{column} {kind}" for column, kind, _ in COLUMNS)
    every_replica(pool, f"CREATE TABLE {name} ({columns}) ENGINE = MergeTree ORDER BY u8")
    yield name
    every_replica(pool, f"DROP TABLE IF EXISTS {name}")


def test_insert_and_query_round_trip_many_types(pool: ReplicaPool, typed_table: str) -> None:
    row = [value for _, _, value in COLUMNS]
    pool.insert(typed_table, [row], column_names=[column for column, _, _ in COLUMNS])
    assert list(pool.query(f"SELECT * FROM {typed_table}").result_rows[0]) == row


def test_contexts_work_with_the_pools_query_and_insert(pool: ReplicaPool, typed_table: str) -> None:
    row = [value for _, _, value in COLUMNS]
    insert_context = pool.create_insert_context(typed_table, data=[row])
    pool.insert(context=insert_context)
    pool.data_insert(pool.create_insert_context(typed_table, data=[row]))
    query_context = pool.create_query_context(f"SELECT u8, s FROM {typed_table}")
    assert pool.query(context=query_context).result_rows == [(255, "héllo"), (255, "héllo")]
    assert pool.query_df(context=query_context).shape == (2, 2)


def test_dataframe_and_arrow_round_trips(pool: ReplicaPool, typed_table: str) -> None:
    pytest.importorskip("pandas")
    row = [value for _, _, value in COLUMNS]
    pool.insert(typed_table, [row])
    df = pool.query_df(f"SELECT u8, s, d FROM {typed_table}")
    pool.insert_df(typed_table, df, column_names=["u8", "s", "d"])
    assert pool.command(f"SELECT count() FROM {typed_table}") == 2
    assert pool.query_arrow(f"SELECT s FROM {typed_table}").num_rows == 2


# -- the async pool: the same through await ---------------------------------------------------


def _async_available() -> bool:
    try:
        from clickhouse_lb.pools.aio import require_native_async_client

        require_native_async_client()
    except Exception:  # clickhouse-connect 0.x (the compat job)
        return False
    return True


@pytest.mark.skipif(not _async_available(), reason="clickhouse-connect 0.x has no native AsyncClient")
async def test_async_pool_is_awaited_like_get_async_client(cluster: ClusterBase) -> None:
    with pytest.raises(DatabaseError) as caught:
        await clickhouse_lb.get_async_pool(cluster.hosts, password="wrong")
    assert error_code(caught.value) == 516
    pool = await clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order", user="default")
    try:
        client = await pool.client(cluster.hosts[0])
        members = {n for n in (*dir(type(client)), *vars(client)) if not n.startswith("_")}
        assert members - set(dir(pool)) == set()
        assert pool.server_version == client.server_version
        for address in pool.addresses:
            await (await pool.client(address)).command("CREATE DATABASE IF NOT EXISTS dropin_db")
        pool.database = "dropin_db"
        pool.set_client_setting("max_threads", 3)
        for offset in range(3):
            settings = {"load_balancing": "first_or_random", "load_balancing_first_offset": offset}
            row = await pool.query("SELECT currentDatabase(), getSetting('max_threads')", settings=settings)
            assert row.result_rows == [("dropin_db", 3)]
        name = f"dropin_{uuid.uuid4().hex[:8]}"
        for address in pool.addresses:
            await (await pool.client(address)).command(f"CREATE TABLE {name} (n UInt32, s String) ENGINE = Memory")
        context = await pool.create_insert_context(name, data=[[1, "one"]])
        await pool.insert(context=context)
        assert (await pool.query(f"SELECT n, s FROM {name}")).result_rows == [(1, "one")]
        await pool.close_connections()
        assert await pool.command("SELECT 1") == 1
    finally:
        await pool.close()

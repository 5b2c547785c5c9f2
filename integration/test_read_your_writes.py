"""Read-your-writes against real replication: the local cluster's replicas apply each other's
writes late (``delay_replication``), so a balanced read after an insert misses it unless the pool
sends the read where the write is, or makes the replica it reads from catch up first
(``SYSTEM SYNC REPLICA``, which the local cluster implements with ``receive_timeout``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

import clickhouse_lb
from clickhouse_lb.core.read_your_writes import forget_writes
from clickhouse_lb.errors import ReadYourWritesError
from clickhouse_lb.testing import ClusterBase, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Longer than any test here: a replica that was not written to never has the row by itself.
NEVER = 600.0


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> LocalCluster:
    if not isinstance(healthy_clickhouse_cluster, LocalCluster):
        pytest.skip("needs the local cluster's delay_replication")
    forget_writes()
    return healthy_clickhouse_cluster


@pytest.fixture
def table(cluster: LocalCluster) -> Iterator[str]:
    name = f"ryw_{uuid.uuid4().hex[:10]}"
    cluster.query(
        0, f"CREATE TABLE {name} ON CLUSTER lb_cluster (k UInt32) ENGINE = ReplicatedMergeTree ORDER BY k"
    )
    yield name
    cluster.heal()
    cluster.query(0, f"DROP TABLE IF EXISTS {name} ON CLUSTER lb_cluster SYNC")


def _pairs(pool: clickhouse_lb.ReplicaPool, table: str, n: int, start: int = 0) -> int:
    """Insert a row and read it back, ``n`` times; how many reads saw their own row."""
    seen = 0
    for k in range(start, start + n):
        pool.insert(table, [[k]], column_names=["k"])
        seen += pool.query(f"SELECT count() FROM {table} WHERE k = {k}").result_rows[0][0]
    return seen


def test_200_write_then_read_pairs_see_their_own_write_with_it_on(cluster: LocalCluster, table: str) -> None:
    for i in range(len(cluster)):
        cluster.delay_replication(i, NEVER)  # every replica applies the others' writes late
    options = {"load_balancing": "round_robin", "health_check_interval_ms": 0}
    with clickhouse_lb.get_pool(hosts=cluster.hosts, **options) as off:
        missed = 20 - _pairs(off, table, 20)
    assert missed >= 10  # the scenario is real: balanced reads miss the write without it
    with clickhouse_lb.get_pool(hosts=cluster.hosts, read_your_writes=1, **options) as on:
        assert _pairs(on, table, 200, start=1000) == 200


def test_a_block_and_the_statement_setting_give_the_same_guarantee(cluster: LocalCluster, table: str) -> None:
    for i in range(len(cluster)):
        cluster.delay_replication(i, NEVER)
    with clickhouse_lb.get_pool(hosts=cluster.hosts, load_balancing="random", health_check_interval_ms=0) as pool:
        with pool.read_your_writes():
            assert _pairs(pool, table, 30) == 30
        on = {"read_your_writes": 1}
        for k in range(100, 130):
            pool.insert(table, [[k]], column_names=["k"], settings=on)
            assert pool.query(f"SELECT count() FROM {table} WHERE k = {k}", settings=on).result_rows == [(1,)]


def test_with_the_writer_killed_the_read_waits_for_another_replica_to_catch_up(
    cluster: LocalCluster, table: str
) -> None:
    delay = 1.5
    for i in (1, 2):
        cluster.delay_replication(i, delay)
    with clickhouse_lb.get_pool(
        hosts=cluster.hosts, load_balancing="in_order", read_your_writes=1, health_check_interval_ms=0
    ) as pool:
        written = time.monotonic()
        pool.insert(table, [[7]], column_names=["k"])  # acknowledged by replica 0 (in_order)
        cluster.kill(0)
        assert pool.query(f"SELECT count() FROM {table} WHERE k = 7").result_rows == [(1,)]
        # it did wait for the replication delay: without the catch-up the row would be missing
        assert time.monotonic() - written >= delay * 0.9


def test_with_the_writer_killed_and_no_catch_up_in_time_the_read_raises_within_the_bound(
    cluster: LocalCluster, table: str
) -> None:
    for i in (1, 2):
        cluster.delay_replication(i, NEVER)
    with clickhouse_lb.get_pool(
        hosts=cluster.hosts, load_balancing="in_order", read_your_writes=1, read_your_writes_timeout_ms=500,
        health_check_interval_ms=0,
    ) as pool:
        pool.insert(table, [[7]], column_names=["k"])
        cluster.kill(0)
        started = time.monotonic()
        with pytest.raises(ReadYourWritesError) as caught:
            pool.query(f"SELECT count() FROM {table} WHERE k = 7")
        assert time.monotonic() - started < 5.0  # the bound is 0.5 s; the replication delay 600 s
    error = caught.value
    assert (error.writer, error.replica, error.timeout) == (cluster.hosts[0], cluster.hosts[1], 0.5)
    assert table in error.table
    assert "read_your_writes_timeout_ms=500" in str(error)


def test_async_pool_pairs_see_their_own_write(cluster: LocalCluster, table: str) -> None:
    for i in range(len(cluster)):
        cluster.delay_replication(i, NEVER)

    async def main() -> int:
        pool = clickhouse_lb.get_async_pool(
            hosts=cluster.hosts, load_balancing="round_robin", health_check_interval_ms=0
        )
        seen = 0
        try:
            async with pool.read_your_writes():
                for k in range(40):
                    await pool.insert(table, [[k]], column_names=["k"])
                    result = await pool.query(f"SELECT count() FROM {table} WHERE k = {k}")
                    seen += result.result_rows[0][0]
        finally:
            await pool.close()
        return seen

    assert asyncio.run(main()) == 40


#: The socket timeout of the hung-replica tests: a catch-up left to it would take this long.
SOCKET_TIMEOUT = 60
#: Far below the socket timeout, far above the bounds the tests set (2 s, liveness checks).
HUNG_BOUND = 10.0


def _hung_pool_options(cluster: LocalCluster, **extra: object) -> dict[str, object]:
    """in_order (replica 0 acknowledges the insert), read-your-writes bound 2 s."""
    return {"hosts": cluster.hosts, "load_balancing": "in_order", "read_your_writes": 1,
            "read_your_writes_timeout_ms": 2000, "health_check_interval_ms": 0,
            "send_receive_timeout": SOCKET_TIMEOUT, **extra}


@pytest.mark.parametrize("liveness", [True, False], ids=["liveness-checks", "no-liveness-checks"])
def test_a_catch_up_on_a_hung_replica_is_bounded_and_fails_over(
    cluster: LocalCluster, table: str, liveness: bool
) -> None:
    extra = {} if liveness else {"liveness_check_after_ms": 0}
    with clickhouse_lb.get_pool(**_hung_pool_options(cluster, **extra)) as pool:
        for host in cluster.hosts:
            pool.client(host)  # every replica's client made: a liveness check has one to ask with
        pool.insert(table, [[7]], column_names=["k"])
        cluster.kill(0)
        cluster.pause(1)  # the next replica of the plan is hung: its catch-up gets no answer
        started = time.monotonic()
        try:
            if liveness:  # given up as hung: the read catches up on replica 2 and reads there
                assert pool.query(f"SELECT count() FROM {table} WHERE k = 7").result_rows == [(1,)]
            else:  # nothing tells it is hung: the read's bound ends the wait
                with pytest.raises(ReadYourWritesError) as caught:
                    pool.query(f"SELECT count() FROM {table} WHERE k = 7")
                assert caught.value.replica == cluster.hosts[1]
            assert time.monotonic() - started < HUNG_BOUND
        finally:
            cluster.resume(1)


@pytest.mark.parametrize("liveness", [True, False], ids=["liveness-checks", "no-liveness-checks"])
def test_async_a_catch_up_on_a_hung_replica_is_bounded_and_fails_over(
    cluster: LocalCluster, table: str, liveness: bool
) -> None:
    extra = {} if liveness else {"liveness_check_after_ms": 0}

    async def main() -> float:
        pool = await clickhouse_lb.get_async_pool(**_hung_pool_options(cluster, **extra))
        try:
            for host in cluster.hosts:
                await pool.client(host)
            await pool.insert(table, [[7]], column_names=["k"])
            cluster.kill(0)
            cluster.pause(1)
            started = time.monotonic()
            if liveness:
                result = await pool.query(f"SELECT count() FROM {table} WHERE k = 7")
                assert result.result_rows == [(1,)]
            else:
                with pytest.raises(ReadYourWritesError) as caught:
                    await pool.query(f"SELECT count() FROM {table} WHERE k = 7")
                assert caught.value.replica == cluster.hosts[1]
            return time.monotonic() - started
        finally:
            cluster.resume(1)
            await pool.close()

    assert asyncio.run(main()) < HUNG_BOUND


def test_the_pools_own_settings_in_a_context_are_taken_as_in_settings(cluster: LocalCluster, table: str) -> None:
    from clickhouse_lb.core.read_your_writes import recent_writes

    with clickhouse_lb.get_pool(hosts=cluster.hosts, health_check_interval_ms=0) as pool:
        for own in ({"read_your_writes": 1}, {"load_balancing": "in_order"}, {"idempotent": 1}):
            context = pool.create_query_context("SELECT 1", settings={**own, "max_threads": 1})
            assert pool.query(context=context).result_rows == [(1,)]  # not UNKNOWN_SETTING
            assert context.settings == {**own, "max_threads": 1}  # the caller's context is left as it was
        context = pool.create_insert_context(table, ["k"], data=[[1]], settings={"read_your_writes": 1})
        assert pool.insert(context=context).written_rows == 1
        # taken as the statement's own setting: the write is remembered
        assert [w.table for w in recent_writes(cluster.hosts, time.monotonic(), 60.0)] == [f"`{table}`"]

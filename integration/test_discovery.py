"""Discovery from ``system.clusters`` against the local cluster: the pool finds every replica
from one seed, survives a seed that is down, and follows replicas added and removed at run time."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from waiting import wait_for

import clickhouse_lb
from clickhouse_lb.config.discovery import DiscoveryError
from clickhouse_lb.testing import ClusterBase, LocalCluster

WHO = "SELECT getMacro('replica')"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


def _closed_port() -> str:
    """An address where nothing listens (bound, then closed: connecting is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_one_seed_finds_every_replica(cluster: ClusterBase) -> None:
    with clickhouse_lb.get_pool(hosts=[cluster.hosts[1]], cluster="lb_cluster", load_balancing="round_robin") as pool:
        assert sorted(pool.addresses) == sorted(cluster.hosts)
        answered = {pool.query(WHO).result_rows[0][0] for _ in range(3 * len(cluster.hosts))}
        assert len(answered) == len(cluster.hosts)


def test_a_seed_that_is_down_is_not_fatal(cluster: ClusterBase) -> None:
    with clickhouse_lb.get_pool(hosts=[_closed_port(), cluster.hosts[2]], cluster="lb_cluster") as pool:
        assert sorted(pool.addresses) == sorted(cluster.hosts)
        assert pool.query("SELECT 1").result_rows == [(1,)]


def test_no_seed_answering_names_each_seed() -> None:
    down = _closed_port()
    with pytest.raises(DiscoveryError, match=down):
        clickhouse_lb.get_pool(hosts=[down], cluster="lb_cluster", connect_timeout_with_failover_ms=500)


def test_unknown_cluster_is_a_clear_error(cluster: ClusterBase) -> None:
    with pytest.raises(DiscoveryError, match="'no_such_cluster'"):
        clickhouse_lb.get_pool(hosts=cluster.hosts[:1], cluster="no_such_cluster")


def test_dsn_takes_cluster_and_shard(cluster: ClusterBase) -> None:
    with clickhouse_lb.get_pool(dsn=f"clickhouse://{cluster.hosts[0]}/default?cluster=lb_cluster&shard=1") as pool:
        assert sorted(pool.addresses) == sorted(cluster.hosts)
        assert pool.config.seeds[0].address == cluster.hosts[0]
        assert not pool.config.share_state


def test_async_pool_discovers(cluster: ClusterBase) -> None:
    async def run() -> list[str]:
        pool = clickhouse_lb.get_async_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster")
        try:
            assert (await pool.query("SELECT 1")).result_rows == [(1,)]
            return pool.addresses
        finally:
            await pool.close()

    assert sorted(asyncio.run(run())) == sorted(cluster.hosts)


def test_sqlalchemy_url_discovers(cluster: ClusterBase) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    # Each DB-API connection is pinned to one replica: a new one per statement, round robin.
    url = f"clickhousedb+lb://default@{cluster.hosts[0]}/default?cluster=lb_cluster&load_balancing=round_robin"
    engine = create_engine(url, poolclass=NullPool)
    try:
        answered = set()
        for _ in range(3 * len(cluster.hosts)):
            with engine.connect() as connection:
                answered.add(connection.execute(text(WHO)).scalar())
        assert len(answered) == len(cluster.hosts)
    finally:
        engine.dispose()


# -- the set changing at run time ------------------------------------------------------------

#: Generous bound for a refresh every 100 ms to be seen on a loaded 2-core machine; without
#: refreshes the set would never change.
BOUND = 10.0


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    wait_for(predicate, BOUND, what)


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of our own: these tests change what its system.clusters lists."""
    with LocalCluster(replicas=3) as cluster:
        yield cluster


def test_replicas_added_and_removed_at_run_time(own_cluster: LocalCluster) -> None:
    hosts = own_cluster.hosts
    own_cluster.describe([0, 1])
    try:
        with clickhouse_lb.get_pool(
            hosts=[hosts[0]], cluster="lb_cluster", cluster_discovery_interval_ms=100,
            load_balancing="round_robin", distributed_replica_error_half_life=3600,
        ) as pool:
            assert pool.addresses == hosts[:2]
            pool.query("SELECT 1")  # starts the worker
            for _ in range(3):
                pool.record_error(hosts[1])

            own_cluster.describe()  # replica 2 added
            _wait_for(lambda: pool.addresses == hosts, "replica 2 joins")
            errors = {r.address: r.errors_count for r in pool.replicas}
            assert errors == {hosts[0]: 0, hosts[1]: 3, hosts[2]: 0}
            assert {pool.query(WHO).result_rows[0][0] for _ in range(6)} == {own_cluster.names[0], own_cluster.names[2]}

            own_cluster.describe([1, 2])  # replica 0 (also the seed) removed
            _wait_for(lambda: pool.addresses == hosts[1:], "replica 0 leaves")
            assert {r.address: r.errors_count for r in pool.replicas} == {hosts[1]: 3, hosts[2]: 0}
            assert {pool.query(WHO).result_rows[0][0] for _ in range(4)} == {own_cluster.names[2]}
    finally:
        own_cluster.describe()


def test_a_statement_in_flight_on_a_removed_replica_completes(own_cluster: LocalCluster) -> None:
    hosts = own_cluster.hosts
    own_cluster.describe()
    try:
        with clickhouse_lb.get_pool(
            hosts=hosts[:1], cluster="lb_cluster", cluster_discovery_interval_ms=100, load_balancing="in_order"
        ) as pool:
            result: list[Any] = []
            who = "SELECT sleep(1), getMacro('replica')"
            slow = threading.Thread(target=lambda: result.append(pool.query(who).result_rows))
            slow.start()
            _wait_for(lambda: pool.replicas[0].in_flight == 1, "the statement runs on replica 0")
            own_cluster.describe([1, 2])
            _wait_for(lambda: pool.addresses == hosts[1:], "replica 0 leaves")
            slow.join(BOUND)
            assert result
            assert result[0][0][1] == own_cluster.names[0]
    finally:
        own_cluster.describe()


def test_async_pool_follows_the_set(own_cluster: LocalCluster) -> None:
    hosts = own_cluster.hosts
    own_cluster.describe([0])

    async def run() -> None:
        pool = clickhouse_lb.get_async_pool(hosts=hosts[:1], cluster="lb_cluster", cluster_discovery_interval_ms=100)
        try:
            assert pool.addresses == hosts[:1]
            await pool.query("SELECT 1")
            own_cluster.describe([1, 2])
            deadline = time.monotonic() + BOUND
            while pool.addresses != hosts[1:]:
                assert time.monotonic() < deadline, "the async pool did not follow the set"
                await asyncio.sleep(0.02)
            assert {(await pool.query(WHO)).result_rows[0][0] for _ in range(4)} <= set(own_cluster.names[1:])
        finally:
            await pool.close()

    try:
        asyncio.run(run())
    finally:
        own_cluster.describe()


def test_describe_changes_what_system_clusters_lists(own_cluster: LocalCluster) -> None:
    try:
        own_cluster.describe([2, 0])
        assert own_cluster.described == [0, 2]
        rows = own_cluster.client(1).query(
            "SELECT host_name, port FROM system.clusters WHERE cluster = 'lb_cluster' ORDER BY replica_num"
        ).result_rows
        assert [f"{h}:{p}" for h, p in rows] == [own_cluster.hosts[0], own_cluster.hosts[2]]
        with pytest.raises(ValueError, match=r"no replica 3; valid indices 0\.\.2"):
            own_cluster.describe([3])
    finally:
        own_cluster.describe()
    assert own_cluster.described == [0, 1, 2]


def test_discovered_replicas_keep_every_option_the_user_gave(cluster: ClusterBase) -> None:
    """Issue 23: discovery re-derived the pool's timeouts from options it had taken out, so the
    discovered replicas' clients waited 300 s (clickhouse-connect's default) instead of 7."""
    with clickhouse_lb.get_pool(
        hosts=[cluster.hosts[1]], cluster="lb_cluster", load_balancing="round_robin",
        send_receive_timeout=7, connect_timeout_with_failover_ms=2500, settings={"max_threads": 3},
    ) as pool:
        assert sorted(pool.addresses) == sorted(cluster.hosts)
        answers = {pool.query("SELECT getMacro('replica'), getSetting('max_threads')").result_rows[0]
                   for _ in range(3 * len(cluster.hosts))}
        assert len({who for who, _ in answers}) == len(cluster.hosts)  # every replica answered ...
        assert {int(threads) for _, threads in answers} == {3}  # ... with the server setting given
        timeouts = {(slot.client.timeout.connect_timeout, slot.client.timeout.read_timeout)
                    for slot in pool._view.slots}
        assert timeouts == {(2.5, 7.0)}  # and every replica's client with the timeouts given
        assert pool.config.attempts.timeouts.receive == 7.0


def test_async_discovered_replicas_keep_the_timeouts_given(cluster: ClusterBase) -> None:
    async def run() -> tuple[float | None, float | None]:
        pool = clickhouse_lb.get_async_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster", send_receive_timeout=7)
        try:
            assert (await pool.query("SELECT 1")).result_rows == [(1,)]
            assert len(pool.addresses) == len(cluster.hosts)
            timeouts = pool.config.attempts.timeouts
            return timeouts.send, timeouts.receive
        finally:
            await pool.close()

    assert asyncio.run(run()) == (7.0, 7.0)

"""Discovery from ``system.clusters`` against the local cluster: the pool finds every replica
from one seed, survives a seed that is down, and follows replicas added and removed at run time."""

from __future__ import annotations

import asyncio
import socket

import pytest

import clickhouse_lb
from clickhouse_lb.discovery import DiscoveryError
from clickhouse_lb.testing import ClusterBase

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

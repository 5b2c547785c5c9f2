"""``cluster_host_map``: discovery reaches replicas that ``system.clusters`` lists under names
the pool cannot reach (servers in a Docker network list ``ch-1:9000``, reached from the host
at ``127.0.0.1:8123``). The local cluster lists such names with ``advertised_hosts``."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

import clickhouse_lb
from clickhouse_lb.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WHO = "SELECT getMacro('replica')"
INSIDE = ["ch-1:9000", "ch-2:9000", "ch-3:9000"]
# 9000 is the native port: the port rule maps it to HTTP 8123, the key the map is written with.
LISTED = ["ch-1:8123", "ch-2:8123", "ch-3:8123"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(replicas=3, advertised_hosts=INSIDE) as local:
        yield local


def test_system_clusters_lists_the_inside_names(cluster: LocalCluster) -> None:
    rows = cluster.client(0).query(
        "SELECT host_name, port FROM system.clusters WHERE cluster = 'lb_cluster' ORDER BY replica_num"
    ).result_rows
    assert [f"{host}:{port}" for host, port in rows] == INSIDE


def test_without_a_map_discovery_names_replicas_the_pool_cannot_reach(cluster: LocalCluster) -> None:
    with clickhouse_lb.get_pool(
        hosts=cluster.hosts[:1], cluster="lb_cluster", connect_on_create=False, health_check_interval_ms=0
    ) as pool:
        assert pool.addresses == LISTED


def test_the_map_makes_every_discovered_replica_reachable(cluster: LocalCluster) -> None:
    host_map = dict(zip(LISTED, cluster.hosts))
    with clickhouse_lb.get_pool(
        hosts=cluster.hosts[1:2], cluster="lb_cluster", cluster_host_map=host_map, load_balancing="round_robin"
    ) as pool:
        assert pool.addresses == cluster.hosts
        answered = {pool.query(WHO).result_rows[0][0] for _ in range(9)}
        assert answered == {"r1", "r2", "r3"}


def test_the_text_form_works_in_a_dsn_and_a_sqlalchemy_url(cluster: LocalCluster) -> None:
    import sqlalchemy

    text = ",".join(f"{listed}={reached}" for listed, reached in zip(LISTED, cluster.hosts))
    query = f"cluster=lb_cluster&cluster_host_map={quote(text)}&load_balancing=round_robin"
    with clickhouse_lb.get_pool(dsn=f"clickhouse://{cluster.hosts[2]}/default?{query}") as pool:
        assert pool.addresses == cluster.hosts
    engine = sqlalchemy.create_engine(f"clickhousedb+lb://default@{cluster.hosts[0]}/default?{query}")
    try:
        # Unmapped, the discovered ch-N:8123 would not resolve and the statement would fail.
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text(WHO)).scalar() in {"r1", "r2", "r3"}
    finally:
        engine.dispose()


def test_a_sharded_pool_maps_every_shards_replicas() -> None:
    # get_sharded_pool(cluster=...) read the shards without the map: each shard's pool got the
    # listed names, which do not resolve, and its creation check failed.
    listed = ["ch-1:8123", "ch-2:8123"]
    with LocalCluster(shards=2, replicas=1, advertised_hosts=listed) as local:
        host_map = dict(zip(listed, local.hosts))
        with clickhouse_lb.get_sharded_pool(hosts=local.hosts[:1], cluster="lb_cluster",
                                            cluster_host_map=host_map) as sharded:
            assert [shard.addresses for shard in sharded.shards] == [[local.hosts[0]], [local.hosts[1]]]
            assert sharded.shard(2).query("SELECT getMacro('shard')").result_rows == [("02",)]

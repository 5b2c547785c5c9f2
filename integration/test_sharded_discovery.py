"""A sharded pool built from ``cluster=`` follows the cluster: when ``system.clusters`` gains or
loses a shard, or a shard's replicas change, the pool's view is replaced whole on the discovery
interval (shards' pools made or closed, weights re-read), the kept shards keep their pools and
their replicas' error counts, and routed inserts go where the engine's expression says over the
new shards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
from clickhouse_connect.driver.exceptions import ProgrammingError
from waiting import wait_for

import clickhouse_lb
from clickhouse_lb.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "follow_local"
#: Generous bound for a refresh every 100 ms to be seen on a loaded 2-core machine.
BOUND = 15.0


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    wait_for(predicate, BOUND, what)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two shards of two replicas, weights 1 and 3; these tests change what system.clusters lists."""
    with LocalCluster(shards=2, replicas=2, shard_weights=[1, 3]) as cluster:
        yield cluster


@pytest.fixture
def clean(cluster: LocalCluster) -> Iterator[None]:
    cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64) ENGINE = ReplicatedMergeTree ORDER BY id")
    yield
    cluster.describe()
    cluster.query(0, f"DROP TABLE IF EXISTS {TABLE} ON CLUSTER lb_cluster SYNC")


def ids_on(cluster: LocalCluster, i: int) -> list[int]:
    cluster.query(i, f"SYSTEM SYNC REPLICA {TABLE}")
    return [int(x) for x in cluster.query(i, f"SELECT id FROM {TABLE} ORDER BY id").split()]


def engine_positions(cluster: LocalCluster, ids: list[int], weights: list[int]) -> dict[int, int]:
    """The shard position the engine's cityHash64 and the slot rule give each id."""
    slots = [shard for shard, weight in enumerate(weights) for _ in range(weight)]
    listed = ",".join(map(str, ids))
    body = cluster.query(
        0, f"SELECT x, cityHash64(x) % {len(slots)} FROM (SELECT arrayJoin([{listed}]::Array(Int64)) AS x)"
    )
    return {int(x): slots[int(slot)] for x, slot in (line.split("\t") for line in body.splitlines())}


def test_a_shard_added_then_removed_replaces_the_view_and_keeps_the_kept_shards_counts(
    cluster: LocalCluster, clean: None
) -> None:
    hosts = cluster.hosts
    shard_1, shard_2 = cluster.shard_indices(1), cluster.shard_indices(2)
    cluster.describe(shard_1)  # only shard 1 listed
    with clickhouse_lb.get_sharded_pool(
        hosts=[hosts[0]], cluster="lb_cluster", cluster_discovery_interval_ms=100,
        distributed_replica_error_half_life=3600,
    ) as sharded:
        assert sharded.shard_nums == (1,)
        assert sharded.weights == (1,)
        first = sharded.shards[0]
        for _ in range(3):
            first.record_error(hosts[shard_1[1]])
        sharded.insert(TABLE, [[i] for i in range(50)], column_names=["id"], sharding_key="cityHash64(id)")

        cluster.describe()  # shard 2 (weight 3) joins
        _wait_for(lambda: sharded.shard_nums == (1, 2), "shard 2 joins")
        assert sharded.weights == (1, 3)
        assert sharded.shards[0] is first  # kept: the same pool, its counts with it
        assert {r.address: r.errors_count for r in first.replicas}[hosts[shard_1[1]]] == 3
        assert sorted(sharded.shard(2).addresses) == sorted(hosts[i] for i in shard_2)
        ids = list(range(50, 450))
        sharded.insert(TABLE, [[i] for i in ids], column_names=["id"], sharding_key="cityHash64(id)")
        expected = engine_positions(cluster, ids, [1, 3])
        on_2 = sorted(i for i in ids if expected[i] == 1)
        assert on_2
        assert all(ids_on(cluster, i) == on_2 for i in shard_2)
        assert all(ids_on(cluster, i) == sorted(set(range(50)) | {i for i in ids if expected[i] == 0})
                   for i in shard_1)

        removed = sharded.shard(2)
        cluster.describe(shard_1)  # shard 2 removed again
        _wait_for(lambda: sharded.shard_nums == (1,), "shard 2 leaves")
        assert sharded.shards[0] is first
        with pytest.raises(ProgrammingError, match="closed"):  # its pool was closed
            removed.query("SELECT 1")
        sharded.insert(TABLE, [[i] for i in range(1000, 1040)], column_names=["id"], sharding_key="cityHash64(id)")
        assert all(set(range(1000, 1040)) <= set(ids_on(cluster, i)) for i in shard_1)


def test_a_replica_leaving_a_shard_is_followed_by_that_shards_pool(cluster: LocalCluster, clean: None) -> None:
    hosts = cluster.hosts
    shard_1, shard_2 = cluster.shard_indices(1), cluster.shard_indices(2)
    with clickhouse_lb.get_sharded_pool(hosts=[hosts[0]], cluster="lb_cluster",
                                        cluster_discovery_interval_ms=100) as sharded:
        second = sharded.shard(2)
        cluster.describe([*shard_1, shard_2[0]])  # shard 2 keeps one replica
        _wait_for(lambda: second.addresses == [hosts[shard_2[0]]], "shard 2's second replica leaves")
        assert sharded.shard(2) is second
        assert sharded.shard_nums == (1, 2)


def test_the_async_sharded_pool_follows_the_cluster_too(cluster: LocalCluster, clean: None) -> None:
    hosts = cluster.hosts
    shard_1 = cluster.shard_indices(1)

    async def run() -> None:
        cluster.describe(shard_1)
        async with await clickhouse_lb.get_async_sharded_pool(
            hosts=[hosts[0]], cluster="lb_cluster", cluster_discovery_interval_ms=100,
        ) as sharded:
            assert sharded.shard_nums == (1,)
            cluster.describe()
            deadline = time.monotonic() + BOUND
            while sharded.shard_nums != (1, 2):
                assert time.monotonic() < deadline, "shard 2 joins the async pool"
                await asyncio.sleep(0.02)
            assert sharded.weights == (1, 3)
            summary = await sharded.insert(TABLE, [[i] for i in range(200)], column_names=["id"],
                                           sharding_key="cityHash64(id)")
            assert set(summary.rows) == {1, 2}

    asyncio.run(run())


def test_changed_shard_weights_are_seen_and_routed_inserts_follow_them(cluster: LocalCluster, clean: None) -> None:
    """system.clusters' shard_weight changes (remote_servers edited): the view is replaced with
    the new weights, the shards keep their pools, and the next routed insert puts every row on
    the shard the engine's expression and the *new* slots pick; weight 0 gets no rows."""
    hosts = cluster.hosts
    shard_1, shard_2 = cluster.shard_indices(1), cluster.shard_indices(2)
    expected_on: list[set[int]] = [set(), set()]

    def insert_and_expect(ids: list[int], weights: list[int]) -> None:
        summary = sharded.insert(TABLE, [[i] for i in ids], column_names=["id"], sharding_key="cityHash64(id)")
        positions = engine_positions(cluster, ids, weights)
        for position in range(2):
            mine = {i for i in ids if positions[i] == position}
            assert summary.rows.get(position + 1, 0) == len(mine)
            expected_on[position] |= mine

    try:
        with clickhouse_lb.get_sharded_pool(hosts=[hosts[0]], cluster="lb_cluster",
                                            cluster_discovery_interval_ms=100) as sharded:
            assert sharded.weights == (1, 3)
            pools = sharded.shards
            insert_and_expect(list(range(0, 400)), [1, 3])

            cluster.set_shard_weights([3, 1])
            _wait_for(lambda: sharded.weights == (3, 1), "the new weights")
            assert sharded.shards == pools  # kept: same shard numbers, same replicas
            insert_and_expect(list(range(400, 800)), [3, 1])

            cluster.set_shard_weights([0, 2])
            _wait_for(lambda: sharded.weights == (0, 2), "shard 1 weighted 0")
            insert_and_expect(list(range(800, 1000)), [0, 2])
            assert set(range(800, 1000)) <= expected_on[1]  # weight 0: shard 1 gets none of them
        for position, replicas in enumerate((shard_1, shard_2)):
            for i in replicas:
                assert ids_on(cluster, i) == sorted(expected_on[position]), (position, i)
        # Different weights send rows elsewhere: the two first batches' splits are not alike.
        assert len(expected_on[0] & set(range(400))) < len(expected_on[0] & set(range(400, 800)))
    finally:
        cluster.set_shard_weights([1, 3])

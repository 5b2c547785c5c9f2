"""A sharded pool over two shards (each a replicated local cluster of its own, given shard by
shard): inserts routed by sharding key land on the shard the engine's own expression picks,
on every replica of that shard, exactly once, also with a replica killed mid-way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from clickhouse_connect.driver.exceptions import ProgrammingError

import clickhouse_lb
from clickhouse_lb.errors import ShardedInsertError
from clickhouse_lb.testing import LocalCluster

pytestmark = pytest.mark.integration

TABLE = "events_local"
DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (id Int64, name String, v UInt32) "
    "ENGINE = ReplicatedMergeTree ORDER BY id"
)


@pytest.fixture(scope="module")
def shards() -> Iterator[list[LocalCluster]]:
    clusters = [LocalCluster(replicas=2, names=[f"s{s}r1", f"s{s}r2"]) for s in (1, 2)]
    try:
        for cluster in clusters:
            cluster.start()
        yield clusters
    finally:
        for cluster in clusters:
            cluster.close()


@pytest.fixture
def tables(shards: list[LocalCluster]) -> Iterator[None]:
    for cluster in shards:
        for i in range(len(cluster)):
            if not cluster.is_alive(i):
                cluster.restart(i)
        cluster.query(0, f"CREATE TABLE IF NOT EXISTS {TABLE} ON CLUSTER lb_cluster "
                         "(id Int64, name String, v UInt32) ENGINE = ReplicatedMergeTree ORDER BY id")
    yield
    for cluster in shards:
        cluster.query(0, f"DROP TABLE IF EXISTS {TABLE} ON CLUSTER lb_cluster SYNC")


def ids_on(cluster: LocalCluster, i: int) -> list[int]:
    cluster.query(i, f"SYSTEM SYNC REPLICA {TABLE}")
    return [int(x) for x in cluster.query(i, f"SELECT id FROM {TABLE} ORDER BY id").split()]


def engine_shard(cluster: LocalCluster, expression: str, ids: list[int], weights: list[int]) -> dict[int, int]:
    """The shard position ClickHouse's selector gives each id, the hash computed by the engine."""
    total = sum(weights)
    slots = [shard for shard, weight in enumerate(weights) for _ in range(weight)]
    listed = ",".join(map(str, ids))
    body = cluster.query(0, f"SELECT x, {expression} % {total} FROM (SELECT arrayJoin([{listed}]::Array(Int64)) AS x)")
    pairs = [line.split("\t") for line in body.splitlines()]
    return {int(x): slots[int(slot)] for x, slot in pairs}


@pytest.mark.parametrize("expression", ["cityHash64(x)", "sipHash64(x)", "intHash64(x)", "toUInt64(x)"])
def test_rows_land_on_the_shard_the_engine_picks(shards: list[LocalCluster], tables: None, expression: str) -> None:
    key = expression.replace("(x)", "(id)").replace("toUInt64(id)", "id")
    weights = [1, 2]
    ids = list(range(-150, 150))
    rows = [[i, f"n{i}", i % 7] for i in ids]
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], shard_weights=weights) as sharded:
        summary = sharded.insert(TABLE, rows, column_names=["id", "name", "v"], sharding_key=key)
    # Int64 column: the selector takes the value as UInt64 (toUInt64 is that conversion).
    expected = engine_shard(shards[0], expression, ids, weights)
    for position, cluster in enumerate(shards):
        want = sorted(i for i in ids if expected[i] == position)
        assert want, "both shards get rows"
        for replica in range(len(cluster)):
            assert ids_on(cluster, replica) == want, (position, replica)
        assert summary.rows[position + 1] == len(want)
    assert summary.written_rows == len(ids)


def test_columns_are_read_once_and_column_oriented_data_routes_too(shards: list[LocalCluster], tables: None) -> None:
    ids = list(range(100))
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards]) as sharded:
        sharded.insert(TABLE, [ids, [f"n{i}" for i in ids], [0] * 100], column_oriented=True,
                       sharding_key="cityHash64(name)")
    got = sorted(ids_on(shards[0], 0) + ids_on(shards[1], 0))
    assert got == ids
    assert ids_on(shards[0], 0)
    assert ids_on(shards[1], 0)


def test_a_killed_replica_loses_no_acknowledged_row_and_doubles_none(shards: list[LocalCluster], tables: None) -> None:
    acknowledged: list[int] = []
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], health_check_interval_ms=0) as sharded:
        for batch in range(12):
            if batch == 4:
                shards[1].kill(0)  # shard 2's first replica: its parts fail over to the second
            ids = list(range(batch * 50, batch * 50 + 50))
            sharded.insert(TABLE, [[i, "x", 0] for i in ids], column_names=["id", "name", "v"],
                           column_type_names=["Int64", "String", "UInt32"], sharding_key="intHash64(id)")
            acknowledged += ids
    shards[1].restart(0)
    on_shards = [ids_on(cluster, r) for cluster in shards for r in range(len(cluster))]
    assert on_shards[0] == on_shards[1]
    assert on_shards[2] == on_shards[3]
    assert sorted(on_shards[0] + on_shards[2]) == acknowledged  # every row once, none doubled
    assert not set(on_shards[0]) & set(on_shards[2])


def test_a_failed_part_names_itself_and_what_was_written(shards: list[LocalCluster], tables: None) -> None:
    ids = list(range(60))
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], health_check_interval_ms=0,
                                        connect_on_create=False) as sharded:
        for i in range(len(shards[1])):
            shards[1].kill(i)
        with pytest.raises(ShardedInsertError) as raised:
            sharded.insert(TABLE, [[i, "x", 0] for i in ids], column_names=["id", "name", "v"],
                           column_type_names=["Int64", "String", "UInt32"], sharding_key="id",
                           settings={"insert_deduplication_token": "batch-1"})
        error = raised.value
        assert set(error.written) == {1}
        assert set(error.failed) == {2}
        assert error.may_have_been_applied is False  # nothing reached shard 2
        assert "shard 2" in str(error)
        assert "written: shard 1" in str(error)
        # Shard 2's line names the last error of each of its replicas, not a bare heading.
        line = next(x for x in str(error).splitlines() if x.startswith("  shard 2"))
        assert "last error per replica:" in line
        assert all(f"{address}: " in line for address in shards[1].hosts), line
        assert line.endswith("[not applied]")
        for i in range(len(shards[1])):
            shards[1].restart(i)
        # The same insert again, same token: shard 1's part is deduplicated, shard 2's written.
        sharded.insert(TABLE, [[i, "x", 0] for i in ids], column_names=["id", "name", "v"],
                       column_type_names=["Int64", "String", "UInt32"], sharding_key="id",
                       settings={"insert_deduplication_token": "batch-1"})
    assert sorted(ids_on(shards[0], 0) + ids_on(shards[1], 0)) == ids


def test_a_part_clickhouse_connect_refused_before_sending_is_reported_not_applied(
    shards: list[LocalCluster], tables: None
) -> None:
    # Shard 2's part starts with a row of two values for three columns: clickhouse-connect's
    # InsertContext refuses it ("column count does not match", a ProgrammingError) before any
    # request; shard 1's part is written.
    rows = [[0, "a", 0], [1, "b"], [2, "c", 0], [3, "d", 0]]
    with (clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], connect_on_create=False) as sharded,
          pytest.raises(ShardedInsertError) as raised):
        sharded.insert(TABLE, rows, column_names=["id", "name", "v"],
                       column_type_names=["Int64", "String", "UInt32"], sharding_key="id")
    error = raised.value
    assert error.written == {1: 2}
    assert isinstance(error.failed[2], ProgrammingError)
    assert error.may_have_been_applied is False
    line = next(x for x in str(error).splitlines() if x.startswith("  shard 2"))
    assert "column count does not match" in line
    assert line.endswith("[not applied]"), line
    assert ids_on(shards[0], 0) == [0, 2]
    assert ids_on(shards[1], 0) == []


def test_shard_lookup_and_bad_layouts(shards: list[LocalCluster]) -> None:
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], shard_weights=[3, 1],
                                        connect_on_create=False) as sharded:
        assert sharded.shard_nums == (1, 2)
        assert sharded.weights == (3, 1)
        assert sharded.shard(2) is sharded.shards[1]
        with pytest.raises(clickhouse_lb.ConfigurationError, match="shards are 1, 2"):
            sharded.shard(3)
    with pytest.raises(clickhouse_lb.ConfigurationError, match="one weight for each"):
        clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], shard_weights=[1])
    with pytest.raises(clickhouse_lb.ConfigurationError, match="cluster="):
        clickhouse_lb.get_sharded_pool(hosts=shards[0].hosts)


async def test_the_async_sharded_pool_routes_the_same_way(shards: list[LocalCluster], tables: None) -> None:
    ids = list(range(-50, 150))
    weights = [2, 1]
    async with await clickhouse_lb.get_async_sharded_pool(shards=[c.hosts for c in shards],
                                                          shard_weights=weights) as sharded:
        assert isinstance(sharded, clickhouse_lb.AsyncShardedPool)
        summary = await sharded.insert(TABLE, [[i, "a", 0] for i in ids], column_names=["id", "name", "v"],
                                       sharding_key="sipHash64(id)")
    expected = engine_shard(shards[0], "sipHash64(x)", ids, weights)
    for position, cluster in enumerate(shards):
        assert ids_on(cluster, 1) == sorted(i for i in ids if expected[i] == position)
    assert summary.written_rows == len(ids)


def test_discovered_from_a_sharded_cluster_routes_to_every_shards_replicas() -> None:
    """get_sharded_pool(hosts=[seed], cluster=...) reads shards, weights and replicas from
    system.clusters; each row lands on both replicas of the shard the engine's expression picks."""
    weights = [1, 3]
    with LocalCluster(shards=2, replicas=2, shard_weights=weights) as cluster:
        cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                         "ENGINE = ReplicatedMergeTree ORDER BY id")
        with clickhouse_lb.get_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster") as sharded:
            assert sharded.shard_nums == (1, 2)
            assert sharded.weights == (1, 3)
            assert [sorted(p.addresses) for p in sharded.shards] == [sorted(h) for h in cluster.shard_hosts]
            ids = list(range(400))
            sharded.insert(TABLE, [[i, "x", 0] for i in ids], column_names=["id", "name", "v"],
                           sharding_key="cityHash64(id)")
        expected = engine_shard(cluster, "cityHash64(x)", ids, weights)
        for position in range(2):
            want = sorted(i for i in ids if expected[i] == position)
            for i in cluster.shard_indices(position + 1):
                assert ids_on(cluster, i) == want, (position, i)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_a_replica_failing_during_routed_inserts_loses_and_doubles_nothing(fault: str) -> None:
    """LocalCluster(shards=2, replicas=2): a replica of shard 2 killed (or paused) between routed
    inserts; every acknowledged row is on its shard's replicas exactly once, on no other shard."""
    with LocalCluster(shards=2, replicas=2) as cluster:
        cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                         "ENGINE = ReplicatedMergeTree ORDER BY id")
        victim = cluster.shard_indices(2)[0]
        acknowledged: list[int] = []
        with clickhouse_lb.get_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster",
                                            load_balancing="in_order") as sharded:
            for batch in range(10):
                if batch == 3:
                    (cluster.kill if fault == "kill" else cluster.pause)(victim)
                ids = list(range(batch * 40, batch * 40 + 40))
                sharded.insert(TABLE, [[i, "x", 0] for i in ids], column_names=["id", "name", "v"],
                               column_type_names=["Int64", "String", "UInt32"], sharding_key="sipHash64(id)")
                acknowledged += ids
        (cluster.restart if fault == "kill" else cluster.resume)(victim)
        expected = engine_shard(cluster, "sipHash64(x)", acknowledged, [1, 1])
        for position in range(2):
            want = sorted(i for i in acknowledged if expected[i] == position)
            for i in cluster.shard_indices(position + 1):
                assert ids_on(cluster, i) == want, (fault, position, i)


def frame_of(ids: list[int]) -> Any:
    pd = pytest.importorskip("pandas")
    return pd.DataFrame({"id": np.array(ids, dtype=np.int64), "name": [f"n{i}" for i in ids],
                         "v": np.zeros(len(ids), dtype=np.uint32)})


def data_of(kind: str, ids: list[int]) -> Any:
    if kind == "arrow":
        pa = pytest.importorskip("pyarrow")
        return pa.Table.from_pandas(frame_of(ids), preserve_index=False)
    return frame_of(ids)


@pytest.mark.parametrize("kind", ["dataframe", "arrow"])
def test_dataframes_and_arrow_tables_route_as_rows_do_and_a_repeat_with_its_token_doubles_nothing(
    shards: list[LocalCluster], tables: None, kind: str
) -> None:
    ids = list(range(-100, 200))
    weights = [1, 2]
    data = data_of(kind, ids)
    token = {"insert_deduplication_token": f"{kind}-batch"}
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], shard_weights=weights) as sharded:
        insert = sharded.insert_df if kind == "dataframe" else sharded.insert_arrow
        summary = insert(TABLE, data, sharding_key="cityHash64(id)", settings=token)
        again = insert(TABLE, data, sharding_key="cityHash64(id)", settings=token)  # deduplicated part by part
    expected = engine_shard(shards[0], "cityHash64(x)", ids, weights)
    for position, cluster in enumerate(shards):
        want = sorted(i for i in ids if expected[i] == position)
        assert summary.rows[position + 1] == len(want)
        for i in range(len(cluster)):
            assert ids_on(cluster, i) == want, (kind, position, i)  # once each, on its shard's replicas
    assert again.rows == summary.rows


async def test_the_async_sharded_pool_routes_dataframes_and_arrow_tables(
    shards: list[LocalCluster], tables: None
) -> None:
    frame_ids, arrow_ids = list(range(0, 150)), list(range(150, 300))
    async with await clickhouse_lb.get_async_sharded_pool(shards=[c.hosts for c in shards]) as sharded:
        await sharded.insert_df(TABLE, data_of("dataframe", frame_ids), sharding_key="intHash64(id)")
        await sharded.insert_arrow(TABLE, data_of("arrow", arrow_ids), sharding_key="intHash64(id)")
    ids = frame_ids + arrow_ids
    expected = engine_shard(shards[0], "intHash64(x)", ids, [1, 1])
    for position, cluster in enumerate(shards):
        assert ids_on(cluster, 0) == sorted(i for i in ids if expected[i] == position)


def _pairs(sharded: clickhouse_lb.ShardedPool, n: int, start: int) -> int:
    """``n`` routed inserts of two rows (key ``id``: one row on each shard), each followed by a
    read of each row through its shard's pool; how many of the 2n reads saw their row."""
    seen = 0
    for k in range(start, start + 2 * n, 2):
        sharded.insert(TABLE, [[k, "x", 0], [k + 1, "x", 0]], column_names=["id", "name", "v"],
                       column_type_names=["Int64", "String", "UInt32"], sharding_key="id")
        for shard, row in ((1, k), (2, k + 1)):
            seen += sharded.shard(shard).query(f"SELECT count() FROM {TABLE} WHERE id = {row}").result_rows[0][0]
    return seen


def test_read_your_writes_on_a_sharded_pool_reads_each_shards_part_where_it_was_written(
    shards: list[LocalCluster], tables: None
) -> None:
    """Replication delayed on every replica: without read-your-writes a shard's balanced read
    often misses the part just written there; in ``sharded.read_your_writes()`` never."""
    try:
        for cluster in shards:
            for i in range(len(cluster)):
                cluster.delay_replication(i, 600.0)
        with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], load_balancing="round_robin",
                                            health_check_interval_ms=0) as sharded:
            assert 40 - _pairs(sharded, 20, 0) >= 10  # the scenario is real: reads miss without it
            with sharded.read_your_writes():
                assert _pairs(sharded, 50, 1000) == 100
            assert 40 - _pairs(sharded, 20, 5000) >= 10  # the block closed: balanced as before
    finally:
        for cluster in shards:
            cluster.heal()


#: Rows enough for the parts after the first to be taken while the first is written.
LARGE = 60_000


def large_data(kind: str) -> Any:
    ids = np.arange(LARGE, dtype=np.int64)
    names = [f"n{i}" for i in range(LARGE)]
    if kind == "rows":
        return [[i, names[i], i % 7] for i in range(LARGE)]
    if kind == "columns":
        return [ids, names, (ids % 7).astype(np.uint32)]
    frame = frame_of(list(range(LARGE)))
    return frame if kind == "dataframe" else data_of("arrow", list(range(LARGE)))


def assert_large_on_engine_shards(shards: list[LocalCluster], weights: list[int]) -> None:
    """Ids 0..LARGE-1 each on every replica of the shard the engine's cityHash64 picks, once."""
    slots = [shard for shard, weight in enumerate(weights) for _ in range(weight)]
    body = shards[0].query(0, f"SELECT cityHash64(toInt64(number)) % {len(slots)} FROM numbers({LARGE})")
    expected = [slots[int(slot)] for slot in body.split()]
    for position, cluster in enumerate(shards):
        want = [i for i in range(LARGE) if expected[i] == position]
        assert want, "both shards get rows"
        for replica in range(len(cluster)):
            assert ids_on(cluster, replica) == want, (position, replica)


def insert_large(sharded: Any, kind: str, data: Any) -> Any:
    if kind == "dataframe":
        return sharded.insert_df(TABLE, data, sharding_key="cityHash64(id)")
    if kind == "arrow":
        return sharded.insert_arrow(TABLE, data, sharding_key="cityHash64(id)")
    return sharded.insert(TABLE, data, column_names=["id", "name", "v"], sharding_key="cityHash64(id)",
                          column_oriented=kind == "columns")


@pytest.mark.parametrize("kind", ["rows", "columns", "dataframe", "arrow"])
def test_a_large_insert_whose_later_parts_are_taken_while_the_first_is_written_routes_every_row(
    shards: list[LocalCluster], tables: None, kind: str
) -> None:
    weights = [1, 2]
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], shard_weights=weights) as sharded:
        summary = insert_large(sharded, kind, large_data(kind))
    assert summary.written_rows == LARGE
    assert_large_on_engine_shards(shards, weights)


async def test_the_async_sharded_pool_routes_a_large_insert_taken_part_by_part(
    shards: list[LocalCluster], tables: None
) -> None:
    weights = [2, 1]
    async with await clickhouse_lb.get_async_sharded_pool(shards=[c.hosts for c in shards],
                                                          shard_weights=weights) as sharded:
        summary = await insert_large(sharded, "rows", large_data("rows"))
    assert summary.written_rows == LARGE
    assert_large_on_engine_shards(shards, weights)


def test_a_routed_insert_without_column_types_fails_over_from_a_hung_replica(
    shards: list[LocalCluster], tables: None
) -> None:
    # The column types are read from the first shard (create_insert_context), and that read ran
    # outside the attempt watch: a paused replica held every such insert for the whole read
    # timeout (300 s by default).
    with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in shards], load_balancing="in_order",
                                        send_receive_timeout=30, health_check_interval_ms=0) as sharded:
        shards[0].pause(0)
        try:
            started = time.monotonic()
            summary = sharded.insert(TABLE, [[i, "x", 0] for i in range(100)], column_names=["id", "name", "v"],
                                     sharding_key="intHash64(id)")
            assert time.monotonic() - started < 5  # about a second; the paused replica held it 30 s
        finally:
            shards[0].resume(0)
    assert sum(summary.rows.values()) == 100

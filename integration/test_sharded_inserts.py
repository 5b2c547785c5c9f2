"""The insert variants of a sharded pool beyond ``insert``/``insert_df``/``insert_arrow``, against
``LocalCluster(shards=2, replicas=2)``: ``insert_df_arrow`` (pandas Arrow dtypes, polars) and
inserts with a prepared ``InsertContext`` are routed (each row on both replicas of the shard the
engine's expression picks, exactly once), ``raw_insert`` is refused with the alternatives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import clickhouse_lb
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "variants_local"
WEIGHTS = [1, 2]
NAMES = ["id", "name", "v"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(shards=2, replicas=2, shard_weights=WEIGHTS) as cluster:
        yield cluster


@pytest.fixture
def sharded(cluster: LocalCluster) -> Iterator[clickhouse_lb.ShardedPool]:
    cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        with clickhouse_lb.get_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster") as pool:
            yield pool
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {TABLE} ON CLUSTER lb_cluster SYNC")


def ids_on(cluster: LocalCluster, i: int) -> list[int]:
    cluster.query(i, f"SYSTEM SYNC REPLICA {TABLE}")
    return [int(x) for x in cluster.query(i, f"SELECT id FROM {TABLE} ORDER BY id").split()]


def assert_on_engine_shards(cluster: LocalCluster, expression: str, ids: list[int]) -> None:
    """Every id on both replicas of the shard the engine's ``expression`` and the slot rule
    pick, once, and on no other shard."""
    slots = [shard for shard, weight in enumerate(WEIGHTS) for _ in range(weight)]
    listed = ",".join(map(str, ids))
    body = cluster.query(
        0, f"SELECT x, {expression} % {len(slots)} FROM (SELECT arrayJoin([{listed}]::Array(Int64)) AS x)"
    )
    expected = {int(x): slots[int(slot)] for x, slot in (line.split("\t") for line in body.splitlines())}
    for position in range(2):
        want = sorted(i for i in ids if expected[i] == position)
        assert want, "both shards get rows"
        for replica in cluster.shard_indices(position + 1):
            assert ids_on(cluster, replica) == want, (position, replica)


def arrow_frame(ids: list[int]) -> Any:
    import pandas as pd
    import pyarrow as pa

    return pd.DataFrame({"id": pd.array(ids, dtype="int64[pyarrow]"),
                         "name": pd.array([f"n{i}" for i in ids], dtype=pd.ArrowDtype(pa.string())),
                         "v": pd.array([i % 5 for i in ids], dtype="uint32[pyarrow]")})


def polars_frame(ids: list[int]) -> Any:
    import polars as pl  # (the test extra has it: a missing polars fails, it does not skip)
    return pl.DataFrame({"id": pl.Series(ids, dtype=pl.Int64), "name": [f"n{i}" for i in ids],
                         "v": pl.Series([i % 5 for i in ids], dtype=pl.UInt32)})


@pytest.mark.parametrize("kind", ["pandas-arrow", "polars"])
def test_insert_df_arrow_routes_as_the_engine_would_and_a_repeat_with_its_token_doubles_nothing(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool, kind: str
) -> None:
    ids = list(range(-120, 180))
    frame = arrow_frame(ids) if kind == "pandas-arrow" else polars_frame(ids)
    token = {"insert_deduplication_token": f"{kind}-batch"}
    summary = sharded.insert_df_arrow(TABLE, frame, sharding_key="cityHash64(id)", settings=token)
    again = sharded.insert_df_arrow(TABLE, frame, sharding_key="cityHash64(id)", settings=token)
    assert summary.written_rows == len(ids)
    assert again.rows == summary.rows
    assert_on_engine_shards(cluster, "cityHash64(x)", ids)
    names = cluster.query(cluster.shard_indices(2)[0], f"SELECT DISTINCT name FROM {TABLE} WHERE id = 7")
    assert names.strip() == "n7"  # the other columns travel with their row


def test_insert_df_arrow_refuses_a_frame_without_arrow_dtypes_before_writing_anything(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool
) -> None:
    import pandas as pd
    frame = pd.DataFrame({"id": np.arange(10, dtype=np.int64), "name": ["x"] * 10, "v": np.zeros(10, np.uint32)})
    with pytest.raises(ConfigurationError, match=r"PyArrow dtypes.*id, name, v.*insert_df"):
        sharded.insert_df_arrow(TABLE, frame, sharding_key="id")
    assert all(ids_on(cluster, i) == [] for i in range(len(cluster)))


@pytest.mark.parametrize("how", ["insert", "data_insert", "column_oriented", "insert_df"])
def test_a_prepared_insert_context_is_routed_and_left_empty_for_the_next_batch(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool, how: str
) -> None:
    context = sharded.shards[0].create_insert_context(TABLE, NAMES, column_oriented=how == "column_oriented")
    batches = [list(range(0, 150)), list(range(150, 300))]
    for ids in batches:
        rows = [[i, f"n{i}", 0] for i in ids]
        if how == "insert":
            summary = sharded.insert(data=rows, context=context, sharding_key="sipHash64(id)")
        elif how == "data_insert":
            context.data = rows
            summary = sharded.data_insert(context, sharding_key="sipHash64(id)")
        elif how == "insert_df":
            import pandas as pd
            frame = pd.DataFrame({"id": np.array(ids, dtype=np.int64), "name": [f"n{i}" for i in ids],
                                  "v": np.zeros(len(ids), dtype=np.uint32)})
            summary = sharded.insert_df(df=frame, context=context, sharding_key="sipHash64(id)")
        else:
            columns = [ids, [f"n{i}" for i in ids], [0] * len(ids)]
            summary = sharded.insert(data=columns, context=context, sharding_key="sipHash64(id)")
        assert summary.written_rows == len(ids)
        assert context.empty  # reusable, as after clickhouse-connect's own insert
    assert_on_engine_shards(cluster, "sipHash64(x)", batches[0] + batches[1])


def test_a_context_with_a_token_gives_each_part_its_own_and_a_repeat_doubles_nothing(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool
) -> None:
    context = sharded.shards[1].create_insert_context(
        TABLE, NAMES, settings={"insert_deduplication_token": "ctx-batch"}
    )
    ids = list(range(200))
    rows = [[i, "x", 0] for i in ids]
    first = sharded.insert(data=rows, context=context, sharding_key="intHash64(id)")
    again = sharded.insert(data=rows, context=context, sharding_key="intHash64(id)")
    assert again.rows == first.rows
    assert context.settings == {"insert_deduplication_token": "ctx-batch"}  # the caller's context unchanged
    assert_on_engine_shards(cluster, "intHash64(x)", ids)


def test_a_context_holding_data_and_given_data_too_is_refused(sharded: clickhouse_lb.ShardedPool) -> None:
    context = sharded.shards[0].create_insert_context(TABLE, NAMES, data=[[1, "x", 0]])
    with pytest.raises(ConfigurationError, match="non-empty insert context"):
        sharded.insert(data=[[2, "y", 0]], context=context, sharding_key="id")


async def test_the_async_sharded_pool_routes_df_arrow_and_contexts(cluster: LocalCluster) -> None:
    cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        async with await clickhouse_lb.get_async_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster") as pool:
            await pool.insert_df_arrow(TABLE, polars_frame(list(range(100))), sharding_key="cityHash64(id)")
            context = await pool.shards[0].create_insert_context(TABLE, NAMES)
            await pool.insert(data=[[i, "x", 0] for i in range(100, 200)], context=context,
                              sharding_key="cityHash64(id)")
            with pytest.raises(ConfigurationError, match=r"raw_insert cannot be routed.*shard\(n\)\.raw_insert"):
                await pool.raw_insert(TABLE, NAMES, b"1\tx\t0\n", fmt="TabSeparated")
        assert_on_engine_shards(cluster, "cityHash64(x)", list(range(200)))
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {TABLE} ON CLUSTER lb_cluster SYNC")


def test_raw_insert_is_refused_naming_the_alternatives_and_writes_nothing(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        sharded.raw_insert(TABLE, NAMES, b"1\tx\t0\n", fmt="TabSeparated")
    message = str(raised.value)
    assert "parsed" in message
    assert "sharded.shard(n).raw_insert" in message
    assert "insert_arrow()" in message
    assert all(ids_on(cluster, i) == [] for i in range(len(cluster)))
    # The alternative it names works: one shard's pool writes the bytes as they are.
    sharded.shard(2).raw_insert(TABLE, NAMES, b"1\tx\t0\n", fmt="TabSeparated")
    assert all(ids_on(cluster, i) == [1] for i in cluster.shard_indices(2))


NARROW = "narrow_key_local"


def _count_describes(pool: clickhouse_lb.ShardedPool) -> list[str]:
    """The tables each shard pool was asked to describe (a spy on the real call)."""
    asked: list[str] = []
    for shard in pool.shards:
        real = shard.create_insert_context

        def spy(table: str, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            asked.append(table)
            return _real(table, *args, **kwargs)

        shard.create_insert_context = spy  # type: ignore[method-assign]
    return asked


@pytest.mark.parametrize("cache_ms", [60_000, 0])
def test_an_arrow_insert_remembers_the_tables_key_type_not_arrows_and_routes_the_next_batch_as_the_engine(
    cluster: LocalCluster, cache_ms: int
) -> None:
    """The key column is Int32 in the table and int64 in the Arrow data: a negative id hashes
    differently by width, so a batch routed by Arrow's type would land on the wrong shard."""
    pa = pytest.importorskip("pyarrow")
    cluster.query(0, f"CREATE TABLE {NARROW} ON CLUSTER lb_cluster (id Int32, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    batches = [list(range(-300, -150)), list(range(-150, 0)), list(range(0, 150))]
    try:
        with clickhouse_lb.get_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster",
                                            sharding_key_type_cache_ms=cache_ms) as sharded:
            asked = _count_describes(sharded)
            for ids in batches[:2]:
                sharded.insert_arrow(NARROW, pa.table({"id": pa.array(ids, pa.int64()), "v": [0] * len(ids)}),
                                     sharding_key="cityHash64(id)")
            assert asked == [NARROW] * (1 if cache_ms else 2)  # read once while remembered
            sharded.forget_key_types()
            ids = batches[2]
            sharded.insert_arrow(NARROW, pa.table({"id": pa.array(ids, pa.int64()), "v": [0] * len(ids)}),
                                 sharding_key="cityHash64(id)")
            assert asked == [NARROW] * (2 if cache_ms else 3)  # forgotten: read again
        every = [i for batch in batches for i in batch]
        slots = [shard for shard, weight in enumerate(WEIGHTS) for _ in range(weight)]
        body = cluster.query(0, f"SELECT x, cityHash64(toInt32(x)) % {len(slots)} "
                                f"FROM (SELECT arrayJoin([{','.join(map(str, every))}]::Array(Int64)) AS x)")
        expected = {int(x): slots[int(s)] for x, s in (line.split("\t") for line in body.splitlines())}
        for position in range(2):
            want = sorted(i for i in every if expected[i] == position)
            for replica in cluster.shard_indices(position + 1):
                cluster.query(replica, f"SYSTEM SYNC REPLICA {NARROW}")
                got = [int(x) for x in cluster.query(replica, f"SELECT id FROM {NARROW} ORDER BY id").split()]
                assert got == want, (position, replica)
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {NARROW} ON CLUSTER lb_cluster SYNC")


async def test_the_async_sharded_pool_remembers_the_key_type_too(cluster: LocalCluster) -> None:
    pa = pytest.importorskip("pyarrow")
    cluster.query(0, f"CREATE TABLE {NARROW} ON CLUSTER lb_cluster (id Int32, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        async with await clickhouse_lb.get_async_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster") as pool:
            asked: list[str] = []
            real = pool.shards[0].create_insert_context

            async def spy(table: str, *args: Any, **kwargs: Any) -> Any:
                asked.append(table)
                return await real(table, *args, **kwargs)

            pool.shards[0].create_insert_context = spy  # type: ignore[method-assign]
            for start in (-100, 0):
                ids = list(range(start, start + 100))
                await pool.insert_arrow(NARROW, pa.table({"id": pa.array(ids, pa.int64()), "v": [0] * 100}),
                                        sharding_key="cityHash64(id)")
        assert asked == [NARROW]
        counts = []
        for replica in (cluster.shard_indices(1)[0], cluster.shard_indices(2)[0]):
            cluster.query(replica, f"SYSTEM SYNC REPLICA {NARROW}")
            counts.append(int(cluster.query(replica, f"SELECT count() FROM {NARROW}").strip()))
        assert sum(counts) == 200
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {NARROW} ON CLUSTER lb_cluster SYNC")


@pytest.mark.parametrize("bad", [-1, "soon", 1.5])
def test_a_bad_key_type_cache_time_is_refused_naming_it_before_any_io(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=rf"sharding_key_type_cache_ms {bad!r}"):
        clickhouse_lb.get_sharded_pool(hosts=["127.0.0.1:1"], cluster="lb_cluster", sharding_key_type_cache_ms=bad)
    with pytest.raises(ConfigurationError, match=rf"sharding_key_type_cache_ms {bad!r}"):
        clickhouse_lb.get_async_sharded_pool(hosts=["127.0.0.1:1"], cluster="lb_cluster",
                                             sharding_key_type_cache_ms=bad)


FIXED = "fixed_key_local"


@pytest.fixture
def fixed_table(cluster: LocalCluster) -> Iterator[str]:
    cluster.query(0, f"CREATE TABLE {FIXED} ON CLUSTER lb_cluster (k FixedString(4), n UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY n")
    try:
        yield FIXED
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {FIXED} ON CLUSTER lb_cluster SYNC")


def assert_stored_where_the_engine_hashes_them(cluster: LocalCluster, table: str, expression: str, rows: int) -> None:
    """Every stored row on both replicas of the shard the engine's ``expression`` of the
    stored value picks (the slot rule of WEIGHTS), and ``rows`` rows in all."""
    slots = [shard for shard, weight in enumerate(WEIGHTS) for _ in range(weight)]
    total = 0
    for position in range(2):
        for replica in cluster.shard_indices(position + 1):
            cluster.query(replica, f"SYSTEM SYNC REPLICA {table}")
            body = cluster.query(replica, f"SELECT n, {expression} % {len(slots)} FROM {table} ORDER BY n")
            pairs = [line.split("\t") for line in body.splitlines()]
            assert pairs, "both shards get rows"
            assert {slots[int(slot)] for _, slot in pairs} == {position}, (position, replica, pairs)
        total += len(pairs)
    assert total == rows


@pytest.mark.parametrize("function", ["cityHash64", "sipHash64"])
def test_fixed_string_keys_shorter_than_n_land_where_the_engine_hashes_the_padded_value(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool, fixed_table: str, function: str
) -> None:
    import pyarrow as pa

    keys = ["ab", "x", "abc", "", "zz", "k1", "abcd", "\u00e9", "q"] * 4
    sharded.insert(fixed_table, [[k, i] for i, k in enumerate(keys)], column_names=["k", "n"],
                   sharding_key=f"{function}(k)")
    arrow = pa.table({"k": pa.array(keys), "n": pa.array(range(100, 100 + len(keys)), pa.uint32())})
    sharded.insert_arrow(fixed_table, arrow, sharding_key=f"{function}(k)")
    assert_stored_where_the_engine_hashes_them(cluster, fixed_table, f"{function}(k)", 2 * len(keys))


def test_a_fixed_string_key_longer_than_n_is_refused_before_any_part_is_written(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool, fixed_table: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"'abcde': 5 bytes, longer than its FixedString\(4\)"):
        sharded.insert(fixed_table, [["ab", 1], ["abcde", 2], ["x", 3]], column_names=["k", "n"],
                       sharding_key="cityHash64(k)")
    assert all(cluster.query(i, f"SELECT count() FROM {fixed_table}").strip() == "0" for i in range(len(cluster)))


#: Column-oriented data whose columns differ in length (id, name, v), and the lengths named.
UNEVEN = {
    "a value column longer": ([[1, 2], ["a", "b", "c"], [0, 0, 0]], "id: 2, name: 3, v: 3"),
    "the key column longer": ([[1, 2, 3], ["a", "b"], [0, 0, 0]], "id: 3, name: 2, v: 3"),
    "NumPy columns": ([np.arange(4, dtype=np.int64), np.array(["a", "b"], dtype=object), np.zeros(4, np.uint32)],
                      "id: 4, name: 2, v: 4"),
}


@pytest.mark.parametrize("case", list(UNEVEN))
@pytest.mark.parametrize("given_types", [False, True])
def test_columns_of_different_lengths_are_refused_naming_each_before_anything_is_written(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool, case: str, given_types: bool
) -> None:
    columns, lengths = UNEVEN[case]
    types = {"column_type_names": ["Int64", "String", "UInt32"]} if given_types else {}
    with pytest.raises(ConfigurationError, match=f"columns differ in length \\({lengths}\\)"):
        sharded.insert(TABLE, columns, NAMES, column_oriented=True, sharding_key="id", **types)
    assert all(ids_on(cluster, i) == [] for i in range(len(cluster)))


async def test_the_async_sharded_pool_refuses_columns_of_different_lengths_too(cluster: LocalCluster) -> None:
    cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        async with await clickhouse_lb.get_async_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster") as pool:
            for columns, lengths in UNEVEN.values():
                with pytest.raises(ConfigurationError, match=f"columns differ in length \\({lengths}\\)"):
                    await pool.insert(TABLE, columns, NAMES, column_oriented=True, sharding_key="cityHash64(id)")
        assert all(ids_on(cluster, i) == [] for i in range(len(cluster)))
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {TABLE} ON CLUSTER lb_cluster SYNC")


def rows_on(cluster: LocalCluster, i: int, table: str) -> str:
    cluster.query(i, f"SYSTEM SYNC REPLICA {table}")
    return cluster.query(i, f"SELECT id, name, v FROM {table} ORDER BY id")


def plain_frame(ids: list[int]) -> Any:
    import pandas as pd

    return pd.DataFrame({"id": np.array(ids, dtype=np.int64), "name": [f"n{i}" for i in ids],
                         "v": np.array([i % 7 for i in ids], dtype=np.uint32)})


@pytest.mark.parametrize("given", ["nothing", "column_names", "column_names and types"])
def test_a_dataframe_given_to_insert_lands_as_insert_df_puts_it(
    cluster: LocalCluster, sharded: clickhouse_lb.ShardedPool, given: str
) -> None:
    twin = "frame_twin_local"
    cluster.query(0, f"CREATE TABLE {twin} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        ids = list(range(-60, 60))
        frame = plain_frame(ids)
        kwargs: dict[str, Any] = {
            "nothing": {}, "column_names": {"column_names": NAMES},
            "column_names and types": {"column_names": NAMES, "column_type_names": ["Int64", "String", "UInt32"]},
        }[given]
        summary = sharded.insert(TABLE, frame, sharding_key="intHash64(id)", **kwargs)
        expected = sharded.insert_df(twin, frame, sharding_key="intHash64(id)", **kwargs)
        assert summary.rows == expected.rows
        assert summary.written_rows == len(ids)
        assert [rows_on(cluster, i, TABLE) for i in range(len(cluster))] == [
            rows_on(cluster, i, twin) for i in range(len(cluster))]
        assert_on_engine_shards(cluster, "intHash64(x)", ids)
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {twin} ON CLUSTER lb_cluster SYNC")


async def test_the_async_sharded_pool_routes_a_dataframe_given_to_insert(cluster: LocalCluster) -> None:
    cluster.query(0, f"CREATE TABLE {TABLE} ON CLUSTER lb_cluster (id Int64, name String, v UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        async with await clickhouse_lb.get_async_sharded_pool(hosts=[cluster.hosts[0]], cluster="lb_cluster") as pool:
            summary = await pool.insert(TABLE, plain_frame(list(range(100))), sharding_key="cityHash64(id)")
        assert summary.written_rows == 100
        assert_on_engine_shards(cluster, "cityHash64(x)", list(range(100)))
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {TABLE} ON CLUSTER lb_cluster SYNC")

"""LocalCluster(shards=2, replicas=2): shards, their replication, ON CLUSTER, macros, faults;
concurrent replicated inserts (behaviour only: their timings are bench/bench_replication.py's);
system.tables for replicated tables; the applier's batches through a crash.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from clickhouse_lb.testing import LocalCluster

pytestmark = pytest.mark.integration

WEIGHTS = [1, 2]


@pytest.fixture(scope="module")
def sharded() -> Iterator[LocalCluster]:
    with LocalCluster(shards=2, replicas=2, shard_weights=WEIGHTS) as cluster:
        yield cluster


@pytest.fixture
def cluster(sharded: LocalCluster) -> Iterator[LocalCluster]:
    sharded.heal()
    yield sharded
    sharded.heal()


@pytest.fixture
def table(cluster: LocalCluster) -> Iterator[str]:
    """A fresh ReplicatedMergeTree table on every process (default path: one per shard)."""
    name = f"sh_{uuid.uuid4().hex[:10]}"
    cluster.query(
        0,
        f"CREATE TABLE {name} ON CLUSTER lb_cluster (w UInt32, k UInt32) ENGINE = ReplicatedMergeTree ORDER BY w",
    )
    yield name
    cluster.heal()
    cluster.query(0, f"DROP TABLE IF EXISTS {name} ON CLUSTER lb_cluster SYNC")


def rows(cluster: LocalCluster, i: int, table: str) -> list[tuple[int, int]]:
    return [tuple(r) for r in cluster.client(i).query(f"SELECT w, k FROM {table} ORDER BY w, k").result_rows]


def caught_up(cluster: LocalCluster, i: int, timeout: float = 30.0) -> None:
    """Until replica ``i`` has processed every log entry (those of other shards' tables too,
    which change nothing there): only then does "not there" mean "never coming"."""
    deadline = time.monotonic() + timeout
    while True:
        state = cluster.replication_state(i)
        if state["applied"] == state["log_end"] and state["queue"] == 0:
            return
        assert time.monotonic() < deadline, f"replica {i} did not catch up: {state}"
        time.sleep(0.02)


def sync_shard(cluster: LocalCluster, shard: int, table: str) -> None:
    for i in cluster.shard_indices(shard):
        cluster.query(i, f"SYSTEM SYNC REPLICA {table}")


# -- layout ------------------------------------------------------------------------------------
def test_processes_are_in_shard_order_with_accessors(cluster: LocalCluster) -> None:
    assert len(cluster) == 4
    assert cluster.names == ["r1", "r2", "r3", "r4"]
    assert [cluster.shard_of(i) for i in range(4)] == [1, 1, 2, 2]
    assert cluster.shard_indices(1) == [0, 1]
    assert cluster.shard_indices(2) == [2, 3]
    assert cluster.shard_hosts == [cluster.hosts[:2], cluster.hosts[2:]]
    assert (cluster.shards, cluster.replicas_per_shard, cluster.shard_weights) == (2, 2, WEIGHTS)
    with pytest.raises(ValueError, match=r"no shard 3; valid shards 1\.\.2"):
        cluster.shard_indices(3)
    with pytest.raises(IndexError, match=r"no replica 4"):
        cluster.shard_of(4)


def test_system_clusters_lists_every_replica_with_shard_replica_and_weight(cluster: LocalCluster) -> None:
    expected = []
    for i, host in enumerate(cluster.hosts):
        address, port = host.rsplit(":", 1)
        shard = cluster.shard_of(i)
        expected.append((shard, f"{shard:02d}", WEIGHTS[shard - 1], i % 2 + 1, address, int(port)))
    for i in range(len(cluster)):
        listed = cluster.client(i).query(
            "SELECT shard_num, shard_name, shard_weight, replica_num, host_address, port, is_local "
            "FROM system.clusters WHERE cluster = 'lb_cluster' ORDER BY shard_num, replica_num"
        )
        assert [tuple(r[:6]) for r in listed.result_rows] == expected, i
        assert [r[6] for r in listed.result_rows] == [int(j == i) for j in range(4)], i


def test_describe_renumbers_like_a_changed_remote_servers(cluster: LocalCluster) -> None:
    try:
        cluster.describe([1, 2, 3])  # shard 1 keeps one replica, now replica_num 1
        listed = cluster.client(3).query(
            "SELECT shard_num, replica_num, shard_weight FROM system.clusters ORDER BY shard_num, replica_num"
        )
        assert listed.result_rows == [(1, 1, 1), (2, 1, 2), (2, 2, 2)]
        cluster.describe([2, 3])  # no replica of shard 1 listed: shard 2 is the first shard
        listed = cluster.client(0).query("SELECT shard_num, shard_weight FROM system.clusters")
        assert listed.result_rows == [(1, 2), (1, 2)]
    finally:
        cluster.describe()


def test_macros_per_process(cluster: LocalCluster) -> None:
    got = [
        tuple(cluster.client(i).query("SELECT getMacro('shard'), getMacro('replica'), displayName()").result_rows[0])
        for i in range(len(cluster))
    ]
    assert got == [("01", "r1", "r1"), ("01", "r2", "r2"), ("02", "r3", "r3"), ("02", "r4", "r4")]


# -- replication within a shard ---------------------------------------------------------------
def test_an_insert_reaches_both_replicas_of_its_shard_and_not_the_other_shard(
    cluster: LocalCluster, table: str
) -> None:
    cluster.client(0).insert(table, [[1, 1]], column_names=["w", "k"])
    cluster.client(3).insert(table, [[2, 2]], column_names=["w", "k"])
    sync_shard(cluster, 1, table)
    sync_shard(cluster, 2, table)
    for i in range(len(cluster)):
        caught_up(cluster, i)
    assert [rows(cluster, i, table) for i in range(4)] == [[(1, 1)], [(1, 1)], [(2, 2)], [(2, 2)]]
    paths = [
        cluster.client(i).query(f"SELECT zookeeper_path, total_replicas FROM system.replicas WHERE table = '{table}'")
        for i in range(4)
    ]
    first, second = (paths[0].result_rows[0], paths[2].result_rows[0])
    assert first[0].endswith("/01")
    assert second[0].endswith("/02")
    assert (first[1], second[1]) == (2, 2)  # each shard's table has its own two replicas


def test_on_cluster_ddl_runs_on_all_replicas_of_all_shards(cluster: LocalCluster, table: str) -> None:
    cluster.query(0, f"ALTER TABLE {table} ON CLUSTER lb_cluster ADD COLUMN extra String DEFAULT 'x'")
    assert [
        cluster.query(i, f"SELECT count() FROM system.columns WHERE table = '{table}'").strip() for i in range(4)
    ] == ["3"] * 4
    plain = f"plain_{uuid.uuid4().hex[:8]}"
    cluster.query(3, f"CREATE TABLE {plain} ON CLUSTER lb_cluster (a UInt8) ENGINE = MergeTree ORDER BY a")
    assert [cluster.query(i, f"EXISTS TABLE {plain}").strip() for i in range(4)] == ["1"] * 4
    cluster.query(2, f"DROP TABLE {plain} ON CLUSTER lb_cluster SYNC")
    assert [cluster.query(i, f"EXISTS TABLE {plain}").strip() for i in range(4)] == ["0"] * 4


def test_a_killed_replica_of_shard_2_catches_up_and_a_paused_one_too(cluster: LocalCluster, table: str) -> None:
    cluster.kill(3)
    cluster.client(2).insert(table, [[5, k] for k in range(3)], column_names=["w", "k"])
    cluster.query(2, f"ALTER TABLE {table} UPDATE k = k + 10 WHERE 1 SETTINGS mutations_sync = 1")
    cluster.client(0).insert(table, [[6, 0]], column_names=["w", "k"])  # shard 1 goes on meanwhile
    assert not cluster.is_alive(3)
    cluster.restart(3)
    cluster.pause(2)
    cluster.client(3).insert(table, [[7, 0]], column_names=["w", "k"])  # shard 2 via its other replica
    cluster.resume(2)
    sync_shard(cluster, 2, table)
    sync_shard(cluster, 1, table)
    expected = [(5, 10), (5, 11), (5, 12), (7, 0)]
    assert rows(cluster, 2, table) == expected
    assert rows(cluster, 3, table) == expected
    assert rows(cluster, 0, table) == rows(cluster, 1, table) == [(6, 0)]


def test_faults_stay_per_process(cluster: LocalCluster, table: str) -> None:
    cluster.stop_replication(3)
    cluster.client(2).insert(table, [[1, 1]], column_names=["w", "k"])
    assert cluster.replication_state(3)["queue"] == 1
    assert rows(cluster, 3, table) == []
    assert all(cluster.replication_state(i)["stopped"] is False for i in (0, 1, 2))
    cluster.start_replication(3)
    sync_shard(cluster, 2, table)
    assert rows(cluster, 3, table) == [(1, 1)]


# -- concurrent inserts -------------------------------------------------------------------------
def test_16_concurrent_writers_land_exactly_once_on_their_shard(cluster: LocalCluster, table: str) -> None:
    writers, per_writer = 16, 15
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers)

    def write(w: int) -> None:
        try:
            host, port = cluster.hosts[w % 4].rsplit(":", 1)
            client = clickhouse_connect.get_client(host=host, port=int(port))
            barrier.wait()
            for k in range(per_writer):
                client.insert(table, [[w, k]], column_names=["w", "k"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    sync_shard(cluster, 1, table)
    sync_shard(cluster, 2, table)
    for shard in (1, 2):
        expected = sorted((w, k) for w in range(writers) if cluster.shard_of(w % 4) == shard for k in range(per_writer))
        for i in cluster.shard_indices(shard):
            got = rows(cluster, i, table)
            assert Counter(got).most_common(1)[0][1] == 1, f"a row twice on replica {i}"
            assert got == expected, i


def test_concurrent_writers_on_a_table_each_with_alters_between_stay_in_step(cluster: LocalCluster) -> None:
    # Inserts run beside each other; an ALTER waits for the ones in flight and is applied
    # everywhere in the same place relative to them (the applier's batches end before it).
    tables = [f"own_{uuid.uuid4().hex[:8]}" for _ in range(4)]
    for name in tables:
        cluster.query(
            0, f"CREATE TABLE {name} ON CLUSTER lb_cluster (w UInt32, k UInt32) ENGINE = ReplicatedMergeTree ORDER BY w"
        )
    cluster.stop_replication(1)  # r2 applies everything at the end, in batches
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            client = cluster.client(0)
            for k in range(12):
                client.insert(tables[n], [[n, k]], column_names=["w", "k"])
                if k % 4 == 3:
                    client.command(
                        f"ALTER TABLE {tables[n]} UPDATE k = k + 100 WHERE k < 100 SETTINGS mutations_sync = 1"
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    cluster.start_replication(1)
    try:
        for name in tables:
            sync_shard(cluster, 1, name)
            assert rows(cluster, 1, name) == rows(cluster, 0, name)
            assert sorted(k for _, k in rows(cluster, 0, name)) == [100 + k for k in range(12)]
    finally:
        for name in tables:
            cluster.query(0, f"DROP TABLE IF EXISTS {name} ON CLUSTER lb_cluster SYNC")


def test_a_replica_killed_inside_a_batch_inserts_it_once_at_restart(cluster: LocalCluster, table: str) -> None:
    cluster.stop_replication(1)
    client = cluster.client(0)
    for k in range(10):
        client.insert(table, [[1, k]], column_names=["w", "k"])
    client.raw_insert(table, ["w", "k"], insert_block=b"2\t0\n2\t1\n", fmt="TabSeparated")
    client.raw_insert(table, ["w", "k"], insert_block=b"2\t2\n", fmt="TabSeparated")
    client.command(f"INSERT INTO {table} VALUES (3, 0)")
    cluster.crash_in_batch(1)
    cluster.start_replication(1)
    deadline = time.monotonic() + 30
    while cluster.is_alive(1):  # the applier's first batch kills it
        assert time.monotonic() < deadline, "replica 1 did not crash in its batch"
        time.sleep(0.02)
    cluster.restart(1)
    sync_shard(cluster, 1, table)
    expected = [(1, k) for k in range(10)] + [(2, 0), (2, 1), (2, 2), (3, 0)]
    assert rows(cluster, 1, table) == expected
    assert rows(cluster, 0, table) == expected
    assert cluster.replication_state(1)["crash_in_batch"] is False


def test_a_write_crashed_before_logging_on_shard_2_is_rolled_forward(cluster: LocalCluster, table: str) -> None:
    cluster.crash_before_logging(2)
    with pytest.raises(OperationalError):
        cluster.client(2).insert(table, [[9, 9]], column_names=["w", "k"])
    cluster.restart(2)
    sync_shard(cluster, 2, table)
    assert rows(cluster, 2, table) == rows(cluster, 3, table) == [(9, 9)]


def test_a_block_run_before_a_crash_and_retried_elsewhere_is_not_doubled_by_a_batch(
    cluster: LocalCluster, table: str
) -> None:
    # Replica 0 runs the block (token t-1) and dies before logging it; the retry on replica 1
    # logs it, with more inserts of the same shape. Replica 0's engine holds t-1 already: the
    # retried entry must reach it alone (under t-1, dropped), not inside a batch's token.
    cluster.crash_before_logging(0)
    with pytest.raises(OperationalError):
        cluster.client(0).insert(
            table, [[1, 1]], column_names=["w", "k"], settings={"insert_deduplication_token": "t-1"}
        )
    other = cluster.client(1)
    other.insert(table, [[1, 1]], column_names=["w", "k"], settings={"insert_deduplication_token": "t-1"})
    for k in range(2, 8):
        other.insert(table, [[1, k]], column_names=["w", "k"])
    cluster.restart(0)
    sync_shard(cluster, 1, table)
    expected = [(1, k) for k in range(1, 8)]
    assert rows(cluster, 0, table) == rows(cluster, 1, table) == expected


def test_a_session_set_of_the_dedup_settings_is_honoured(cluster: LocalCluster, table: str) -> None:
    session = cluster.client(2)  # clickhouse-connect opens a session per client
    session.command("SET insert_deduplicate = 0")
    session.insert(table, [[1, 1]], column_names=["w", "k"])
    session.insert(table, [[1, 1]], column_names=["w", "k"])  # the same block twice: both written
    session.command("SET insert_deduplicate = 1")
    session.command("SET insert_deduplication_token = 'session-token'")
    session.insert(table, [[2, 1]], column_names=["w", "k"])
    session.insert(table, [[2, 2]], column_names=["w", "k"])  # other rows, same token: dropped
    sync_shard(cluster, 2, table)
    assert rows(cluster, 2, table) == rows(cluster, 3, table) == [(1, 1), (1, 1), (2, 1)]


# -- system.tables ------------------------------------------------------------------------------
def test_system_tables_says_replicated_engines(cluster: LocalCluster, table: str) -> None:
    other = f"rr_{uuid.uuid4().hex[:8]}"
    plain = f"pl_{uuid.uuid4().hex[:8]}"
    cluster.query(
        0,
        f"CREATE TABLE {other} ON CLUSTER lb_cluster (a UInt32, v UInt32) "
        f"ENGINE = ReplicatedReplacingMergeTree('/t/{{shard}}/{other}', '{{replica}}', v) ORDER BY a",
    )
    cluster.query(0, f"CREATE TABLE {plain} (a UInt32) ENGINE = MergeTree ORDER BY a")
    try:
        for i in range(len(cluster)):
            listed = cluster.client(i).query(
                f"SELECT name, engine, engine_full FROM system.tables WHERE name IN ('{table}', '{other}', '{plain}')"
            )
            got = {name: (engine, full) for name, engine, full in listed.result_rows}
            assert got[table][0] == "ReplicatedMergeTree"
            assert got[table][1].startswith(
                "ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY"
            )
            assert got[other] == (
                "ReplicatedReplacingMergeTree",
                f"ReplicatedReplacingMergeTree('/t/{{shard}}/{other}', '{{replica}}', v) ORDER BY a "
                "SETTINGS index_granularity = 8192",
            )
            assert "non_replicated_deduplication_window" not in got[table][1]
            if i == 0:
                assert got[plain][0] == "MergeTree"
            else:
                assert plain not in got
        readonly = cluster.client(1, settings={"readonly": 1})
        assert readonly.query(f"SELECT engine FROM system.tables WHERE name = '{table}'").result_rows == [
            ("ReplicatedMergeTree",)
        ]
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {other} ON CLUSTER lb_cluster SYNC")
        cluster.query(0, f"DROP TABLE IF EXISTS {plain}")


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shards": 0}, r"shards must be an integer of at least 1, not 0"),
        ({"replicas": 0}, r"replicas must be an integer of at least 1, not 0"),
        ({"shards": 2, "shard_weights": [1]}, r"one weight per shard \(2\), not 1"),
        ({"shards": 2, "shard_weights": [1, -1]}, r"weight of shard 2 must be an integer >= 0, not -1"),
        ({"shards": 2, "replicas": 1, "names": ["a"]}, r"one entry per replica \(2\), not 1"),
        ({"shards": 2, "replicas": 1, "names": ["a", "a"]}, r"names must be distinct"),
    ],
)
def test_bad_shape_arguments_say_what_is_wrong(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LocalCluster(**kwargs)  # type: ignore[arg-type]

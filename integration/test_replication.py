"""Replication on the test cluster: ReplicatedMergeTree, ON CLUSTER, deduplication, lag, system tables.

Most tests run on either cluster (local or docker); the fault-injection ones (replication delay,
stop, black hole) need the local cluster's control endpoint and skip on Docker.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError
from waiting import wait_for

from clickhouse_lb.core.classify import error_code
from clickhouse_lb.testing import ClusterBase, ClusterError, LocalCluster

pytestmark = pytest.mark.integration


#: Needs a process that runs on time: skipped under tools/busy_machine_tests.py's GIL holder.
on_time_process = pytest.mark.on_time_process


def _local_only(cluster: ClusterBase) -> LocalCluster:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("needs the local cluster's fault injection")
    return cluster


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


@pytest.fixture
def table(cluster: ClusterBase) -> Iterator[str]:
    """A fresh replicated table on every replica (created ON CLUSTER), dropped afterwards."""
    name = f"rep_{uuid.uuid4().hex[:10]}"
    cluster.query(
        0,
        f"CREATE TABLE {name} ON CLUSTER lb_cluster (batch UInt32, x UInt32) "
        "ENGINE = ReplicatedMergeTree ORDER BY batch",
    )
    yield name
    cluster.heal()
    cluster.query(0, f"DROP TABLE IF EXISTS {name} ON CLUSTER lb_cluster SYNC")


def sync_all(cluster: ClusterBase, table: str) -> None:
    for i in range(len(cluster)):
        cluster.query(i, f"SYSTEM SYNC REPLICA {table}")


def counts(cluster: ClusterBase, sql: str) -> list[str]:
    return [cluster.query(i, sql).strip() for i in range(len(cluster))]


def test_on_cluster_create_reaches_every_replica_and_inserts_replicate(cluster: ClusterBase, table: str) -> None:
    # ON CLUSTER waits for every active replica: the table is there at once, everywhere.
    assert counts(cluster, f"EXISTS TABLE {table}") == ["1"] * len(cluster)
    cluster.query(1, f"INSERT INTO {table} VALUES (1, 1), (1, 2)")
    cluster.client(2).insert(table, [[2, 3]], column_names=["batch", "x"])
    sync_all(cluster, table)
    assert counts(cluster, f"SELECT count(), sum(x) FROM {table}") == ["3\t6"] * len(cluster)


def test_alter_truncate_and_delete_replicate(cluster: ClusterBase, table: str) -> None:
    cluster.query(0, f"INSERT INTO {table} VALUES (1, 1), (1, 2), (1, 3)")
    cluster.query(1, f"ALTER TABLE {table} ADD COLUMN note String DEFAULT 'n'")
    cluster.query(2, f"ALTER TABLE {table} DELETE WHERE x = 1 SETTINGS mutations_sync = 1")
    cluster.query(0, f"DELETE FROM {table} WHERE x = 2")
    sync_all(cluster, table)
    assert counts(cluster, f"SELECT groupArray(x), any(note) FROM {table}") == ["[3]\tn"] * len(cluster)
    cluster.query(2, f"TRUNCATE TABLE {table}")
    cluster.query(1, f"INSERT INTO {table} (batch, x) VALUES (9, 9)")
    sync_all(cluster, table)
    assert counts(cluster, f"SELECT groupArray(x) FROM {table}") == ["[9]"] * len(cluster)


def test_drop_on_cluster_drops_everywhere(cluster: ClusterBase) -> None:
    name = f"rep_drop_{uuid.uuid4().hex[:8]}"
    cluster.query(1, f"CREATE TABLE {name} ON CLUSTER lb_cluster (x UInt8) ENGINE = ReplicatedMergeTree ORDER BY x")
    cluster.query(2, f"DROP TABLE {name} ON CLUSTER lb_cluster SYNC")
    assert counts(cluster, f"EXISTS TABLE {name}") == ["0"] * len(cluster)


def test_tables_with_one_keeper_path_are_replicas_and_a_late_one_clones_the_history(cluster: ClusterBase) -> None:
    name = f"rep_path_{uuid.uuid4().hex[:8]}"
    create = (
        f"CREATE TABLE {name} (x UInt32) ENGINE = "
        f"ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{name}', '{{replica}}') ORDER BY x"
    )
    cluster.query(0, create)
    cluster.query(1, create)
    cluster.query(0, f"INSERT INTO {name} VALUES (1), (2)")
    cluster.query(1, f"SYSTEM SYNC REPLICA {name}")
    assert cluster.query(1, f"SELECT sum(x) FROM {name}").strip() == "3"
    cluster.query(2, create)  # joins later: gets what was written before
    cluster.query(2, f"SYSTEM SYNC REPLICA {name}")
    assert cluster.query(2, f"SELECT sum(x) FROM {name}").strip() == "3"
    for i in range(len(cluster)):
        cluster.query(i, f"DROP TABLE {name} SYNC")


def test_a_replica_name_is_registered_once_per_path(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    name = f"rep_twice_{uuid.uuid4().hex[:8]}"
    create = (
        f"CREATE TABLE {name} (x UInt8) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{name}', 'same') ORDER BY x"
    )
    local.query(0, create)
    with pytest.raises(ClusterError, match="REPLICA_ALREADY_EXISTS"):
        local.query(1, create)
    assert local.query(1, f"EXISTS TABLE {name}").strip() == "0"
    local.query(0, f"DROP TABLE {name} SYNC")
    local.query(1, create)  # the path's replica left: the name is free again
    local.query(1, f"DROP TABLE {name} SYNC")


def test_tables_with_different_uuids_do_not_replicate(cluster: ClusterBase) -> None:
    # Without ON CLUSTER each replica's table gets its own {uuid}: separate tables, as in ClickHouse.
    name = f"rep_own_{uuid.uuid4().hex[:8]}"
    cluster.on_all(f"CREATE TABLE {name} (x UInt32) ENGINE = ReplicatedMergeTree ORDER BY x")
    cluster.query(0, f"INSERT INTO {name} VALUES (1)")
    cluster.query(1, f"SYSTEM SYNC REPLICA {name}")
    assert cluster.query(1, f"SELECT count() FROM {name}").strip() == "0"
    paths = counts(cluster, f"SELECT zookeeper_path FROM system.replicas WHERE table = '{name}'")
    assert len(set(paths)) == len(cluster)
    cluster.on_all(f"DROP TABLE {name} SYNC")


def test_system_replicas_reports_macros_and_paths(cluster: ClusterBase, table: str) -> None:
    rows = [
        cluster.query(
            i,
            "SELECT engine, zookeeper_path, replica_name, replica_path, is_readonly, total_replicas, active_replicas "
            f"FROM system.replicas WHERE database = currentDatabase() AND table = '{table}'",
        )
        .strip()
        .split("\t")
        for i in range(len(cluster))
    ]
    assert {row[1] for row in rows} == {rows[0][1]}  # one Keeper path: ON CLUSTER shares the {uuid}
    assert rows[0][1].startswith("/clickhouse/tables/")
    assert rows[0][1].endswith("/01")  # {shard}
    for row, name in zip(rows, cluster.names):
        assert row[0] == "ReplicatedMergeTree"
        assert row[2] == name  # {replica}
        assert row[3] == f"{rows[0][1]}/replicas/{name}"
        assert row[4:] == ["0", str(len(cluster)), str(len(cluster))]


def test_system_clusters_describes_the_cluster(cluster: ClusterBase) -> None:
    expected_ports = {int(h.rpartition(":")[2]) for h in cluster.hosts}
    for i in range(len(cluster)):
        rows = [
            line.split("\t")
            for line in cluster.query(
                i,
                "SELECT cluster, shard_num, replica_num, host_name, port, is_local, errors_count "
                "FROM system.clusters WHERE cluster = 'lb_cluster' ORDER BY replica_num",
            ).splitlines()
        ]
        assert [r[2] for r in rows] == [str(n) for n in range(1, len(cluster) + 1)]
        assert {r[1] for r in rows} == {"1"}
        assert [r[5] for r in rows].count("1") == 1
        if isinstance(cluster, LocalCluster):
            assert [f"{r[3]}:{r[4]}" for r in rows] == cluster.hosts
            assert rows[i][5] == "1"
            assert {int(r[4]) for r in rows} == expected_ports
    types = cluster.query(0, "SELECT toTypeName(port), toTypeName(shard_num) FROM system.clusters LIMIT 1")
    assert types.strip() == "UInt16\tUInt32"
    readonly = cluster.client(1).query("SELECT count() FROM system.clusters", settings={"readonly": 1})
    assert readonly.result_rows == [(len(cluster),)]


def test_unknown_cluster_is_refused(cluster: ClusterBase) -> None:
    with pytest.raises(DatabaseError) as info:
        cluster.client(0).command("CREATE TABLE nowhere ON CLUSTER no_such_cluster (x UInt8) ENGINE = Memory")
    assert error_code(info.value) == 701
    assert "no_such_cluster" in str(info.value)


def test_replicated_database_engine_is_refused_clearly(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    with pytest.raises(DatabaseError) as info:
        local.client(0).command("CREATE DATABASE rdb ENGINE = Replicated('/clickhouse/db/rdb', '{shard}', '{replica}')")
    assert error_code(info.value) == 48
    assert "ON CLUSTER" in str(info.value)


def test_token_deduplicates_across_replicas(cluster: ClusterBase, table: str) -> None:
    for i in (0, 1, 2, 0):
        cluster.client(i).insert(
            table, [[1, 5]], column_names=["batch", "x"], settings={"insert_deduplication_token": "same-token"}
        )
    # Without a token the block's data is its identity: the same block again is a no-op too.
    for i in (2, 1):
        cluster.client(i).insert(table, [[2, 7]], column_names=["batch", "x"])
    # insert_deduplicate = 0: no deduplication at all.
    for i in (0, 1):
        cluster.client(i).insert(table, [[3, 9]], column_names=["batch", "x"], settings={"insert_deduplicate": 0})
    sync_all(cluster, table)
    assert counts(cluster, f"SELECT batch, count() FROM {table} GROUP BY batch ORDER BY batch FORMAT CSV") == [
        "1,1\n2,1\n3,2"
    ] * len(cluster)


def test_insert_select_replicates_its_rows_and_is_not_deduplicated_by_its_text(
    cluster: ClusterBase, table: str
) -> None:
    for i in (0, 1):
        cluster.query(i, f"INSERT INTO {table} SELECT 4, number FROM numbers(3)")
    cluster.query(2, f"INSERT INTO {table} VALUES (5, 1)")
    cluster.query(0, f"INSERT INTO {table} VALUES (5, 1)")  # the same block of VALUES: deduplicated
    sync_all(cluster, table)
    assert counts(cluster, f"SELECT batch, count() FROM {table} GROUP BY batch ORDER BY batch FORMAT CSV") == [
        "4,6\n5,1"
    ] * len(cluster)


def test_acknowledged_insert_survives_sigkill_right_after_the_answer(cluster: ClusterBase, table: str) -> None:
    local = _local_only(cluster)
    local.query(0, f"INSERT INTO {table} VALUES (1, 1)")
    local.kill(0)  # SIGKILL right after the answer
    local.query(1, f"SYSTEM SYNC REPLICA {table}")
    assert local.query(1, f"SELECT count() FROM {table}").strip() == "1"
    local.restart(0)
    local.query(0, f"SYSTEM SYNC REPLICA {table}")
    assert local.query(0, f"SELECT count() FROM {table}").strip() == "1"


def _write_row(client: Any, table: str, how: str, row: int) -> None:
    if how == "command":
        client.command(f"INSERT INTO {table} VALUES ({row}, {row})")
    else:
        settings = {"insert_deduplication_token": f"crash-{row}"} if how == "insert with a token" else {}
        client.insert(table, [[row, row]], column_names=["batch", "x"], settings=settings)


@pytest.mark.parametrize("how", ["insert", "insert with a token", "command"])
def test_a_write_crashed_before_it_was_logged_reaches_every_replica_at_restart(
    cluster: ClusterBase, table: str, how: str
) -> None:
    # SIGKILL after the write ran on replica 0's engine and before it is in the log: without
    # the roll-forward at restart, the row stays on replica 0 only (the chaos test's defect).
    local = _local_only(cluster)
    local.crash_before_logging(0)
    with pytest.raises(OperationalError):  # the connection dies with the replica: no answer
        _write_row(local.client(0), table, how, 7)
    local.restart(0)
    sync_all(local, table)
    assert counts(local, f"SELECT count(), sum(x) FROM {table} FORMAT CSV") == ["1,7"] * len(local)
    assert local.replication_state(0)["crash_before_logging"] is False  # a fault for one write


def test_a_write_retried_elsewhere_after_a_crash_before_logging_is_not_doubled(
    cluster: ClusterBase, table: str
) -> None:
    # The client retries on replica 1 with the same token before replica 0 is back: the write
    # replica 0 rolls forward at restart is then a duplicate and must not be applied twice.
    local = _local_only(cluster)
    local.crash_before_logging(0)
    with pytest.raises(OperationalError):
        _write_row(local.client(0), table, "insert with a token", 8)
    _write_row(local.client(1), table, "insert with a token", 8)
    local.restart(0)
    sync_all(local, table)
    assert counts(local, f"SELECT count(), sum(x) FROM {table} FORMAT CSV") == ["1,8"] * len(local)


def test_killed_and_paused_replicas_catch_up(cluster: ClusterBase, table: str) -> None:
    local = _local_only(cluster)
    local.kill(1)
    local.pause(2)
    local.query(0, f"INSERT INTO {table} VALUES (1, 1), (1, 2)")
    local.query(0, f"ALTER TABLE {table} UPDATE x = x * 10 WHERE 1 SETTINGS mutations_sync = 1")
    local.restart(1)
    local.resume(2)
    sync_all(local, table)
    assert counts(local, f"SELECT sum(x) FROM {table}") == ["30"] * len(local)


def test_delay_replication_is_lag_that_sync_replica_waits_out(cluster: ClusterBase, table: str) -> None:
    local = _local_only(cluster)
    delay = 1.5
    local.delay_replication(2, delay)
    started = time.monotonic()
    local.query(0, f"INSERT INTO {table} VALUES (1, 1)")
    row = local.query(2, f"SELECT count() FROM {table}").strip()
    lag = local.query(2, f"SELECT queue_size, inserts_in_queue FROM system.replicas WHERE table = '{table}'")
    if time.monotonic() - started < delay:  # only meaningful while the delay has not passed
        assert row == "0"
        assert lag.strip() == "1\t1"
    local.query(2, f"SYSTEM SYNC REPLICA {table}")
    assert time.monotonic() - started >= delay
    assert local.query(2, f"SELECT count() FROM {table}").strip() == "1"
    state = local.replication_state(2)
    assert state["delay"] == delay
    assert state["queue"] == 0


def test_absolute_delay_grows_while_replication_is_stopped(cluster: ClusterBase, table: str) -> None:
    local = _local_only(cluster)
    local.stop_replication(1)
    local.query(0, f"INSERT INTO {table} VALUES (1, 1)")
    local.query(0, f"INSERT INTO {table} VALUES (2, 2)")
    time.sleep(1.2)  # the lag to measure, not a synchronisation
    queue_size, delay = local.query(
        1, f"SELECT queue_size, absolute_delay FROM system.replicas WHERE table = '{table}'"
    ).split()
    assert queue_size == "2"
    assert int(delay) >= 1
    assert local.query(1, f"SELECT count() FROM {table}").strip() == "0"
    with pytest.raises(ClusterError, match="TIMEOUT_EXCEEDED"):
        local.query(1, f"SYSTEM SYNC REPLICA {table} SETTINGS receive_timeout = 1")
    local.start_replication(1)
    local.query(1, f"SYSTEM SYNC REPLICA {table}")
    assert local.query(1, f"SELECT count() FROM {table}").strip() == "2"
    assert local.query(1, f"SELECT absolute_delay FROM system.replicas WHERE table = '{table}'").strip() == "0"


def test_system_stop_fetches_stops_replication_like_the_server(cluster: ClusterBase, table: str) -> None:
    local = _local_only(cluster)
    local.query(2, "SYSTEM STOP FETCHES")
    assert local.replication_state(2)["stopped"] is True
    local.query(0, f"INSERT INTO {table} VALUES (1, 1)")
    assert local.query(2, f"SELECT queue_size FROM system.replicas WHERE table = '{table}'").strip() == "1"
    local.query(2, "SYSTEM START FETCHES")
    local.query(2, f"SYSTEM SYNC REPLICA {table}")
    assert local.query(2, f"SELECT count() FROM {table}").strip() == "1"


def test_sync_replica_of_a_plain_table_is_an_error(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    name = f"plain_{uuid.uuid4().hex[:8]}"
    local.query(0, f"CREATE TABLE {name} (x UInt8) ENGINE = MergeTree ORDER BY x")
    with pytest.raises(ClusterError, match="is not replicated"):
        local.query(0, f"SYSTEM SYNC REPLICA {name}")
    local.query(0, f"DROP TABLE {name}")


# -- black hole --------------------------------------------------------------------------------
def _connect_outcome(host: str, port: int, timeout: float) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        return "connected"


def test_blackhole_makes_connect_hang_and_unblackhole_restores(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    host, port = local.address(1)
    local.blackhole(1)
    assert local.is_blackholed(1)
    assert _connect_outcome(host, port, 0.5) == "timeout"
    assert not local.ping(1, timeout=0.5)
    local.unblackhole(1)
    assert _connect_outcome(host, port, 5) == "connected"
    assert local.query(1, "SELECT getMacro('replica')").strip() == "r2"


def test_blackhole_silences_established_connections(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    client = local.client(2, send_receive_timeout=1)
    assert client.command("SELECT 1") == 1  # a keep-alive connection now exists
    local.blackhole(2)
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        client.command("SELECT 1")
    assert time.monotonic() - started >= 0.9  # no answer, no reset: only the read timeout ends it
    local.unblackhole(2)
    assert local.client(2).command("SELECT 2") == 2


def test_blackholed_replica_still_replicates_and_heal_lifts_it(cluster: ClusterBase, table: str) -> None:
    local = _local_only(cluster)
    local.blackhole(2)
    local.query(0, f"INSERT INTO {table} VALUES (1, 1)")
    local.heal()
    assert not local.is_blackholed(2)
    local.query(2, f"SYSTEM SYNC REPLICA {table}")
    assert local.query(2, f"SELECT count() FROM {table}").strip() == "1"


# -- same-port replicas ------------------------------------------------------------------------
def test_same_port_replicas_take_the_shared_port_url_forms() -> None:
    import clickhouse_lb

    with LocalCluster(replicas=3, shared_port=True) as same:
        ports = {int(h.rpartition(":")[2]) for h in same.hosts}
        assert len(ports) == 1
        port = ports.pop()
        hosts = [h.rpartition(":")[0] for h in same.hosts]
        assert hosts == ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
        pool = clickhouse_lb.get_pool(
            dsn=f"clickhouse://{','.join(hosts)}:{port}/default?load_balancing=in_order&share_state=0"
        )
        with pool:
            assert pool.command("SELECT getMacro('replica')") == "r1"
            same.kill(0)
            assert pool.command("SELECT getMacro('replica')") == "r2"
            same.restart(0)
            assert same.hosts[0] == f"127.0.0.11:{port}"
        from sqlalchemy import create_engine, text

        engine = create_engine(
            f"clickhousedb+lb://default:@{','.join(hosts)}:{port}/default?load_balancing=in_order&share_state=0"
        )
        with engine.connect() as conn:
            assert conn.execute(text("SELECT getMacro('replica')")).scalar() == "r1"
        engine.dispose()


def test_same_port_needs_distinct_addresses() -> None:
    with pytest.raises(ValueError, match="distinct"):
        LocalCluster(replicas=2, shared_port=True, distinct_addresses=False)
    with pytest.raises(ValueError, match="port"):
        LocalCluster(replicas=2, port=70000)


# -- through the pool ----------------------------------------------------------------------------
WHO = "SELECT getMacro('replica')"


class _FailedOverAt:
    """When the pool gave up a replica (its first failover)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_failover(self, event: Any) -> None:
        if self.at is None:
            self.at = time.monotonic()


def _first_statement_times(local: LocalCluster, timeout_ms: int) -> tuple[float, float]:
    """For a fresh in_order pool's first statement while replica 0 is black-holed: seconds until
    it gave replica 0 up, and until it was answered (which adds creating r2's client)."""
    import clickhouse_lb

    failed_over = _FailedOverAt()
    pool = clickhouse_lb.get_pool(
        local.hosts,
        load_balancing="in_order",
        connect_timeout_with_failover_ms=timeout_ms,
        send_receive_timeout=10,
        share_state=False,  # no error count from an earlier pool: r1 is tried first
        connect_on_create=False,  # the creation check would meet the black hole first and count it
        listeners=[failed_over],
    )
    with pool:
        started = time.monotonic()
        assert pool.command(WHO) == "r2"  # r1 first (in_order): its connect() hangs until the timeout
        answered = time.monotonic()
    assert failed_over.at is not None
    return failed_over.at - started, answered - started


def _first_statement_time(local: LocalCluster, timeout_ms: int) -> float:
    """Seconds for a fresh in_order pool's first statement while replica 0 is black-holed."""
    return _first_statement_times(local, timeout_ms)[1]


def test_connect_timeout_with_failover_ms_governs_failover_from_a_blackholed_replica(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    local.blackhole(0)
    short, long = _first_statement_time(local, 1000), _first_statement_time(local, 6000)
    assert short >= 1.0, short  # it did wait for the connect timeout, not fail at once
    assert long >= 6.0, long
    # The setting, not anything else, sets the wait: 5 s apart by the settings; half of that
    # leaves room for a GIL hold of a busy process inside the short one (1 s and 3 s were
    # measured 2.13 s and 3.48 s in a busy run: holds of up to 3.6 s).
    assert long - short >= 2.5, (short, long)


@on_time_process
def test_a_200ms_connect_timeout_fails_over_well_under_a_second(cluster: ClusterBase) -> None:
    local = _local_only(cluster)
    local.blackhole(0)
    gave_up, _ = _first_statement_times(local, 200)
    # The failure this is about took about 2 s: 200 ms rounded up to clickhouse-connect's whole
    # second, and the connect tried twice. A third of it; measured to the failover, so creating
    # the next replica's client (a query of its own: 1.17 s on a busy machine) is not counted.
    assert gave_up < 0.67, gave_up


def _batch_counts(cluster: ClusterBase, i: int, table: str) -> dict[int, int]:
    body = cluster.query(i, f"SELECT batch, count() FROM {table} GROUP BY batch FORMAT TSV")
    return {int(b): int(c) for b, c in (line.split("\t") for line in body.splitlines())}


ROWS_PER_BATCH = 10


class _Failovers:
    """Records the pool's failovers of inserts (proof that the faults hit the inserts)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_failover(self, event: Any) -> None:
        if event.operation == "insert":
            self.errors.append(event.error)


def _batch(n: int) -> list[list[int]]:
    return [[n, n * ROWS_PER_BATCH + k] for k in range(ROWS_PER_BATCH)]


def test_numbered_batches_land_exactly_once_through_kills_pauses_and_restarts(cluster: ClusterBase, table: str) -> None:
    import clickhouse_lb

    local = _local_only(cluster)
    faults = {
        4: lambda: local.kill(0),
        9: lambda: local.pause(1),
        15: lambda: local.restart(0),
        19: lambda: local.resume(1),
        23: lambda: local.kill(2),
        28: lambda: local.pause(0),
        31: lambda: local.restart(2),
        35: lambda: local.resume(0),
    }
    acknowledged: list[int] = []
    failed: list[int] = []
    failovers = _Failovers()
    pool = clickhouse_lb.get_pool(
        local.hosts,
        load_balancing="round_robin",
        send_receive_timeout=2,
        connect_timeout_with_failover_ms=300,
        listeners=[failovers],
        share_state=False,
        # The test is about inserts meeting faults: background probes would route them away.
        health_check_interval_ms=0,
    )
    with pool:
        for n in range(40):
            if n in faults:
                faults[n]()
            try:
                pool.insert(table, _batch(n), column_names=["batch", "x"])
                acknowledged.append(n)
            except Exception:  # "may have been applied": must not be duplicated
                failed.append(n)
    local.heal()
    sync_all(local, table)
    # Inserts sent to a paused replica were abandoned after sending (the liveness check found it
    # hung, or the socket timed out): "may have been applied", retried with their token.
    assert any("timed out" in error.lower() or error.startswith("hung:") for error in failovers.errors), (
        failovers.errors
    )
    assert len(acknowledged) >= 30, failed  # the pool fails over; only a few may fail
    for i in range(len(local)):
        seen = _batch_counts(local, i, table)
        assert {n: seen.get(n) for n in acknowledged} == dict.fromkeys(acknowledged, ROWS_PER_BATCH), local.names[i]
        assert all(seen.get(n, 0) in (0, ROWS_PER_BATCH) for n in failed), (local.names[i], seen)
        assert set(seen) <= set(range(40))


def _wait_dead(local: LocalCluster, i: int) -> None:
    deadline = time.monotonic() + 30
    while local.is_alive(i):
        assert time.monotonic() < deadline, f"replica {i} did not crash at its fault point"
        time.sleep(0.02)


def test_an_insert_applied_alone_before_a_sigkill_is_not_applied_again_inside_a_batch(
    cluster: ClusterBase, table: str
) -> None:
    # Replica 1's applier sends batch 0 to its engine alone (under batch 0's own token) and dies
    # before recording it applied. Batches 1 and 2 (same statement shape) are logged while it
    # is down: at restart its applier could join all three into one engine insert under a
    # batch token, which the engine would take for new rows, batch 0's included.
    local = _local_only(cluster)
    client = local.client(0)
    local.crash_after_applying(1)
    client.insert(table, _batch(0), column_names=["batch", "x"])
    _wait_dead(local, 1)
    for n in (1, 2):
        client.insert(table, _batch(n), column_names=["batch", "x"])
    local.restart(1)
    sync_all(local, table)
    for i in range(len(local)):
        assert _batch_counts(local, i, table) == dict.fromkeys(range(3), ROWS_PER_BATCH), local.names[i]
    assert local.replication_state(1)["crash_after_applying"] is False  # a fault for one entry


def test_a_mutation_applied_before_a_sigkill_is_not_applied_again_at_restart(cluster: ClusterBase, table: str) -> None:
    # Replica 1's applier runs the UPDATE and dies before recording it applied. An UPDATE has no
    # token to make a second run a no-op: run again at restart, x would be incremented twice.
    local = _local_only(cluster)
    local.query(0, f"INSERT INTO {table} VALUES (1, 1)")
    sync_all(local, table)
    local.crash_after_applying(1)
    local.query(0, f"ALTER TABLE {table} UPDATE x = x + 1 WHERE 1")
    _wait_dead(local, 1)
    local.restart(1)
    sync_all(local, table)
    pending = f"SELECT count() FROM system.mutations WHERE table = '{table}' AND NOT is_done"
    for i in range(len(local)):
        wait_for(lambda i=i: local.query(i, pending).strip() == "0", 30, f"{local.names[i]}'s mutations done")
        assert local.query(i, f"SELECT x FROM {table}").strip() == "2", local.names[i]


def test_a_block_logged_twice_by_a_retry_racing_a_slow_replica_lands_once_everywhere(
    cluster: ClusterBase, table: str
) -> None:
    # Replica 0 runs batch 5 and is slow to log it; the client's retry on replica 1 finds no
    # entry of the block yet, runs it and logs it first; replica 0 logs it after. Replica 2
    # (its replication stopped) then has the first entry due with batch 6 behind it: sent in a
    # batch under a batch token, the second entry alone under the block's own token would be
    # new rows to its engine; and replica 0 holds the block under its own token already.
    import threading

    local = _local_only(cluster)
    token = {"insert_deduplication_token": "batch-5"}
    local.stop_replication(2)
    local.hold_before_logging(0)
    slow = threading.Thread(
        target=lambda: local.client(0).insert(table, _batch(5), column_names=["batch", "x"], settings=token)
    )
    slow.start()
    try:
        wait_for(lambda: local.replication_state(0)["holding"] is True, 30, "replica 0's insert held before logging")
        retry = local.client(1)
        retry.insert(table, _batch(5), column_names=["batch", "x"], settings=token)
        retry.insert(table, _batch(6), column_names=["batch", "x"])
    finally:
        local.hold_before_logging(0, False)
        slow.join(timeout=60)
    local.start_replication(2)
    sync_all(local, table)
    for i in range(len(local)):
        assert _batch_counts(local, i, table) == {5: ROWS_PER_BATCH, 6: ROWS_PER_BATCH}, local.names[i]


def test_batches_retried_with_their_token_after_sigkills_mid_insert_are_exactly_once(
    cluster: ClusterBase, table: str
) -> None:
    import threading

    import clickhouse_lb

    local = _local_only(cluster)
    stop = threading.Event()

    def chaos() -> None:  # SIGKILL replicas at arbitrary moments, mid-request included
        victim = 0
        while not stop.is_set():
            local.kill(victim)
            stop.wait(0.3)
            local.restart(victim)
            victim = (victim + 1) % len(local)

    failed: list[int] = []
    batches = 60
    failovers = _Failovers()
    pool = clickhouse_lb.get_pool(
        local.hosts,
        load_balancing="random",
        send_receive_timeout=5,
        listeners=[failovers],
        share_state=False,
        health_check_interval_ms=0,  # the kills must meet inserts: background probes would route them away
    )
    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        with pool:
            for n in range(batches):
                try:
                    pool.insert(
                        table,
                        _batch(n),
                        column_names=["batch", "x"],
                        settings={"insert_deduplication_token": f"batch-{n}"},
                    )
                except Exception:
                    failed.append(n)
    finally:
        stop.set()
        thread.join(timeout=60)
    local.heal()
    assert failovers.errors  # the kills hit inserts
    with clickhouse_lb.get_pool(local.hosts, load_balancing="random") as pool:
        for n in failed:  # the application retries what raised, with the same token
            pool.insert(
                table, _batch(n), column_names=["batch", "x"], settings={"insert_deduplication_token": f"batch-{n}"}
            )
    sync_all(local, table)
    for i in range(len(local)):
        assert _batch_counts(local, i, table) == dict.fromkeys(range(batches), ROWS_PER_BATCH), local.names[i]


# Exact round_robin placement of the SELECTs: a read stalled over 450 ms is raced on the next
# replica (docs/busy-process.md), which can answer first.
@on_time_process
def test_the_docs_async_example_runs_as_written_across_replicas(cluster: ClusterBase) -> None:
    """The asyncio page's example (docs/asyncio.md) creates its table ON CLUSTER: with
    round_robin the CREATE, the INSERT and the SELECT land on different replicas and still see
    one table."""
    import asyncio
    import re
    from pathlib import Path

    import clickhouse_lb

    page = (Path(__file__).resolve().parents[1] / "docs" / "asyncio.md").read_text()
    create = re.search(r'"(CREATE TABLE IF NOT EXISTS t ON CLUSTER[^"]*)"', page)
    assert create is not None, "the asyncio page's example no longer creates t ON CLUSTER"
    assert 'await pool.insert("t", [[1], [2]], column_names=["x"])' in page
    cluster.query(0, "DROP TABLE IF EXISTS t ON CLUSTER lb_cluster SYNC")

    async def example() -> list[str]:
        pool = clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="round_robin", password=cluster.password)
        async with pool:
            await pool.command(create.group(1))
            await pool.insert("t", [[1], [2]], column_names=["x"])
            return [str(await pool.command("SELECT getMacro('replica')")) for _ in range(len(cluster))]

    try:
        answered = asyncio.run(example())
        assert sorted(answered) == sorted(cluster.names)
        sync_all(cluster, "t")
        assert counts(cluster, "SELECT sum(x) FROM t") == ["3"] * len(cluster)
    finally:
        cluster.query(0, "DROP TABLE IF EXISTS t ON CLUSTER lb_cluster SYNC")


def test_a_shared_port_taken_before_the_replicas_bind_it_is_chosen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from clickhouse_lb.testing import cluster as cluster_module

    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.12", 0))
    squatter.listen(1)
    taken = squatter.getsockname()[1]
    real = cluster_module._free_common_port
    answers = iter([taken])
    monkeypatch.setattr(cluster_module, "_free_common_port", lambda hosts: next(answers, None) or real(hosts))
    try:
        with LocalCluster(replicas=2, shared_port=True) as same:
            ports = {same.address(i)[1] for i in range(2)}
            assert len(ports) == 1
            assert taken not in ports
            assert same.query(1, "SELECT 1").strip() == "1"
    finally:
        squatter.close()

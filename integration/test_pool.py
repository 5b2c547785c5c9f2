"""The sync pool against a real 3-replica cluster (local by default), asking who answered.

Each test builds its own pool (fresh balancing state) over the session's cluster, which the
``healthy_clickhouse_cluster`` fixture heals before and after.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from waiting import wait_for

import clickhouse_lb
from clickhouse_lb import AllReplicasUnavailableError, ReplicaPool, SessionLostError
from clickhouse_lb.core.classify import error_code
from clickhouse_lb.testing import ClusterBase

WHO = "SELECT getMacro('replica')"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


def make_pool(cluster: ClusterBase, **options: Any) -> ReplicaPool:
    options.setdefault("send_receive_timeout", 2)
    return clickhouse_lb.get_pool(cluster.hosts, **options)


def who(pool: ReplicaPool, statements: int, **settings: Any) -> Counter[str]:
    return Counter(str(pool.command(WHO, settings=settings or None)) for _ in range(statements))


def host(cluster: ClusterBase, i: int) -> str:
    return cluster.hosts[i].rpartition(":")[0]


def test_replicas_have_distinct_addresses_for_the_hostname_strategies(cluster: ClusterBase) -> None:
    assert len({host(cluster, i) for i in range(3)}) == 3


@pytest.mark.parametrize(
    ("strategy", "extra", "expected"),
    [
        ("in_order", {}, "r1"),
        ("first_or_random", {"load_balancing_first_offset": 1}, "r2"),
        ("first_or_random", {"load_balancing_first_offset": 5}, "r3"),  # 5 mod 3
    ],
)
def test_static_strategies(cluster: ClusterBase, strategy: str, extra: dict[str, Any], expected: str) -> None:
    with make_pool(cluster, load_balancing=strategy, **extra) as pool:
        assert who(pool, 12) == {expected: 12}


@pytest.mark.parametrize(
    ("strategy", "local", "expected"),
    [
        ("nearest_hostname", 1, "r2"),
        ("hostname_levenshtein_distance", 2, "r3"),
        ("hostname_longest_common_prefix", 1, "r2"),
        ("hostname_longest_common_suffix", 0, "r1"),
    ],
)
def test_hostname_strategies_prefer_the_closest_name(
    cluster: ClusterBase, strategy: str, local: int, expected: str
) -> None:
    with make_pool(cluster, load_balancing=strategy, local_hostname=host(cluster, local)) as pool:
        assert who(pool, 12) == {expected: 12}


def test_random_reaches_every_replica(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="random") as pool:
        assert set(who(pool, 60)) == {"r1", "r2", "r3"}


def test_round_robin_splits_exactly(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="round_robin") as pool:
        assert who(pool, 30) == {"r1": 10, "r2": 10, "r3": 10}


def test_statement_settings_choose_the_strategy(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="random") as pool:
        assert who(pool, 6, load_balancing="first_or_random", load_balancing_first_offset=2) == {"r3": 6}


def test_killed_replica_gets_errors_and_is_avoided(cluster: ClusterBase) -> None:
    # Exact counts as on the server: decay only, no probes.
    with make_pool(cluster, load_balancing="in_order", health_check_interval_ms=0) as pool:
        assert who(pool, 3) == {"r1": 3}
        cluster.kill(0)
        assert who(pool, 10) == {"r2": 10}
        status = pool.replicas
        assert status[0].errors_count == 1  # one failed attempt; then the plan avoids it
        assert status[0].is_up is False
        assert status[0].estimated_recovery_time > 0
        assert "refused" in (status[0].last_error or "").lower()
        assert pool.plan()[0] == cluster.hosts[1]


def test_paused_replica_times_out_and_is_avoided(cluster: ClusterBase) -> None:
    # Liveness checks off: the socket timeout alone (integration/test_hung_replicas.py has them on).
    with make_pool(
        cluster,
        load_balancing="in_order",
        send_receive_timeout=1,
        health_check_interval_ms=0,
        liveness_check_after_ms=0,
    ) as pool:
        cluster.pause(0)
        assert who(pool, 5) == {"r2": 5}
        assert pool.replicas[0].errors_count == 1
        assert "timed out" in (pool.replicas[0].last_error or "").lower()


def test_decay_returns_a_recovered_replica_to_rotation(cluster: ClusterBase) -> None:
    with make_pool(
        cluster, load_balancing="in_order", distributed_replica_error_half_life=0.5, health_check_interval_ms=0
    ) as pool:  # decay alone brings it back (probes would, sooner: see test_health.py)
        cluster.kill(0)
        assert who(pool, 2) == {"r2": 2}
        cluster.restart(0)
        wait_for(lambda: pool.replicas[0].errors_count == 0, 5, "the error count to decay")
        assert who(pool, 3) == {"r1": 3}


def test_max_ignored_errors_as_on_the_server(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="in_order", distributed_replica_max_ignored_errors=2) as pool:
        pool.record_error(cluster.hosts[0])
        pool.record_error(cluster.hosts[0])
        assert who(pool, 3) == {"r1": 3}  # two errors are ignored
        pool.record_error(cluster.hosts[0])
        assert who(pool, 3) == {"r2": 3}
        assert who(pool, 3, distributed_replica_max_ignored_errors=3) == {"r1": 3}


def test_a_killed_replica_costs_zero_failed_statements_under_load(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="round_robin") as pool:
        served: Counter[str] = Counter()
        failures: list[BaseException] = []
        lock = threading.Lock()
        killed = threading.Event()

        def worker(n: int) -> None:
            for i in range(40):
                if n == 0 and i == 10:
                    cluster.kill(1)
                    killed.set()
                try:
                    answer = str(pool.command(WHO))
                except BaseException as exc:  # every failure is a test failure
                    with lock:
                        failures.append(exc)
                    continue
                with lock:
                    served[answer] += 1

        with ThreadPoolExecutor(6) as executor:
            list(executor.map(worker, range(6)))
        assert killed.is_set()
        assert failures == []
        assert sum(served.values()) == 240
        assert pool.replicas[1].errors_count >= 1
        assert served["r1"] > 0
        assert served["r3"] > 0


def test_all_replicas_down_then_back(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="random", connections_with_failover_max_tries=2) as pool:
        for i in range(3):
            cluster.kill(i)
        started = time.monotonic()
        with pytest.raises(AllReplicasUnavailableError) as caught:
            pool.command(WHO)
        assert time.monotonic() - started < 10  # refused connections fail fast, never a hang
        message = str(caught.value)
        for address in cluster.hosts:
            assert address in message
        assert len(caught.value.failures) == 6
        for i in range(3):
            cluster.restart(i)
        assert str(pool.command(WHO)) in {"r1", "r2", "r3"}


def test_query_failures_are_not_retried_nor_counted(cluster: ClusterBase) -> None:
    with make_pool(cluster, load_balancing="in_order") as pool:
        with pytest.raises(DatabaseError) as caught:
            pool.query("SELECT * FROM no_such_table")
        assert error_code(caught.value) == 60
        with pytest.raises(DatabaseError):
            pool.query("SELECT throwIf(1)")
        assert [r.errors_count for r in pool.replicas] == [0, 0, 0]


def test_server_side_replica_errors_fail_over(cluster: ClusterBase) -> None:
    # The injected failures are for statements: no background delay reads to take them.
    with make_pool(cluster, load_balancing="in_order", health_check_delay_interval_ms=0) as pool:
        cluster.fail_next(0, n=2, code=210)
        assert who(pool, 1) == {"r2": 1}
        assert pool.replicas[0].errors_count == 1
        assert "NETWORK_ERROR" in (pool.replicas[0].last_error or "")


def test_a_replica_still_running_the_query_id_hands_the_statement_to_another(cluster: ClusterBase) -> None:
    # QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING (216): an earlier try of the statement still runs
    # there (a hung replica resumed, a driver's resend). Another replica can take it; raising
    # the 216 as a query failure made a retryable insert fail without saying whether it applied.
    query_id = f"still-running-{time.monotonic_ns()}"
    bare = cluster.client(0)
    running = threading.Thread(
        target=bare.command, args=("SELECT sleep(3)",), kwargs={"settings": {"query_id": query_id}}
    )
    running.start()
    try:
        probe = cluster.client(0)

        def refused_as_running() -> bool:
            try:
                probe.command("SELECT 1", settings={"query_id": query_id})
            except DatabaseError as exc:
                return error_code(exc) == 216
            return False

        wait_for(refused_as_running, 10, "replica r1 to run the query id")
        with make_pool(cluster, load_balancing="in_order", health_check_delay_interval_ms=0) as pool:
            assert who(pool, 1, query_id=query_id) == {"r2": 1}
            assert pool.replicas[0].errors_count == 1
            assert "QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING" in (pool.replicas[0].last_error or "")
    finally:
        running.join()


def test_sessions_stay_on_one_replica_and_report_loss(cluster: ClusterBase) -> None:
    # Exact counts as on the server: decay only, no probes.
    with make_pool(cluster, load_balancing="round_robin", health_check_interval_ms=0) as pool:
        with pool.session() as session:
            session.command("CREATE TEMPORARY TABLE seen (x UInt8)")
            session.command("SET max_threads = 1")
            answers = {str(session.command(WHO)) for _ in range(6)}
            assert len(answers) == 1
            session.command("INSERT INTO seen VALUES (1), (2)")
            assert session.command("SELECT count() FROM seen") == 2
            assert session.command("SELECT getSetting('max_threads')") == 1
            index = cluster.names.index(answers.pop())
            cluster.kill(index)
            with pytest.raises(SessionLostError, match=cluster.hosts[index]):
                session.command("SELECT count() FROM seen")
        assert pool.replicas[index].errors_count == 1


def test_inserts_and_reads(cluster: ClusterBase) -> None:
    cluster.on_all("DROP TABLE IF EXISTS lb_rows")
    cluster.on_all("CREATE TABLE lb_rows (id UInt32, name String) ENGINE = MergeTree ORDER BY id")
    with make_pool(cluster, load_balancing="in_order") as pool:
        pool.insert("lb_rows", [[1, "a"], [2, "b"]], column_names=["id", "name"])
        assert pool.query("SELECT id, name FROM lb_rows ORDER BY id").result_rows == [(1, "a"), (2, "b")]
        df = pool.query_df("SELECT id FROM lb_rows ORDER BY id")
        assert list(df["id"]) == [1, 2]
        assert pool.query_arrow("SELECT id FROM lb_rows").num_rows == 2
        with pool.query_row_block_stream("SELECT number FROM numbers(1000)") as stream:
            assert sum(len(block) for block in stream) == 1000


def test_insert_that_failed_after_sending_is_retried_with_its_token(cluster: ClusterBase) -> None:
    cluster.on_all("DROP TABLE IF EXISTS lb_retry")
    cluster.on_all("CREATE TABLE lb_retry (id UInt32) ENGINE = MergeTree ORDER BY id")
    # The injected failure is for the insert: no background delay reads to take it.
    with make_pool(cluster, load_balancing="in_order", health_check_delay_interval_ms=0) as pool:
        cluster.fail_next(0, n=1, code=210)  # the server answers NETWORK_ERROR after the send
        pool.insert("lb_retry", [[7]], column_names=["id"])
        assert cluster.query(0, "SELECT count() FROM lb_retry").strip() == "0"
        assert cluster.query(1, "SELECT count() FROM lb_retry").strip() == "1"


def test_an_insert_repeated_by_the_caller_is_deduplicated_only_with_a_token_of_the_callers(
    cluster: ClusterBase,
) -> None:
    # docs/pool.md ("Differences"): the automatic token replaces the server's content hashing,
    # so a second insert() of the same rows is a second insert; a bare client's repeat of the
    # same block is dropped by a Replicated table. The caller's own token (kept by the pool), or
    # auto_insert_deduplication_token=False, gives the repeat its deduplication back.
    table = f"lb_repeat_{uuid.uuid4().hex[:10]}"
    cluster.query(0, f"CREATE TABLE {table} ON CLUSTER lb_cluster (batch UInt8, id UInt32) "
                     "ENGINE = ReplicatedMergeTree ORDER BY id")
    try:
        with make_pool(cluster, load_balancing="in_order", health_check_interval_ms=0) as pool:
            for _ in range(2):
                pool.insert(table, [[1, 1], [1, 2]], column_names=["batch", "id"])
            for _ in range(2):
                pool.insert(table, [[2, 1], [2, 2]], column_names=["batch", "id"],
                            settings={"insert_deduplication_token": "the-callers"})
        with make_pool(cluster, load_balancing="in_order", health_check_interval_ms=0,
                       auto_insert_deduplication_token=False) as pool:
            for _ in range(2):
                pool.insert(table, [[3, 1], [3, 2]], column_names=["batch", "id"])
        counted = cluster.query(0, f"SELECT batch, count() FROM {table} GROUP BY batch ORDER BY batch FORMAT CSV")
        assert counted.split() == ["1,4", "2,2", "3,2"]
    finally:
        cluster.query(0, f"DROP TABLE IF EXISTS {table} ON CLUSTER lb_cluster SYNC")


def test_non_idempotent_write_is_not_retried_after_sending(cluster: ClusterBase) -> None:
    cluster.on_all("DROP TABLE IF EXISTS lb_once")
    cluster.on_all("CREATE TABLE lb_once (id UInt32) ENGINE = MergeTree ORDER BY id")
    # The injected failure is for the write: no background delay reads to take it.
    with make_pool(cluster, load_balancing="in_order", health_check_delay_interval_ms=0) as pool:
        assert who(pool, 1) == {"r1": 1}  # the replica's client exists: the next request is the write
        cluster.fail_next(0, n=1, code=210)
        with pytest.raises(DatabaseError):
            pool.command("INSERT INTO lb_once VALUES (1)")
        assert cluster.query(1, "SELECT count() FROM lb_once").strip() == "0"

"""Tests of the test cluster itself: names, kill, pause, restart, delay, injected errors, sessions."""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clickhouse_lb.core.classify import error_code
from clickhouse_lb.testing import ClusterBase, LocalCluster

pytestmark = pytest.mark.integration


def _local_only(cluster: ClusterBase) -> LocalCluster:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("fault-injection endpoint exists only on LocalCluster replicas")
    return cluster


def _post(cluster: ClusterBase, i: int, sql: str, timeout: float = 10.0, **params: str) -> tuple[int, bytes, Any]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    req = urllib.request.Request(f"http://{cluster.hosts[i]}/?{query}", data=sql.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers


def test_replicas_answer_with_their_names(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    assert cluster.names == ["r1", "r2", "r3"]
    assert len(set(cluster.hosts)) == 3
    for i, name in enumerate(cluster.names):
        client = cluster.client(i)
        assert client.query("SELECT getMacro('replica'), displayName()").result_rows == [(name, name)]
        status, _, headers = _post(cluster, i, "SELECT 1")
        assert status == 200
        assert headers["X-ClickHouse-Server-Display-Name"] == name


def test_kill_refuses_connections_and_restart_keeps_mergetree_data(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    cluster.query(0, "DROP TABLE IF EXISTS kept")
    cluster.query(0, "CREATE TABLE kept (x UInt32) ENGINE = MergeTree ORDER BY x")
    cluster.query(0, "INSERT INTO kept SELECT number FROM numbers(100)")
    cluster.kill(0)
    assert not cluster.is_alive(0)
    host, port = cluster.address(0)
    with pytest.raises(urllib.error.URLError) as info:
        urllib.request.urlopen(f"http://{host}:{port}/ping", timeout=5)
    assert isinstance(info.value.reason, ConnectionRefusedError)
    cluster.restart(0)
    assert cluster.is_alive(0)
    assert cluster.hosts[0] == f"{host}:{port}"
    assert cluster.query(0, "SELECT count(), sum(x) FROM kept") == "100\t4950\n"
    cluster.query(0, "DROP TABLE kept")


def test_pause_hangs_and_resume_answers(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    cluster.pause(1)
    assert cluster.is_alive(1)
    client_timeout = 0.5
    started = time.monotonic()
    assert not cluster.ping(1, timeout=client_timeout)  # the kernel accepts, nobody answers
    assert time.monotonic() - started >= client_timeout * 0.9
    cluster.resume(1)
    assert cluster.ping(1, timeout=10)
    assert cluster.query(1, "SELECT 42") == "42\n"


def test_pause_returns_once_every_thread_of_the_replica_is_stopped(healthy_clickhouse_cluster: ClusterBase) -> None:
    # SIGSTOP is delivered asynchronously; a test's next request must already meet a hung replica.
    cluster = healthy_clickhouse_cluster
    pid = getattr(cluster, "pids", [None])[0]
    if pid is None or not os.path.isdir(f"/proc/{pid}/task"):
        pytest.skip("needs a local replica process and /proc")
    for _ in range(5):
        cluster.pause(0)
        states = {
            Path(f"/proc/{pid}/task/{task}/stat").read_text().rpartition(")")[2].split()[0]
            for task in os.listdir(f"/proc/{pid}/task")
        }
        cluster.resume(0)
        assert states <= {"T", "t"}, states


def test_set_delay_slows_queries(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = _local_only(healthy_clickhouse_cluster)
    client = cluster.client(2)
    cluster.set_delay(2, 0.3)
    started = time.monotonic()
    assert client.command("SELECT 7") == 7
    assert time.monotonic() - started >= 0.3
    cluster.set_delay(2, 0)
    assert cluster.faults(2)["delay"] == 0


@pytest.mark.parametrize(
    ("code", "name"), [(210, "NETWORK_ERROR"), (241, "MEMORY_LIMIT_EXCEEDED"), (999, "KEEPER_EXCEPTION")]
)
def test_fail_next_raises_the_code_then_recovers(healthy_clickhouse_cluster: ClusterBase, code: int, name: str) -> None:
    cluster = _local_only(healthy_clickhouse_cluster)
    client = cluster.client(1)
    cluster.fail_next(1, n=2, code=code)
    for _ in range(2):
        with pytest.raises(DatabaseError) as info:
            client.query("SELECT 1")
        assert error_code(info.value) == code
        assert name in str(info.value)
        assert "Injected failure by clickhouse_lb.testing" in str(info.value)
    assert client.query("SELECT 1").result_rows == [(1,)]


def test_heal_restores_everything(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = _local_only(healthy_clickhouse_cluster)
    cluster.kill(0)
    cluster.pause(1)
    cluster.set_delay(2, 5)
    cluster.fail_next(2, n=10)
    cluster.heal()
    assert all(cluster.ping(i) for i in range(3))
    assert cluster.faults(2) == {"delay": 0.0, "fail_next": 0, "code": 210}
    assert [cluster.query(i, "SELECT 1") for i in range(3)] == ["1\n"] * 3


def test_sessions_isolate_temporary_tables(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    a = cluster.client(0, session_id="iso-a")
    b = cluster.client(0, session_id="iso-b")
    a.command("CREATE TEMPORARY TABLE tmp (x UInt8)")
    a.command("INSERT INTO tmp VALUES (1), (2)")
    a.command("SET max_threads = 3")
    assert a.command("SELECT count() FROM tmp") == 2
    assert a.command("SELECT getSetting('max_threads')") == 3
    with pytest.raises(DatabaseError) as info:
        b.command("SELECT count() FROM tmp")
    assert error_code(info.value) == 60
    assert b.command("SELECT getSetting('max_threads')") != 3


def test_concurrent_use_of_one_session_is_locked(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    results: list[tuple[int, bytes]] = []

    def slow() -> None:
        status, body, _ = _post(cluster, 0, "SELECT sleep(2)", timeout=30, session_id="locked-one")
        results.append((status, body))

    thread = threading.Thread(target=slow)
    thread.start()
    codes: list[str] = []
    while thread.is_alive():
        _, _, headers = _post(cluster, 0, "SELECT 1", session_id="locked-one")
        codes.append(headers.get("X-ClickHouse-Exception-Code", ""))
        if "373" in codes:
            break
    thread.join()
    assert "373" in codes or results[0][1].startswith(b"Code: 373."), (codes, results)


def test_session_check_on_a_missing_session(healthy_clickhouse_cluster: ClusterBase) -> None:
    status, body, headers = _post(healthy_clickhouse_cluster, 0, "SELECT 1", session_id="nope-never", session_check="1")
    assert headers["X-ClickHouse-Exception-Code"] == "372"
    assert b"SESSION_NOT_FOUND" in body
    assert status == 500


def test_no_orphan_after_close() -> None:
    cluster = LocalCluster(replicas=1)
    with cluster:
        pids = [p for p in cluster.pids if p is not None]
        assert len(pids) == 1
        assert cluster.replica_memory_mb()[0]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

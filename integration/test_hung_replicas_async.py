"""Hung and slow replicas, the async pool (the sync pool's tests: test_hung_replicas.py):
liveness checks, the statement deadline and hedged reads with tasks instead of threads."""

from __future__ import annotations

import asyncio
import time

import pytest

import clickhouse_lb
from clickhouse_lb.errors import StatementTimeoutError
from clickhouse_lb.testing import ClusterBase

WHO = "SELECT getMacro('replica')"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


async def test_failover_timeout_holds_on_hung_replicas_async(cluster: ClusterBase) -> None:
    # Probes off: with every replica paused, closing the pool waits for the async probe worker
    # (found while writing this test; see the report of issue 9).
    pool = clickhouse_lb.get_async_pool(
        cluster.hosts, load_balancing="in_order", failover_timeout=1.0, liveness_check_after_ms=0,
        health_check_interval_ms=0,
    )
    async with pool:
        assert await pool.command(WHO) == "r1"
        for i in range(3):
            cluster.pause(i)
        started = time.monotonic()
        with pytest.raises(StatementTimeoutError):
            await pool.command(WHO)
        assert time.monotonic() - started < 5.0  # the 1 s deadline; 1/60 of the 300 s socket timeout


async def test_a_paused_replica_is_left_without_waiting_for_a_socket_timeout_async(cluster: ClusterBase) -> None:
    async with clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order") as pool:
        assert await pool.command(WHO) == "r1"
        for address in cluster.hosts[1:]:  # the measured time is the hang's, not client creation's
            await (await pool.client(address)).command("SELECT 1")
        cluster.pause(0)
        started = time.monotonic()
        assert await pool.command(WHO) in ("r2", "r3")
        assert time.monotonic() - started < 10.0  # liveness: about 0.35 s (BENCHMARKS.md); 1/30 of 300 s
        assert pool.replicas[0].errors_count == 1


async def test_hedged_reads_async(cluster: ClusterBase) -> None:
    async with clickhouse_lb.get_async_pool(
        cluster.hosts, load_balancing="in_order", use_hedged_requests=1, receive_data_timeout_ms=100
    ) as pool:
        assert await pool.command(WHO, settings={"use_hedged_requests": 0}) == "r1"
        await (await pool.client(cluster.hosts[1])).command("SELECT 1")
        cluster.set_delay(0, 10)
        started = time.monotonic()
        assert await pool.command(WHO) in ("r2", "r3")
        assert time.monotonic() - started < 3.0  # hedged after 0.1 s: under a third of the slow replica's 10 s
        assert pool.replicas[0].slowdowns_count >= 1
        await asyncio.sleep(0)



async def test_a_read_stalled_on_a_paused_replica_is_answered_by_another_right_after_the_stall_async(
    cluster: ClusterBase, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sync pool's test of the same name (test_hung_replicas.py), with the event loop stalled
    by the GIL held 0.8 s: the task's first check comes due during the stall, and the read is
    raced on the next replica when it ends, not after a 20 s ping."""
    import threading
    from typing import Any

    import aiohttp

    from clickhouse_lb.testing.load import _sleep_holding_gil

    paused_port = int(cluster.hosts[0].rpartition(":")[2])
    stalled = threading.Event()
    original = aiohttp.ClientRequest.send

    async def send(self: Any, *args: Any, **kwargs: Any) -> Any:
        response = await original(self, *args, **kwargs)
        if self.url.port == paused_port and not stalled.is_set():  # the read is out: now the stall
            stalled.set()
            threading.Thread(target=_sleep_holding_gil, args=(0.8,), daemon=True).start()
        return response

    async with clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order", liveness_ping_timeout_ms=20_000,
                                            health_check_interval_ms=0) as pool:
        assert await pool.command(WHO) == cluster.names[0]
        cluster.pause(0)
        monkeypatch.setattr(aiohttp.ClientRequest, "send", send)
        started = time.monotonic()
        answered = await pool.command(WHO)
        elapsed = time.monotonic() - started
        assert pool.replicas[0].errors_count == 0  # a lost race is not an error of the replica
    assert stalled.is_set()  # the read did go to the paused replica first
    assert answered == cluster.names[1]
    assert elapsed < 6.0, f"{elapsed:.2f}s: the read waited for its ping instead of racing replica 1"


async def test_create_insert_context_fails_over_from_a_hung_replica_async(cluster: ClusterBase) -> None:
    # As the sync test: its DESCRIBE ran outside the attempt's driver, unwatched.
    cluster.on_all("DROP TABLE IF EXISTS lb_hang_async")
    cluster.on_all("CREATE TABLE lb_hang_async (id UInt32) ENGINE = MergeTree ORDER BY id")
    async with await clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order", send_receive_timeout=30,
                                                  failover_timeout=10, health_check_interval_ms=0) as pool:
        cluster.pause(0)
        started = time.monotonic()
        context = await pool.create_insert_context("lb_hang_async")
        assert time.monotonic() - started < 5  # a few tenths; the paused replica held it 30 s
        assert context.column_names == ["id"]
        assert pool.replicas[0].errors_count == 1

"""The retry budget against the real engine: with every replica slow and hedging on, the pool's
own extra requests stay a small share of the statements (executions counted by the servers in
system.query_log), where without a budget every statement is sent twice; with the budget spent,
a read on a slow replica keeps waiting and then fails naming the budget, while one on a hung
replica (no answer to /ping) still fails over."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb.errors import RetryBudgetExhaustedError
from clickhouse_lb.testing import ClusterBase

#: Every read takes 0.2 s inside the engine (so each execution reaches system.query_log),
#: four times the hedge delay below: without a budget, every read is hedged.
SLOW_READ = "SELECT sleep(0.2) /* {marker} */"


def executions(cluster: ClusterBase, marker: str, replicas: range | None = None) -> int:
    total = 0
    for i in replicas if replicas is not None else range(len(cluster.hosts)):
        cluster.query(i, "SYSTEM FLUSH LOGS")
        total += int(cluster.query(
            i, f"SELECT count() FROM system.query_log WHERE type = 'QueryStart' AND query LIKE '%{marker}%' "
               "AND query NOT LIKE '%system.query_log%'",
        ).strip())
    return total


def run_reads(cluster: ClusterBase, statements: int, **options: Any) -> tuple[int, int]:
    """(statements completed, executions on the servers) for ``statements`` slow reads from 4 threads."""
    marker = uuid.uuid4().hex
    sql = SLOW_READ.format(marker=marker)
    with clickhouse_lb.get_pool(cluster.hosts, use_hedged_requests=1, receive_data_timeout_ms=50,
                                share_state=False, **options) as pool, ThreadPoolExecutor(4) as workers:
        results = list(workers.map(lambda _: pool.query(sql).result_rows, range(statements)))
    return len(results), executions(cluster, marker)


def test_hedging_every_slow_read_stays_within_the_default_budget(healthy_clickhouse_cluster: ClusterBase) -> None:
    cluster = healthy_clickhouse_cluster
    unlimited_done, unlimited_runs = run_reads(cluster, 30, retry_budget_window_ms=0)
    assert unlimited_done == 30
    assert unlimited_runs >= 1.6 * unlimited_done  # the control: without a budget nearly every read runs twice
    done, runs = run_reads(cluster, 120)
    assert done == 120
    # The default budget: 0.1 per statement (12) plus 0.2 per second of the 10 s window (2).
    assert runs <= 1.25 * done


def test_with_the_budget_spent_a_read_on_a_slow_replica_is_not_sent_again(
    healthy_clickhouse_cluster: ClusterBase,
) -> None:
    """No extra request allowed: a read on a replica that is slow but alive (it answers /ping)
    waits for its 1.5 s receive timeout and is then not sent elsewhere: the error names the budget."""
    cluster = healthy_clickhouse_cluster
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", share_state=False,
                                send_receive_timeout=1.5, retry_budget_ratio=0,
                                retry_budget_min_per_second=0) as pool:
        assert pool.command("SELECT getMacro('replica')") == "r1"
        marker = uuid.uuid4().hex
        cluster.set_delay(0, 6.0)
        started = time.monotonic()
        with pytest.raises(RetryBudgetExhaustedError) as caught:
            pool.query(f"SELECT 1 /* {marker} */")
        waited = time.monotonic() - started
        cluster.set_delay(0, 0)
    assert waited >= 1.4  # it kept waiting for its replica, up to the receive timeout
    assert "retry_budget_ratio" in str(caught.value)
    assert executions(cluster, marker, range(1, len(cluster.hosts))) == 0  # sent to no other replica


def test_with_the_budget_spent_a_read_on_a_hung_replica_still_fails_over(
    healthy_clickhouse_cluster: ClusterBase,
) -> None:
    """A replica that does not answer /ping serves nothing: moving its read costs the live
    replicas no more than the read itself, and is not charged (the 6 s hang separates it from
    the quarter of a second a hung-replica failover takes)."""
    cluster = healthy_clickhouse_cluster
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", share_state=False,
                                health_check_interval_ms=0, retry_budget_ratio=0,
                                retry_budget_min_per_second=0) as pool:
        assert pool.command("SELECT getMacro('replica')") == "r1"
        cluster.pause(0)
        try:
            started = time.monotonic()
            assert pool.command("SELECT getMacro('replica')") == "r2"
            waited = time.monotonic() - started
        finally:
            cluster.resume(0)
    assert waited < 2.0

"""Lag-aware routing in the pools (fake replicas; the delays are handed to the probe monitor as
the worker would after reading ``system.replicas``): stale replicas get no statement while
fresh ones exist, per-statement settings win, and no fallback with no fresh replica is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from clickhouse_lb.core.health import ProbeOutcome
from clickhouse_lb.errors import AllReplicasStaleError
from clickhouse_lb.pools.pool import ReplicaPool

from .fakes import FakeCluster, make_pool


def lagging_pool(delays: Sequence[float | None], **options: Any) -> tuple[FakeCluster, ReplicaPool]:
    """An in_order pool over fake replicas a, b, c whose replication delays are ``delays``."""
    cluster = FakeCluster("a", "b", "c")
    pool = make_pool(cluster, load_balancing="in_order", health_check_interval_ms=1000, **options)
    pool._prober = None  # no worker: the test is the worker, below (fake replicas answer no /ping)
    monitor = pool._health
    assert monitor is not None
    monitor.due()
    for i, delay in enumerate(delays):
        monitor.finish(i, ProbeOutcome(True, 0.001))
        if delay is not None:
            monitor.finish_delay(i, delay)
    return cluster, pool


def served(cluster: FakeCluster) -> list[str]:
    return [h for h, r in cluster.replicas.items() for _ in r.calls]


def test_a_replica_lagging_beyond_the_limit_gets_no_reads_while_fresh_ones_exist() -> None:
    cluster, pool = lagging_pool([400.0, 10.0, None])
    for _ in range(3):
        pool.query("SELECT 1")
    assert served(cluster) == ["b", "b", "b"]
    assert pool.plan() == ["b:8123", "c:8123", "a:8123"]
    assert [r.delay for r in pool.replicas] == [400.0, 10.0, None]


def test_it_gets_them_again_when_it_catches_up() -> None:
    cluster, pool = lagging_pool([400.0, 0.0, 0.0])
    assert pool._health is not None
    pool._health.finish_delay(0, 2.0)
    pool.query("SELECT 1")
    assert served(cluster) == ["a"]


def test_stale_replicas_are_still_used_after_the_fresh_ones_fail() -> None:
    from .fakes import refused

    cluster, pool = lagging_pool([400.0, 0.0, 0.0], connections_with_failover_max_tries=1)
    cluster["b"].outcomes = [refused]
    cluster["c"].outcomes = [refused]
    pool.query("SELECT 1")
    # b and c (fresh) first, then a (stale), which answers: fallback_to_stale_replicas=1.
    assert [len(cluster[h].calls) for h in "abc"] == [1, 1, 1]
    assert pool.replicas[0].errors_count == 0


def test_without_fallback_stale_replicas_are_skipped_and_none_fresh_is_a_clear_error() -> None:
    cluster, pool = lagging_pool([400.0, 500.0, 0.0], fallback_to_stale_replicas_for_distributed_queries=0)
    pool.query("SELECT 1")
    assert served(cluster) == ["c"]
    _, stale = lagging_pool([400.0, 500.0, 301.0], fallback_to_stale_replicas_for_distributed_queries="0")
    with pytest.raises(AllReplicasStaleError, match="fallback_to_stale_replicas_for_distributed_queries=1"):
        stale.query("SELECT 1")


def test_a_statements_own_settings_win_and_still_reach_the_server() -> None:
    cluster, pool = lagging_pool([400.0, 0.0, 0.0])
    pool.query("SELECT 1", settings={"max_replica_delay_for_distributed_queries": 1000})
    assert served(cluster) == ["a"]  # 400 s is fresh under a 1000 s limit
    assert cluster["a"].calls[0][2]["settings"] == {"max_replica_delay_for_distributed_queries": 1000}
    cluster, pool = lagging_pool([400.0, 300.0, 200.0])
    pool.query("SELECT 1", settings={"fallback_to_stale_replicas_for_distributed_queries": 0})
    assert served(cluster) == ["c"]  # the pool's 300 s limit: only c is fresh
    with pytest.raises(AllReplicasStaleError):
        pool.query("SELECT 1", settings={"max_replica_delay_for_distributed_queries": 100,
                                         "fallback_to_stale_replicas_for_distributed_queries": 0})


def test_zero_limit_turns_the_check_off() -> None:
    cluster, pool = lagging_pool([10_000.0, 0.0, 0.0], max_replica_delay_for_distributed_queries=0)
    pool.query("SELECT 1")
    assert served(cluster) == ["a"]


def test_sessions_prefer_fresh_replicas_too() -> None:
    _, pool = lagging_pool([400.0, 0.0, 0.0])
    with pool.session() as session:
        assert session.address == "b:8123"

"""A discovered pool's set replaced at run time (no I/O: the discovered set is handed to the
pool as a refresh would): counts kept, added replicas clean, removed ones leave after their
in-flight statements; and when the worker refreshes (injected clock)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from clickhouse_lb.config.discovery import DiscoverySettings
from clickhouse_lb.config.health import HealthSettings
from clickhouse_lb.config.pool_config import sync_client_option_names
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.pools.pool import ReplicaPool
from clickhouse_lb.probes.workers import _Refresh

from .conftest import FakeClock
from .fakes import FakeCluster, pool_parts


def discovered_pool(cluster: FakeCluster, hosts: list[str], **options: Any) -> ReplicaPool:
    """A pool as discovery leaves it after construction: over ``hosts``, seeds remembered."""
    options.setdefault("load_balancing", "in_order")
    options.setdefault("distributed_replica_error_half_life", 3600)
    config, balancer = pool_parts(hosts, options, sync_client_option_names())
    config = dataclasses.replace(
        config, discovery=DiscoverySettings("c"), seeds=(Replica(hosts[0], 8123),), share_state=False
    )
    return ReplicaPool(config, client_factory=cluster.factory, balancer=balancer)


def replicas(*hosts: str) -> list[Replica]:
    return [Replica(h, 8123) for h in hosts]


def test_kept_replicas_keep_their_counts_added_ones_start_clean() -> None:
    cluster = FakeCluster("a", "b", "c")
    pool = discovered_pool(cluster, ["a", "b"])
    for _ in range(3):
        pool.record_error("b:8123")
    pool.record_slowdown("a:8123")
    change = pool._apply_discovered(replicas("c", "b", "a"))
    assert change is not None
    assert not change.removed
    assert pool.addresses == ["a:8123", "b:8123", "c:8123"]  # kept first, in their order
    counts = {r.address: (r.errors_count, r.slowdowns_count) for r in pool.replicas}
    assert counts == {"a:8123": (0, 1), "b:8123": (3, 0), "c:8123": (0, 0)}
    assert pool.config.replicas == replicas("a", "b", "c")
    assert pool.query("SELECT 1") == "query@c"  # a slowed, b has errors: the new clean one first


def test_an_unchanged_set_replaces_nothing() -> None:
    pool = discovered_pool(FakeCluster("a", "b"), ["a", "b"])
    view = pool._view
    assert pool._apply_discovered(replicas("B", "a")) is None
    assert pool._view is view


def test_listeners_and_stats_follow_the_new_set() -> None:
    cluster = FakeCluster("a", "b")
    seen: list[str] = []

    class Listener:
        def on_error_recorded(self, event: Any) -> None:
            seen.append(event.address)

    pool = discovered_pool(cluster, ["a"], listeners=[Listener()])
    pool._apply_discovered(replicas("a", "b"))
    pool.record_error("b:8123")
    pool.query("SELECT 1")
    assert seen == ["b:8123"]
    assert pool.stats.statements == 1


def test_a_removed_replica_leaves_after_its_in_flight_statement() -> None:
    cluster = FakeCluster("a", "b")
    pool = discovered_pool(cluster, ["a", "b"])
    client = pool.client("a:8123")
    started, release = threading.Event(), threading.Event()

    def slow_query(*args: Any, **kwargs: Any) -> str:
        started.set()
        assert release.wait(10)
        return "slow@a"

    client.query = slow_query  # type: ignore[method-assign]
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(pool.query("SELECT sleep(1)")))
    worker.start()
    assert started.wait(10)
    pool._apply_discovered(replicas("b"))
    assert pool.addresses == ["b:8123"]
    assert pool.query("SELECT 1") == "query@b"  # new statements use the new set
    assert not client.closed  # still running its statement
    release.set()
    worker.join(10)
    assert result == ["slow@a"]
    assert client.closed


def test_a_removed_replica_without_statements_is_closed_at_once() -> None:
    cluster = FakeCluster("a", "b")
    pool = discovered_pool(cluster, ["a", "b"])
    client = pool.client("a:8123")
    pool._apply_discovered(replicas("b"))
    assert client.closed


def test_a_replica_that_comes_back_starts_clean() -> None:
    cluster = FakeCluster("a", "b")
    pool = discovered_pool(cluster, ["a", "b"])
    pool.record_error("a:8123")
    pool._apply_discovered(replicas("b"))
    pool._apply_discovered(replicas("a", "b"))
    assert pool.addresses == ["b:8123", "a:8123"]
    assert [r.errors_count for r in pool.replicas] == [0, 0]
    assert pool.query("SELECT 1", settings={"load_balancing": "in_order"}) == "query@b"


def test_probe_state_moves_with_the_replica() -> None:
    cluster = FakeCluster("a", "b")
    pool = discovered_pool(cluster, ["a", "b"], health_check_interval_ms=1000)
    assert pool._health is not None
    schedule = pool._health.schedule
    schedule._replicas[1].delay = 42.0
    schedule._worst_delay = 42.0
    pool._apply_discovered(replicas("b"))
    assert pool._health is not None
    assert pool._health.schedule.delays() == [42.0]
    assert [r.delay for r in pool.replicas] == [42.0]
    pool.close()


def test_refresh_schedule_with_an_injected_clock() -> None:
    clock = FakeClock()
    refresh = _Refresh(30.0, clock)
    assert not refresh.due()
    assert refresh.wait(100.0) == 30.0
    clock.advance(30.0)
    assert refresh.due()
    assert not refresh.due()  # one at a time
    assert refresh.wait(1.0) == 1.0
    clock.advance(5.0)
    refresh.done()
    assert refresh.wait(100.0) == 30.0


def test_no_refresh_when_the_interval_is_zero() -> None:
    refresh = _Refresh(None, FakeClock())
    assert not refresh.due()
    assert refresh.wait(5.0) == 5.0


def test_health_settings_in_use() -> None:  # the probes' settings survive the swap
    pool = discovered_pool(FakeCluster("a", "b"), ["a"], health_check_interval_ms=700)
    pool._apply_discovered(replicas("a", "b"))
    assert pool._health is not None
    assert pool._health.settings == HealthSettings(health_check_interval_ms=700)
    pool.close()

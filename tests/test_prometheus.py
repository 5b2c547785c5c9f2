"""The Prometheus collector: what a scrape shows for a pool, registered with one call."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

import clickhouse_lb.prometheus
from clickhouse_lb.config.pool_config import async_client_option_names
from clickhouse_lb.core.health import ProbeOutcome
from clickhouse_lb.pools.aio import AsyncReplicaPool

from .fakes import FakeCluster, make_pool, pool_parts, refused


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_scrape_shows_replicas_and_pool_totals() -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [refused, "ok"]
    pool = make_pool(cluster, load_balancing="in_order")
    registry = CollectorRegistry()
    clickhouse_lb.prometheus.register(pool, name="main", registry=registry)
    pool.command("SELECT 1")  # fails over from a to b
    pool.command("SELECT 1")
    pool.record_error("a:8123", "stale data")
    samples = scrape(registry)

    def replica(metric: str, address: str) -> float | None:
        return samples.get((f"clickhouse_lb_replica_{metric}", (("pool", "main"), ("replica", address))))

    assert replica("errors", "a:8123") == 2
    assert replica("errors", "b:8123") == 0
    assert replica("up", "a:8123") == 0  # its latest attempt failed
    assert replica("up", "b:8123") == 1
    assert replica("probe_up", "a:8123") is None  # probes off: nothing known
    assert replica("delay_seconds", "a:8123") is None
    assert samples[("clickhouse_lb_statements_total", (("pool", "main"),))] == 2
    assert samples[("clickhouse_lb_failovers_total", (("pool", "main"),))] == 1
    assert samples[("clickhouse_lb_failures_total", (("kind", "connect"), ("pool", "main")))] == 1
    assert samples[("clickhouse_lb_failures_total", (("kind", "recorded"), ("pool", "main")))] == 1


def test_probe_results_and_two_pools_in_one_registry() -> None:
    probed = make_pool(FakeCluster("a", "b"), health_check_interval_ms=1000)
    other = make_pool(FakeCluster("c"))
    registry = CollectorRegistry()
    clickhouse_lb.prometheus.register(probed, registry=registry)  # named by its addresses
    clickhouse_lb.prometheus.register(other, name="other", registry=registry)
    monitor = probed._health
    assert monitor is not None
    monitor.due()  # what the worker does, without its thread
    monitor.finish(0, ProbeOutcome(True, 0.003))
    monitor.finish(1, ProbeOutcome(False, 0.5, "timed out"))
    samples = scrape(registry)
    pool_label = ("pool", "a:8123,b:8123")
    assert samples[("clickhouse_lb_replica_probe_up", (pool_label, ("replica", "a:8123")))] == 1
    assert samples[("clickhouse_lb_replica_probe_latency_seconds", (pool_label, ("replica", "a:8123")))] == 0.003
    assert samples[("clickhouse_lb_replica_probe_up", (pool_label, ("replica", "b:8123")))] == 0
    assert samples[("clickhouse_lb_replica_up", (pool_label, ("replica", "b:8123")))] == 0
    assert samples[("clickhouse_lb_probes_total", (pool_label,))] == 2
    assert samples[("clickhouse_lb_failed_probes_total", (pool_label,))] == 1
    assert samples[("clickhouse_lb_failures_total", (("kind", "probe"), pool_label))] == 1
    assert samples[("clickhouse_lb_replica_errors", (("pool", "other"), ("replica", "c:8123")))] == 0


def make_async_pool(*hosts: str) -> AsyncReplicaPool:
    """An async pool on fake replicas that is only scraped (no statement: no client is made)."""

    async def no_client(**options: Any) -> Any:
        raise AssertionError("the collector made a client")

    config, balancer = pool_parts(hosts, {}, async_client_option_names())
    return AsyncReplicaPool(config, client_factory=no_client, balancer=balancer)


def pool_labels(registry: CollectorRegistry, metric: str) -> list[str]:
    return sorted(
        pool
        for (name, labels), _ in scrape(registry).items()
        if name == metric
        for key, pool in labels
        if key == "pool"
    )


def test_two_pools_emit_each_family_once_in_both_formats() -> None:
    sync_pool = make_pool(FakeCluster("a", "b"))
    async_pool = make_async_pool("c")
    registry = CollectorRegistry()
    clickhouse_lb.prometheus.register(sync_pool, name="events", registry=registry)
    clickhouse_lb.prometheus.register(async_pool, name="users", registry=registry)
    sync_pool.command("SELECT 1")

    # OpenMetrics (what Prometheus asks for first) refuses a metric name in two groups.
    families = list(openmetrics_families(openmetrics_latest(registry).decode()))
    text = generate_latest(registry).decode()
    assert text.count("# TYPE clickhouse_lb_replica_up gauge") == 1
    for parsed in (families, list(text_string_to_metric_families(text))):
        names = [family.name for family in parsed]
        assert len(names) == len(set(names)), names
        by_name = {family.name: family for family in parsed}
        up = {(s.labels["pool"], s.labels["replica"]): s.value for s in by_name["clickhouse_lb_replica_up"].samples}
        assert up == {("events", "a:8123"): 1, ("events", "b:8123"): 1, ("users", "c:8123"): 1}
        statements = {
            s.labels["pool"]: s.value for s in by_name["clickhouse_lb_statements"].samples if s.name.endswith("_total")
        }
        assert statements == {"events": 1, "users": 0}


def test_a_dropped_or_closed_pool_leaves_the_output() -> None:
    registry = CollectorRegistry()
    kept = make_pool(FakeCluster("a"))
    clickhouse_lb.prometheus.register(kept, name="kept", registry=registry)
    dropped = make_pool(FakeCluster("b"))
    clickhouse_lb.prometheus.register(dropped, name="dropped", registry=registry)
    closed = make_async_pool("c")
    clickhouse_lb.prometheus.register(closed, name="closed", registry=registry)
    assert pool_labels(registry, "clickhouse_lb_statements_total") == ["closed", "dropped", "kept"]
    del dropped
    gc.collect()  # the collector's reference is weak: nothing else holds the pool
    asyncio.run(closed.close())
    assert pool_labels(registry, "clickhouse_lb_statements_total") == ["kept"]
    assert pool_labels(registry, "clickhouse_lb_replica_up") == ["kept"]
    # Their names are free again: a replacement pool can take one.
    replacement = make_async_pool("d")
    clickhouse_lb.prometheus.register(replacement, name="closed", registry=registry)
    assert pool_labels(registry, "clickhouse_lb_statements_total") == ["closed", "kept"]
    kept.close()


def test_a_pool_twice_or_a_name_twice_is_refused() -> None:
    registry = CollectorRegistry()
    pool = make_pool(FakeCluster("a", "b"))
    collector = clickhouse_lb.prometheus.register(pool, name="events", registry=registry)
    with pytest.raises(ValueError, match="already registered in this registry"):
        clickhouse_lb.prometheus.register(pool, name="other", registry=registry)
    same_cluster = make_pool(FakeCluster("a", "b"))
    with pytest.raises(ValueError, match="pool='events'"):
        clickhouse_lb.prometheus.register(same_cluster, name="events", registry=registry)
    # Default names are the addresses: two pools to one cluster need names of their own.
    clickhouse_lb.prometheus.register(same_cluster, registry=registry)
    with pytest.raises(ValueError, match="pool='a:8123,b:8123'"):
        clickhouse_lb.prometheus.register(make_pool(FakeCluster("a", "b")), registry=registry)
    async_pool = make_async_pool("c")  # held: the collector's reference is weak
    assert clickhouse_lb.prometheus.register(async_pool, registry=registry) is collector
    assert pool_labels(registry, "clickhouse_lb_statements_total") == ["a:8123,b:8123", "c:8123", "events"]
    # Another registry is another collector: the same pool can be there too.
    assert clickhouse_lb.prometheus.register(pool, name="events", registry=CollectorRegistry()) is not collector


def test_the_registry_sees_the_names_and_one_pool_can_be_removed() -> None:
    registry = CollectorRegistry()
    pool, other = make_pool(FakeCluster("a")), make_pool(FakeCluster("b"))
    collector = clickhouse_lb.prometheus.register(pool, name="one", registry=registry)
    clickhouse_lb.prometheus.register(other, name="two", registry=registry)

    class Clashing:
        def collect(self) -> list[GaugeMetricFamily]:
            return [GaugeMetricFamily("clickhouse_lb_replica_up", "a clash")]

        describe = collect

    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(Clashing())  # the registry knows our names (describe())
    collector.remove(pool)
    assert pool_labels(registry, "clickhouse_lb_replica_up") == ["two"]
    registry.unregister(collector)  # every pool of the registry
    assert pool_labels(registry, "clickhouse_lb_replica_up") == []
    again = clickhouse_lb.prometheus.register(pool, name="one", registry=registry)  # a new collector
    assert again is not collector
    assert pool_labels(registry, "clickhouse_lb_replica_up") == ["one"]

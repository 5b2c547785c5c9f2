"""The Prometheus collector: what a scrape shows for a pool, registered with one call."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import clickhouse_lb.prometheus
from clickhouse_lb.core.health import ProbeOutcome

from .fakes import FakeCluster, make_pool, refused


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

"""A ready Prometheus collector for a pool (the optional ``prometheus`` extra).

>>> import clickhouse_lb.prometheus
>>> clickhouse_lb.prometheus.register(pool)                   # the default registry
>>> clickhouse_lb.prometheus.register(pool, name="events")    # a label, to tell pools apart

The collector reads the pool at scrape time (``pool.replicas``, ``pool.stats``): nothing is
pushed and nothing is computed between scrapes. Per replica (labels ``pool``, ``replica``):
``clickhouse_lb_replica_up``, ``..._errors``, ``..._slowdowns``, ``..._delay_seconds`` (when
known), ``..._probe_latency_seconds`` (latest answered probe), ``..._probe_up`` and
``..._estimated_recovery_seconds``; per pool (label ``pool``): ``clickhouse_lb_statements_total``,
``clickhouse_lb_failovers_total``, ``clickhouse_lb_failures_total`` (label ``kind``),
``clickhouse_lb_probes_total`` and ``clickhouse_lb_failed_probes_total``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from clickhouse_lb.core.balancer import ReplicaStatus
from clickhouse_lb.core.stats import StatsSnapshot

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "clickhouse_lb.prometheus needs prometheus_client: pip install 'clickhouse-lb[prometheus]'"
    ) from exc

__all__ = ["PoolCollector", "register"]


class _Pool(Protocol):
    @property
    def replicas(self) -> list[ReplicaStatus]: ...

    @property
    def stats(self) -> StatsSnapshot: ...

    @property
    def addresses(self) -> list[str]: ...


class PoolCollector:
    """Exports one pool's state on every scrape."""

    def __init__(self, pool: _Pool, name: str) -> None:
        self.pool = pool
        self.name = name

    def describe(self) -> list[Metric]:
        # Metric names without reading the pool: registration must not do work.
        return []

    def collect(self) -> Iterator[Metric]:
        name = self.name
        replica_labels = ["pool", "replica"]

        def gauge(metric: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"clickhouse_lb_replica_{metric}", documentation, labels=replica_labels)

        up = gauge("up", "1 when the replica is in rotation: its last attempt did not fail, probes do not see it down")
        probe_up = gauge("probe_up", "1: the latest health probe answered; 0: probes see it down; absent: unknown")
        errors = gauge("errors", "errors_count: errors counted against the replica, decayed to now")
        slowdowns = gauge("slowdowns", "slowdowns_count, decayed to now")
        recovery = gauge("estimated_recovery_seconds", "seconds until the replica's counts decay to zero")
        delay = gauge("delay_seconds", "replication delay of the replica, when known")
        latency = gauge("probe_latency_seconds", "latency of the replica's latest answered health probe")
        for status in self.pool.replicas:
            labels = [name, status.address]
            in_rotation = status.is_up and status.probe_state != "down"
            up.add_metric(labels, 1.0 if in_rotation else 0.0)
            if status.probe_state in ("up", "down"):
                probe_up.add_metric(labels, 1.0 if status.probe_state == "up" else 0.0)
            errors.add_metric(labels, status.errors_count)
            slowdowns.add_metric(labels, status.slowdowns_count)
            recovery.add_metric(labels, status.estimated_recovery_time)
            if status.delay is not None:
                delay.add_metric(labels, status.delay)
            if status.probe_latency is not None:
                latency.add_metric(labels, status.probe_latency)
        yield from (up, probe_up, errors, slowdowns, recovery, delay, latency)

        stats = self.pool.stats
        for metric, documentation, value in (
            ("statements", "statements run through the pool (each counts once, however many attempts)",
             stats.statements),
            ("failovers", "attempts that failed on a replica and moved on to another", stats.failovers),
            ("probes", "health probes sent", stats.probes),
            ("failed_probes", "health probes that failed", stats.failed_probes),
        ):
            counter = CounterMetricFamily(f"clickhouse_lb_{metric}", documentation, labels=["pool"])
            counter.add_metric([name], value)
            yield counter
        failures = CounterMetricFamily(
            "clickhouse_lb_failures",
            "errors counted against replicas, by kind (connect, disconnect, timeout, http_status, "
            "server_error, probe, ping, recorded)",
            labels=["pool", "kind"],
        )
        for kind, count in sorted(stats.failures.items()):
            failures.add_metric([name, kind], count)
        yield failures


def register(pool: Any, *, name: str | None = None, registry: CollectorRegistry = REGISTRY) -> PoolCollector:
    """Register a collector for ``pool`` (sync or async) and return it (``registry.unregister``
    takes it back). ``name`` labels the pool's series (default: its addresses, comma-joined)."""
    collector = PoolCollector(pool, name if name is not None else ",".join(pool.addresses))
    registry.register(collector)
    return collector

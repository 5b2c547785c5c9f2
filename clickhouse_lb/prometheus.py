"""A ready Prometheus collector for pools (the optional ``prometheus`` extra).

>>> import clickhouse_lb.prometheus
>>> clickhouse_lb.prometheus.register(pool)                   # the default registry
>>> clickhouse_lb.prometheus.register(pool, name="events")    # a label, to tell pools apart

A registry gets one collector, which holds every pool registered in it and emits each metric
family once, with every pool's samples under its ``pool`` label (the exposition formats allow
one group per metric name). It holds the pools weakly: a pool that is closed or garbage-collected
leaves the output. Registering the same pool twice in one registry, or a second live pool under
a ``name`` already used there, is a ``ValueError``.

The collector reads the pools at scrape time (``pool.replicas``, ``pool.stats``): nothing is
pushed and nothing is computed between scrapes. Per replica (labels ``pool``, ``replica``):
``clickhouse_lb_replica_up``, ``..._errors``, ``..._slowdowns``, ``..._delay_seconds`` (when
known), ``..._probe_latency_seconds`` (latest answered probe), ``..._probe_up`` and
``..._estimated_recovery_seconds``; per pool (label ``pool``): ``clickhouse_lb_statements_total``,
``clickhouse_lb_failovers_total``, ``clickhouse_lb_failures_total`` (label ``kind``),
``clickhouse_lb_probes_total`` and ``clickhouse_lb_failed_probes_total``.
"""

from __future__ import annotations

import threading
import weakref
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


_REPLICA_GAUGES = (
    ("up", "1 when the replica is in rotation: its last attempt did not fail, probes do not see it down"),
    ("probe_up", "1: the latest health probe answered; 0: probes see it down; absent: unknown"),
    ("errors", "errors_count: errors counted against the replica, decayed to now"),
    ("slowdowns", "slowdowns_count, decayed to now"),
    ("estimated_recovery_seconds", "seconds until the replica's counts decay to zero"),
    ("delay_seconds", "replication delay of the replica, when known"),
    ("probe_latency_seconds", "latency of the replica's latest answered health probe"),
)
_POOL_COUNTERS = (
    ("statements", "statements run through the pool (each counts once, however many attempts)"),
    ("failovers", "attempts that failed on a replica and moved on to another"),
    ("probes", "health probes sent"),
    ("failed_probes", "health probes that failed"),
)
_FAILURES_HELP = (
    "errors counted against replicas, by kind (connect, disconnect, timeout, hung, http_status, "
    "server_error, probe, ping, recorded)"
)


def _families() -> tuple[dict[str, GaugeMetricFamily], dict[str, CounterMetricFamily], CounterMetricFamily]:
    gauges = {
        metric: GaugeMetricFamily(f"clickhouse_lb_replica_{metric}", documentation, labels=["pool", "replica"])
        for metric, documentation in _REPLICA_GAUGES
    }
    counters = {
        metric: CounterMetricFamily(f"clickhouse_lb_{metric}", documentation, labels=["pool"])
        for metric, documentation in _POOL_COUNTERS
    }
    return gauges, counters, CounterMetricFamily("clickhouse_lb_failures", _FAILURES_HELP, labels=["pool", "kind"])


def _gone(pool: object | None) -> bool:
    """A pool garbage-collected (its weak reference is dead) or closed: not exported any more."""
    return pool is None or bool(getattr(pool, "_closed", False))


class PoolCollector:
    """Exports, on every scrape, every pool registered in one registry: each metric family once,
    a pool's samples under its ``pool`` label. Pools are held weakly; a closed or collected one
    is dropped. :func:`register` makes one per registry and adds the pools to it;
    ``PoolCollector(pool, name)`` starts with that pool (``name`` defaults to its addresses)."""

    def __init__(self, pool: _Pool | None = None, name: str | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: list[tuple[weakref.ref[Any], str]] = []
        if pool is not None:
            self.add(pool, name if name is not None else ",".join(pool.addresses))

    def add(self, pool: _Pool, name: str) -> None:
        """Export ``pool`` under the label ``pool=name``. ``ValueError`` when the pool is already
        here, or when another live pool already has that name (their samples would clash)."""
        with self._lock:
            self._prune()
            for reference, existing in self._entries:
                if reference() is pool:
                    raise ValueError(
                        f"this pool is already registered in this registry (as pool={existing!r}); "
                        "register each pool once per registry"
                    )
                if existing == name:
                    raise ValueError(
                        f"another pool is already registered in this registry as pool={name!r}: "
                        "pass a distinct name= to tell the pools apart"
                    )
            self._entries.append((weakref.ref(pool), name))

    def remove(self, pool: _Pool) -> None:
        """Stop exporting ``pool`` (``ValueError`` when it is not exported here)."""
        with self._lock:
            kept = [(reference, name) for reference, name in self._entries if reference() is not pool]
            if len(kept) == len(self._entries):
                raise ValueError("this pool is not registered in this registry")
            self._entries = kept

    @property
    def pools(self) -> list[tuple[Any, str]]:
        """``[(pool, name), ...]``: the pools exported, in the order they were registered."""
        with self._lock:
            live = [(reference(), name) for reference, name in self._entries]
        return [(pool, name) for pool, name in live if not _gone(pool)]

    def _prune(self) -> None:
        self._entries = [(reference, name) for reference, name in self._entries if not _gone(reference())]

    def describe(self) -> list[Metric]:
        # The families' names, without reading a pool: registration must not do work. With them
        # the registry refuses another collector that emits one of these names.
        gauges, counters, failures = _families()
        return [*gauges.values(), *counters.values(), failures]

    def collect(self) -> Iterator[Metric]:
        gauges, counters, failures = _families()
        for pool, name in self.pools:
            for status in pool.replicas:
                labels = [name, status.address]
                in_rotation = status.is_up and status.probe_state != "down"
                gauges["up"].add_metric(labels, 1.0 if in_rotation else 0.0)
                if status.probe_state in ("up", "down"):
                    gauges["probe_up"].add_metric(labels, 1.0 if status.probe_state == "up" else 0.0)
                gauges["errors"].add_metric(labels, status.errors_count)
                gauges["slowdowns"].add_metric(labels, status.slowdowns_count)
                gauges["estimated_recovery_seconds"].add_metric(labels, status.estimated_recovery_time)
                if status.delay is not None:
                    gauges["delay_seconds"].add_metric(labels, status.delay)
                if status.probe_latency is not None:
                    gauges["probe_latency_seconds"].add_metric(labels, status.probe_latency)
            stats = pool.stats
            counters["statements"].add_metric([name], stats.statements)
            counters["failovers"].add_metric([name], stats.failovers)
            counters["probes"].add_metric([name], stats.probes)
            counters["failed_probes"].add_metric([name], stats.failed_probes)
            for kind, count in sorted(stats.failures.items()):
                failures.add_metric([name, kind], count)
        yield from gauges.values()
        yield from counters.values()
        yield failures


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, PoolCollector] = weakref.WeakKeyDictionary()
_collectors_lock = threading.Lock()


def _registered(registry: CollectorRegistry, collector: PoolCollector) -> bool:
    # prometheus_client has no public "is it registered?"; its registries have kept this map
    # since 0.1. Without it, trust our own record.
    names = getattr(registry, "_collector_to_names", None)
    return names is None or collector in names


def register(pool: Any, *, name: str | None = None, registry: CollectorRegistry = REGISTRY) -> PoolCollector:
    """Export ``pool`` (sync or async) in ``registry`` and return the registry's collector, the
    one that exports every pool registered there (``collector.remove(pool)`` stops one pool,
    ``registry.unregister(collector)`` all of them). ``name`` labels the pool's series (default:
    its addresses, comma-joined). ``ValueError`` when the pool is already registered in this
    registry, or another live pool there has the same name."""
    label = name if name is not None else ",".join(pool.addresses)
    with _collectors_lock:
        collector = _collectors.get(registry)
        if collector is None or not _registered(registry, collector):
            # The first pool of this registry (or its collector was unregistered): a new one.
            collector = PoolCollector(pool, label)
            registry.register(collector)
            _collectors[registry] = collector
        else:
            collector.add(pool, label)
    return collector

"""The pools' side of discovery: the I/O steps (``system.clusters`` read from a seed) and the
replacement of a pool's replica set, whose carry-over is
:meth:`clickhouse_lb.core.replica_set.ReplicaSetView.carried_over`.

Two named I/O steps, and no other: :func:`read_discovered_config` (the pool's first set, read
before the pool is built over it) and :meth:`DiscoveryMembers._read_cluster` (each refresh, on
the health worker)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from clickhouse_lb.config.discovery import DiscoveryError
from clickhouse_lb.config.pool_config import PoolConfig
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.discovery import InFlight, ReplicaSetChange, diff_replicas
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.health import HealthMonitor
from clickhouse_lb.core.replica_set import ReplicaSetView
from clickhouse_lb.pools._client_slot import ClientSlot
from clickhouse_lb.probes._discovery_query import ClusterReader

__all__ = ["DiscoveryMembers", "discovery_reader", "needs_first_discovery", "read_discovered_config"]


def discovery_reader(config: PoolConfig) -> ClusterReader:
    return ClusterReader(
        config.client_options, config.discovery,
        connect_timeout=config.settings.connect_timeout_with_failover_ms / 1000.0,
    )


def needs_first_discovery(config: PoolConfig) -> bool:
    """Whether ``config`` asks for discovery and its replicas are still the seeds."""
    return config.discovery.enabled and not config.seeds


def read_discovered_config(config: PoolConfig) -> PoolConfig:
    """I/O: the configuration over the replicas of ``config.discovery.cluster``, read from the
    seeds (``config.replicas``). Its balancing state is the pool's own: the shared-state key
    is the ordered replica set, which a discovered pool changes at run time."""
    reader = discovery_reader(config)
    try:
        replicas = reader.replicas(config.replicas)
    finally:
        reader.close()
    return dataclasses.replace(config, replicas=replicas, seeds=tuple(config.replicas), share_state=False)


class _Prober(Protocol):
    """The pool's probe worker (a thread for the sync pool, a task for the async one)."""

    def ensure_started(self) -> None: ...

    def stop(self) -> None: ...

    def retarget(self, monitor: HealthMonitor, addresses: tuple[str, ...]) -> None: ...


class DiscoveryMembers:
    """A pool's replica set replaced when discovery reads another: the view swap, the
    statements counted in flight per view, the retired clients closed after them."""

    config: PoolConfig
    _view: ReplicaSetView
    _closed: bool
    #: The health-probe worker, set by the driver when probing is on.
    _prober: _Prober | None = None

    def _init_discovery(self) -> None:
        #: Statements running per view: the clients of replicas that discovery removed are
        #: closed once the last statement that may use them is done.
        self._in_flight: InFlight[ReplicaSetView] = InFlight()
        #: Only discovery replaces the view: without it, statements need not be counted in flight.
        self._track_views = self.config.discovery.enabled
        self._discovery_lock = threading.Lock()

    def _new_slot(self) -> ClientSlot[Any]:
        raise NotImplementedError

    def _close_retired(self, slots: list[ClientSlot[Any]]) -> None:
        """Close the clients of replicas that left the set (their statements are done)."""
        raise NotImplementedError

    @contextmanager
    def _view_in_use(self, view: ReplicaSetView) -> Iterator[None]:
        """Count a statement or ping on ``view`` in flight while it runs (only under discovery,
        the one thing that replaces a view; the statement path tests ``_track_views`` itself)."""
        if not self._track_views:
            yield
            return
        self._in_flight.acquire(view)
        try:
            yield
        finally:
            self._in_flight.release(view)

    def _discovery_seeds(self) -> list[Replica]:
        """Who to ask: the seeds, then the replicas discovered last time (so the pool still
        refreshes when every seed is gone but the cluster lives on)."""
        seeds = list(self.config.seeds)
        known = {seed.address.lower() for seed in seeds}
        return seeds + [r for r in self._view.balancer.replicas if r.address.lower() not in known]

    def _read_cluster(self) -> list[Replica] | None:
        """I/O: the cluster's replicas now, or None when no one answered: the set is kept as
        it is, and the next refresh tries again."""
        reader = discovery_reader(self.config)
        try:
            return reader.replicas(self._discovery_seeds())
        except DiscoveryError as exc:
            logger.warning("discovery of cluster %r failed; keeping the current replicas: %s",
                           self.config.discovery.cluster, exc)
            return None
        finally:
            reader.close()

    def _apply_discovered(self, replicas: list[Replica]) -> ReplicaSetChange | None:
        """Replace the view when the discovered set differs from the current one (the
        carry-over is the view's: kept replicas keep their records, probe records and clients);
        removed ones' clients are closed once the statements running on the old view are done."""
        with self._discovery_lock:
            if self._closed:
                return None
            old = self._view
            change = diff_replicas(old.balancer.replicas, replicas)
            if change.unchanged:
                return None
            self._view = view = old.carried_over(change, self._new_slot)
            self.config = dataclasses.replace(self.config, replicas=list(change.replicas))
            if self._prober is not None and view.health is not None:
                self._prober.retarget(view.health, view.balancer.addresses)
        removed = [old.slots[i] for i in change.removed]
        addresses, before = view.balancer.addresses, old.balancer.addresses
        logger.info(
            "cluster %r: replicas now %s (added %s, removed %s)", self.config.discovery.cluster,
            ", ".join(addresses), [addresses[i] for i in change.added] or "none",
            [before[i] for i in change.removed] or "none",
        )
        for slot in removed:
            slot.retired = True
        self._in_flight.retire(old, lambda: self._close_retired(removed))
        return change

"""What the sync and async pools share above the balancer: configuration, status, plan,
recording errors, listeners. No I/O and no client here, so neither pool's transport leaks
into the other (the async one imports aiohttp, the sync one must not)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .balancer import Balancer, ReplicaStatus
from .config import PoolConfig
from .health import HealthMonitor, probe_statuses_off
from .settings import BalancingSettings, Replica, split_statement_settings
from .stats import PoolStats, StatsSnapshot

__all__ = ["PoolBase"]


class PoolBase:
    """The balancing side of a pool; subclasses add the clients and the statements."""

    def __init__(
        self, config: PoolConfig, *, listeners: Iterable[object] = (), balancer: Balancer | None = None
    ) -> None:
        self.config = config
        self._balancer = balancer or Balancer(config.replicas, config.settings, listeners=listeners)
        self._closed = False
        self._stats = PoolStats()
        self._balancer.listeners.add(self._stats)
        #: Decides the background probes (None when health_check_interval_ms=0); the pools
        #: add the worker that sends them.
        self._health: HealthMonitor | None = (
            HealthMonitor(self._balancer, config.health) if config.health.enabled else None
        )

    @property
    def settings(self) -> BalancingSettings:
        """The pool's balancing settings."""
        return self._balancer.settings

    @property
    def balancer(self) -> Balancer:
        return self._balancer

    @property
    def addresses(self) -> list[str]:
        """``["host:port", ...]`` in the configured order."""
        return list(self._balancer.addresses)

    @property
    def replicas(self) -> list[ReplicaStatus]:
        """Per replica: host, port, errors_count, slowdowns_count, estimated_recovery_time,
        last_error, is_up ... (named like ``system.clusters``), and what the health probes
        saw: probe_state, last_probe_time, probe_latency, last_probe_error."""
        statuses = self._balancer.statuses()
        probes = self._health.statuses() if self._health else probe_statuses_off(len(statuses))
        return [
            dataclasses.replace(status, **probe._asdict()) for status, probe in zip(statuses, probes)
        ]

    @property
    def stats(self) -> StatsSnapshot:
        """Running totals: statements, failovers, failures by kind, probes."""
        return self._stats.snapshot()

    def plan(self, load_balancing: str | None = None) -> list[str]:
        """``["host:port", ...]``: the order the next statement would try the replicas
        (optionally under another strategy). A look only: it does not advance ``round_robin``."""
        overrides, _ = split_statement_settings({"load_balancing": load_balancing} if load_balancing else None)
        return self._balancer.plan(overrides)

    def record_error(self, address: str | Replica, reason: str = "recorded by the application") -> int:
        """Count an error against a replica, as a failed attempt would (for application-level
        checks such as stale data). Returns the replica's new errors_count."""
        return self._balancer.record_error(self._balancer.index_of(address), reason)

    def record_slowdown(self, address: str | Replica) -> int:
        """Count a slowdown (hedged-read accounting; shown as slowdowns_count)."""
        return self._balancer.record_slowdown(self._balancer.index_of(address))

    def add_listener(self, listener: object) -> None:
        """Receive failover, error-recorded and replica-recovered events (see ``PoolListener``).
        Listeners are called synchronously (on the event loop for the async pool): keep them quick."""
        self._balancer.listeners.add(listener)

    def remove_listener(self, listener: object) -> None:
        self._balancer.listeners.remove(listener)

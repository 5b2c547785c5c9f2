"""One health worker for every sync pool over one shared replica set.

Pools that share a balancing state (:mod:`clickhouse_lb.core.shared_state`) share its probes too:
the worker probes through a balancer of its own over the shared state (so what it counts and
clears is what every pool sees), and its events reach each pool's listeners through a
forwarder the pool adds while it is open. The worker lives as long as the shared state:
closing the pool that started it (the engine of one query, in an engine-per-query
application) leaves it running for the next pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clickhouse_lb.config.health import HealthSettings
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BalancingSettings
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.events import (
    ErrorRecordedEvent,
    FailoverEvent,
    ListenerSet,
    ProbeEvent,
    ReplicaDownEvent,
    ReplicaRecoveredEvent,
)
from clickhouse_lb.core.health import HealthMonitor
from clickhouse_lb.core.state import ReplicaSetState
from clickhouse_lb.probes.workers import ProbeWorker

__all__ = ["Forwarder", "SharedProbes"]


class SharedProbes:
    """The probe worker of one shared replica set, and the listeners its events go to."""

    def __init__(
        self,
        replicas: list[Replica],
        settings: BalancingSettings,
        health: HealthSettings,
        state: ReplicaSetState,
        options: Mapping[str, Any],
    ) -> None:
        self.listeners = ListenerSet()
        self.balancer = Balancer(replicas, settings, state=state)
        self.balancer.listeners = self.listeners
        self.monitor = HealthMonitor(self.balancer, health)
        self.worker = ProbeWorker(self.monitor, self.balancer.addresses, options)

    def stop(self) -> None:
        self.worker.stop()


class Forwarder:
    """Hands the shared worker's events to one pool's listeners (its stats and the user's)."""

    __slots__ = ("target",)

    def __init__(self, target: ListenerSet) -> None:
        self.target = target

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        self.target.error_recorded(event)

    def on_failover(self, event: FailoverEvent) -> None:
        self.target.failover(event)

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        self.target.replica_recovered(event)

    def on_probe(self, event: ProbeEvent) -> None:
        self.target.probe(event)

    def on_replica_down(self, event: ReplicaDownEvent) -> None:
        self.target.replica_down(event)

"""A pool's replica set, one generation of it: the one object discovery replaces, and the one
place where it carries the per-replica state over to the new set.

Per replica, three things, each indexed by the replica's position in the set:

* its **record** (:class:`~clickhouse_lb.core.records.ReplicaRecord`: counts, decay marks,
  load), in the balancer's :class:`~clickhouse_lb.core.state.ReplicaSetState`. Shared by every
  pool over the same replicas (:mod:`clickhouse_lb.core.shared_state`), so it cannot hold
  anything that is one pool's;
* its **probe record** (verdict, rise/fall streaks, latest probe, replication delay), in the
  health monitor's schedule: one per prober (the shared worker of sync pools, each async
  pool's task), under the same set lock as the records;
* its **client slot** (the pool's clickhouse-connect client, created on first use): one per
  pool, an opaque handle here (the pools own the clients; this layer does no I/O).

:meth:`ReplicaSetView.carried_over` moves all three for a kept replica together, by one rule
(:func:`~clickhouse_lb.core.records.remap`): added replicas start fresh, removed ones stay
with the old view, whose statements still run on it (their clients close once the last is
done, :class:`~clickhouse_lb.core.discovery.InFlight`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.discovery import ReplicaSetChange
from clickhouse_lb.core.health import HealthMonitor
from clickhouse_lb.core.records import remap

__all__ = ["ReplicaSetView"]


class ReplicaSetView(NamedTuple):
    """A pool's replica set with everything indexed by position in it: the balancer (and the
    records of its state), the probe schedule, the clients' slots. Replaced whole when
    discovery changes the set; a statement keeps the view it started with, so positions
    never mix across sets."""

    balancer: Balancer
    health: HealthMonitor | None
    slots: tuple[Any, ...]

    def carried_over(self, change: ReplicaSetChange, new_slot: Callable[[], Any]) -> ReplicaSetView:
        """The view of ``change.replicas``: every kept replica's record, probe record and
        client slot at its new position, fresh ones for the added (``new_slot()`` for a slot).
        The listeners stay the pool's."""
        old = self.balancer
        size = len(change.replicas)
        state = old.state.carried_over(change.kept, size)
        balancer = Balancer(change.replicas, old.settings, state=state)
        balancer.listeners = old.listeners
        health = None
        if self.health is not None:
            schedule = self.health.schedule.carried_over(change.kept, size, state.set_clock)
            health = HealthMonitor.with_schedule(balancer, schedule)
        slots = remap(self.slots, change.kept, size, new_slot)
        return ReplicaSetView(balancer, health, tuple(slots))

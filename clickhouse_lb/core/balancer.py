"""The balancing core shared by the sync and async pools: ordering, counting, reporting.

No I/O happens here. :class:`Balancer` owns one :class:`~clickhouse_lb.core.state.ReplicaSetState`
and answers two questions for a statement: in which order to try the replicas
(:meth:`Balancer.plan_indices`), and what an attempt's outcome does to the counts
(:meth:`Balancer.count_failure` is the one place that classifies a failed call and counts it
when it is the replica's fault; :meth:`Balancer.record_success` notes a success).
"""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from clickhouse_lb._redact import redact
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import NO_OVERRIDES, BalancingSettings, LoadBalancing, StatementOverrides
from clickhouse_lb.core.classify import PING_DISPROVABLE_KINDS, Failure, classify
from clickhouse_lb.core.events import ErrorRecordedEvent, Listener, ListenerSet, ReplicaRecoveredEvent, logger
from clickhouse_lb.core.ordering import (
    least_loaded_order,
    plan_order,
    rank_order,
    rank_orders,
    round_robin_order,
    round_robin_rotations,
    static_ranks,
)
from clickhouse_lb.core.state import Clock, HealthReading, ReplicaSetState
from clickhouse_lb.core.strategies import default_local_hostname, hostname_scores, strategy_priorities
from clickhouse_lb.errors import ConfigurationError

__all__ = ["Balancer", "ReplicaStatus", "new_replica_set_state"]

# Looked up once per statement: module constants are cheaper than enum members.
_ROUND_ROBIN = LoadBalancing.ROUND_ROBIN
_LEAST_LOADED = LoadBalancing.LEAST_LOADED


@dataclass(frozen=True)
class ReplicaStatus:
    """What the pool thinks of one replica, named like ``system.clusters``.

    ``errors_count`` and ``slowdowns_count`` are decayed to now; ``estimated_recovery_time``
    is the number of seconds until both reach zero; ``is_up`` is False while the latest
    attempt on the replica failed (until one succeeds again); ``last_error_time`` is a
    ``time.time()`` timestamp. ``in_flight`` is the number of this pool's attempts running on
    the replica now (of every pool sharing its balancing state), ``latency_ewma`` the decayed
    latency average in seconds (None until an attempt there ended); ``least_loaded`` balances
    on both.

    From the health probes: ``probe_state`` (``up``, ``down``, ``unknown`` before the first
    probe, ``off`` when probing is turned off), ``last_probe_time`` (``time.time()``),
    ``probe_latency`` (seconds, latest answered probe) and ``last_probe_error``.
    ``delay``: the replica's replication delay in seconds, when known.
    """

    host: str
    port: int
    address: str
    priority: int
    errors_count: int
    slowdowns_count: int
    estimated_recovery_time: float
    last_error: str | None
    last_error_time: float | None
    is_up: bool
    in_flight: int = 0
    latency_ewma: float | None = None
    probe_state: str = "off"
    last_probe_time: float | None = None
    probe_latency: float | None = None
    last_probe_error: str | None = None
    delay: float | None = None


def new_replica_set_state(size: int, settings: BalancingSettings, clock: Clock = time.monotonic) -> ReplicaSetState:
    """A fresh state for ``size`` replicas under ``settings``."""
    return ReplicaSetState(
        size,
        half_life=settings.distributed_replica_error_half_life,
        error_cap=settings.distributed_replica_error_cap,
        clock=clock,
        # Many processes started together must not all begin with the same replica.
        round_robin_start=_random.SystemRandom().getrandbits(32),
        load_decay_time=settings.least_loaded_decay_time,
    )


class Balancer:
    """Ordering and error accounting for one replica set (thread-safe)."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        settings: BalancingSettings,
        *,
        clock: Clock = time.monotonic,
        random: Callable[[], float] = _random.random,
        listeners: Iterable[Listener] = (),
        state: ReplicaSetState | None = None,
    ) -> None:
        if not replicas:
            raise ConfigurationError("No replicas given")
        self.replicas: tuple[Replica, ...] = tuple(replicas)
        self.settings = settings
        self.addresses: tuple[str, ...] = tuple(r.address for r in self.replicas)
        self._index = {address: i for i, address in enumerate(self.addresses)}
        self._index.update({address.lower(): i for i, address in enumerate(self.addresses)})
        self._priorities = [r.priority for r in self.replicas]
        self._priority_ranks = static_ranks(self._priorities, [0] * len(self._priorities))
        self._random = random
        self.listeners = ListenerSet(listeners)
        # ``state``: one shared with other pools over the same replicas (clickhouse_lb.core.shared_state).
        self.state = state if state is not None else new_replica_set_state(len(self.replicas), settings, clock)
        # Static parts of the sort key, per (strategy, first offset): computed once, on first use.
        self._ranks: dict[tuple[LoadBalancing, int], list[int]] = {}
        self._local_hostname = settings.local_hostname
        self._default_ranks: list[int] | None = None
        #: The default strategy's ranks, when its order while every count is zero follows from
        #: them alone (None: round_robin or least_loaded, or not computed yet): see plan_indices.
        self._clear_ranks: list[int] | None = None
        #: The orders those ranks allow, one drawn per statement (None: too many to list, see
        #: ordering.rank_orders; one order when no two ranks tie).
        self._clear_orders: list[list[int]] | None = None
        #: round_robin's orders while every count is zero, one per counter step modulo their
        #: period (None: another strategy, or too many: see ordering.round_robin_rotations).
        self._clear_rotations: list[list[int]] | None = None
        #: least_loaded is the default: on a healthy set its order needs the loads, not the counts.
        self._clear_least_loaded = False
        if not settings.load_balancing.uses_hostnames:  # a hostname default may need a DNS lookup
            self._default_ranks = self._static_ranks(settings.load_balancing, settings.load_balancing_first_offset)

    # -- ordering --------------------------------------------------------------------------

    @property
    def local_hostname(self) -> str:
        if self._local_hostname is None:
            self._local_hostname = default_local_hostname()
        return self._local_hostname

    def _static_ranks(self, strategy: LoadBalancing, first_offset: int) -> list[int]:
        key = (strategy, first_offset if strategy is LoadBalancing.FIRST_OR_RANDOM else 0)
        ranks = self._ranks.get(key)
        if ranks is None:
            n = len(self.replicas)
            scores = (
                hostname_scores(strategy, self.local_hostname, [r.host for r in self.replicas])
                if strategy.uses_hostnames
                else None
            )
            priorities = strategy_priorities(strategy, n, first_offset=first_offset, hostname_score=scores)
            ranks = static_ranks(self._priorities, priorities)
            self._ranks[key] = ranks
            if strategy is self.settings.load_balancing and first_offset == self.settings.load_balancing_first_offset:
                self._default_ranks = ranks
                if strategy is _ROUND_ROBIN:
                    self._clear_rotations = round_robin_rotations(self._priority_ranks)
                elif strategy is _LEAST_LOADED:
                    self._clear_least_loaded = True
                else:
                    self._clear_ranks, self._clear_orders = ranks, rank_orders(ranks)
        return ranks

    def plan_indices(self, overrides: StatementOverrides = NO_OVERRIDES, *, advance: bool = True) -> list[int]:
        """Replica indices in the order the next statement tries them. ``advance``: this is a
        statement (round_robin takes one step); False for a look (``pool.plan()``)."""
        clear_ranks = self._clear_ranks
        if clear_ranks is not None and overrides is NO_OVERRIDES and self.state.clear():
            # The fast path, a healthy set: no snapshot of the counts (all zero, nothing to decay),
            # the order of the ranks alone, as plan_order gives it for zero counts: one of the
            # orders listed once, drawn uniformly (no draw when there is one), else drawn by a sort.
            orders = self._clear_orders
            if orders is None:
                return rank_order(clear_ranks, self._random)
            return (orders[0] if len(orders) == 1 else orders[int(self._random() * len(orders))])[:]
        rotations = self._clear_rotations
        if rotations is not None and overrides is NO_OVERRIDES and self.state.clear():
            # round_robin on a healthy set: the counter's step alone, the order listed once.
            return rotations[self.state.round_robin_step(advance) % len(rotations)][:]
        if self._clear_least_loaded and overrides is NO_OVERRIDES and self.state.clear():
            # least_loaded on a healthy set: no snapshot of the counts (all zero), the loads decide.
            return least_loaded_order(self.state.zeros, self._priority_ranks, 0, self.state.replica_load.order_keys(),
                                      self._random)
        settings = self.settings
        if overrides is not NO_OVERRIDES and overrides:
            strategy = overrides.load_balancing or settings.load_balancing
            offset = overrides.load_balancing_first_offset
            first_offset = settings.load_balancing_first_offset if offset is None else offset
            ignored = overrides.distributed_replica_max_ignored_errors
            max_ignored = settings.distributed_replica_max_ignored_errors if ignored is None else ignored
        else:
            strategy = settings.load_balancing
            first_offset = settings.load_balancing_first_offset
            max_ignored = settings.distributed_replica_max_ignored_errors
        round_robin = strategy is _ROUND_ROBIN
        snapshot = self.state.select(advance_round_robin=advance and round_robin)
        if snapshot.recovered:
            self._recovered(snapshot.recovered, "decayed")
        if round_robin:
            return round_robin_order(snapshot.errors, self._priority_ranks, max_ignored, snapshot.round_robin)
        if strategy is _LEAST_LOADED:
            scores = self.state.replica_load.order_keys()
            return least_loaded_order(snapshot.errors, self._priority_ranks, max_ignored, scores, self._random)
        ranks = self._default_ranks if strategy is settings.load_balancing else None
        if ranks is None or first_offset != settings.load_balancing_first_offset:
            ranks = self._static_ranks(strategy, first_offset)
        # Slowdowns (pool.record_slowdown) rank right after errors, as under hedged requests;
        # none recorded (the usual case) gives the plain order, on its faster path.
        slowdowns = snapshot.slowdowns if snapshot.slowed else None
        return plan_order(snapshot.errors, ranks, max_ignored, self._random, slowdowns=slowdowns)

    def plan(self, overrides: StatementOverrides = NO_OVERRIDES) -> list[str]:
        return [self.addresses[i] for i in self.plan_indices(overrides, advance=False)]

    # -- outcomes --------------------------------------------------------------------------

    def index_of(self, address: str | Replica) -> int:
        key = address.address if isinstance(address, Replica) else str(address).strip()
        index = self._index.get(key, self._index.get(key.lower()))
        if index is None:
            raise ConfigurationError(f"Unknown replica {address!r}; this pool has: {', '.join(self.addresses)}")
        return index

    def count_failure(self, index: int, exc: BaseException) -> Failure:
        """Classify a call that failed on replica ``index`` and, when the replica is at fault
        (``failure.replica``), count an error against it at once. A query failure (bad SQL,
        authentication, ...) counts nothing: the caller raises or reports it unchanged.

        The one place where a failed call becomes an error count: failover, pings, pinned
        sessions and the CLI all go through here."""
        failure = classify(exc)
        if failure.replica:
            self.record_error(index, failure.reason, kind=failure.kind)
        return failure

    def ping_answered(self, index: int, answered: bool) -> bool:
        """Count a ping's outcome like an attempt's; returns ``answered``."""
        if answered:
            self.record_success(index)
        else:
            self.record_error(index, "ping failed", kind="ping")
        return answered

    def record_error(self, index: int, reason: str, kind: str = "recorded") -> int:
        """Count an error; ``kind`` says what failed (see :class:`ErrorRecordedEvent`)."""
        reason = redact(reason)
        count = self.state.record_error(index, reason, sticky=kind not in PING_DISPROVABLE_KINDS)
        address = self.addresses[index]
        logger.debug("error recorded against %s (errors_count=%d): %s", address, count, reason)
        if self.listeners:
            self.listeners.error_recorded(ErrorRecordedEvent(address, count, reason, kind))
        return count

    def announce_outage(self, index: int) -> bool:
        """Whether this is the first report of the replica's current outage (log it at WARNING;
        later reports of the same outage go at INFO): one WARNING line per outage."""
        return self.state.announce_outage(index)

    def readmit(self, index: int, reason: str) -> bool:
        """Clear a replica's error count (health probes saw it answer again); False when there
        was nothing to clear."""
        if not self.state.clear_errors(index):
            return False
        self._recovered([index], reason)
        return True

    def health_marks(self) -> tuple[list[int], list[bool]]:
        """Per replica: errors ever counted, and whether the count holds one a ping cannot
        disprove (see :meth:`ReplicaSetState.health_marks`)."""
        return self.state.health_marks()

    def health_reading(self) -> HealthReading:
        """Counts, suspects and marks in one consistent read (:meth:`ReplicaSetState.health_reading`)."""
        return self.state.health_reading()

    def error_counts(self) -> list[int]:
        """Errors per replica, decayed to now (a look: the decay clock does not move)."""
        return [c.errors for c in self.state.counts()]

    def suspects(self) -> list[bool]:
        """Per replica: it has errors, or its latest attempt failed (probed more often)."""
        return [c.errors > 0 or c.last_attempt_failed for c in self.state.counts()]

    def record_slowdown(self, index: int) -> int:
        return self.state.record_slowdown(index)

    def record_success(self, index: int) -> None:
        record = self.state.records[index]
        if not record.failed and not record.announced:  # the common case (state.record_success's own test, inlined)
            return
        if self.state.record_success(index):
            self._recovered([index], "succeeded")

    def _recovered(self, indices: Iterable[int], reason: str) -> None:
        for index in indices:
            address = self.addresses[index]
            logger.info("replica %s is back in rotation (%s)", address, reason)
            if self.listeners:
                self.listeners.replica_recovered(ReplicaRecoveredEvent(address, reason))

    # -- reporting -------------------------------------------------------------------------

    def statuses(self) -> list[ReplicaStatus]:
        """Every replica's status, its counts and load read in one hold of the set's lock
        (the fields in ``ReplicaStatus``'s order)."""
        return [
            ReplicaStatus(
                r.host, r.port, r.address, r.priority, c.errors, c.slowdowns, c.estimated_recovery_time,
                c.last_error, c.last_error_time, not c.last_attempt_failed, load.in_flight, load.latency_ewma,
            )
            for r, (c, load) in zip(self.replicas, self.state.report())
        ]

"""What the sync and async pools share above the balancer: configuration, status, plan,
recording errors, listeners. No I/O and no client here, so neither pool's transport leaks
into the other (the async one imports aiohttp, the sync one must not)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .balancer import Balancer, ReplicaStatus, new_replica_set_state
from .config import PoolConfig
from .settings import BalancingSettings, Replica, split_statement_settings
from .shared_state import acquire_state

__all__ = ["PoolBase"]


class PoolBase:
    """The balancing side of a pool; subclasses add the clients and the statements."""

    def __init__(
        self, config: PoolConfig, *, listeners: Iterable[object] = (), balancer: Balancer | None = None
    ) -> None:
        self.config = config
        # -- shared balancing state (clickhouse_lb.shared_state) --------------------------------
        # A pool given no balancer shares its counts with the other pools and engines of the
        # process over the same replica set (unless share_state=False); the hold is given back
        # on close() or when the balancer is garbage-collected.
        self._release_state: Callable[[], object] | None = None
        if balancer is None:
            size, settings = len(config.replicas), config.settings
            lease = acquire_state(config, lambda: new_replica_set_state(size, settings)) if config.share_state else None
            balancer = Balancer(
                config.replicas, settings, listeners=listeners, state=lease.value if lease is not None else None
            )
            if lease is not None:
                self._release_state = lease.release_with(balancer)
        # -------------------------------------------------------------------------------------
        self._balancer = balancer
        self._closed = False

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
        last_error, is_up ... (named like ``system.clusters``)."""
        return self._balancer.statuses()

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

    def _release_shared_state(self) -> None:
        """Give back this pool's hold on the shared balancing state (on close)."""
        if self._release_state is not None:
            self._release_state()

    def add_listener(self, listener: object) -> None:
        """Receive failover, error-recorded and replica-recovered events (see ``PoolListener``).
        Listeners are called synchronously (on the event loop for the async pool): keep them quick."""
        self._balancer.listeners.add(listener)

    def remove_listener(self, listener: object) -> None:
        self._balancer.listeners.remove(listener)

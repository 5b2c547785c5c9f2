"""Replica-lag-aware ordering, as the server does it for distributed queries. No I/O.

The server checks each replica's replication delay (``system.replicas.absolute_delay``) when it
connects for a distributed query (src/Client/ConnectionEstablisher.cpp): a replica whose delay
is at least ``max_replica_delay_for_distributed_queries`` seconds is *stale* (0 turns the check
off). Stale replicas are tried after every fresh one, least stale first
(PoolWithFailoverBase::getMany sorts by ``(not up_to_date, delay)``, stably); with
``fallback_to_stale_replicas_for_distributed_queries=0`` they are not used at all, and a query
with no fresh replica fails with ``ALL_REPLICAS_ARE_STALE``.

Here the delays come from the health probes (``None``: not known, which counts as fresh), and
the rule is applied to the plan the strategy made, so that errors and priorities still order
the fresh replicas among themselves.

The pools apply it (``PoolBase._fresh_first``) to every statement, ``plan()`` and sessions.
"""

from __future__ import annotations

from collections.abc import Sequence

from clickhouse_lb.config.lag import LAG_SETTING_NAMES, LagSettings, parse_lag_settings
from clickhouse_lb.errors import AllReplicasStaleError

__all__ = ["LAG_SETTING_NAMES", "LagSettings", "order_by_freshness", "parse_lag_settings"]


def is_stale(delay: float | None, settings: LagSettings) -> bool:
    limit = settings.max_replica_delay_for_distributed_queries
    return bool(limit) and delay is not None and delay >= limit


def order_by_freshness(
    order: Sequence[int], delays: Sequence[float | None], settings: LagSettings, addresses: Sequence[str]
) -> list[int]:
    """``order`` (the strategy's plan) with every stale replica moved after the fresh ones,
    least stale first (ties keep the plan's order); without fallback, the stale ones are left
    out, and :class:`AllReplicasStaleError` is raised when none is fresh."""
    if not settings.max_replica_delay_for_distributed_queries:
        return list(order)
    fresh = [i for i in order if not is_stale(delays[i], settings)]
    if len(fresh) == len(order):
        return list(order)
    if not settings.fallback_to_stale_replicas_for_distributed_queries:
        if not fresh:
            raise AllReplicasStaleError(
                {addresses[i]: delays[i] for i in order}, settings.max_replica_delay_for_distributed_queries
            )
        return fresh
    stale = sorted((i for i in order if is_stale(delays[i], settings)), key=lambda i: delays[i] or 0.0)
    return fresh + stale

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._values import as_bool, bounded
from .errors import AllReplicasStaleError

__all__ = ["LAG_SETTING_NAMES", "LagSettings", "order_by_freshness", "parse_lag_settings"]


@dataclass(frozen=True)
class LagSettings:
    """The server's names and defaults (src/Core/Settings.cpp)."""

    #: Seconds; a replica lagging this much or more is stale. 0: lag is not checked.
    max_replica_delay_for_distributed_queries: int = 300
    #: Use stale replicas (after the fresh ones) rather than fail when no fresh one is left.
    fallback_to_stale_replicas_for_distributed_queries: bool = True


LAG_SETTING_NAMES: tuple[str, ...] = (
    "max_replica_delay_for_distributed_queries",
    "fallback_to_stale_replicas_for_distributed_queries",
)

DEFAULT_LAG = LagSettings()


def parse_lag_settings(values: Mapping[str, Any], base: LagSettings = DEFAULT_LAG) -> LagSettings:
    """The pool's lag settings, or a statement's (``base``: the pool's), from names and values
    (strings allowed, as from a URL or a statement's ``settings=``)."""
    max_delay = values.get("max_replica_delay_for_distributed_queries")
    fallback = values.get("fallback_to_stale_replicas_for_distributed_queries")
    return LagSettings(
        base.max_replica_delay_for_distributed_queries
        if max_delay is None
        else int(bounded("max_replica_delay_for_distributed_queries", max_delay) or 0),
        base.fallback_to_stale_replicas_for_distributed_queries
        if fallback is None
        else as_bool("fallback_to_stale_replicas_for_distributed_queries", fallback),
    )


def statement_lag_settings(statement_settings: Mapping[str, Any] | None, pool: LagSettings) -> LagSettings:
    """The lag settings for one statement: its own ``settings=`` win over the pool's. The two
    settings also go on to the server unchanged (they mean the same there, for a query on a
    Distributed table)."""
    if not statement_settings or not any(name in statement_settings for name in LAG_SETTING_NAMES):
        return pool
    return parse_lag_settings(statement_settings, pool)


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

"""Replica-lag settings: `max_replica_delay_for_distributed_queries` and the stale-replica fallback."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from clickhouse_lb.config._fields import parse_fields
from clickhouse_lb.config._values import as_bool, bounded_int


@dataclass(frozen=True)
class LagSettings:
    """The server's names and defaults (src/Core/Settings.cpp)."""

    #: Seconds; a replica lagging this much or more is stale. 0: lag is not checked.
    max_replica_delay_for_distributed_queries: int = 300
    #: Use stale replicas (after the fresh ones) rather than fail when no fresh one is left.
    fallback_to_stale_replicas_for_distributed_queries: bool = True


_PARSERS = {
    "max_replica_delay_for_distributed_queries": bounded_int,
    "fallback_to_stale_replicas_for_distributed_queries": as_bool,
}

LAG_SETTING_NAMES: tuple[str, ...] = tuple(_PARSERS)

DEFAULT_LAG = LagSettings()


def parse_lag_settings(values: Mapping[str, Any], base: LagSettings = DEFAULT_LAG) -> LagSettings:
    """The pool's lag settings, or a statement's (``base``: the pool's), from names and values
    (strings allowed, as from a URL or a statement's ``settings=``)."""
    return replace(base, **parse_fields(values, _PARSERS))


def statement_lag_settings(statement_settings: Mapping[str, Any] | None, pool: LagSettings) -> LagSettings:
    """The lag settings for one statement: its own ``settings=`` win over the pool's. The two
    settings also go on to the server unchanged (they mean the same there, for a query on a
    Distributed table)."""
    if not statement_settings or not any(name in statement_settings for name in LAG_SETTING_NAMES):
        return pool
    return parse_lag_settings(statement_settings, pool)

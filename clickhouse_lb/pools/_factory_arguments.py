"""The one keyword list of :func:`clickhouse_lb.get_pool` and :func:`clickhouse_lb.get_async_pool`.

Both factories take the same 30-odd keywords. They are written once, as the signature of
:func:`_pool_arguments`; :func:`pool_factory` gives that signature to each factory, for
``help()`` and ``inspect`` (``__signature__``) and for type checkers (a ``ParamSpec``), and
:func:`factory_arguments` binds a call to it, so defaults come from the same place too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from clickhouse_lb.config.pool_config import POOL_SETTING_NAMES, PoolConfig, resolve_pool_config
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.core.events import Listener

__all__ = ["FactoryArguments", "factory_arguments", "pool_factory"]


def _pool_arguments(
    hosts: str | Replica | Iterable[str | Replica] | None = None,
    *,
    dsn: str | None = None,
    load_balancing: str | LoadBalancing | None = None,
    local_hostname: str | None = None,
    load_balancing_first_offset: int | None = None,
    distributed_replica_error_half_life: float | None = None,
    distributed_replica_error_cap: int | None = None,
    distributed_replica_max_ignored_errors: int | None = None,
    connections_with_failover_max_tries: int | None = None,
    connect_timeout_with_failover_ms: int | None = None,
    failover_backoff_ms: int | None = None,
    failover_timeout: float | None = None,
    auto_insert_deduplication_token: bool | None = None,
    least_loaded_decay_time: float | None = None,
    health_check_interval_ms: int | None = None,
    health_check_fast_interval_ms: int | None = None,
    health_check_timeout_ms: int | None = None,
    health_check_rise: int | None = None,
    health_check_fall: int | None = None,
    health_check_delay_interval_ms: int | None = None,
    max_replica_delay_for_distributed_queries: int | None = None,
    fallback_to_stale_replicas_for_distributed_queries: bool | None = None,
    use_hedged_requests: bool | int | None = None,
    receive_data_timeout_ms: float | str | None = None,
    liveness_check_after_ms: float | None = None,
    liveness_ping_timeout_ms: float | None = None,
    liveness_check_interval_ms: float | None = None,
    retry_budget_ratio: float | None = None,
    retry_budget_min_per_second: float | None = None,
    retry_budget_window_ms: int | None = None,
    cluster: str | None = None,
    shard: int | None = None,
    cluster_http_port: int | None = None,
    cluster_discovery_interval_ms: int | None = None,
    cluster_host_map: Mapping[str, str] | str | None = None,
    read_your_writes: bool | int | None = None,
    read_your_writes_window_ms: int | None = None,
    read_your_writes_timeout_ms: int | None = None,
    listeners: Iterable[Listener] = (),
    share_state: bool | None = None,
    connect_on_create: bool = True,
    **client_options: Any,
) -> None:
    """The arguments both factories take (the factories' docstrings say what each means)."""


_SIGNATURE = inspect.signature(_pool_arguments)
#: Names of the signature that are not pool settings (those are resolved by name, see below).
FACTORY_OWN_NAMES = ("hosts", "dsn", "listeners", "share_state", "connect_on_create")

P = ParamSpec("P")
R = TypeVar("R")


def _with_signature_of(template: Callable[P, object]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    def decorate(factory: Callable[..., R]) -> Callable[P, R]:
        own = inspect.signature(factory)
        factory.__dict__["__signature__"] = _SIGNATURE.replace(return_annotation=own.return_annotation)
        return factory

    return decorate


#: ``@pool_factory`` on ``def get_pool(hosts=None, **arguments) -> ReplicaPool``: the factory
#: is seen (by ``help()``, ``inspect`` and type checkers) with :func:`_pool_arguments`' keywords.
pool_factory = _with_signature_of(_pool_arguments)


@dataclass(frozen=True)
class FactoryArguments:
    """One factory call's arguments, defaults applied, sorted by where they go."""

    hosts: str | Replica | Iterable[str | Replica] | None
    dsn: str | None
    #: The pool settings given by keyword (``None`` ones included: the DSN's or the default).
    balancing: dict[str, Any]
    listeners: Iterable[Listener]
    share_state: bool | None
    connect_on_create: bool
    #: Every other keyword: clickhouse-connect's options (validated by the resolver).
    client_options: dict[str, Any]

    def config(self, valid_client_options: frozenset[str]) -> PoolConfig:
        """The pool's configuration, the client options checked against ``valid_client_options``
        (the sync or the async client's)."""
        return resolve_pool_config(
            self.hosts, dsn=self.dsn, balancing=self.balancing, client_options=self.client_options,
            valid_client_options=valid_client_options, share_state=self.share_state,
        )


def factory_arguments(hosts: object, arguments: dict[str, Any]) -> FactoryArguments:
    """Bind a call (``hosts`` and the keywords) to the one signature."""
    bound = _SIGNATURE.bind(hosts, **arguments)
    bound.apply_defaults()
    values = bound.arguments
    return FactoryArguments(
        hosts=values["hosts"],
        dsn=values["dsn"],
        balancing={name: values[name] for name in POOL_SETTING_NAMES if name in values},
        listeners=values["listeners"],
        share_state=values["share_state"],
        connect_on_create=values["connect_on_create"],
        client_options=dict(values["client_options"]),
    )

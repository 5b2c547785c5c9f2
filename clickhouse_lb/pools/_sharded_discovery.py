"""Read a cluster's shards (numbers, weights, replicas) from a seed, with the options a pool
would use to reach it: the same validation, credentials, TLS and timeouts as ``get_pool``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clickhouse_lb.config.pool_config import balancing_arguments, resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.discovery import ShardLayout
from clickhouse_lb.pools._base import discovery_reader


def discover_shards(
    hosts: str | Replica | Iterable[str | Replica] | None, cluster: str, options: dict[str, Any]
) -> list[ShardLayout]:
    named = {**options, "cluster": cluster}
    balancing = balancing_arguments(named)
    client_options = {k: v for k, v in options.items() if k not in balancing and k not in _POOL_ONLY}
    config = resolve_pool_config(
        hosts, dsn=None, balancing=balancing, client_options=client_options,
        valid_client_options=sync_client_option_names(),
    )
    reader = discovery_reader(config)
    try:
        return reader.shards(config.replicas)
    finally:
        reader.close()


#: get_pool keywords that are neither balancing settings nor client options.
_POOL_ONLY = frozenset({"listeners", "share_state", "connect_on_create", "dsn"})

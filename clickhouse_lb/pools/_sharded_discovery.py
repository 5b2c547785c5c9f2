"""Read a cluster's shards (numbers, weights, replicas) from a seed, with the options a pool
would use to reach it: the same validation, credentials, TLS and timeouts as ``get_pool``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.discovery import ShardLayout
from clickhouse_lb.pools._base import discovery_reader
from clickhouse_lb.pools._factory_arguments import factory_arguments


def discover_shards(
    hosts: str | Replica | Iterable[str | Replica] | None, cluster: str, options: dict[str, Any]
) -> list[ShardLayout]:
    arguments = factory_arguments(hosts, {**options, "cluster": cluster})
    config = resolve_pool_config(
        arguments.hosts, dsn=arguments.dsn, balancing=arguments.balancing,
        client_options=arguments.client_options, valid_client_options=sync_client_option_names(),
        share_state=arguments.share_state,
    )
    reader = discovery_reader(config)
    try:
        return reader.shards(config.replicas)
    finally:
        reader.close()


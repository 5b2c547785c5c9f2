"""Ask a seed for the cluster's replicas (the I/O half of :mod:`clickhouse_lb.core.discovery`).

One ``GET`` per seed on a connection of our own (never a statement's), with the pool's
credentials, reaching the seed as its clients do (path prefix, TLS, proxy: see
:mod:`~clickhouse_lb.probes._route`); ``{cluster:String}`` travels as a server-side parameter.
Synchronous (urllib3): the pools discover once at construction, and the refresh runs on the
sync worker's thread or, for the async pool, in a thread of the default executor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import urllib3

from clickhouse_lb.config.discovery import DiscoverySettings
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.discovery import (
    CLUSTER_QUERY,
    ClusterRow,
    ShardLayout,
    discover,
    replicas_from_rows,
    shards_from_rows,
)
from clickhouse_lb.probes._ping import auth_headers
from clickhouse_lb.probes._route import Route, RoutedManagers, base_url

__all__ = ["ClusterReader"]


class ClusterReader:
    """Reads ``system.clusters`` from the first seed that answers (see :func:`discover`)."""

    def __init__(
        self,
        options: Mapping[str, Any],
        settings: DiscoverySettings,
        *,
        connect_timeout: float,
        read_timeout: float = 5.0,
    ) -> None:
        assert settings.cluster is not None
        self.settings = settings
        self.timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        self._options = dict(options)
        self._headers = auth_headers(options)
        self._http = RoutedManagers(Route(options), num_pools=8, maxsize=1, retries=False)
        query = {"query": CLUSTER_QUERY + " FORMAT JSONEachRow", "param_cluster": settings.cluster}
        if options.get("database"):
            query["database"] = str(options["database"])
        self._query = "/?" + urlencode(query)

    def rows(self, seed: Replica) -> list[ClusterRow]:
        response = self._http.get(base_url(seed.address, self._options) + self._query, self._headers, self.timeout)
        body = response.data.decode("utf-8", "replace")
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {body[:200]}")
        return [ClusterRow.from_mapping(json.loads(line)) for line in body.splitlines() if line.strip()]

    def replicas(self, seeds: Sequence[Replica]) -> list[Replica]:
        """The cluster's replicas (of the shard when one is set), from the first seed that
        answers; :class:`~clickhouse_lb.core.discovery.DiscoveryError` when none does, or when the
        cluster (shard) is not there."""
        _, rows = discover(seeds, self.rows)
        settings = self.settings
        assert settings.cluster is not None
        return replicas_from_rows(
            rows, cluster=settings.cluster, shard=settings.shard, http_port=settings.cluster_http_port,
            host_map=settings.cluster_host_map,
        )

    def shards(self, seeds: Sequence[Replica]) -> list[ShardLayout]:
        """Every shard of the cluster with its weight and replicas (a sharded pool's layout)."""
        _, rows = discover(seeds, self.rows)
        settings = self.settings
        assert settings.cluster is not None
        return shards_from_rows(rows, cluster=settings.cluster, http_port=settings.cluster_http_port,
                                host_map=settings.cluster_host_map)

    def close(self) -> None:
        self._http.clear()

"""Discovery settings (``cluster``, ``shard``, ``cluster_http_port``, ``cluster_discovery_interval_ms``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from clickhouse_lb.config._values import bounded
from clickhouse_lb.errors import ConfigurationError


class DiscoveryError(ConfigurationError):
    """No seed answered, or the cluster (or shard) has no replicas."""


@dataclass(frozen=True)
class DiscoverySettings:
    """Where a pool finds its replicas: the ``system.clusters`` rows of ``cluster`` (of one
    ``shard`` when given), asked of the seed hosts and refreshed every
    ``cluster_discovery_interval_ms`` (0: read once, at construction)."""

    cluster: str | None = None
    shard: int | None = None
    #: The HTTP port of every discovered replica; None: the port rule of the module doc.
    cluster_http_port: int | None = None
    cluster_discovery_interval_ms: int = 30000

    @property
    def enabled(self) -> bool:
        return self.cluster is not None

    @property
    def interval(self) -> float | None:
        """Seconds between refreshes, or None when the set is read once."""
        return self.cluster_discovery_interval_ms / 1000.0 if self.cluster_discovery_interval_ms else None


DISCOVERY_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(DiscoverySettings))

NO_DISCOVERY = DiscoverySettings()


def parse_discovery_settings(values: Mapping[str, Any]) -> DiscoverySettings:
    """Validate discovery settings given by name (strings allowed, as from a URL)."""
    values = {name: value for name, value in values.items() if value is not None}
    cluster = values.get("cluster")
    if cluster is not None and (not isinstance(cluster, str) or not cluster.strip()):
        raise ConfigurationError(f"Bad cluster {cluster!r}: give the cluster's name in system.clusters")
    others = sorted(name for name in values if name != "cluster")
    if cluster is None and others:
        raise ConfigurationError(f"{', '.join(others)} given without cluster=: name the cluster to discover")
    shard = values.get("shard")
    http_port = values.get("cluster_http_port")
    interval = values.get("cluster_discovery_interval_ms")
    return DiscoverySettings(
        cluster=cluster.strip() if cluster is not None else None,
        shard=None if shard is None else int(bounded("shard", shard) or 0),
        cluster_http_port=None if http_port is None else int(bounded("cluster_http_port", http_port) or 0),
        cluster_discovery_interval_ms=(
            DiscoverySettings.cluster_discovery_interval_ms
            if interval is None
            else int(bounded("cluster_discovery_interval_ms", interval) or 0)
        ),
    )

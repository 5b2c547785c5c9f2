"""Discovery settings (``cluster``, ``shard``, ``cluster_http_port``, ``cluster_discovery_interval_ms``,
``cluster_host_map``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from clickhouse_lb._redact import shown
from clickhouse_lb.config._fields import parse_fields
from clickhouse_lb.config._values import bounded_int
from clickhouse_lb.config.replicas import parse_host
from clickhouse_lb.errors import ConfigurationError


class DiscoveryError(ConfigurationError):
    """No seed answered, or the cluster (or shard) has no replicas."""


@dataclass(frozen=True)
class HostMapping:
    """One entry of ``cluster_host_map``: a replica ``system.clusters`` names ``listed_host``
    (on ``listed_port``, its HTTP port after the port rule; None: any port) is reached at
    ``host`` (on ``port``; None: the same port)."""

    listed_host: str
    listed_port: int | None
    host: str
    port: int | None


def map_address(host_map: Sequence[HostMapping], host: str, port: int) -> tuple[str, int]:
    """Where the pool reaches a replica listed as ``host:port``: the entry for ``host:port``,
    else the entry for ``host`` alone, else ``host:port`` itself (host names compared
    case-insensitively, as DNS does)."""
    lowered = host.lower()
    exact = next((m for m in host_map if m.listed_host == lowered and m.listed_port == port), None)
    entry = exact or next((m for m in host_map if m.listed_host == lowered and m.listed_port is None), None)
    if entry is None:
        return host, port
    return entry.host, port if entry.port is None else entry.port


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
    #: Where replicas listed under other names are reached (``{"ch-1:8123": "127.0.0.1:8123"}``):
    #: discovery from outside a Docker network or a NAT, whose names resolve only inside it.
    cluster_host_map: tuple[HostMapping, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.cluster is not None

    @property
    def interval(self) -> float | None:
        """Seconds between refreshes, or None when the set is read once."""
        return self.cluster_discovery_interval_ms / 1000.0 if self.cluster_discovery_interval_ms else None


DISCOVERY_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(DiscoverySettings))

NO_DISCOVERY = DiscoverySettings()


def _host_map(name: str, value: object) -> tuple[HostMapping, ...]:
    return parse_host_map(value)


#: The settings besides ``cluster`` and their parsers.
_PARSERS = {
    "shard": bounded_int,
    "cluster_http_port": bounded_int,
    "cluster_discovery_interval_ms": bounded_int,
    "cluster_host_map": _host_map,
}


def parse_discovery_settings(values: Mapping[str, Any]) -> DiscoverySettings:
    """Validate discovery settings given by name (strings allowed, as from a URL)."""
    values = {name: value for name, value in values.items() if value is not None}
    cluster = values.get("cluster")
    if cluster is not None and (not isinstance(cluster, str) or not cluster.strip()):
        raise ConfigurationError(f"Bad cluster {cluster!r}: give the cluster's name in system.clusters")
    others = sorted(name for name in values if name != "cluster")
    if cluster is None and others:
        raise ConfigurationError(f"{', '.join(others)} given without cluster=: name the cluster to discover")
    return DiscoverySettings(cluster=cluster.strip() if cluster is not None else None, **parse_fields(values, _PARSERS))


_HOST_MAP_FORMS = (
    "expected a mapping {'ch-1:8123': '127.0.0.1:8123', ...} (listed host[:port] -> reachable host[:port]), "
    "or the same as text: 'ch-1:8123=127.0.0.1:8123,ch-2:8123=127.0.0.1:8124'"
)
# host:port with the port written (IPv6 in brackets); a bare host or IPv6 address has none.
_PORT_GIVEN = re.compile(r"^(?:[^:\[\]]+|\[[^\]]+\]):[^:]*$")


def _shown(value: object) -> str:
    """The map or one of its names as a message quotes it; not at all when it holds a '@'
    (``user:pw@host``: parse_host's own message shows it masked)."""
    text = shown(value)
    return "(not shown: it holds '@')" if "@" in text else text


def _endpoint(text: object, role: str, whole: object) -> tuple[str, int | None]:
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(
            f"Bad cluster_host_map {_shown(whole)}: {role} {_shown(text)} is not a host; {_HOST_MAP_FORMS}"
        )
    try:
        replica = parse_host(text)
    except ConfigurationError as exc:
        raise ConfigurationError(f"Bad cluster_host_map {_shown(whole)}: {role} {_shown(text)}: {exc}") from None
    return replica.host, replica.port if _PORT_GIVEN.match(text.strip()) else None


def parse_host_map(value: object) -> tuple[HostMapping, ...]:
    """``cluster_host_map`` from a mapping or its text form (see :data:`_HOST_MAP_FORMS`)."""
    if value is None:
        return ()
    if isinstance(value, str):
        pairs: list[tuple[object, object]] = []
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            left, sep, right = item.partition("=")
            if not sep:
                raise ConfigurationError(
                    f"Bad cluster_host_map {_shown(value)}: {_shown(item)} has no '='; {_HOST_MAP_FORMS}"
                )
            pairs.append((left.strip(), right.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ConfigurationError(f"Bad cluster_host_map {_shown(value)}: {_HOST_MAP_FORMS}")
    entries: list[HostMapping] = []
    seen: set[tuple[str, int | None]] = set()
    for listed, reached in pairs:
        listed_host, listed_port = _endpoint(listed, "listed", value)
        key = (listed_host.lower(), listed_port)
        if key in seen:
            raise ConfigurationError(f"Bad cluster_host_map {_shown(value)}: {_shown(listed)} is mapped twice")
        seen.add(key)
        host, port = _endpoint(reached, "reachable", value)
        entries.append(HostMapping(key[0], listed_port, host, port))
    return tuple(entries)

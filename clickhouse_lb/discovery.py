"""Replicas from ``system.clusters``, decided without I/O: which rows make which replicas, how
a refreshed set replaces the current one, and when a removed replica's client may close.

``get_pool(hosts=[seed, ...], cluster="lb_cluster", shard=None)`` is meant to read the
cluster's rows from the first seed that answers (:func:`discover`; a seed that is down is
not fatal while another answers), turn them into replicas (:func:`replicas_from_rows`), and
refresh them periodically through the health worker, replacing the set with
:func:`diff_replicas`: kept replicas keep their counts, added ones start clean, removed ones
leave once their in-flight statements are done (:class:`InFlight`).

**Port rule.** ``system.clusters.port`` is the port in ``remote_servers``, normally the native
TCP port. It maps to the HTTP port as: ``cluster_http_port`` when given (every replica);
otherwise 9000 -> 8123 and 9440 -> 8443 (the defaults of the native and HTTP interfaces, plain
and TLS); any other port is taken to be the HTTP port already (clusters described with HTTP
ports, like the local test cluster).

Settings (keyword, DSN and URL parameter): ``cluster`` (turns discovery on), ``shard``,
``cluster_http_port`` and ``cluster_discovery_interval_ms`` (:class:`DiscoverySettings`).
The I/O (asking a seed) is in :mod:`clickhouse_lb._discovery_io`; wiring into the pools in
:mod:`clickhouse_lb._pool_base`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

from ._redact import redact
from ._values import bounded
from .errors import ConfigurationError
from .replicas import Replica

__all__ = [
    "CLUSTER_QUERY",
    "DISCOVERY_SETTING_NAMES",
    "ClusterRow",
    "DiscoveryError",
    "DiscoverySettings",
    "InFlight",
    "ReplicaSetChange",
    "diff_replicas",
    "discover",
    "http_port_for",
    "parse_discovery_settings",
    "replicas_from_rows",
]

#: What a seed is asked (``{cluster:String}`` is a server-side parameter, never interpolated).
CLUSTER_QUERY = (
    "SELECT shard_num, replica_num, host_name, host_address, port FROM system.clusters "
    "WHERE cluster = {cluster:String} ORDER BY shard_num, replica_num"
)

#: Native-protocol default ports and the HTTP ports that go with them.
NATIVE_TO_HTTP = {9000: 8123, 9440: 8443}


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


@dataclass(frozen=True)
class ClusterRow:
    """One row of ``system.clusters``."""

    shard_num: int
    replica_num: int
    host_name: str
    host_address: str
    port: int

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> ClusterRow:
        return cls(
            int(row["shard_num"]), int(row["replica_num"]), str(row["host_name"] or ""),
            str(row["host_address"] or ""), int(row["port"]),
        )


def http_port_for(port: int, *, http_port: int | None = None) -> int:
    """The HTTP port of a replica listed with ``port`` in ``system.clusters`` (module doc)."""
    if http_port is not None:
        return http_port
    return NATIVE_TO_HTTP.get(port, port)


def replicas_from_rows(
    rows: Iterable[ClusterRow], *, cluster: str, shard: int | None = None, http_port: int | None = None
) -> list[Replica]:
    """The replicas of ``cluster`` (of one ``shard`` when given), named by ``host_name`` (the
    hostname strategies compare names), or ``host_address`` when the name is empty."""
    rows = list(rows)
    chosen = [r for r in rows if shard is None or r.shard_num == shard]
    if not chosen:
        if not rows:
            raise DiscoveryError(f"Cluster {cluster!r} is not in system.clusters (or has no replicas)")
        shards = sorted({r.shard_num for r in rows})
        raise DiscoveryError(f"Cluster {cluster!r} has no shard {shard}; its shards: {', '.join(map(str, shards))}")
    replicas: list[Replica] = []
    seen: set[str] = set()
    for row in chosen:
        replica = Replica(row.host_name or row.host_address, http_port_for(row.port, http_port=http_port))
        if replica.address.lower() not in seen:  # one server listed in several shards
            seen.add(replica.address.lower())
            replicas.append(replica)
    return replicas


T = TypeVar("T")


def discover(seeds: Sequence[Replica], fetch: Callable[[Replica], T]) -> tuple[Replica, T]:
    """Ask the seeds in order until one answers: ``(that seed, its answer)``. A seed that is
    down is skipped; when none answers, :class:`DiscoveryError` lists each seed's failure."""
    failures = []
    for seed in seeds:
        try:
            return seed, fetch(seed)
        except Exception as exc:  # any failure of one seed: try the next
            failures.append(f"{seed.address}: {redact(f'{type(exc).__name__}: {exc}')}")
    raise DiscoveryError("No seed answered the system.clusters query: " + "; ".join(failures))


@dataclass(frozen=True)
class ReplicaSetChange:
    """How a discovered set replaces the current one. ``replicas``: the new set, kept replicas
    first in their current order (so ``in_order`` and priorities keep meaning the same), then
    the added ones in discovery order; ``kept`` maps a current index to its new index."""

    replicas: tuple[Replica, ...]
    kept: dict[int, int]
    added: tuple[int, ...]  # new indices
    removed: tuple[int, ...]  # current indices

    @property
    def unchanged(self) -> bool:
        return not self.added and not self.removed


def diff_replicas(current: Sequence[Replica], discovered: Sequence[Replica]) -> ReplicaSetChange:
    """Compare by address (case-insensitive, as the pool does)."""
    wanted = {r.address.lower(): r for r in discovered}
    replicas: list[Replica] = []
    kept: dict[int, int] = {}
    removed: list[int] = []
    for i, replica in enumerate(current):
        if replica.address.lower() in wanted:
            kept[i] = len(replicas)
            replicas.append(replica)
        else:
            removed.append(i)
    known = {r.address.lower() for r in current}
    added = []
    for replica in discovered:
        if replica.address.lower() not in known:
            known.add(replica.address.lower())
            added.append(len(replicas))
            replicas.append(replica)
    return ReplicaSetChange(tuple(replicas), kept, tuple(added), tuple(removed))


def carry_over(values: Sequence[T], change: ReplicaSetChange, fresh: T) -> list[T]:
    """Per-replica values (counts, clients ...) for the new set: kept ones move to their new
    index, added ones get ``fresh``."""
    result = [fresh] * len(change.replicas)
    for old, new in change.kept.items():
        result[new] = values[old]
    return result


K = TypeVar("K")


class InFlight(Generic[K]):
    """Statements in flight per key (a replica's client), so that a retired key is released
    (its client closed) only once its last statement is done. Thread-safe; the release
    callback runs outside the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[K, int] = {}
        self._retired: dict[K, Callable[[], None]] = {}

    def acquire(self, key: K) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def release(self, key: K) -> None:
        with self._lock:
            count = self._counts.get(key, 0) - 1
            if count > 0:
                self._counts[key] = count
                return
            self._counts.pop(key, None)
            callback = self._retired.pop(key, None)
        if callback is not None:
            callback()

    def retire(self, key: K, release: Callable[[], None]) -> None:
        """Call ``release`` when ``key`` has no statement in flight (now, if it has none)."""
        with self._lock:
            if self._counts.get(key):
                self._retired[key] = release
                return
        release()

    def in_flight(self, key: K) -> int:
        with self._lock:
            return self._counts.get(key, 0)

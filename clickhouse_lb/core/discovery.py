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
The I/O (asking a seed) is in :mod:`clickhouse_lb.probes._discovery_query`; the carry-over of
a kept replica's state in :meth:`clickhouse_lb.core.replica_set.ReplicaSetView.carried_over`;
wiring into the pools in :mod:`clickhouse_lb.pools._discovery`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from clickhouse_lb.config.discovery import (
    DISCOVERY_SETTING_NAMES,
    DiscoveryError,
    DiscoverySettings,
    HostMapping,
    map_address,
    parse_discovery_settings,
)
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.classify import classify
from clickhouse_lb.core.records import remap

__all__ = [
    "CLUSTER_QUERY",
    "DISCOVERY_SETTING_NAMES",
    "ClusterRow",
    "DiscoveryError",
    "DiscoverySettings",
    "InFlight",
    "ReplicaSetChange",
    "ShardLayout",
    "carry_over",
    "diff_replicas",
    "discover",
    "http_port_for",
    "parse_discovery_settings",
    "replicas_from_rows",
    "shards_from_rows",
]

#: What a seed is asked (``{cluster:String}`` is a server-side parameter, never interpolated).
CLUSTER_QUERY = (
    "SELECT shard_num, shard_weight, replica_num, host_name, host_address, port FROM system.clusters "
    "WHERE cluster = {cluster:String} ORDER BY shard_num, replica_num"
)

#: Native-protocol default ports and the HTTP ports that go with them.
NATIVE_TO_HTTP = {9000: 8123, 9440: 8443}


@dataclass(frozen=True)
class ClusterRow:
    """One row of ``system.clusters``."""

    shard_num: int
    replica_num: int
    host_name: str
    host_address: str
    port: int
    shard_weight: int = 1

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> ClusterRow:
        return cls(
            int(row["shard_num"]), int(row["replica_num"]), str(row["host_name"] or ""),
            str(row["host_address"] or ""), int(row["port"]), int(row.get("shard_weight", 1)),
        )


def http_port_for(port: int, *, http_port: int | None = None) -> int:
    """The HTTP port of a replica listed with ``port`` in ``system.clusters`` (module doc)."""
    if http_port is not None:
        return http_port
    return NATIVE_TO_HTTP.get(port, port)


def replicas_from_rows(
    rows: Iterable[ClusterRow],
    *,
    cluster: str,
    shard: int | None = None,
    http_port: int | None = None,
    host_map: Sequence[HostMapping] = (),
) -> list[Replica]:
    """The replicas of ``cluster`` (of one ``shard`` when given), named by ``host_name`` (the
    hostname strategies compare names), or ``host_address`` when the name is empty; a replica
    ``host_map`` maps (``cluster_host_map``) goes by its reachable address instead."""
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
        listed_port = http_port_for(row.port, http_port=http_port)
        host, port = map_address(host_map, row.host_name or row.host_address, listed_port)
        replica = Replica(host, port)
        if replica.address.lower() not in seen:  # one server listed in several shards
            seen.add(replica.address.lower())
            replicas.append(replica)
    return replicas


@dataclass(frozen=True)
class ShardLayout:
    """One shard of a cluster as ``system.clusters`` lists it."""

    shard_num: int
    weight: int
    replicas: tuple[Replica, ...]


def shards_from_rows(
    rows: Iterable[ClusterRow], *, cluster: str, http_port: int | None = None, host_map: Sequence[HostMapping] = (),
) -> list[ShardLayout]:
    """Every shard of ``cluster`` in ``shard_num`` order, with its weight and replicas (named as
    :func:`replicas_from_rows` names them)."""
    rows = list(rows)
    numbers = sorted({r.shard_num for r in rows})
    if not numbers:
        raise DiscoveryError(f"Cluster {cluster!r} is not in system.clusters (or has no replicas)")
    return [
        ShardLayout(
            number,
            next(r.shard_weight for r in rows if r.shard_num == number),
            tuple(replicas_from_rows(rows, cluster=cluster, shard=number, http_port=http_port, host_map=host_map)),
        )
        for number in numbers
    ]


T = TypeVar("T")


def discover(seeds: Sequence[Replica], fetch: Callable[[Replica], T]) -> tuple[Replica, T]:
    """Ask the seeds in order until one answers: ``(that seed, its answer)``. A seed that is
    down is skipped; when none answers, :class:`DiscoveryError` lists each seed's failure."""
    failures = []
    for seed in seeds:
        try:
            return seed, fetch(seed)
        except Exception as exc:  # any failure of one seed: try the next
            # The kind and root cause only: the request URL holds the whole query in its query string.
            failures.append(f"{seed.address}: {classify(exc).reason}")
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
    """Per-replica values for the new set: kept ones move to their new index, added ones get
    ``fresh`` (:func:`~clickhouse_lb.core.records.remap`, the rule every carry-over follows)."""
    return remap(values, change.kept, len(change.replicas), lambda: fresh)


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

"""The rows the local cluster answers for ``system.clusters`` and ``system.replicas``, and its
view of ``system.tables``.

chdb's own system tables are empty (no cluster configured, no Keeper); the replication module
rewrites a ``SELECT`` that names them into a subquery of these rows (see
:func:`clickhouse_lb.testing._sql.literal_table`), with ClickHouse's column names and types.
``system.tables`` is the engine's own, with ``engine`` and ``engine_full`` of the replicated
tables put back as the user wrote them (locally they are plain ``*MergeTree`` tables).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Protocol

from clickhouse_lb.testing._sql import sql_string


class ReplicatedTable(Protocol):
    """What :func:`tables_view` needs of a replicated table (the replication catalog's entries)."""

    database: str
    table: str
    engine: str
    written_path: str
    written_replica: str


def clusters_rows(cluster_name: str, shard: str, self_name: str, cluster_file: Path | None) -> list[dict[str, object]]:
    """One ``system.clusters`` row per replica listed in ``cluster_file`` (written by LocalCluster).

    As a server numbers what its ``remote_servers`` lists: ``shard_num`` counts the shards
    listed (a shard none of whose replicas is listed is not there), ``replica_num`` the listed
    replicas of each shard, both from 1.
    """
    replicas: list[dict[str, Any]] = []
    if cluster_file is not None and cluster_file.exists():
        with contextlib.suppress(ValueError, OSError, KeyError):
            replicas = list(json.loads(cluster_file.read_text())["replicas"])
    if not replicas:  # a replica started on its own
        replicas = [{"name": self_name, "host": "127.0.0.1", "port": 0, "shard": int(shard or 1)}]
    by_shard: dict[int, list[dict[str, Any]]] = {}
    for r in replicas:
        by_shard.setdefault(int(r.get("shard", 1)), []).append(r)
    rows: list[dict[str, object]] = []
    for shard_num, configured in enumerate(sorted(by_shard), start=1):
        for replica_num, r in enumerate(by_shard[configured], start=1):
            rows.append(
                {
                    "cluster": cluster_name,
                    "shard_num": shard_num,
                    "shard_name": f"{configured:02d}",
                    "shard_weight": int(r.get("weight", 1)),
                    "internal_replication": 1,
                    "replica_num": replica_num,
                    "host_name": r["host"],
                    "host_address": r["host"],
                    "port": r["port"],
                    "is_local": int(r["name"] == self_name),
                    "user": "default",
                    "errors_count": 0,
                    "slowdowns_count": 0,
                    "estimated_recovery_time": 0,
                    "name": cluster_name,
                }
            )
    return rows


#: The setting every local replica of a replicated table gets (see _replication): not the user's.
_OWN_SETTING = r"(, )?non_replicated_deduplication_window = \\d+"


def tables_view(tables: list[ReplicatedTable]) -> str:
    """A subquery standing for ``system.tables`` in which ``tables`` show their replicated engine:
    ``engine`` ``Replicated<Kind>MergeTree``, ``engine_full`` with the path and replica name
    first, as a server keeps them (``ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}',
    '{replica}') ORDER BY ...``)."""

    def array(values: list[str]) -> str:
        return "[" + ", ".join(values) + "]"

    keys = array([f"({sql_string(t.database)}, {sql_string(t.table)})" for t in tables])
    engines = array([sql_string(t.engine) for t in tables])
    heads = array(
        [sql_string(f"{t.engine}({sql_string(t.written_path)}, {sql_string(t.written_replica)}") for t in tables]
    )
    # The local table's engine_full: "<Kind>MergeTree[(args)] ORDER BY ... SETTINGS ...".
    args = "extract(engine_full, '^\\\\w+\\\\(([^)]*)\\\\)')"
    rest = "replaceRegexpOne(engine_full, '^\\\\w+(\\\\([^)]*\\\\))?', '')"
    rest = f"replaceRegexpOne({rest}, '{_OWN_SETTING}', '')"
    head = f"transform((database, name), {keys}, {heads}, '')"
    full = f"concat({head}, if({args} = '', '', concat(', ', {args})), ')', {rest})"
    return (
        f"(SELECT * REPLACE (transform((database, name), {keys}, {engines}, engine) AS engine, "
        f"if(has({keys}, (database, name)), {full}, engine_full) AS engine_full) FROM system.tables)"
    )


#: ClickHouse's columns (names and types) of the two system tables the cluster answers.
REPLICAS_COLUMNS: list[tuple[str, str]] = [
    ("database", "String"),
    ("table", "String"),
    ("uuid", "UUID"),
    ("engine", "String"),
    ("is_leader", "UInt8"),
    ("can_become_leader", "UInt8"),
    ("is_readonly", "UInt8"),
    ("is_session_expired", "UInt8"),
    ("future_parts", "UInt32"),
    ("parts_to_check", "UInt32"),
    ("zookeeper_name", "String"),
    ("zookeeper_path", "String"),
    ("replica_name", "String"),
    ("replica_path", "String"),
    ("columns_version", "Int32"),
    ("queue_size", "UInt32"),
    ("inserts_in_queue", "UInt32"),
    ("merges_in_queue", "UInt32"),
    ("part_mutations_in_queue", "UInt32"),
    ("queue_oldest_time", "DateTime"),
    ("inserts_oldest_time", "DateTime"),
    ("merges_oldest_time", "DateTime"),
    ("part_mutations_oldest_time", "DateTime"),
    ("oldest_part_to_get", "String"),
    ("oldest_part_to_merge_to", "String"),
    ("oldest_part_to_mutate_to", "String"),
    ("log_max_index", "UInt64"),
    ("log_pointer", "UInt64"),
    ("last_queue_update", "DateTime"),
    ("absolute_delay", "UInt64"),
    ("total_replicas", "UInt8"),
    ("active_replicas", "UInt8"),
    ("lost_part_count", "UInt64"),
    ("last_queue_update_exception", "String"),
    ("zookeeper_exception", "String"),
    ("replica_is_active", "Map(String, UInt8)"),
]
CLUSTERS_COLUMNS: list[tuple[str, str]] = [
    ("cluster", "String"),
    ("shard_num", "UInt32"),
    ("shard_name", "String"),
    ("shard_weight", "UInt32"),
    ("internal_replication", "UInt8"),
    ("replica_num", "UInt32"),
    ("host_name", "String"),
    ("host_address", "String"),
    ("port", "UInt16"),
    ("is_local", "UInt8"),
    ("user", "String"),
    ("default_database", "String"),
    ("errors_count", "UInt32"),
    ("slowdowns_count", "UInt32"),
    ("estimated_recovery_time", "UInt32"),
    ("database_shard_name", "String"),
    ("database_replica_name", "String"),
    ("is_shared_catalog_cluster", "UInt8"),
    ("is_active", "Nullable(UInt8)"),
    ("unsynced_after_recovery", "Nullable(UInt8)"),
    ("replication_lag", "Nullable(UInt32)"),
    ("recovery_time", "Nullable(UInt64)"),
    ("name", "String"),
]

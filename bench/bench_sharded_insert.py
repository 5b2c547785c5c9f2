"""What routing by sharding key costs: a routed insert against the same parts inserted directly.

    python bench/bench_sharded_insert.py [--rows 1000000] [--rounds 3]

Two shards (one local replica each, plain MergeTree: replication is not what is measured).
Per round, side by side and in alternating order: ``sharded.insert(table, rows,
sharding_key=KEY)`` (reads the columns once, splits, writes each part), and the same parts,
split beforehand and untimed, written with ``shard_pool.insert(...)`` one after the other.
Prints the medians and the ratio for each key, and the split alone (no I/O).
"""

from __future__ import annotations

import argparse
import statistics
import time

import clickhouse_lb
from clickhouse_lb.core.sharding import parse_sharding_key, route, slot_table, value_type
from clickhouse_lb.testing import LocalCluster

TABLE = "bench_routed"
KEYS = ["cityHash64(id)", "intHash64(id)", "id", "cityHash64(name)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = [[i, f"user-{i}", i % 1000] for i in range(args.rows)]
    names, types = ["id", "name", "v"], ["Int64", "String", "UInt32"]
    clusters = [LocalCluster(replicas=1, names=[f"s{n}"]) for n in (1, 2)]
    for cluster in clusters:
        cluster.start()
    try:
        for cluster in clusters:
            cluster.query(0, f"CREATE TABLE {TABLE} (id Int64, name String, v UInt32) ENGINE = MergeTree ORDER BY id")
        with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in clusters], health_check_interval_ms=0) as sharded:
            print("| key | rows | routed insert (s) | same parts, direct (s) | ratio | split alone (s) |")
            print("|---|---|---|---|---|---|")
            for text in KEYS:
                key = parse_sharding_key(text)
                index = names.index(key.column or "id")
                started = time.perf_counter()
                groups = route(key, [r[index] for r in rows], value_type(types[index]), len(rows),
                               slots=slot_table([1, 1]), shards=2)
                parts = [[rows[i] for i in group] for group in groups]
                split = time.perf_counter() - started
                routed, direct = [], []
                for round_ in range(args.rounds):
                    def run_routed(text: str = text) -> None:
                        sharded.insert(TABLE, rows, column_names=names, sharding_key=text)

                    def run_direct(parts: list[list[list[object]]] = parts) -> None:
                        for pool, part in zip(sharded.shards, parts):
                            pool.insert(TABLE, part, column_names=names)

                    order = [(run_routed, routed), (run_direct, direct)]
                    for fn, out in order if round_ % 2 == 0 else reversed(order):
                        began = time.perf_counter()
                        fn()
                        out.append(time.perf_counter() - began)
                    for cluster in clusters:
                        cluster.query(0, f"TRUNCATE TABLE {TABLE}")
                r, d = statistics.median(routed), statistics.median(direct)
                print(f"| `{text}` | {args.rows:,} | {r:.2f} | {d:.2f} | {r / d:.3f} | {split:.2f} |")
    finally:
        for cluster in clusters:
            cluster.close()


if __name__ == "__main__":
    main()

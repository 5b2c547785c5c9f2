"""What routing by sharding key costs: a routed insert against the same parts inserted directly.

    python bench/bench_sharded_insert.py [--rows 1000000] [--rounds 5]

Two shards (one local replica each, plain MergeTree: replication is not what is measured).
Per key and round, side by side and in alternating order:

- **routed**: ``sharded.insert(table, rows, column_names=NAMES, sharding_key=KEY)``, as a user
  calls it (reads the column types once, splits, writes each part);
- **direct, row parts**: what a user without the router would write: the same rows split the
  same way beforehand (untimed), each shard's part as the user's own form (a list of the row
  objects for row data), written with the shard pool's ``insert`` (column names and types given),
  one after the other;
- **direct, router's parts**: the very parts the router makes (split beforehand, untimed), each
  written with the same call and settings the router makes (``part.send(shard_pool)``; for row
  data these are columns, ``column_oriented=True``), one after the other.

Prints the medians, the ratios, the split alone (no I/O, median of the rounds), and the routing
overhead inside the routed call itself: its time minus the time its parts spent in the shard
pools' ``insert`` (measured in the same call, so the inserts' own run-to-run spread, which
dominates the ratio on a loaded machine, is not in it), as a share of each direct median. Then
the pool's own per-part path: one part through the shard's pool (failover, token) against the
same part through a bare clickhouse-connect client of the same replica.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Callable

import clickhouse_connect
import numpy as np

import clickhouse_lb
from clickhouse_lb.testing import LocalCluster

TABLE = "bench_routed"


class TimedPool:
    """A shard's pool whose ``insert`` adds its time to ``spent`` (everything else delegated)."""

    def __init__(self, pool: object, spent: list[float]) -> None:
        self._pool, self._spent = pool, spent

    def insert(self, *args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        try:
            return self._pool.insert(*args, **kwargs)  # type: ignore[attr-defined]
        finally:
            self._spent[0] += time.perf_counter() - began

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)
NAMES, TYPES = ["id", "name", "v"], ["Int64", "String", "UInt32"]
#: (label, sharding key, column-oriented NumPy data instead of rows)
CASES = [
    ("rows", "cityHash64(id)", False), ("rows", "intHash64(id)", False), ("rows", "id", False),
    ("rows", "cityHash64(name)", False), ("NumPy columns", "cityHash64(id)", True),
]


def user_split(data: object, form: str, key: str, shards: int) -> list[tuple[int, object]]:
    """The same rows per shard as the router puts there, in the data's own form: what a user who
    split the rows themselves would hand each shard's insert."""
    from clickhouse_lb.core.shard_split import key_column, row_count, take
    from clickhouse_lb.core.sharding import parse_sharding_key, route, slot_table, value_type

    parsed = parse_sharding_key(key)
    index = NAMES.index(parsed.column or "id")
    kind = value_type(TYPES[index])
    values = key_column(data, form, index, kind)  # type: ignore[arg-type]
    groups = route(parsed, values, kind, row_count(data, form), slots=slot_table([1] * shards),  # type: ignore[arg-type]
                   shards=shards)
    return [(position, take(data, form, indices)) for position, indices in enumerate(groups)]  # type: ignore[arg-type]


def timed(fn: Callable[[], object]) -> float:
    # Each side starts from the same collector state: with a million rows alive, one full
    # collection more or less during clickhouse-connect's transposition is worth a second on
    # this machine, more than routing itself, and otherwise falls on either side at random.
    gc.collect()
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = [[i, f"user-{i}", i % 1000] for i in range(args.rows)]
    ids = np.arange(args.rows, dtype=np.int64)
    columns = [ids, [f"user-{i}" for i in range(args.rows)], (ids % 1000).astype(np.uint32)]
    clusters = [LocalCluster(replicas=1, names=[f"s{n}"]) for n in (1, 2)]
    for cluster in clusters:
        cluster.start()
    try:
        for cluster in clusters:
            cluster.query(0, f"CREATE TABLE {TABLE} (id Int64, name String, v UInt32) ENGINE = MergeTree ORDER BY id")

        def truncate() -> None:
            for cluster in clusters:
                cluster.query(0, f"TRUNCATE TABLE {TABLE}")

        with clickhouse_lb.get_sharded_pool(shards=[c.hosts for c in clusters], health_check_interval_ms=0) as sharded:
            print(f"load average before: {os.getloadavg()}")
            print("| data | key | rows | routed (s) | direct, row parts (s) | ratio | direct, router's parts (s) "
                  "| ratio | split alone (s) | overhead in the routed call (s) | overhead / direct row parts "
                  "| overhead / direct router's parts |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            spent = [0.0]
            view = sharded._view
            sharded._view = dataclasses.replace(view, pools=tuple(TimedPool(p, spent) for p in view.pools))
            context = sharded.shards[0].create_insert_context(TABLE, NAMES)
            # Warm-up, untimed: every shard's connection open before the first measured insert.
            sharded.insert(TABLE, rows[:1000], column_names=NAMES, sharding_key="id")
            truncate()
            for label, key, oriented in CASES:
                data = columns if oriented else rows

                def plan(data: object = data, key: str = key, oriented: bool = oriented) -> object:
                    return sharded._plan_insert(
                        TABLE, data, NAMES, sharding_key=key, database=None, column_type_names=None,
                        column_oriented=oriented, settings=None,
                    )

                parts = plan().parts(context)
                user_parts = user_split(data, "columns" if oriented else "rows", key, len(sharded.shards))
                times: dict[str, list[float]] = {"routed": [], "rows": [], "parts": []}
                split: list[float] = []
                overhead: list[float] = []
                for round_ in range(args.rounds):
                    def run_routed(data: object = data, key: str = key, oriented: bool = oriented) -> None:
                        sharded.insert(TABLE, data, column_names=NAMES, sharding_key=key,
                                       column_oriented=oriented)

                    def run_rows(user_parts: list = user_parts, oriented: bool = oriented) -> None:
                        for position, part_data in user_parts:
                            sharded.shards[position].insert(TABLE, part_data, column_names=NAMES,
                                                            column_type_names=TYPES, column_oriented=oriented)

                    def run_parts(parts: list = parts) -> None:
                        for part in parts:
                            part.send(sharded.shards[part.position])

                    order = [(run_routed, "routed"), (run_rows, "rows"), (run_parts, "parts")]
                    order = order[round_ % 3:] + order[:round_ % 3]  # each side first in turn
                    for fn, side in order:
                        spent[0] = 0.0
                        times[side].append(timed(fn))
                        if side == "routed":
                            overhead.append(times[side][-1] - spent[0])
                        truncate()
                    split.append(timed(lambda: plan().parts(context)))
                r, u, d = (statistics.median(times[side]) for side in ("routed", "rows", "parts"))
                o = statistics.median(overhead)
                print(f"| {label} | `{key}` | {args.rows:,} | {r:.2f} | {u:.2f} | {r / u:.3f} | {d:.2f} | "
                      f"{r / d:.3f} | {statistics.median(split):.3f} | {o:.3f} | {o / u:.1%} | {o / d:.1%} |",
                      flush=True)
            print(f"load average after: {os.getloadavg()}")
            sharded._view = view
            # The pool's own per-part path against a bare client, the same part, alternating.
            part = parts[0]
            host, port = clusters[part.position].hosts[0].rsplit(":", 1)
            bare = clickhouse_connect.get_client(host=host, port=int(port))
            through_pool: list[float] = []
            through_client: list[float] = []
            for round_ in range(args.rounds):
                order = [(lambda: part.send(sharded.shards[part.position]), through_pool),
                         (lambda: part.send(bare), through_client)]
                for fn, out in order if round_ % 2 == 0 else reversed(order):
                    out.append(timed(fn))
                    truncate()
            p, c = statistics.median(through_pool), statistics.median(through_client)
            print(f"per-part path ({part.rows:,} rows, NumPy columns): pool {p:.3f} s, bare client {c:.3f} s, "
                  f"ratio {p / c:.3f}; load average {os.getloadavg()}")
            bare.close()
    finally:
        for cluster in clusters:
            cluster.close()


if __name__ == "__main__":
    main()

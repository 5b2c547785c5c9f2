"""What routing by sharding key costs: a routed insert against the same parts inserted directly,
for every data form, and for two source trees side by side in one run.

    python bench/bench_sharded_insert.py [--rows 1000000] [--rounds 5] [--tree main=/path/to/main ...]

Two shards (one local replica each, plain MergeTree: replication is not what is measured),
started once. Each ``--tree`` (default: this checkout only) gets a worker process of its own
(``PYTHONPATH`` = that tree) that builds the data once and times what it is told; the rounds
alternate the trees and the sides (side by side, the trees taking turns: with several trees every
run follows another worker's), each first in turn, and each side's work starts after a full
garbage collection and the direct side's untimed split (which the routed side makes too, and
drops: both sides' timed work then starts in the same process state). Per data form and key:

- **routed**: the sharded pool's public call as a user makes it (``insert`` of rows or columns,
  ``insert_df``, ``insert_arrow``: the split, each part through its shard's pool), given what
  the direct side is given: the column names and types (so neither side reads them from the
  server; ``insert_arrow`` has no ``column_type_names`` and reads the table's types once, to
  hash the key as the server would, while the direct Arrow insert needs none);
- **direct**: the same parts, honestly: the rows the router sends to each shard, split
  before each run (untimed, fresh every time as a user's are), **in the user's own data
  form** (a list of the row objects, the columns as given: NumPy arrays stay NumPy, a list
  stays a list; a DataFrame's ``take``, an Arrow table's ``take``), each written through that
  shard's pool with the same call and the column types known (``column_type_names``; Arrow
  carries its own), one after the other;
- **columns** (row data only): the same rows as the columns the router itself hands on
  (transposed before each run, untimed), written with ``column_oriented=True``: the cheapest form of
  the same parts;
- **describe**: the DESCRIBE a routed ``insert``/``insert_df`` makes when the column types are
  not given (``create_insert_context`` on the first shard), timed alone after the rounds: what a
  user who gives only the names adds to the routed side (a direct insert without types makes
  one per part).

Prints one table: the medians of each side and tree, routed / direct (the issue's figure:
routing adds at most 10%), and routing's own time: the routed call's time minus the time it
spent inside the shard pools' inserts, measured in the same call (so the server's run-to-run
spread, which dominates the ratio on a loaded machine, is not in it; work done on a thread
while a part is written is not in it either, as it adds no time unless it slows that insert).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

TABLE = "bench_routed"
NAMES, TYPES = ["id", "name", "v"], ["Int64", "String", "UInt32"]
#: (name, data form, sharding key, sides)
CASES = [
    ("rows", "rows", "cityHash64(id)", ("routed", "direct", "columns")),
    ("rows", "rows", "id", ("routed", "direct", "columns")),
    ("rows", "rows", "cityHash64(name)", ("routed", "direct", "columns")),
    ("NumPy columns + list of names", "columns", "cityHash64(id)", ("routed", "direct", "describe")),
    ("NumPy arrays (names an object array)", "numpy", "cityHash64(id)", ("routed", "direct", "describe")),
    ("pandas DataFrame", "dataframe", "cityHash64(id)", ("routed", "direct", "describe")),
    ("Arrow table", "arrow", "cityHash64(id)", ("routed", "direct")),
]


# The worker: one per tree, its own clickhouse_lb on sys.path.

def build(form: str, rows: int) -> Any:
    import numpy as np

    ids = np.arange(rows, dtype=np.int64)
    names = [f"user-{i}" for i in range(rows)]
    v = (ids % 1000).astype(np.uint32)
    if form == "rows":
        return [[i, names[i], i % 1000] for i in range(rows)]
    if form == "columns":
        return [ids, names, v]
    if form == "numpy":
        return [ids, np.array(names, dtype=object), v]
    if form == "dataframe":
        import pandas as pd

        return pd.DataFrame({"id": ids, "name": names, "v": v})
    import pyarrow as pa

    return pa.table({"id": ids, "name": names, "v": v})


def user_parts(data: Any, form: str, key: str, shards: int) -> list[Any]:
    """The rows each shard gets, split as a user would split them, in the data's own form."""
    import numpy as np

    from clickhouse_lb.core.sharding import parse_sharding_key, route, slot_table, value_type

    parsed = parse_sharding_key(key)
    index = NAMES.index(parsed.column or "id")
    if form == "rows":
        column: Any = [row[index] for row in data]
    elif form in ("columns", "numpy"):
        column = data[index]
    elif form == "dataframe":
        column = data.iloc[:, index].to_numpy()
    else:
        column = data.column(index).to_numpy()
    if not isinstance(column, np.ndarray) and value_type(TYPES[index]) != "string":
        column = np.asarray(column, dtype=np.int64)
    groups = route(parsed, column, value_type(TYPES[index]), len(column), slots=slot_table([1] * shards),
                   shards=shards)
    if form == "rows":
        return [[data[i] for i in indices.tolist()] for indices in groups]
    if form in ("columns", "numpy"):
        return [[c[indices] if isinstance(c, np.ndarray) else [c[i] for i in indices.tolist()] for c in data]
                for indices in groups]
    return [data.take(indices) for indices in groups]


class TimedPool:
    """A shard's pool whose inserts add their time to ``spent`` (everything else delegated): the
    routed call's time minus this is routing's own (the same wrapper on both sides)."""

    def __init__(self, pool: Any, spent: list[float]) -> None:
        self._pool, self._spent = pool, spent

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._pool, name)
        if not name.startswith("insert"):
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return attribute(*args, **kwargs)
            finally:
                self._spent[0] += time.perf_counter() - began
        return timed


def worker(hosts: list[list[str]], rows: int, cases: list[str]) -> None:
    import dataclasses

    import clickhouse_lb

    data = {form: build(form, rows) for form in dict.fromkeys(form for _, form, _, _ in CASES if form in cases)}
    spent = [0.0]
    with clickhouse_lb.get_sharded_pool(shards=hosts, health_check_interval_ms=0) as sharded:
        # (a private attribute of both trees: the shard pools, timed, on both sides alike)
        sharded._view = dataclasses.replace(
            sharded._view, pools=tuple(TimedPool(p, spent) for p in sharded._view.pools))
        shards = sharded.shards
        sharded.insert(TABLE, [[0, "", 0]] * 1000, column_names=NAMES, sharding_key="id")  # connections open
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            order = json.loads(line)
            form, key, side = order["form"], order["key"], order["side"]
            values = data[form]
            # One full collection before each side's work, the direct side's split included:
            # a collection between that split and its insert made the direct insert of a
            # DataFrame 68 ms faster than after the same split without it (paired, 15 rounds,
            # load 4-7), as much as the routed call's inserts were slower than it; the routed
            # call's own split has no collection after it either.
            gc.collect()
            # Split anew for every run (untimed), as a user's parts are: parts inserted before,
            # kept and inserted again, went in 15-25% faster (1M rows, NumPy columns, load 17;
            # the insert alone), which is the benchmark's doing, not the user's. The routed side
            # makes the same split and drops it, so that both sides' timed work starts in the
            # same process state (the data read, the allocator's pages mapped): without it the
            # routed call started cold (in a run of two trees, after the other worker's runs)
            # and the direct insert right after its split: an Arrow routed call then took
            # 2,000-3,400 page faults, against 340-870 after the dropped split, and routing's
            # own time measured 16-23 ms against 11-13 (BENCHMARKS.md, 2026-12-07).
            parts: list[Any] = user_parts(values, form, key, len(shards)) if side != "describe" else []
            if side == "routed":
                parts.clear()
                call = routed_call(sharded, form, key, values)
            elif side == "describe":
                call = lambda: shards[0].create_insert_context(TABLE, NAMES)  # noqa: E731
            else:
                if side == "columns":
                    parts = [[list(column) for column in zip(*part)] for part in parts]
                call = direct_call(shards, form, parts, oriented=side == "columns")
            spent[0] = 0.0
            began = time.perf_counter()
            call()
            took = time.perf_counter() - began
            print(json.dumps({"s": took, "own": took - spent[0]}), flush=True)


def routed_call(sharded: Any, form: str, key: str, data: Any) -> Any:
    # The names and types the direct side is given (direct_call): the same information both ways.
    if form == "dataframe":
        return lambda: sharded.insert_df(TABLE, data, sharding_key=key, column_type_names=TYPES)
    if form == "arrow":
        return lambda: sharded.insert_arrow(TABLE, data, sharding_key=key)
    oriented = form != "rows"
    return lambda: sharded.insert(TABLE, data, column_names=NAMES, column_type_names=TYPES, sharding_key=key,
                                  column_oriented=oriented)


def direct_call(shards: list[Any], form: str, parts: list[Any], *, oriented: bool) -> Any:
    def run() -> None:
        for pool, part in zip(shards, parts):
            if form == "dataframe":
                pool.insert_df(TABLE, part, column_names=NAMES, column_type_names=TYPES)
            elif form == "arrow":
                pool.insert_arrow(TABLE, part)
            else:
                pool.insert(TABLE, part, column_names=NAMES, column_type_names=TYPES,
                            column_oriented=oriented or form != "rows")
    return run


# The parent: the clusters, the workers, the rounds, the table.

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a source tree to measure (repeatable); default: this checkout")
    parser.add_argument("--forms", default="rows,columns,numpy,dataframe,arrow",
                        help="the data forms to measure (default: all)")
    parser.add_argument("--samples", action="store_true",
                        help="also print every round's times (seconds, in round order) per side and tree")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker), args.rows, args.forms.split(","))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": here}
    from clickhouse_lb.testing import LocalCluster

    clusters = [LocalCluster(replicas=1, names=[f"s{n}"]) for n in (1, 2)]
    workers: dict[str, subprocess.Popen[str]] = {}
    try:
        for cluster in clusters:
            cluster.start()
            cluster.query(0, f"CREATE TABLE {TABLE} (id Int64, name String, v UInt32) ENGINE = MergeTree ORDER BY id")
        hosts = json.dumps([c.hosts for c in clusters])
        for label, path in trees.items():
            workers[label] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--rows", str(args.rows), "--forms", args.forms,
                 "--worker", hosts],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path},
            )
        for process in workers.values():
            assert process.stdout is not None
            assert json.loads(process.stdout.readline())["ready"]

        def truncate() -> None:
            # Each run starts on an empty table (a table that grows by a million rows a run
            # inserts slower and slower), warmed as a user's table is between batches: the first
            # DESCRIBE of a local replica after a TRUNCATE took 8-10 ms against 1.6-3.5 ms
            # for the next ones (chdb), and only the routed side makes one (insert_arrow reads
            # the key's type), so without this the bench's own TRUNCATE was half of Arrow
            # routing's measured cost. Both sides start from the same warmed table.
            for cluster in clusters:
                cluster.query(0, f"TRUNCATE TABLE {TABLE}")
                cluster.query(0, f"DESCRIBE TABLE {TABLE}")

        def run(label: str, form: str, key: str, side: str) -> dict[str, float]:
            process = workers[label]
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.write(json.dumps({"form": form, "key": key, "side": side}) + "\n")
            process.stdin.flush()
            measured: dict[str, float] = json.loads(process.stdout.readline())
            truncate()
            return measured

        load_before = os.getloadavg()
        labels = list(trees)
        sides_head = " | ".join(f"{label} {side} (s)" for label in labels for side in ("routed", "direct"))
        ratio_head = " | ".join(f"{label} routed / direct (paired)" for label in labels)
        own_head = " | ".join(f"{label} routing's own (s, share of direct)" for label in labels)
        print(f"| data | key | {sides_head} | {ratio_head} | {own_head} | columns, the router's form, direct (s) "
              "| DESCRIBE alone (s) |")
        print("|---|---|" + "---:|" * (4 * len(labels) + 2))
        for name, form, key, sides in CASES:
            if form not in args.forms.split(","):
                continue
            for label in labels:  # untimed: a first insert of each side (imports, allocator)
                for side in sides:
                    run(label, form, key, side)
            times: dict[tuple[str, str], list[float]] = {(label, side): [] for label in labels for side in sides}
            own: dict[str, list[float]] = {label: [] for label in labels}
            # The inserts rotate; the DESCRIBE is timed after them: inside the rotation, every
            # routed call followed a DESCRIBE and every direct one an insert (the cyclic order
            # stays the same when rotated), which is not the same start for both sides.
            # Side by side, the trees taking turns (tree a routed, tree b routed, a direct, b
            # direct): with two trees or more every run follows another worker's run (but a
            # round's first, which follows the previous round's last, of its own worker: each
            # tree's each side in turn), and with one tree its own worker's. Tree by tree (a
            # routed, a direct, b routed, ...), every routed call followed the other worker and
            # every direct insert its own worker's routed call: in an instrumented copy with two
            # workers, Arrow's routed / direct (paired) was 1.154 where the routed call followed
            # the other worker and 1.092 where it followed its own (60 rounds, one run, load 3.6).
            order = [(label, side) for side in sides if side != "describe" for label in labels]
            for round_ in range(args.rounds):
                shift = round_ % len(order)
                for label, side in order[shift:] + order[:shift]:
                    measured = run(label, form, key, side)
                    times[(label, side)].append(measured["s"])
                    if side == "routed":
                        own[label].append(measured["own"])
            for _ in range(args.rounds if "describe" in sides else 0):
                for label in labels:
                    times[(label, "describe")].append(run(label, form, key, "describe")["s"])
            med = {k: statistics.median(v) for k, v in times.items()}
            cells = " | ".join(f"{med[(label, side)]:.3f}" for label in labels for side in ("routed", "direct"))
            # The ratio of the medians, and (paired) the median of each round's own ratio: the
            # two sides of a round run seconds apart, so a load that changes over minutes
            # moves both.
            ratios = " | ".join(
                f"{med[(label, 'routed')] / med[(label, 'direct')]:.3f} ("
                f"{statistics.median(r / d for r, d in zip(times[(label, 'routed')], times[(label, 'direct')])):.3f})"
                for label in labels)
            owns = " | ".join(f"{statistics.median(own[label]):.3f} "
                              f"({statistics.median(own[label]) / med[(label, 'direct')]:.1%})" for label in labels)
            column, describe = (" / ".join(f"{med[(label, side)]:.4f}" for label in labels) if side in sides else ""
                                for side in ("columns", "describe"))
            print(f"| {name} | `{key}` | {cells} | {ratios} | {owns} | {column} | {describe} |", flush=True)
            if args.samples:
                for (label, side), values in times.items():
                    print(f"  {name} `{key}` {label} {side}: {' '.join(f'{x:.3f}' for x in values)}"
                          + (f"; own {' '.join(f'{x:.3f}' for x in own[label])}" if side == "routed" else ""),
                          file=sys.stderr, flush=True)
        print(f"\n{args.rows:,} rows, medians of {args.rounds} rounds; load average before "
              f"{', '.join(f'{x:.1f}' for x in load_before)}, after {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        for process in workers.values():
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=60)
        for cluster in clusters:
            cluster.close()


if __name__ == "__main__":
    main()

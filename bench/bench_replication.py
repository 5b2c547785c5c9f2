"""The local cluster's replication: insert cost, time until another replica sees a row, ON CLUSTER.

    python bench/bench_replication.py [--n 200]
    python bench/bench_replication.py --concurrent [--writers 16] [--per-writer 25] [--baseline-ref REF]

Prints a markdown table for BENCHMARKS.md: median and p95 of a 100-row insert through
clickhouse-connect into a plain MergeTree and into a ReplicatedMergeTree table (the latter logs
and fsyncs before answering), of the time from an insert's answer on r1 until r2 returns the
row (replication lag with no delay injected; polled every query), and of CREATE ... ON CLUSTER.

``--concurrent``: ``--writers`` threads, each with its own clickhouse-connect client on replica
``w % 3`` of a 3-replica cluster, insert one row at a time into ReplicatedMergeTree tables (one
table shared by all writers, then one table per writer), started together; prints p50/p95 of
those inserts. ``--baseline-ref``: the same scenario first against the package exported from
that git ref (``git archive``), in a child process, so "before" and "after" come from one run
under the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clickhouse_lb.testing import LocalCluster


def _stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.95)] * 1000


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


_TABLE = "(w UInt32, k UInt32) ENGINE = ReplicatedMergeTree ORDER BY w"


def _writers(clients: list[Any], table_of: Callable[[int], str], per_writer: int) -> list[float]:
    """One thread per client, started together, each inserting ``per_writer`` single rows."""
    samples: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))

    def write(w: int) -> None:
        client, table = clients[w], table_of(w)
        client.insert(table, [[w, 10**6 + w]], column_names=["w", "k"])  # warm-up (its connection)
        barrier.wait()
        mine = []
        for k in range(per_writer):
            started = time.perf_counter()
            client.insert(table, [[w, k]], column_names=["w", "k"])
            mine.append(time.perf_counter() - started)
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def _concurrent(writers: int, per_writer: int) -> dict[str, list[float]]:
    """Latencies (s) of one-row replicated inserts from ``writers`` threads started together."""
    import clickhouse_connect

    out: dict[str, list[float]] = {}
    with LocalCluster(replicas=3) as cluster:
        c0 = cluster.client(0)
        c0.command(f"CREATE TABLE shared ON CLUSTER lb_cluster {_TABLE}")
        for w in range(writers):
            c0.command(f"CREATE TABLE own_{w} ON CLUSTER lb_cluster {_TABLE}")
        clients = []
        for w in range(writers):
            host, port = cluster.hosts[w % len(cluster.hosts)].rsplit(":", 1)
            clients.append(clickhouse_connect.get_client(host=host, port=int(port)))
        out["one table"] = _writers(clients, lambda w: "shared", per_writer)
        out["a table per writer"] = _writers(clients, lambda w: f"own_{w}", per_writer)
        expected = writers * (per_writer + 1)
        for i in range(len(cluster.hosts)):
            cluster.client(i).command("SYSTEM SYNC REPLICA shared")
            got = cluster.client(i).command("SELECT count() FROM shared")
            if got != expected:
                raise SystemExit(f"replica {i}: {got} rows in table shared, expected {expected}")
    return out


def _export(ref: str, work: Path) -> Path:
    """The tree of git ``ref`` exported into ``work`` (``git archive``)."""
    root = Path(__file__).resolve().parents[1]
    archive = work / "baseline.tar"
    subprocess.run(["git", "-C", str(root), "archive", "-o", str(archive), ref], check=True)
    tree = work / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _concurrent_table(args: argparse.Namespace) -> None:
    results: dict[str, dict[str, list[float]]] = {}
    if args.baseline_ref:
        with tempfile.TemporaryDirectory(prefix="bench-replication-") as tmp:
            tree = _export(args.baseline_ref, Path(tmp))
            env = dict(os.environ, PYTHONPATH=str(tree))
            cmd = [sys.executable, __file__, "--concurrent", "--json"]
            cmd += ["--writers", str(args.writers), "--per-writer", str(args.per_writer)]
            done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            results[f"{args.baseline_ref} (before)"] = json.loads(done.stdout.splitlines()[-1])
    results["this tree"] = _concurrent(args.writers, args.per_writer)
    if args.json:
        print(json.dumps(results["this tree"]))
        return
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"| code | {args.writers} writers, one-row inserts, 3 replicas | p50 | p95 | inserts |")
    print("|---|---|---|---|---|")
    for code, by_label in results.items():
        for label, samples in by_label.items():
            med, p95 = _stats(samples)
            print(f"| {code} | {label} | {med:.1f} ms | {p95:.1f} ms | {len(samples)} |")
    print(f"\nload average after the run: {load} ({os.cpu_count()} cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrent", action="store_true", help="the concurrent writers scenario only")
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--per-writer", type=int, default=25)
    parser.add_argument("--baseline-ref", default=None, help="also run --concurrent against this git ref")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.concurrent:
        _concurrent_table(args)
        return
    rows = [[i, i] for i in range(100)]
    with LocalCluster(replicas=3) as cluster:
        c0, c1 = cluster.client(0), cluster.client(1)
        create_times = []
        for k in range(10):
            started = time.perf_counter()
            c0.command(f"CREATE TABLE oc_{k} ON CLUSTER lb_cluster (a UInt32) ENGINE = ReplicatedMergeTree ORDER BY a")
            create_times.append(time.perf_counter() - started)
        c0.command("CREATE TABLE plain (a UInt32, b UInt32) ENGINE = MergeTree ORDER BY a")
        c0.command(
            "CREATE TABLE rep ON CLUSTER lb_cluster (a UInt32, b UInt32) ENGINE = ReplicatedMergeTree ORDER BY a"
        )
        for _ in range(20):  # warm-up
            c0.insert("plain", rows, column_names=["a", "b"], settings={"insert_deduplicate": 0})
        plain = _timed(lambda: c0.insert("plain", rows, column_names=["a", "b"]), args.n)
        replicated = _timed(
            lambda: c0.insert("rep", rows, column_names=["a", "b"], settings={"insert_deduplicate": 0}), args.n
        )
        c0.command("CREATE TABLE lag ON CLUSTER lb_cluster (a UInt32) ENGINE = ReplicatedMergeTree ORDER BY a")
        lags = []
        for i in range(args.n):
            c0.command(f"INSERT INTO lag VALUES ({i})")
            started = time.perf_counter()
            while c1.command(f"SELECT count() FROM lag WHERE a = {i}") != 1:
                pass
            lags.append(time.perf_counter() - started)
    print(f"| measurement ({args.n} runs, 3 replicas) | median | p95 |")
    print("|---|---|---|")
    for label, samples in (
        ("insert 100 rows, MergeTree", plain),
        ("insert 100 rows, ReplicatedMergeTree (logged, fsynced)", replicated),
        ("insert answered on r1 until r2 returns the row", lags),
        ("CREATE TABLE ... ON CLUSTER (10 runs)", create_times),
    ):
        med, p95 = _stats(samples)
        print(f"| {label} | {med:.2f} ms | {p95:.2f} ms |")


if __name__ == "__main__":
    main()

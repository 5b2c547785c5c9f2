"""False alarms and detection time inside a busy process, before and after the stall-aware
failure detector, side by side in one run.

    python bench/bench_stalls.py [--seconds 20] [--before /path/to/main/tree]

Each tree (``--before``: a checkout of the previous code, default /work/main; after: this one) runs
in a child process of its own with ``PYTHONPATH`` pointing at it, against one LocalCluster of 3
replicas, with a thread holding the GIL 0.8 s at a time back to back and two CPU hogs
(``clickhouse_lb/testing/load.py`` of this tree, loaded by path: the previous tree has none):

* false alarms: errors counted against the healthy replicas (listener events: failed probes,
  "hung" liveness checks, timeouts) while 3 threads read (``SELECT sleep(0.3)``, long enough to
  be checked) and 1 writes, for ``--seconds``; and statements that failed;
* detection: replica 0 paused (SIGSTOP) for 5 s under the same load while 4 threads read; the
  worst per-thread gap between two answers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
LOAD = HERE / "clickhouse_lb" / "testing" / "load.py"


def _busy_process() -> Any:
    spec = importlib.util.spec_from_file_location("_bench_load", LOAD)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.busy_process


def child(seconds: float) -> dict[str, Any]:
    import clickhouse_lb
    from clickhouse_lb.testing import LocalCluster

    busy_process = _busy_process()
    events: list[str] = []

    class Errors:
        def on_error_recorded(self, event: Any) -> None:
            events.append(f"{event.kind}: {event.error[:80]}")

    failed: list[str] = []
    done = [0, 0]
    with LocalCluster(replicas=3) as cluster:
        cluster.on_all("CREATE TABLE IF NOT EXISTS bench_stalls (id UInt32) ENGINE = MergeTree ORDER BY id")
        with clickhouse_lb.get_pool(cluster.hosts, listeners=[Errors()]) as pool:
            for _ in range(6):
                pool.command("SELECT 1")
            stop = threading.Event()

            def read() -> None:
                while not stop.is_set():
                    try:
                        pool.command("SELECT sleep(0.3)")
                        done[0] += 1
                    except Exception as exc:
                        failed.append(f"read {type(exc).__name__}: {str(exc)[:80]}")

            def write() -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        pool.command(f"INSERT INTO bench_stalls SELECT {n} + sleep(0.3)")
                        done[1] += 1
                    except Exception as exc:
                        failed.append(f"write {type(exc).__name__}: {str(exc)[:80]}")

            with busy_process(gil_hold=0.8, hogs=2), ThreadPoolExecutor(4) as executor:
                futures = [executor.submit(read) for _ in range(3)] + [executor.submit(write)]
                time.sleep(seconds)
                stop.set()
                for future in futures:
                    future.result()
        worst = [0.0] * 4
        with clickhouse_lb.get_pool(cluster.hosts) as pool:
            for _ in range(30):
                pool.command("SELECT 1")
            stop = threading.Event()
            running = threading.Barrier(5)

            def reader(n: int) -> None:
                pool.command("SELECT 1")
                running.wait()
                last = time.monotonic()
                while not stop.is_set():
                    try:
                        pool.command("SELECT 1")
                    except Exception as exc:
                        failed.append(f"paused-read {type(exc).__name__}")
                    now = time.monotonic()
                    worst[n] = max(worst[n], now - last)
                    last = now

            with busy_process(gil_hold=0.8, hogs=2), ThreadPoolExecutor(4) as executor:
                futures = [executor.submit(reader, n) for n in range(4)]
                running.wait()
                cluster.pause(0)
                time.sleep(5)
                cluster.resume(0)
                stop.set()
                for future in futures:
                    future.result()
    return {"false_alarms": len(events), "failed": len(failed), "reads": done[0], "writes": done[1],
            "worst_gap": max(worst), "examples": (events + failed)[:4]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--before", default="/work/main")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.seconds)))
        return
    print(f"load before: {os.getloadavg()[0]:.1f} (1-min load average, {os.cpu_count()} CPUs)")
    rows = []
    for label, tree in (("before", args.before), ("after", str(HERE))):
        out = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(args.seconds)],
                             env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True, check=False)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if not lines:
            print(f"{label}: no result\n{out.stderr[-2000:]}")
            continue
        rows.append((label, json.loads(lines[-1])))
    print(f"load after: {os.getloadavg()[0]:.1f}")
    print(f"{'tree':8} {'false alarms':>12} {'failed stmts':>12} {'reads':>6} {'writes':>6} {'worst gap, paused':>18}")
    for label, row in rows:
        print(f"{label:8} {row['false_alarms']:>12} {row['failed']:>12} {row['reads']:>6} {row['writes']:>6} "
              f"{row['worst_gap']:>17.2f}s")
        for example in row["examples"]:
            print(f"    {example}")


if __name__ == "__main__":
    main()

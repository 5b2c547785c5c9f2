"""Hedging from its defaults (issue 24, item 4): this branch against another checkout, side by
side in one run, on one LocalCluster.

    python bench/bench_hedge_defaults.py --before /work/main [--rounds 2] [--threads 4] [--reads 150]

Every pool has ``use_hedged_requests=1`` and nothing else (``receive_data_timeout_ms="auto"``).
Each measurement runs in a child process whose ``PYTHONPATH`` is one checkout (``--before``: e.g.
main's; ``--after``: this one), from a neutral working directory so that the checkout's own
package is the one imported; the parent owns the cluster and its faults.

1. Healthy cluster: ``--threads`` threads x ``--reads`` reads (``SELECT getMacro('replica')``),
   the default strategy (``random``), ``in_order`` and ``round_robin``: hedges started per 100
   statements (``pool.hedged_requests``), median and p99 latency.
2. One slow replica: ``in_order``, replica 0 answering 1.5 s late, 11 reads one after the other
   (the issue's case): the first read, and the median and worst of the 10 after it.

Prints markdown tables for BENCHMARKS.md, with the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, statistics, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import clickhouse_lb
WHO = "SELECT getMacro('replica')"
job = json.loads(sys.argv[1])
settings = {"use_hedged_requests": 1, "share_state": False, **job["settings"]}
with clickhouse_lb.get_pool(job["hosts"], **settings) as pool:
    for host in job["hosts"]:  # every replica's client exists (creating one is a query of its own)
        pool.client(host).command("SELECT 1")
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # the parent has set its faults
    latencies = []
    lock = threading.Lock()
    def reader(n):
        mine = []
        for _ in range(job["reads"]):
            started = time.perf_counter()
            pool.command(WHO)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)
    if job["threads"] == 1:
        reader(0)
    else:
        with ThreadPoolExecutor(job["threads"]) as executor:
            list(executor.map(reader, range(job["threads"])))
    print(json.dumps({"latencies": latencies, "hedges": pool.hedged_requests,
                      "module": clickhouse_lb.__file__}), flush=True)
"""


def measure(checkout: Path, cluster: Any, job: dict[str, Any], slow: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryDirectory() as neutral:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps({**job, "hosts": cluster.hosts})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=neutral, env=env,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        json.loads(child.stdout.readline())  # ready
        cluster.set_delay(0, slow)
        try:
            child.stdin.write("go\n")
            child.stdin.flush()
            result: dict[str, Any] = json.loads(child.stdout.readline())
        finally:
            cluster.set_delay(0, 0)
            child.wait(60)
    module = Path(result["module"]).resolve()
    if checkout.resolve() not in module.parents:
        raise SystemExit(f"the child imported {module}, not the checkout {checkout}")
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare with (e.g. main's)")
    parser.add_argument("--after", type=Path, default=HERE, help="this checkout (default: the one this script is in)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--reads", type=int, default=150)
    args = parser.parse_args()
    sys.path.insert(0, str(args.after))
    from clickhouse_lb.testing import LocalCluster

    versions = (("before", args.before), ("after", args.after))
    print(f"load average at start: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores)\n")
    with LocalCluster(replicas=3) as cluster:
        print(f"### Healthy cluster: {args.threads} threads x {args.reads} reads, `use_hedged_requests=1`\n")
        print("| strategy | round | code | hedges per 100 statements | median | p99 |")
        print("|---|---|---|---|---|---|")
        for strategy in ("random", "in_order", "round_robin"):
            for round_ in range(1, args.rounds + 1):
                for label, checkout in versions:
                    job = {"settings": {"load_balancing": strategy}, "threads": args.threads, "reads": args.reads}
                    result = measure(checkout, cluster, job, 0.0)
                    latencies = sorted(result["latencies"])
                    per_100 = result["hedges"] * 100 / len(latencies)
                    p99 = latencies[int(len(latencies) * 0.99)]
                    print(f"| {strategy} | {round_} | {label} | {per_100:.1f} | {ms(latencies[len(latencies) // 2])} "
                          f"| {ms(p99)} |", flush=True)
        print("\n### One slow replica: `in_order`, replica 0 +1.5 s, 11 reads in a row, `use_hedged_requests=1`\n")
        print("| round | code | first read | reads 2-11: median | reads 2-11: worst | hedges |")
        print("|---|---|---|---|---|---|")
        for round_ in range(1, args.rounds + 1):
            for label, checkout in versions:
                job = {"settings": {"load_balancing": "in_order"}, "threads": 1, "reads": 11}
                result = measure(checkout, cluster, job, 1.5)
                first, *rest = result["latencies"]
                rest.sort()
                print(f"| {round_} | {label} | {ms(first)} | {ms(rest[len(rest) // 2])} | {ms(rest[-1])} "
                      f"| {result['hedges']} |", flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

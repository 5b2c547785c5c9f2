"""Run clickhouse-connect's own integration suite against a local 3-replica cluster, once with
plain clients and once with every ``create_client(...)`` replaced by ``get_pool(...)`` (same
keyword arguments, ``load_balancing="in_order"``), and print both pass counts.

The suite is not part of this repository: export ``tests/`` (and ``pyproject.toml``) of
github.com/ClickHouse/clickhouse-connect at the tag of the clickhouse-connect installed in the
venv you run this with, e.g. ``git archive v0.15.1 tests pyproject.toml | tar -x -C /tmp/cc``,
then::

    python bench/clickhouse_connect_suite.py /tmp/cc [test paths and pytest args ...]

(default: the whole ``tests/integration_tests``; ``CLICKHOUSE_LB_SUITE_MODES=pool`` runs the
pooled run only). Each run's pytest output is kept in
``/tmp/cc/plain.log`` and ``/tmp/cc/pool.log``.

It needs the suite's test dependencies (pytest, pytest-asyncio, pandas, pyarrow, numpy,
SQLAlchemy) and ``clickhouse-lb[local]``. The replicas of the local cluster are independent
engines; with ``in_order`` every statement of the pooled run goes to the first replica while it
answers, as the plain run's do, so the two runs differ only by the client object.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from clickhouse_lb.testing import LocalCluster

HERE = Path(__file__).resolve().parent


def run(suite: Path, hosts: list[str], pooled: bool, extra: list[str]) -> tuple[str, int]:
    host, _, port = hosts[0].rpartition(":")
    env = {
        **os.environ,
        "CLICKHOUSE_CONNECT_TEST_HOST": host,
        "CLICKHOUSE_CONNECT_TEST_PORT": port,
        "CLICKHOUSE_CONNECT_TEST_COMPRESS": "False",
        "PYTHONPATH": os.pathsep.join([str(suite), str(HERE)]),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "--timeout=120", *(extra or ["tests/integration_tests"])]
    if pooled:
        env["CLICKHOUSE_LB_SUITE_HOSTS"] = ",".join(hosts)
        command[3:3] = ["-p", "_pool_as_client"]
    log = suite / ("pool.log" if pooled else "plain.log")
    with log.open("w") as out:
        done = subprocess.run(command, cwd=suite, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return (lines[-1] if lines else "(no output)"), done.returncode


def main() -> None:
    suite = Path(sys.argv[1]).resolve()
    extra = sys.argv[2:]
    with LocalCluster(3) as cluster:
        modes = os.environ.get("CLICKHOUSE_LB_SUITE_MODES", "plain,pool").split(",")
        for pooled in [mode == "pool" for mode in modes]:
            summary, code = run(suite, cluster.hosts, pooled, extra)
            label = "get_pool (3 replicas, in_order)" if pooled else "plain create_client"
            passed = re.search(r"(\d+) passed", summary)
            print(f"{label:34} {summary}  [exit {code}]  passed={passed.group(1) if passed else 0}")


if __name__ == "__main__":
    main()

"""Faults for the hung-replica tests, made certain before the test goes on.

``LocalCluster.pause`` sends SIGSTOP and returns; the signal takes effect asynchronously, so on a
loaded machine the replica may still serve a request sent right after. :func:`pause` returns
once every thread of the replica process is stopped (read from /proc), so that the statement a
test sends next really meets a hung replica.
"""

from __future__ import annotations

import time
from pathlib import Path

from clickhouse_lb.testing import ClusterBase


def _all_stopped(pid: int) -> bool:
    tasks = Path(f"/proc/{pid}/task")
    try:
        states = [(task / "stat").read_text().rpartition(")")[2].split()[0] for task in tasks.iterdir()]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def pause(cluster: ClusterBase, i: int, timeout: float = 10.0) -> None:
    cluster.pause(i)
    pids = getattr(cluster, "pids", None)
    pid = pids[i] if pids is not None else None
    if pid is None or not Path("/proc").is_dir():
        return  # a Docker cluster: `docker compose pause` returns once the container is frozen
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid):
        assert time.monotonic() < deadline, f"replica {i} was not stopped {timeout}s after SIGSTOP"
        time.sleep(0.002)

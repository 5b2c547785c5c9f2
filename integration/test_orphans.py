"""A LocalCluster's replicas die with their owner in every case, and what a SIGKILLed owner
leaves behind can be cleaned up (issue 13)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clickhouse_lb.testing import LocalCluster
from clickhouse_lb.testing._orphans import MARKER

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")]

# The owner: a cluster of one replica, restarted from a short-lived worker thread (which then
# ends), then paused (SIGSTOP): the case where a watchdog inside the replica cannot run and a
# parent-death signal tied to the worker thread would have fired too early or never.
_OWNER = """
import json, sys, threading
from clickhouse_lb.testing import LocalCluster
cluster = LocalCluster(replicas=1, base_dir=None, distinct_addresses=False).start()
worker = threading.Thread(target=cluster.restart, args=(0,))
worker.start(); worker.join()
cluster.pause(0)
print(json.dumps({"pid": cluster.pids[0], "dir": str(cluster.base_dir), "host": cluster.hosts[0]}), flush=True)
sys.stdin.read()
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rpartition(")")[2].split()[0] == "Z":
            return True  # a zombie: dead, waiting for init to reap it
        time.sleep(0.05)
    return False


def test_a_paused_replica_restarted_from_a_thread_dies_with_its_sigkilled_owner(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ)
    )
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        base_dir = Path(info["dir"])
        assert json.loads((base_dir / MARKER).read_text())["replicas"] == [info["pid"]]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    # seconds, not minutes: the kernel's parent-death signal, not a timeout somewhere
    assert _gone(info["pid"], within=15.0), "the paused replica survived its owner"
    assert base_dir.exists()  # nothing of a SIGKILLed owner runs to remove it ...
    removed = LocalCluster.cleanup_orphans(base_dir.parent)
    assert base_dir in removed  # ... so the documented cleanup does
    assert not base_dir.exists()


def test_cleanup_never_touches_a_live_owners_cluster() -> None:
    with LocalCluster(replicas=1, distinct_addresses=False) as cluster:
        base_dir = cluster.base_dir
        assert base_dir not in LocalCluster.cleanup_orphans(base_dir.parent)
        assert base_dir.exists()
        assert cluster.is_alive(0)
    assert not base_dir.exists()  # close() removes its own directory

"""No orphan replicas, and a way to clean up after an owner that could not.

Three mechanisms, from strongest to last resort:

* **Parent-death signal from one long-lived thread.** ``PR_SET_PDEATHSIG`` (Linux) makes the
  kernel SIGKILL a replica when its parent dies, even while the replica is stopped by SIGSTOP
  (a watchdog thread inside a stopped process cannot run). The kernel ties the signal to the
  *thread* that forked the child, so :func:`spawn` forks every replica from one dedicated
  daemon thread that lives as long as the process: a replica restarted from a short-lived
  worker thread, then paused, still dies with its owner.
* **The replica's own parent watch** (``replica.py``), for other platforms; it runs once a
  paused replica is resumed.
* **An owner marker** (:data:`MARKER`) in every cluster directory: the owner's pid and start
  time, and its replicas' pids. After an owner was SIGKILLed (nothing of it runs to remove its
  temporary directory), :func:`cleanup_orphans` -- ``python -m clickhouse_lb.testing.cleanup``
  or ``LocalCluster.cleanup_orphans()`` -- kills what is left of its replicas and removes the
  directory. Directories whose owner is alive are never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DIR_PREFIX", "MARKER", "cleanup_orphans", "spawn", "write_marker"]

DIR_PREFIX = "clickhouse-lb-cluster-"
MARKER = "clickhouse-lb-owner.json"
_REPLICA_MODULE = "clickhouse_lb.testing.replica"

_requests: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[tuple[bool, Any]]]] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _serve() -> None:
    while True:
        work, reply = _requests.get()
        try:
            reply.put((True, work()))
        except BaseException as exc:  # handed back to the caller
            reply.put((False, exc))


def spawn(cmd: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, **popen)``, forked from the process's one spawner thread (see
    the module docstring: the replica's parent-death signal then holds until the process
    itself ends, whichever thread asked)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_serve, name="clickhouse-lb-spawner", daemon=True)
            _spawner.start()
    reply: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    _requests.put((lambda: subprocess.Popen(cmd, **popen), reply))
    ok, value = reply.get()
    if not ok:
        raise value
    assert isinstance(value, subprocess.Popen)
    return value


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a live owner from a
    reused pid; None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or _start_time(pid) in (None, start)


def write_marker(base_dir: Path, replica_pids: list[int]) -> None:
    """Record the owner (this process) and its replicas' pids in ``base_dir``."""
    data = {"owner": os.getpid(), "owner_start": _start_time(os.getpid()), "replicas": replica_pids}
    tmp = base_dir / (MARKER + ".tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(data))
        os.replace(tmp, base_dir / MARKER)


def _is_replica_of(pid: int, base_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _REPLICA_MODULE.encode() in cmdline and any(str(base_dir).encode() in part for part in cmdline)


def cleanup_orphans(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Kill the replicas and remove the directories of LocalClusters whose owner process is
    gone (e.g. SIGKILLed). ``root``: where the clusters' temporary directories are (default:
    the system's temporary directory). Returns the directories removed."""
    removed: list[Path] = []
    for base_dir in sorted(Path(root or tempfile.gettempdir()).glob(DIR_PREFIX + "*")):
        try:
            data = json.loads((base_dir / MARKER).read_text())
            owner, start = int(data["owner"]), data.get("owner_start")
            replicas = [int(pid) for pid in data.get("replicas", [])]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no marker (an older version, or not ours): never touched
        if _alive(owner, start):
            continue
        for pid in replicas:
            if _is_replica_of(pid, base_dir):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base_dir, ignore_errors=True)
        removed.append(base_dir)
    return removed

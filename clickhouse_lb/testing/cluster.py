"""``LocalCluster``: local ClickHouse replicas (the real engine through chdb), no Docker needed.

Each replica is a separate Python process (``python -m clickhouse_lb.testing.replica``) running
the ClickHouse engine from chdb behind ClickHouse's HTTP interface (see
:mod:`clickhouse_lb.testing.server` for what is faithful and what is not). On Linux, replica ``i``
listens on its own loopback address (``127.0.0.11``, ``127.0.0.12``, ...) so host-name based
load-balancing strategies see different host strings; elsewhere all listen on ``127.0.0.1``.

Faults are real: :meth:`LocalCluster.kill` is SIGKILL (connections refused), :meth:`pause` is
SIGSTOP (the kernel still accepts connections, nothing answers), :meth:`restart` starts the
process again on the same address with the same data directory (MergeTree data survives),
:meth:`set_delay` and :meth:`fail_next` use the replica's fault-injection endpoint.

Replication: ``ReplicatedMergeTree`` tables replicate between the replicas and ``ON CLUSTER
lb_cluster`` statements run on all of them, through a replication log in ``base_dir/replication``
shared by the replica processes (see docs/local-cluster.md for what it guarantees and how it
differs from ClickHouse Keeper). Replication faults: :meth:`delay_replication`,
:meth:`stop_replication` / :meth:`start_replication`; network fault: :meth:`blackhole` /
:meth:`unblackhole` (``connect()`` hangs). Plain MergeTree tables are per replica, as on a server.

Shards: ``LocalCluster(shards=2, replicas=2)`` runs 4 processes in shard order (indices 0, 1 are
shard 1's replicas, 2, 3 shard 2's); each has macro ``shard`` = its shard number (``01``,
``02``), so ReplicatedMergeTree tables (default path ``/clickhouse/tables/{uuid}/{shard}``)
replicate within their shard only; ``system.clusters`` lists every replica with its
``shard_num``, ``replica_num`` and ``shard_weight`` (``shard_weights=``); ``ON CLUSTER`` runs on
every process of every shard. See :attr:`LocalCluster.shard_hosts`, :meth:`LocalCluster.shard_of`,
:meth:`LocalCluster.shard_indices`.

Same port: ``shared_port=True`` (or ``port=N``) runs every replica on its own loopback address
and one shared port, for the ``a,b,c:PORT`` URL forms.

No orphan processes: replicas are SIGKILLed by :meth:`close`, at interpreter exit (atexit), and
die with their owner process in every case on Linux (PR_SET_PDEATHSIG, set for replicas started
or restarted from any thread, paused or not; see :mod:`clickhouse_lb.testing._orphans`); elsewhere
each replica exits when it sees its parent gone. After an owner was SIGKILLed, its temporary
directory is left: :meth:`LocalCluster.cleanup_orphans` (or ``python -m
clickhouse_lb.testing.cleanup``) removes it.

Example::

    with LocalCluster(replicas=3) as cluster:
        client = cluster.client(0)
        client.query("SELECT getMacro('replica')").result_rows  # [('r1',)]
        cluster.query(0, "CREATE TABLE t ON CLUSTER lb_cluster (x UInt8) ENGINE = ReplicatedMergeTree ORDER BY x")
        cluster.query(1, "INSERT INTO t VALUES (1)")
        cluster.query(2, "SYSTEM SYNC REPLICA t")  # r3 now has the row
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clickhouse_lb.testing import _orphans, _replog
from clickhouse_lb.testing._base import ClusterBase, ClusterError
from clickhouse_lb.testing._users import User, users_to_json

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_FAULTS_PATH = "/__clickhouse_lb__/faults"
_REPLICATION_PATH = "/__clickhouse_lb__/replication"
_BLACKHOLE_STATE = "blackhole.state"
_LIVE: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until every thread of process ``pid`` is stopped (Linux: read from /proc; elsewhere at once)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [(task / "stat").read_text().rpartition(")")[2].split()[0] for task in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return  # the process is gone: nothing left to wait for
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)
    raise ClusterError(f"process {pid} was not stopped {timeout:g} s after SIGSTOP")


@dataclass
class _Replica:
    index: int
    name: str
    host: str
    data_dir: Path
    shard: int = 1  # shard_num, from 1
    port: int = 0
    https_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    blackholed: bool = False


def _default_distinct() -> bool:
    return sys.platform.startswith("linux")


class LocalCluster(ClusterBase):
    """Replica processes on loopback, each the real ClickHouse engine behind its HTTP interface.

    :param replicas: number of replicas (of each shard).
    :param shards: number of shards (default 1); processes are numbered in shard order, shard 1's
        replicas first. Every process's macro ``shard`` is its shard number, two digits
        (``01``, ``02``, ...), as in a server's ``<macros>``.
    :param shard_weights: ``shard_weight`` of each shard in ``system.clusters`` (non-negative
        integers, one per shard, as ``<weight>`` in ``remote_servers``); default 1 each.
    :param names: replica names (macro ``replica`` and display name), one per process in shard
        order; default ``r1``, ``r2``, ... (numbered across shards).
    :param base_dir: where the replicas' data directories go; default a temporary directory that
        :meth:`close` removes (a given ``base_dir`` is kept).
    :param distinct_addresses: replica ``i`` listens on ``127.0.0.(11+i)`` (Linux default) instead
        of ``127.0.0.1``.
    :param password: password of user ``default`` on every replica (default: empty).
    :param users: more users on every replica, by name (``User(password, readonly)``), so that
        authentication failures and readonly users can be tested.
    :param tls: every replica also serves HTTPS on a port of its own (:meth:`https_address`),
        with a certificate for its address signed by a test CA made with ``trustme``
        (:attr:`ca_path`); ``client(i, secure=True)`` connects there and verifies it.
    :param startup_timeout: seconds to wait for a replica to answer ``/ping``.
    :param cluster_name: the cluster's name in ``system.clusters`` and ``ON CLUSTER``
        (default ``lb_cluster``, as in docker-compose.yml).
    :param shared_port: every replica listens on the same port (one free on all the replicas'
        addresses), each on its own address; needs distinct addresses (Linux).
    :param port: that shared port, chosen by you (implies ``shared_port``).
    :param advertised_hosts: what ``system.clusters`` lists for each replica instead of its
        address: ``"host"`` (with the replica's port) or ``"host:port"``, one per replica, as
        servers inside a Docker network list names only that network resolves (for
        ``cluster_host_map`` tests).
    """

    def __init__(
        self,
        replicas: int = 3,
        *,
        shards: int = 1,
        shard_weights: list[int] | None = None,
        names: list[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        distinct_addresses: bool | None = None,
        password: str = "",
        users: Mapping[str, User] | None = None,
        tls: bool = False,
        startup_timeout: float = 60.0,
        cluster_name: str = "lb_cluster",
        shared_port: bool = False,
        port: int | None = None,
        advertised_hosts: list[str] | None = None,
    ) -> None:
        for label, value in (("replicas", replicas), ("shards", shards)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an integer of at least 1, not {value!r}")
        shard_weights = _checked_weights([1] * shards if shard_weights is None else shard_weights, shards)
        total = shards * replicas
        if names is not None and len(names) != total:
            raise ValueError(f"names must have one entry per replica ({total}), not {len(names)}")
        if names is not None and len(set(names)) != len(names):
            raise ValueError(f"names must be distinct, not {names!r}")
        self.shards = shards
        self.replicas_per_shard = replicas
        self.shard_weights = list(shard_weights)
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be between 1 and 65535, not {port!r}")
        if not cluster_name or not all(c.isalnum() or c in "_-" for c in cluster_name):
            raise ValueError(
                f"cluster_name must be a non-empty name of letters, digits, '_' or '-', not {cluster_name!r}"
            )
        self._names = list(names) if names is not None else [f"r{i + 1}" for i in range(total)]
        self._advertised = _advertised(advertised_hosts, total)
        self._own_dir = base_dir is None
        self._base_dir = Path(base_dir) if base_dir is not None else None
        distinct = _default_distinct() if distinct_addresses is None else distinct_addresses
        self.password = password
        self.users = dict(users or {})
        if "default" in self.users:
            raise ValueError("users: user 'default' is configured by password=, not by users=")
        for name, user in self.users.items():
            if not isinstance(user, User):
                raise TypeError(f"users[{name!r}] must be a clickhouse_lb.testing.User, not {type(user).__name__}")
        self.tls = tls
        self._ca_path: Path | None = None
        self.startup_timeout = startup_timeout
        self._replicas: list[_Replica] = []
        self._described: list[int] | None = None  # None: every replica (see describe())
        self._distinct = distinct
        self.cluster_name = cluster_name
        self._shared_port = shared_port or port is not None
        self._port = port
        if self._shared_port and not distinct:
            raise ValueError(
                "shared_port/port need distinct loopback addresses per replica (distinct_addresses=True, Linux)"
            )
        self._lock = threading.RLock()
        self._started = False

    # -- ClusterBase ---------------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        self._require_started()
        return [f"{r.host}:{r.port}" for r in self._replicas]

    @property
    def names(self) -> list[str]:
        return list(self._names)

    # -- shards ----------------------------------------------------------------------------------
    def shard_of(self, i: int) -> int:
        """The shard (``shard_num``, from 1) of process ``i``."""
        if not 0 <= i < len(self._names):
            raise IndexError(f"no replica {i}; valid indices 0..{len(self._names) - 1}")
        return i // self.replicas_per_shard + 1

    def shard_indices(self, shard: int) -> list[int]:
        """The process indices of shard ``shard`` (from 1), in replica order."""
        if not 1 <= shard <= self.shards:
            raise ValueError(f"no shard {shard!r}; valid shards 1..{self.shards}")
        first = (shard - 1) * self.replicas_per_shard
        return list(range(first, first + self.replicas_per_shard))

    @property
    def shard_hosts(self) -> list[list[str]]:
        """``"host:port"`` of every replica, one list per shard in shard order."""
        hosts = self.hosts
        return [[hosts[i] for i in self.shard_indices(s)] for s in range(1, self.shards + 1)]

    @property
    def base_dir(self) -> Path:
        """The directory holding one data directory per replica."""
        self._require_started()
        assert self._base_dir is not None
        return self._base_dir

    @property
    def ca_path(self) -> Path:
        """PEM file of the CA that signed the replicas' HTTPS certificates (``tls=True``)."""
        self._require_started()
        if self._ca_path is None:
            raise ClusterError("the cluster was started without tls=True")
        return self._ca_path

    def https_address(self, i: int) -> tuple[str, int]:
        """``(host, port)`` of replica ``i``'s HTTPS listener (``tls=True``)."""
        r = self._replica(i)
        if not self.tls:
            raise ClusterError("the cluster was started without tls=True")
        return r.host, r.https_port

    def client(self, i: int, **kwargs: Any) -> Any:
        """A clickhouse_connect client for replica ``i``; ``secure=True`` uses its HTTPS listener,
        verified against :attr:`ca_path` unless ``verify``/``ca_cert`` say otherwise."""
        if not (kwargs.get("secure") or kwargs.get("interface") == "https"):
            return super().client(i, **kwargs)
        import clickhouse_connect

        host, port = self.https_address(i)
        kwargs.setdefault("username", "default")
        kwargs.setdefault("password", self.password)
        if kwargs.get("verify", True):
            kwargs.setdefault("ca_cert", str(self.ca_path))
        return clickhouse_connect.get_client(host=host, port=port, **kwargs)

    @property
    def pids(self) -> list[int | None]:
        """Process id of each replica (None when killed)."""
        return [r.proc.pid if r.proc is not None and r.proc.poll() is None else None for r in self._replicas]

    def start(self) -> LocalCluster:
        with self._lock:
            if self._started:
                return self
            if self._base_dir is None:
                self._base_dir = Path(tempfile.mkdtemp(prefix=_orphans.DIR_PREFIX))
            self._base_dir.mkdir(parents=True, exist_ok=True)
            self._replicas = [
                _Replica(
                    i,
                    name,
                    f"127.0.0.{11 + i}" if self._distinct else "127.0.0.1",
                    self._base_dir / name,
                    shard=self.shard_of(i),
                )
                for i, name in enumerate(self._names)
            ]
            if self._shared_port:
                port = self._port or _free_common_port([r.host for r in self._replicas])
                for r in self._replicas:
                    r.port = port
            self._started = True
            _LIVE.add(self)
            try:
                if self.tls:
                    self._make_certificates()
                for attempt in range(3):
                    for r in self._replicas:
                        self._spawn(r)
                    try:
                        self._wait_all(self._replicas)
                        break
                    except ClusterError as exc:
                        # A port chosen for all addresses can be taken by another process before
                        # the replicas bind it: choose again.
                        chosen_here = self._shared_port and self._port is None
                        if attempt == 2 or not chosen_here or "Address already in use" not in str(exc):
                            raise
                        for r in self._replicas:
                            self._kill_proc(r)
                        port = _free_common_port([r.host for r in self._replicas])
                        for r in self._replicas:
                            r.port = port
                self._write_cluster_file()
            except BaseException:
                self.close()
                raise
            return self

    def close(self) -> None:
        with self._lock:
            if not self._started:
                return
            self._started = False
            for r in self._replicas:
                self._kill_proc(r)
            _LIVE.discard(self)
            if self._own_dir and self._base_dir is not None:
                shutil.rmtree(self._base_dir, ignore_errors=True)
                self._base_dir = None

    def kill(self, i: int) -> None:
        with self._lock:
            self._kill_proc(self._replica(i))

    def restart(self, i: int) -> None:
        with self._lock:
            r = self._replica(i)
            self._kill_proc(r)
            self._spawn(r)
            self._wait_all([r])

    def pause(self, i: int) -> None:
        with self._lock:
            r = self._replica(i)
            if r.proc is None or r.proc.poll() is not None:
                raise ClusterError(f"replica {r.name} is not running")
            # Never stop a replica while it holds the replication log's lock (shared, inside an
            # insert, or exclusive): the others would wait for it. Holding it exclusively here,
            # no replica is inside.
            with _replog.writer_lock(self.replication_dir):
                os.kill(r.proc.pid, signal.SIGSTOP)
                # SIGSTOP takes effect asynchronously. Wait for it while still holding the lock:
                # released earlier, the replica could take the lock before the signal lands and
                # be stopped holding it (every other writer, and the next pause(), would then
                # wait forever); and a request sent right after pause() returned must meet a
                # stopped replica.
                _wait_stopped(r.proc.pid)
            r.paused = True

    def resume(self, i: int) -> None:
        with self._lock:
            r = self._replica(i)
            if r.proc is not None and r.proc.poll() is None:
                os.kill(r.proc.pid, signal.SIGCONT)
            r.paused = False

    def is_alive(self, i: int) -> bool:
        r = self._replica(i)
        return r.proc is not None and r.proc.poll() is None

    def is_paused(self, i: int) -> bool:
        """Whether replica ``i`` is stopped by :meth:`pause`."""
        return self._replica(i).paused and self.is_alive(i)

    def set_delay(self, i: int, seconds: float) -> None:
        self._faults(i, {"delay": float(seconds)})

    def fail_next(self, i: int, n: int = 1, code: int = 210) -> None:
        self._faults(i, {"fail_next": int(n), "code": int(code)})

    def faults(self, i: int) -> dict[str, object]:
        """The fault-injection state of replica ``i`` (delay, fail_next, code)."""
        return self._faults(i, None)

    def heal(self) -> None:
        with self._lock:
            self._require_started()
            dead = [r for r in self._replicas if r.proc is None or r.proc.poll() is not None]
            for r in self._replicas:
                if r.paused:
                    self.resume(r.index)
            for r in dead:
                self._kill_proc(r)
                self._spawn(r)
            if dead:
                self._wait_all(dead)
            for r in self._replicas:
                if r.blackholed:
                    self.unblackhole(r.index)
            for r in self._replicas:
                self._faults(r.index, {"delay": 0.0, "fail_next": 0, "code": 210})
                self._replication(r.index, {"delay": 0.0, "stopped": False, "hold_before_logging": False})

    def _reachable(self, i: int) -> bool:
        r = self._replica(i)
        return self.is_alive(i) and not r.paused and not r.blackholed

    # -- replication -----------------------------------------------------------------------------
    @property
    def replication_dir(self) -> Path:
        """The replication log shared by the replicas (see docs/local-cluster.md)."""
        return self.base_dir / "replication"

    def delay_replication(self, i: int, seconds: float) -> None:
        """Replica ``i`` applies replicated writes only once they are ``seconds`` old (0 clears).

        Its ``system.replicas`` shows the lag (``absolute_delay``, ``queue_size``); ``ON CLUSTER``
        statements are not delayed (ClickHouse runs them outside the replication queue).
        Cleared by :meth:`heal` and by a restart of the replica.
        """
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, not {seconds!r}")
        self._replication(i, {"delay": float(seconds)})

    def stop_replication(self, i: int) -> None:
        """Replica ``i`` stops applying replicated writes (like ``SYSTEM STOP REPLICATION QUEUES``)."""
        self._replication(i, {"stopped": True})

    def start_replication(self, i: int) -> None:
        """Undo :meth:`stop_replication`: replica ``i`` catches up with the log."""
        self._replication(i, {"stopped": False})

    def crash_before_logging(self, i: int) -> None:
        """Replica ``i`` SIGKILLs itself during its next replicated write, after the write ran on
        its engine and before it is in the replication log: the moment a real crash can leave a
        write on one replica only. The restarted replica logs it then, so every replica gets it
        (see :mod:`clickhouse_lb.testing._replication`). Cleared by the crash."""
        self._replication(i, {"crash_before_logging": True})

    def crash_in_batch(self, i: int) -> None:
        """Replica ``i`` SIGKILLs itself the next time its applier inserts several log entries as
        one engine insert (see :mod:`clickhouse_lb.testing._batching`), after the insert and
        before the entries are recorded as applied. The restarted replica inserts that same
        batch again, which the engine drops as a duplicate: every row once. Cleared by the crash."""
        self._replication(i, {"crash_in_batch": True})

    def crash_after_applying(self, i: int) -> None:
        """Replica ``i`` SIGKILLs itself the next time its applier sends one replicated write
        alone to its engine (an insert, an ALTER, a DELETE, ...), after the engine ran it and
        before the entry is recorded as applied. The restarted replica sends an insert again
        under its own token, which the engine drops (every row once, even when more inserts
        arrived meanwhile that its applier could join to it), and a mutation (``ALTER UPDATE``,
        ``DELETE``) only if it had not run. Cleared by the crash."""
        self._replication(i, {"crash_after_applying": True})

    def hold_before_logging(self, i: int, hold: bool = True) -> None:
        """Replica ``i``'s next replicated writes wait after they ran on its engine, before they
        are logged, until ``hold_before_logging(i, False)`` (or :meth:`heal`): a replica slow to
        log a write, which a client gave up on and retried elsewhere. ``replication_state(i)``
        says ``holding`` while a write waits there."""
        self._replication(i, {"hold_before_logging": bool(hold)})

    def replication_state(self, i: int) -> dict[str, object]:
        """Replica ``i``'s replication: ``delay``, ``stopped``, ``crash_before_logging``,
        ``crash_in_batch``, ``crash_after_applying``, ``hold_before_logging``, ``holding``,
        ``applied``, ``log_end``, ``queue``."""
        return self._replication(i, None)

    def _replication(self, i: int, change: dict[str, object] | None) -> dict[str, object]:
        return self._control(i, _REPLICATION_PATH, "replication", change)

    # -- black hole ------------------------------------------------------------------------------
    def blackhole(self, i: int, timeout: float = 10.0) -> None:
        """Connections to replica ``i`` are never answered: ``connect()`` hangs (SYNs dropped),
        established connections go silent. The process keeps running (and replicating)."""
        with self._lock:
            r = self._replica(i)
            if r.proc is None or r.proc.poll() is not None or r.paused:
                raise ClusterError(f"replica {r.name} is not running (or paused): cannot black-hole it")
            if r.blackholed:
                return
            os.kill(r.proc.pid, signal.SIGUSR1)
            self._wait_blackhole_state(r, "on", timeout)
            r.blackholed = True

    def unblackhole(self, i: int, timeout: float = 10.0) -> None:
        """Undo :meth:`blackhole`: replica ``i`` accepts connections again."""
        with self._lock:
            r = self._replica(i)
            if not r.blackholed:
                return
            r.blackholed = False
            if r.proc is None or r.proc.poll() is not None:
                return
            os.kill(r.proc.pid, signal.SIGUSR2)
            self._wait_blackhole_state(r, "off", timeout)
            self.wait_ready(i, timeout)

    def is_blackholed(self, i: int) -> bool:
        """Whether replica ``i`` is in a :meth:`blackhole`."""
        return self._replica(i).blackholed

    def _wait_blackhole_state(self, r: _Replica, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        path = r.data_dir / _BLACKHOLE_STATE
        while True:
            with contextlib.suppress(OSError):
                if path.read_text() == state:
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"replica {r.name} did not switch its black hole {state} within {timeout:g}s")
            time.sleep(0.01)

    def describe(self, replicas: Iterable[int] | None = None) -> None:
        """List only ``replicas`` (indices) in every replica's ``system.clusters`` from now on,
        as when servers are taken out of (or put back in) ``remote_servers``; the others keep
        running. ``None``: list them all again. For discovery tests: a replica "added" or
        "removed" at run time, as a client reading ``system.clusters`` sees it."""
        with self._lock:
            self._require_started()
            if replicas is None:
                self._described = None
            else:
                chosen = sorted(set(replicas))
                bad = [i for i in chosen if not 0 <= i < len(self._replicas)]
                if bad:
                    raise ValueError(f"describe: no replica {bad[0]}; valid indices 0..{len(self._replicas) - 1}")
                self._described = chosen
            self._write_cluster_file()

    def set_shard_weights(self, weights: list[int]) -> None:
        """Give the shards these ``shard_weight``s (one per shard, integers >= 0) in every
        replica's ``system.clusters`` from now on, as when ``remote_servers`` is edited and
        reloaded; the data stays where it is. For discovery tests of weight changes."""
        checked = _checked_weights(weights, self.shards)
        with self._lock:
            self._require_started()
            self.shard_weights = checked
            self._write_cluster_file()

    @property
    def described(self) -> list[int]:
        """The indices of the replicas ``system.clusters`` lists (see :meth:`describe`)."""
        return list(range(len(self._replicas))) if self._described is None else list(self._described)

    def _write_cluster_file(self) -> None:
        """Describe the cluster for the replicas' system.clusters."""
        def row(r: _Replica) -> dict[str, object]:
            host, port = self._advertised[r.index] if self._advertised else (r.host, None)
            return {
                "name": r.name,
                "host": host,
                "port": port or r.port,
                "shard": r.shard,
                "weight": self.shard_weights[r.shard - 1],
            }

        description = {"cluster": self.cluster_name, "replicas": [row(self._replicas[i]) for i in self.described]}
        path = self.base_dir / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(description))
        os.replace(tmp, path)

    def replica_memory_mb(self) -> list[float | None]:
        """Resident memory (RSS, MiB) of each replica process (Linux; None when unknown or killed)."""
        out: list[float | None] = []
        for pid in self.pids:
            rss: float | None = None
            if pid is not None:
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            rss = int(line.split()[1]) / 1024
                except OSError:
                    pass
            out.append(rss)
        return out

    def log_path(self, i: int) -> Path:
        """The replica's log file."""
        return self._replica(i).data_dir / "replica.log"

    # -- internals -----------------------------------------------------------------------------
    def _require_started(self) -> None:
        if not self._started:
            raise ClusterError("the cluster is not started (use start() or a with block)")

    def _replica(self, i: int) -> _Replica:
        self._require_started()
        return self._replicas[i]

    def _make_certificates(self) -> None:
        try:
            import trustme
        except ImportError:
            raise ClusterError("LocalCluster(tls=True) needs the trustme package (pip install trustme)") from None
        assert self._base_dir is not None
        tls_dir = self._base_dir / "tls"
        tls_dir.mkdir(exist_ok=True)
        ca = trustme.CA()
        names = sorted({"localhost", "127.0.0.1", *(r.host for r in self._replicas)})
        cert = ca.issue_cert(*names)
        self._ca_path = tls_dir / "ca.pem"
        ca.cert_pem.write_to_path(str(self._ca_path))
        cert.private_key_and_cert_chain_pem.write_to_path(str(tls_dir / "replica.pem"))

    def _spawn(self, r: _Replica) -> None:
        r.data_dir.mkdir(parents=True, exist_ok=True)
        (r.data_dir / _BLACKHOLE_STATE).unlink(missing_ok=True)
        r.blackholed = False
        port_file = r.data_dir / "replica.port"
        port_file.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "clickhouse_lb.testing.replica",
            "--host",
            r.host,
            "--port",
            str(r.port),
            "--name",
            r.name,
            "--shard",
            f"{r.shard:02d}",
            "--data-dir",
            str(r.data_dir),
            "--port-file",
            str(port_file),
            "--parent-pid",
            str(os.getpid()),
            "--cluster-name",
            self.cluster_name,
            "--replication-dir",
            str(self.replication_dir),
            "--cluster-file",
            str(self.base_dir / "cluster.json"),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        if self.users:
            env["CLICKHOUSE_LB_REPLICA_USERS"] = users_to_json(self.users)
            cmd += ["--users-env", "CLICKHOUSE_LB_REPLICA_USERS"]
        if self.tls:
            assert self._base_dir is not None
            https_port_file = r.data_dir / "replica.https-port"
            https_port_file.unlink(missing_ok=True)
            pem = str(self._base_dir / "tls" / "replica.pem")
            cmd += ["--tls-cert", pem, "--tls-key", pem, "--https-port", str(r.https_port)]
            cmd += ["--https-port-file", str(https_port_file)]
        if self.password:
            env["CLICKHOUSE_LB_REPLICA_PASSWORD"] = self.password
            cmd += ["--password-env", "CLICKHOUSE_LB_REPLICA_PASSWORD"]
        if sys.platform.startswith("linux"):
            cmd.append("--pdeathsig")  # safe from any thread: _orphans.spawn forks from one long-lived thread
        with open(r.data_dir / "stderr.log", "ab") as err:
            r.proc = _orphans.spawn(
                cmd,
                cwd=str(r.data_dir),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                close_fds=True,
            )
        r.paused = False
        if self._own_dir and self._base_dir is not None:
            _orphans.write_marker(self._base_dir, [x.proc.pid for x in self._replicas if x.proc is not None])

    @staticmethod
    def cleanup_orphans(root: str | os.PathLike[str] | None = None) -> list[Path]:
        """After an owner process was SIGKILLed: kill its leftover replicas and remove its
        temporary directory (see :func:`clickhouse_lb.testing._orphans.cleanup_orphans`; also
        ``python -m clickhouse_lb.testing.cleanup``). Returns the directories removed."""
        return _orphans.cleanup_orphans(root)

    def _wait_all(self, replicas: list[_Replica]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending = list(replicas)
        while pending:
            for r in list(pending):
                assert r.proc is not None
                if r.proc.poll() is not None:
                    raise ClusterError(
                        f"replica {r.name} exited with code {r.proc.returncode} during startup:\n{self._tail(r)}"
                    )
                port_file = r.data_dir / "replica.port"
                if r.port == 0 and port_file.exists():
                    r.port = int(port_file.read_text())
                if self.tls and r.https_port == 0 and port_file.exists():  # written before the port file
                    r.https_port = int((r.data_dir / "replica.https-port").read_text())
                if r.port and (r.https_port or not self.tls) and self.ping(r.index, timeout=1.0):
                    pending.remove(r)
            if pending:
                if time.monotonic() > deadline:
                    names = ", ".join(r.name for r in pending)
                    raise ClusterError(f"replicas {names} not ready after {self.startup_timeout:.0f}s")
                time.sleep(0.05)

    @staticmethod
    def _tail(r: _Replica) -> str:
        text = ""
        for name in ("stderr.log", "replica.log"):
            with contextlib.suppress(OSError):
                text += (r.data_dir / name).read_text(errors="replace")[-3000:]
        return text

    @staticmethod
    def _kill_proc(r: _Replica) -> None:
        proc, r.proc = r.proc, None
        r.paused = False
        r.blackholed = False
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)  # works on stopped processes too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def _faults(self, i: int, change: dict[str, object] | None) -> dict[str, object]:
        return self._control(i, _FAULTS_PATH, "fault", change)

    def _control(self, i: int, path: str, what: str, change: dict[str, object] | None) -> dict[str, object]:
        """Replica ``i``'s state behind one of its control endpoints (``what``: for the error),
        after applying ``change`` (None: read only)."""
        r = self._replica(i)
        if change is None:
            status, body = self._http(i, "GET", path, None, 5.0)
        else:
            status, body = self._http(
                i, "POST", path, json.dumps(change).encode(), 5.0, headers={"Content-Type": "application/json"}
            )
        if status != 200:
            raise ClusterError(f"{what} endpoint of {r.name}: HTTP {status} {body!r}")
        state = json.loads(body)
        assert isinstance(state, dict)
        return state


def _advertised(hosts: list[str] | None, replicas: int) -> list[tuple[str, int | None]] | None:
    """``advertised_hosts`` as ``(host, port or None)`` pairs."""
    if hosts is None:
        return None
    if len(hosts) != replicas:
        raise ValueError(f"advertised_hosts must have one entry per replica ({replicas}), not {len(hosts)}")
    pairs: list[tuple[str, int | None]] = []
    for text in hosts:
        host, sep, port = str(text).rpartition(":") if ":" in str(text) else (str(text), "", "")
        if not host or (sep and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(f"advertised_hosts: expected 'host' or 'host:port', not {text!r}")
        pairs.append((host, int(port) if sep else None))
    return pairs


def _free_common_port(hosts: list[str], attempts: int = 50) -> int:
    """A TCP port free on every one of ``hosts`` right now (the kernel picks it on the first)."""
    for _ in range(attempts):
        probes: list[socket.socket] = []
        try:
            first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probes.append(first)
            first.bind((hosts[0], 0))
            port = int(first.getsockname()[1])
            for host in hosts[1:]:
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                probes.append(probe)
                probe.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise ClusterError(f"no TCP port free on all of {', '.join(hosts)} after {attempts} attempts")


@atexit.register
def _close_all() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.close()


def _checked_weights(weights: list[int], shards: int) -> list[int]:
    if len(weights) != shards:
        raise ValueError(f"shard_weights must have one weight per shard ({shards}), not {len(weights)}")
    for n, weight in enumerate(weights, start=1):
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise ValueError(f"shard_weights: the weight of shard {n} must be an integer >= 0, not {weight!r}")
    return list(weights)

"""``DockerCluster``: the repository's docker-compose.yml (real clickhouse-server replicas + Keeper).

Three ``clickhouse/clickhouse-server`` replicas of one shard (macros ``replica`` = r1..r3,
``shard`` = 01, ReplicatedMergeTree through ClickHouse Keeper), services ``ch-1``..``ch-3``
(the docs' host names, inside the compose network), HTTP ports published on
``127.0.0.1:8123``, ``8124``, ``8125`` (:attr:`DockerCluster.host_map` maps the names
``system.clusters`` lists to them, for ``cluster_host_map``). Fault injection goes through ``docker compose``:
``kill`` (SIGKILL), ``pause``/``unpause`` (cgroup freezer: the kernel still accepts connections),
``start`` after a kill; :meth:`DockerCluster.stop_replication` / ``start_replication`` send
``SYSTEM STOP|START FETCHES`` and ``SYSTEM STOP|START REPLICATION QUEUES`` to the replica.
:meth:`DockerCluster.set_delay`, :meth:`DockerCluster.fail_next`,
:meth:`DockerCluster.delay_replication` and :meth:`DockerCluster.blackhole` are not available
on real servers and raise :class:`NotImplementedError` (tests needing them should use
:class:`~clickhouse_lb.testing.LocalCluster`).

Replication is ClickHouse Keeper's here (the local cluster emulates it with a shared log):
``ON CLUSTER lb_cluster`` DDL and ReplicatedMergeTree work; :meth:`on_all` still runs a
statement on each replica.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from clickhouse_lb.testing._base import ClusterBase, ClusterError

_DEFAULT_COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
_SERVICES = ("ch-1", "ch-2", "ch-3")
_PORTS = (8123, 8124, 8125)


class DockerCluster(ClusterBase):
    """The docker compose cluster, with the same interface as :class:`LocalCluster`.

    :param compose_file: the compose file (default: the repository's docker-compose.yml).
    :param project: the compose project name (containers, network and volumes are prefixed with it).
    :param keep: leave the cluster running on :meth:`close` (default: ``down -v``).
    :param startup_timeout: seconds to wait for the healthchecks and ``/ping``.
    """

    def __init__(
        self,
        *,
        compose_file: str | Path | None = None,
        project: str = "clickhouse-lb-test",
        keep: bool = False,
        startup_timeout: float = 180.0,
        password: str = "",
    ) -> None:
        self.compose_file = Path(compose_file) if compose_file is not None else _DEFAULT_COMPOSE
        self.project = project
        self.keep = keep
        self.startup_timeout = startup_timeout
        self.password = password
        self._killed: set[int] = set()
        self._paused: set[int] = set()
        self._replication_stopped: set[int] = set()
        self._started = False

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why a DockerCluster cannot run here (None when it can)."""
        if shutil.which("docker") is None:
            return "the docker command is not installed"
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`docker info` failed: {exc}"
        if info.returncode != 0:
            return "no Docker engine answers (`docker info` failed)"
        try:
            compose = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`docker compose version` failed: {exc}"
        if compose.returncode != 0:
            return "the docker compose plugin is missing"
        return None

    @classmethod
    def available(cls) -> bool:
        """Whether a Docker engine (and the compose plugin) answers."""
        return cls.unavailable_reason() is None

    @property
    def hosts(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in _PORTS]

    @property
    def host_map(self) -> dict[str, str]:
        """``cluster_host_map`` for discovery from the host: the names ``system.clusters``
        lists (``ch-1:9000``, HTTP ``ch-1:8123`` by the port rule) -> the published ports."""
        return {f"{service}:8123": f"127.0.0.1:{port}" for service, port in zip(_SERVICES, _PORTS)}

    @property
    def names(self) -> list[str]:
        return ["r1", "r2", "r3"]

    def _compose(self, *args: str, timeout: float = 300.0) -> str:
        cmd = ["docker", "compose", "-f", str(self.compose_file), "-p", self.project, *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{' '.join(cmd)} timed out") from exc
        if done.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> DockerCluster:
        if self._started:
            return self
        reason = self.unavailable_reason()
        if reason:
            raise ClusterError(f"DockerCluster unavailable: {reason}")
        if not self.compose_file.exists():
            raise ClusterError(f"compose file {self.compose_file} not found")
        self._compose(
            "up", "-d", "--wait", "--wait-timeout", str(int(self.startup_timeout)), timeout=self.startup_timeout + 60
        )
        self._started = True
        for i in range(len(_SERVICES)):
            self.wait_ready(i, self.startup_timeout)
        return self

    def close(self) -> None:
        if not self._started:
            return
        self._started = False
        if not self.keep:
            self._compose("down", "-v", "--remove-orphans")

    def kill(self, i: int) -> None:
        self._compose("kill", "-s", "SIGKILL", _SERVICES[i])
        self._killed.add(i)
        self._paused.discard(i)

    def restart(self, i: int) -> None:
        if i in self._paused:
            self.resume(i)
        if i in self._killed:
            self._compose("start", _SERVICES[i])
        else:
            self._compose("restart", _SERVICES[i])
        self._killed.discard(i)
        self.wait_ready(i, self.startup_timeout)

    def pause(self, i: int) -> None:
        self._compose("pause", _SERVICES[i])
        self._paused.add(i)

    def resume(self, i: int) -> None:
        self._compose("unpause", _SERVICES[i])
        self._paused.discard(i)

    def set_delay(self, i: int, seconds: float) -> None:
        raise NotImplementedError(
            "DockerCluster cannot inject a per-request delay into a real clickhouse-server; "
            "use LocalCluster (CLICKHOUSE_LB_CLUSTER=local) for delay tests"
        )

    def fail_next(self, i: int, n: int = 1, code: int = 210) -> None:
        raise NotImplementedError(
            "DockerCluster cannot make a real clickhouse-server fail its next queries; "
            "use LocalCluster (CLICKHOUSE_LB_CLUSTER=local) for injected-error tests"
        )

    def delay_replication(self, i: int, seconds: float) -> None:
        raise NotImplementedError(
            "A real clickhouse-server has no timed replication delay; use stop_replication/start_replication "
            "(SYSTEM STOP/START FETCHES) here, or LocalCluster (CLICKHOUSE_LB_CLUSTER=local) for lag tests"
        )

    def stop_replication(self, i: int) -> None:
        self.query(i, "SYSTEM STOP FETCHES")
        self.query(i, "SYSTEM STOP REPLICATION QUEUES")
        self._replication_stopped.add(i)

    def start_replication(self, i: int) -> None:
        self.query(i, "SYSTEM START FETCHES")
        self.query(i, "SYSTEM START REPLICATION QUEUES")
        self._replication_stopped.discard(i)

    def blackhole(self, i: int) -> None:
        raise NotImplementedError(
            "DockerCluster cannot black-hole a replica: its HTTP port is published by Docker's proxy on "
            "127.0.0.1, which completes TCP handshakes itself even when the container is disconnected; "
            "use LocalCluster (CLICKHOUSE_LB_CLUSTER=local) for connect-timeout tests"
        )

    def unblackhole(self, i: int) -> None:
        self.blackhole(i)

    def is_alive(self, i: int) -> bool:
        return self._started and i not in self._killed

    def _reachable(self, i: int) -> bool:
        return self.is_alive(i) and i not in self._paused

    def heal(self) -> None:
        for i in sorted(self._paused):
            self.resume(i)
        for i in sorted(self._killed):
            self.restart(i)
        for i in sorted(self._replication_stopped):
            self.start_replication(i)

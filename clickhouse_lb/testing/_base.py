"""The interface shared by :class:`LocalCluster` and :class:`DockerCluster`."""

from __future__ import annotations

import abc
import base64
import http.client
import time
import urllib.parse
from types import TracebackType
from typing import Any, TypeVar

_C = TypeVar("_C", bound="ClusterBase")


class ClusterError(RuntimeError):
    """A cluster could not be started, or a statement failed on a replica."""


class ClusterBase(abc.ABC):
    """A set of ClickHouse replicas (one shard) with fault injection, usable as a context manager.

    Replicas are addressed by index (``0 .. len(cluster) - 1``) in the order of :attr:`hosts`.
    """

    password: str = ""
    #: The cluster's name in ``system.clusters`` and for ``ON CLUSTER`` statements.
    cluster_name: str = "lb_cluster"

    @property
    @abc.abstractmethod
    def hosts(self) -> list[str]:
        """``"host:port"`` of every replica's HTTP interface, in replica order."""

    @property
    @abc.abstractmethod
    def names(self) -> list[str]:
        """Replica names: what ``getMacro('replica')`` and ``displayName()`` answer on each."""

    @abc.abstractmethod
    def start(self: _C) -> _C:
        """Start every replica and wait until each answers ``/ping``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every replica (idempotent)."""

    @abc.abstractmethod
    def kill(self, i: int) -> None:
        """SIGKILL replica ``i``: its port then refuses connections."""

    @abc.abstractmethod
    def restart(self, i: int) -> None:
        """Start replica ``i`` again (same address, same data) and wait for ``/ping``."""

    @abc.abstractmethod
    def pause(self, i: int) -> None:
        """SIGSTOP replica ``i``: connections are accepted by the kernel but never answered."""

    @abc.abstractmethod
    def resume(self, i: int) -> None:
        """SIGCONT a paused replica."""

    @abc.abstractmethod
    def set_delay(self, i: int, seconds: float) -> None:
        """Delay every query request on replica ``i`` by ``seconds`` (0 clears)."""

    @abc.abstractmethod
    def fail_next(self, i: int, n: int = 1, code: int = 210) -> None:
        """Make the next ``n`` query requests on replica ``i`` fail with ClickHouse error ``code``."""

    @abc.abstractmethod
    def is_alive(self, i: int) -> bool:
        """Whether replica ``i``'s server process exists (a paused replica is alive)."""

    @abc.abstractmethod
    def heal(self) -> None:
        """Restart killed replicas, resume paused ones, clear delays and injected failures."""

    # -- replication and network faults (where the cluster can do them) -------------------------
    def delay_replication(self, i: int, seconds: float) -> None:
        """Replica ``i`` applies the replication log ``seconds`` late (replication lag; 0 clears)."""
        raise NotImplementedError(f"{type(self).__name__} cannot delay replication")

    def stop_replication(self, i: int) -> None:
        """Replica ``i`` stops applying replicated writes until :meth:`start_replication`."""
        raise NotImplementedError(f"{type(self).__name__} cannot stop replication")

    def start_replication(self, i: int) -> None:
        """Replica ``i`` applies replicated writes again (and catches up)."""
        raise NotImplementedError(f"{type(self).__name__} cannot start replication")

    def blackhole(self, i: int) -> None:
        """Connections to replica ``i`` are never answered (``connect()`` hangs)."""
        raise NotImplementedError(f"{type(self).__name__} cannot black-hole a replica")

    def unblackhole(self, i: int) -> None:
        """Undo :meth:`blackhole`."""
        raise NotImplementedError(f"{type(self).__name__} cannot black-hole a replica")

    # -- shared helpers ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self: _C) -> _C:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def address(self, i: int) -> tuple[str, int]:
        """``(host, port)`` of replica ``i``."""
        host, _, port = self.hosts[i].rpartition(":")
        return host, int(port)

    def client(self, i: int, **kwargs: Any) -> Any:
        """A plain ``clickhouse_connect`` client connected to replica ``i`` (keyword args passed on)."""
        import clickhouse_connect

        host, port = self.address(i)
        kwargs.setdefault("username", "default")
        kwargs.setdefault("password", self.password)
        return clickhouse_connect.get_client(host=host, port=port, **kwargs)

    def query(self, i: int, sql: str, timeout: float = 30.0) -> str:
        """Run one statement on replica ``i`` over HTTP (no session) and return the body as text."""
        status, body = self._http(
            i, "POST", "/?" + urllib.parse.urlencode({"default_format": "TabSeparated"}), sql.encode(), timeout
        )
        if status != 200:
            raise ClusterError(f"replica {self.names[i]} ({self.hosts[i]}): {body.decode(errors='replace').strip()}")
        return body.decode()

    def on_all(self, sql: str) -> list[str]:
        """Run a statement on every reachable replica (live, not paused); return the bodies.

        For tables every replica needs, prefer ``CREATE TABLE ... ON CLUSTER`` with a
        ReplicatedMergeTree engine: both clusters replicate those. ``on_all`` is for per-replica
        state (plain MergeTree copies that differ on purpose, settings, ...).
        """
        return [self.query(i, sql) for i in range(len(self)) if self._reachable(i)]

    def _reachable(self, i: int) -> bool:
        return self.is_alive(i)

    def ping(self, i: int, timeout: float = 1.0) -> bool:
        """Whether replica ``i`` answers ``GET /ping`` with ``Ok.`` within ``timeout``."""
        try:
            status, body = self._http(i, "GET", "/ping", None, timeout)
        except OSError:
            return False
        return status == 200 and body.startswith(b"Ok.")

    def wait_ready(self, i: int, timeout: float = 60.0) -> None:
        """Poll ``/ping`` on replica ``i`` until it answers or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not self.ping(i):
            if time.monotonic() > deadline:
                raise ClusterError(f"replica {self.names[i]} ({self.hosts[i]}) not ready after {timeout:.0f}s")
            time.sleep(0.05)

    def _http(
        self,
        i: int,
        method: str,
        path: str,
        body: bytes | None,
        timeout: float,
        *,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        host, port = self.address(i)
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            all_headers = dict(headers or {})
            if self.password:
                token = base64.b64encode(f"default:{self.password}".encode()).decode()
                all_headers.setdefault("Authorization", f"Basic {token}")
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

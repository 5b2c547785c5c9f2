"""Stand-ins for clickhouse-connect clients, for unit tests of the pool's own logic.

The pool's behaviour against real servers is tested in integration/ against the real engine;
here a fake replica only has to succeed or fail the way clickhouse-connect does.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError
from urllib3.exceptions import NewConnectionError, ProtocolError, ReadTimeoutError

from clickhouse_lb.config.pool_config import PoolConfig, resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.pools.pool import ReplicaPool

from .conftest import FakeClock


def refused() -> OperationalError:
    """What clickhouse-connect raises when the replica refuses the connection."""
    try:
        raise NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]
    except NewConnectionError as cause:
        err = OperationalError("Error executing HTTP request")
        err.__cause__ = cause
        return err


def reset_after_send() -> OperationalError:
    """The connection dropped after the request went out."""
    try:
        raise ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
    except ProtocolError as cause:
        err = OperationalError("Error executing HTTP request")
        err.__cause__ = cause
        return err


def read_timeout() -> OperationalError:
    try:
        raise ReadTimeoutError(None, "/", "Read timed out. (read timeout=1)")  # type: ignore[arg-type]
    except ReadTimeoutError as cause:
        err = OperationalError("Error executing HTTP request")
        err.__cause__ = cause
        return err


def server_error(code: int, name: str) -> DatabaseError:
    """A server error as clickhouse-connect raises it (``.code`` is set from 1.x on; older
    versions carry the code in the message only, which is what classification falls back to)."""
    error = DatabaseError(
        f"Received ClickHouse exception, code: {code}, server response: Code: {code}. DB::Exception: boom ({name})"
    )
    error.code = code
    return error


class FakeReplica:
    """One fake server: a script of outcomes ('ok' or an exception factory), the last repeating."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.outcomes: list[str | Callable[[], BaseException]] = ["ok"]
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.created = 0
        self.fail_creation: Callable[[], BaseException] | None = None
        self.creation_gate: threading.Event | None = None  # creation waits for it, then fails
        self.answer_gate: threading.Event | None = None  # statements wait for it before answering
        self.lock = threading.Lock()

    def next_outcome(self) -> str | Callable[[], BaseException]:
        with self.lock:
            return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


class FakeClient:
    def __init__(self, replica: FakeReplica, options: dict[str, Any]) -> None:
        self.replica = replica
        self.options = options
        self.closed = False

    def _run(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self.replica.lock:
            self.replica.calls.append((method, args, kwargs))
        gate = self.replica.answer_gate
        if gate is not None and method != "ping":
            gate.wait(timeout=30)
        outcome = self.replica.next_outcome()
        if outcome != "ok":
            raise outcome()  # type: ignore[operator]
        return f"{method}@{self.replica.host}"

    def get_client_setting(self, name: str) -> Any:
        return self.options.get(name)

    def ping(self, timeout: float | None = None) -> bool:
        return self._run("ping", (), {}) is not None

    def close(self) -> None:
        self.closed = True

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._run(method, args, kwargs)


class FakeCluster:
    """A client factory over named fake replicas (``host`` -> FakeReplica)."""

    def __init__(self, *hosts: str) -> None:
        self.replicas = {h: FakeReplica(h) for h in hosts}
        self.clients: list[FakeClient] = []

    def __getitem__(self, host: str) -> FakeReplica:
        return self.replicas[host]

    def factory(self, **options: Any) -> FakeClient:
        replica = self.replicas[options["host"]]
        replica.created += 1
        if replica.creation_gate is not None:
            replica.creation_gate.wait(timeout=30)
        if replica.fail_creation is not None:
            raise replica.fail_creation()
        client = FakeClient(replica, options)
        self.clients.append(client)
        return client

    def served(self) -> list[str]:
        """Which replica served each call, in order (all replicas' calls merged by arrival)."""
        return [h for h, r in self.replicas.items() for _ in r.calls]


def pool_parts(
    hosts: Iterable[str],
    options: dict[str, Any],
    valid_client_options: frozenset[str],
    *,
    clock: FakeClock | None = None,
    seed: int = 7,
) -> tuple[PoolConfig, Balancer]:
    """A pool's configuration and a balancer on a test clock and seeded random, for fake replicas
    ``host:8123``. ``options`` mixes balancing settings, ``listeners`` and client options."""
    # Fake replicas answer no /ping: liveness checks are off unless a test turns them on (a
    # statement delayed past 200 ms by a loaded machine must not fail over here).
    options.setdefault("liveness_check_after_ms", 0)
    balancing = {k: options.pop(k) for k in list(options) if k in BALANCING_SETTING_NAMES}
    # Fake replicas answer no /ping: background probes stay off unless a test turns them on.
    options.setdefault("health_check_interval_ms", 0)
    listeners = options.pop("listeners", ())
    config = resolve_pool_config(
        [f"{h}:8123" for h in hosts],
        dsn=None,
        balancing=balancing,
        client_options=options,
        valid_client_options=valid_client_options,
    )
    balancer = Balancer(
        config.replicas, config.settings, clock=clock or FakeClock(), random=random.Random(seed).random,
        listeners=listeners,
    )
    return config, balancer


def make_pool(
    cluster: FakeCluster, *, clock: FakeClock | None = None, seed: int = 7, **options: Any
) -> ReplicaPool:
    config, balancer = pool_parts(cluster.replicas, options, sync_client_option_names(), clock=clock, seed=seed)
    return ReplicaPool(config, client_factory=cluster.factory, balancer=balancer)


def reply(handler: Any, body: bytes) -> None:
    """A stub HTTP server's answer: 200 with ``body`` (``handler``: a BaseHTTPRequestHandler)."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)

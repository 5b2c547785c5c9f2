"""ReplicaPool: one Client-like object over N replicas, balanced per statement.

For every statement the pool asks the :class:`~clickhouse_lb.balancer.Balancer` in which
order ClickHouse would try the replicas right now, runs the call on the first through a
clickhouse-connect client of that replica, and fails over (see :mod:`clickhouse_lb.failover`).

Each replica's clickhouse-connect client is created on first use (creating one talks to the
server), so a pool over partly-down replicas constructs fine and a replica that is down at
first use is just a failed attempt. Pooled clients carry no session id, so one client serves
many threads; state that must stay on one server goes through :meth:`ReplicaPool.session`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ProgrammingError

from ._calls import prepare_call, settings_positions
from ._client_api import SYNC_METHODS, SyncClientAPI
from ._driver_logs import handled_by_pool
from ._pool_base import PoolBase
from .balancer import Balancer
from .classify import classify
from .config import PoolConfig, connect_timeout_argument, resolve_pool_config, sync_client_option_names
from .errors import ReplicaConnectError, SessionLostError
from .events import logger
from .failover import StatementAttempts, run_sync
from .settings import LoadBalancing, Replica, StatementOverrides

__all__ = ["PinnedSession", "ReplicaPool", "get_pool"]

ClientFactory = Callable[..., Client]

_SETTINGS_POSITION = settings_positions(Client, SYNC_METHODS)


def client_options_for(config: PoolConfig) -> dict[str, Any]:
    """Options given to every replica's client: the user's, plus the pool's defaults."""
    options = dict(config.client_options)
    # Failover is the pool's job: the client's own retries would only delay it on one replica.
    options.setdefault("query_retries", 0)
    timeout = config.connect_timeout_seconds
    if timeout is not None:
        options["connect_timeout"] = connect_timeout_argument(timeout)
    return options


def set_connect_timeout(client: Any, seconds: float | None) -> None:
    """Give a sync client a sub-second connect timeout (its constructor takes whole seconds).
    Uses clickhouse-connect's transport object when it has one; otherwise keeps the rounded value."""
    backend = getattr(client, "_backend", None)
    current = getattr(backend, "timeout", None)
    if seconds is None or current is None:
        return
    try:
        from urllib3 import Timeout

        backend.timeout = Timeout(connect=seconds, read=current.read_timeout)  # type: ignore[union-attr]
    except Exception:  # pragma: no cover - an older or newer transport layout
        logger.debug("could not set a %.3fs connect timeout; keeping the client's", seconds)


class _ReplicaClient:
    """A replica's shared client, created on first use, and the outcome of the last creation."""

    __slots__ = ("client", "creations", "failure", "lock")

    def __init__(self) -> None:
        self.client: Client | None = None
        self.failure: ReplicaConnectError | None = None
        self.creations = 0
        self.lock = threading.Lock()


def connect_failure(address: str, exc: Exception) -> ReplicaConnectError | None:
    """A client creation that failed on a replica failure, as the error attempts share."""
    failure = classify(exc)
    if not failure.replica:
        return None
    error = ReplicaConnectError(address, failure.reason)
    error.__cause__ = exc
    return error


class ReplicaPool(SyncClientAPI, PoolBase):
    """A Client-like pool over ClickHouse replicas with ClickHouse's load balancing and failover.

    Create it with :func:`get_pool`. Statements (``query``, ``command``, ``insert``, ``query_df``,
    ``query_arrow``, ``raw_query``, the streaming variants ...) take clickhouse-connect's
    arguments and return its types. Thread-safe.
    """

    def __init__(
        self,
        config: PoolConfig,
        *,
        listeners: Iterable[object] = (),
        client_factory: ClientFactory | None = None,
        balancer: Balancer | None = None,
    ) -> None:
        super().__init__(config, listeners=listeners, balancer=balancer)
        self._factory: ClientFactory = client_factory or clickhouse_connect.get_client
        self._options = client_options_for(config)
        self._clients = [_ReplicaClient() for _ in config.replicas]

    # -- clients ---------------------------------------------------------------------------

    def _new_client(self, index: int, **extra: Any) -> Client:
        replica = self.config.replicas[index]
        client = self._factory(host=replica.host, port=replica.port, **{**self._options, **extra})
        set_connect_timeout(client, self.config.connect_timeout_seconds)
        return client

    def _client(self, index: int) -> Client:
        slot = self._clients[index]
        client = slot.client
        if client is not None:
            return client
        seen = slot.creations
        with slot.lock:
            if self._closed:
                raise ProgrammingError("This ReplicaPool is closed")
            if slot.client is not None:
                return slot.client
            if slot.creations != seen and slot.failure is not None:
                # Another thread's attempt failed while this one waited: share its outcome
                # rather than wait out the same timeout again.
                raise slot.failure
            try:
                slot.client = self._new_client(index, autogenerate_session_id=False)
                slot.failure = None
            except Exception as exc:
                slot.failure = connect_failure(self._balancer.addresses[index], exc)
                if slot.failure is None:
                    raise
                raise slot.failure from exc
            finally:
                slot.creations += 1
            return slot.client

    def client(self, address: str | Replica) -> Client:
        """The shared clickhouse-connect client of one replica (no balancing, no failover)."""
        return self._client(self._balancer.index_of(address))

    # -- statements ------------------------------------------------------------------------

    def _attempts(self, method: str, overrides: StatementOverrides, retry_after_send: bool) -> StatementAttempts:
        return StatementAttempts(
            self._balancer,
            self._balancer.plan_indices(overrides),
            operation=method,
            retry_after_send=retry_after_send,
        )

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._closed:
            raise ProgrammingError("This ReplicaPool is closed")
        call = prepare_call(
            method, args, kwargs, _SETTINGS_POSITION.get(method),
            auto_token=self._balancer.settings.auto_insert_deduplication_token,
        )
        attempts = self._attempts(method, call.overrides, call.retry_after_send)
        call_args, call_kwargs = call.args, call.kwargs

        def attempt(index: int) -> Any:
            return getattr(self._client(index), method)(*call_args, **call_kwargs)

        return run_sync(attempts, attempt)

    def ping(self, timeout: float | None = None) -> bool:
        """True when some replica answers ``/ping`` (tried in plan order); each replica that
        does not answer gets an error counted, as a failed attempt would."""
        for index in self._balancer.plan_indices():
            try:
                answered = self._client(index).ping(timeout) if timeout else self._client(index).ping()
            except Exception as exc:
                if self._balancer.replica_failure(index, exc) is None:
                    raise
                continue
            if self._balancer.ping_answered(index, answered):
                return True
        return False

    # -- sessions --------------------------------------------------------------------------

    def pin(self, *, session: bool = True) -> PinnedSession:
        """A client pinned to one replica chosen by the strategy (trying the next ones, in plan
        order, while a replica cannot be reached). ``session``: give it a ClickHouse session id
        (temporary tables, SET). Close it when done; :meth:`session` does that for you."""
        if self._closed:
            raise ProgrammingError("This ReplicaPool is closed")
        extra: dict[str, Any] = {"session_id": str(uuid.uuid4())} if session else {"autogenerate_session_id": False}
        attempts = StatementAttempts(
            self._balancer, self._balancer.plan_indices(), operation="session", retry_after_send=True
        )

        def connect(index: int) -> tuple[int, Client]:
            return index, self._new_client(index, **extra)

        index, client = run_sync(attempts, connect)
        return PinnedSession(self, index, client)

    @contextmanager
    def session(self) -> Iterator[PinnedSession]:
        """``with pool.session() as client:`` runs every statement of the block on one replica,
        in one ClickHouse session (temporary tables, SET, USE). If that replica fails inside
        the block, :class:`~clickhouse_lb.errors.SessionLostError` is raised: the session is
        never moved silently to another replica without its state."""
        pinned = self.pin(session=True)
        try:
            yield pinned
        finally:
            pinned.close()

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Close every replica client. Statements after this raise ProgrammingError."""
        self._closed = True
        for slot in self._clients:
            with slot.lock:
                client, slot.client = slot.client, None
            if client is not None:
                try:
                    client.close()
                except Exception:  # pragma: no cover - closing must not fail the caller
                    logger.debug("closing a replica client failed", exc_info=True)

    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ReplicaPool {self._balancer.settings.load_balancing.value} over "
            f"{', '.join(self._balancer.addresses)}{' (closed)' if self._closed else ''}>"
        )


class PinnedSession(SyncClientAPI):
    """A client pinned to one replica of a pool (``pool.session()``).

    Statements run on that replica only. A replica failure counts an error against it (as in
    the pool) and raises :class:`~clickhouse_lb.errors.SessionLostError`; query failures pass
    through unchanged.
    """

    def __init__(self, pool: ReplicaPool, index: int, client: Client) -> None:
        self._pool = pool
        self._index = index
        self.client = client
        self.address = pool.balancer.addresses[index]
        self.session_id: str | None = client.get_client_setting("session_id") if hasattr(
            client, "get_client_setting") else None

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = prepare_call(method, args, kwargs, _SETTINGS_POSITION.get(method), auto_token=False)
        try:
            with handled_by_pool():  # a failure here is reported as SessionLostError
                return getattr(self.client, method)(*call.args, **call.kwargs)
        except Exception as exc:
            failure = self._pool.balancer.replica_failure(self._index, exc)
            if failure is None:
                raise
            raise SessionLostError(self.address, failure.reason) from exc

    def ping(self, timeout: float | None = None) -> bool:
        return bool(self.client.ping(timeout) if timeout else self.client.ping())

    def close(self) -> None:
        self.client.close()

    def __getattr__(self, name: str) -> Any:
        # Everything that is not a statement (server_tz, create_query_context, ...) is the
        # pinned client's own: there is only one replica to ask.
        if name.startswith("__") or name == "client":
            raise AttributeError(name)
        return getattr(self.client, name)

    def __enter__(self) -> PinnedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PinnedSession on {self.address}>"


def get_pool(
    hosts: str | Replica | Iterable[str | Replica] | None = None,
    *,
    dsn: str | None = None,
    load_balancing: str | LoadBalancing | None = None,
    local_hostname: str | None = None,
    load_balancing_first_offset: int | None = None,
    distributed_replica_error_half_life: float | None = None,
    distributed_replica_error_cap: int | None = None,
    distributed_replica_max_ignored_errors: int | None = None,
    connections_with_failover_max_tries: int | None = None,
    connect_timeout_with_failover_ms: int | None = None,
    failover_backoff_ms: int | None = None,
    failover_timeout: float | None = None,
    auto_insert_deduplication_token: bool | None = None,
    listeners: Iterable[object] = (),
    **client_options: Any,
) -> ReplicaPool:
    """A :class:`ReplicaPool` over ``hosts`` (``["ch-1:8123", ...]``, ``"ch-1:8123,ch-2:8123"``,
    :class:`~clickhouse_lb.Replica` objects) or a ``dsn``
    (``clickhouse://user:pw@ch-1:8123,ch-2:8123/db?load_balancing=in_order``).

    Balancing settings keep ClickHouse's names and defaults: ``load_balancing="random"``,
    ``load_balancing_first_offset=0``, ``distributed_replica_error_half_life=60`` (seconds),
    ``distributed_replica_error_cap=1000``, ``distributed_replica_max_ignored_errors=0``,
    ``connections_with_failover_max_tries=3``, ``connect_timeout_with_failover_ms=1000``;
    ``local_hostname`` defaults to this machine's canonical name. Ours: ``failover_backoff_ms=0``
    (pause before each new pass), ``failover_timeout=None`` (total seconds per statement),
    ``auto_insert_deduplication_token=True``. A value left as ``None`` comes from the DSN, or
    is the default.

    Every other keyword (``username``, ``password``, ``database``, ``secure``, ``compress``,
    ``send_receive_timeout``, ``settings``, ...) goes to each replica's
    ``clickhouse_connect.get_client``. Bad names and values raise
    :class:`~clickhouse_lb.errors.ConfigurationError` here, before any I/O.
    """
    config = resolve_pool_config(
        hosts,
        dsn=dsn,
        balancing={
            "load_balancing": load_balancing,
            "local_hostname": local_hostname,
            "load_balancing_first_offset": load_balancing_first_offset,
            "distributed_replica_error_half_life": distributed_replica_error_half_life,
            "distributed_replica_error_cap": distributed_replica_error_cap,
            "distributed_replica_max_ignored_errors": distributed_replica_max_ignored_errors,
            "connections_with_failover_max_tries": connections_with_failover_max_tries,
            "connect_timeout_with_failover_ms": connect_timeout_with_failover_ms,
            "failover_backoff_ms": failover_backoff_ms,
            "failover_timeout": failover_timeout,
            "auto_insert_deduplication_token": auto_insert_deduplication_token,
        },
        client_options=client_options,
        valid_client_options=sync_client_option_names(),
    )
    return ReplicaPool(config, listeners=listeners)

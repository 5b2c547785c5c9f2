"""A replica's client as a pool holds it: the slot it is created in once (and the failure a
creation shares with the callers that waited for it), the options every client gets, the
options of a pinned client. No I/O and no client class here (each pool brings its own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from clickhouse_lb.config.pool_config import PoolConfig
from clickhouse_lb.config.timeouts import client_timeout_arguments
from clickhouse_lb.core.classify import classify
from clickhouse_lb.errors import ReplicaConnectError
from clickhouse_lb.pools._session_mode import SESSION_OPTIONS

__all__ = ["ClientSlot", "client_options_for", "connect_failure", "kill_query_sql", "pin_options"]

C = TypeVar("C")


def kill_query_sql(query_id: str) -> str:
    """``KILL QUERY`` for one query id (best effort; ASYNC: the pool does not wait for it)."""
    quoted = query_id.replace("\\", "\\\\").replace("'", "\\'")
    return f"KILL QUERY WHERE query_id = '{quoted}' ASYNC"


def client_options_for(config: PoolConfig, *, whole_seconds: bool) -> dict[str, Any]:
    """Options given to every replica's client: the user's, plus the pool's defaults and
    timeouts. ``whole_seconds``: the client takes its timeouts in whole seconds (the sync one,
    at construction; the pool sets the exact values on its transport afterwards, see
    :func:`clickhouse_lb.pools._transport.set_client_timeouts`); the async one takes floats."""
    # The session options are decided per client (clickhouse_lb.pools._session_mode).
    options = {k: v for k, v in config.client_options.items() if k not in SESSION_OPTIONS}
    # Failover is the pool's job: the client's own retries would only delay it on one replica.
    options.setdefault("query_retries", 0)
    timeouts = config.attempts.timeouts
    if whole_seconds:
        options.update(client_timeout_arguments(timeouts))
    else:
        options.update(connect_timeout=timeouts.connect, send_receive_timeout=timeouts.socket)
    return options


def connect_failure(address: str, exc: Exception) -> ReplicaConnectError | None:
    """A client creation that failed on a replica failure, as the error attempts share."""
    failure = classify(exc)
    if not failure.replica:
        return None
    error = ReplicaConnectError(address, failure.reason, failure.kind)
    error.__cause__ = exc
    return error


def pin_options(session: bool) -> dict[str, Any]:
    """The client options of a pinned client: its own ClickHouse session, or none."""
    return {"session_id": str(uuid.uuid4())} if session else {"autogenerate_session_id": False}


class ClientSlot(Generic[C]):
    """A replica's shared client, created on first use, and the outcome of the last creation.
    The lock (a thread's or a task's) is the driver's; the bookkeeping is here."""

    __slots__ = ("client", "creations", "failure", "retired")

    def __init__(self) -> None:
        self.client: C | None = None
        self.failure: ReplicaConnectError | None = None
        self.creations = 0
        #: The replica left the discovered set: no new client is created here.
        self.retired = False

    def raise_if_retired(self, address: str) -> None:
        """A statement that started before discovery removed the replica, and fails over to it
        after its client was closed: a connect failure, so it moves on to the next replica."""
        if self.retired:
            raise ReplicaConnectError(address, "removed from the cluster by discovery")

    def raise_shared_failure(self, seen: int) -> None:
        """Another caller's creation failed while this one waited for the lock: share its
        outcome rather than wait out the same timeout again."""
        if self.creations != seen and self.failure is not None:
            raise self.failure

    @contextmanager
    def creating(self, address: str) -> Iterator[None]:
        """Around one creation: a replica failure becomes the ReplicaConnectError the waiters
        share; the count moves when it ends, so that they know it did."""
        self.failure = None
        try:
            yield
        except Exception as exc:
            self.failure = connect_failure(address, exc)
            if self.failure is None:
                raise
            raise self.failure from exc
        finally:
            self.creations += 1

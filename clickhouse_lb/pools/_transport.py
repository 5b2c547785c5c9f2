"""The sync pool's hold on clickhouse-connect's urllib3 layer: exact (sub-second) timeouts, and
connections an attempt can be abandoned on.

clickhouse-connect's constructor takes whole seconds; every supported version (0.13 to 1.x)
keeps the urllib3 ``Timeout`` it sends each request with in ``client.timeout`` (an attribute
in 0.x, a property with a setter in 1.x), so the pool sets the exact value there
(:func:`set_client_timeouts`), checking that it is what it expects.

To abandon an attempt (a hung replica, a hedged read that lost, a deadline), the pool must be
able to close the connection the attempt's worker thread is blocked on. It gives the clients a
urllib3 ``PoolManager`` of its own, built by clickhouse-connect's ``get_pool_manager`` (the same
socket options), whose connections register themselves with the attempt running on the
current thread (:class:`AttemptConnections`); abandoning shuts their sockets down, which wakes
the blocked thread at once with a connection error. The pool does this only where it can build
the same manager clickhouse-connect would (no user ``pool_mgr``, no proxy, no custom TLS
options); elsewhere an abandoned attempt's thread finishes at its own socket timeout instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager, Timeout
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from clickhouse_lb.config.timeouts import Timeouts
from clickhouse_lb.core._driver_logs import attach_filter
from clickhouse_lb.core.events import logger

__all__ = [
    "AttemptConnections", "current_attempt", "get_ident", "quiet_transport", "release_pool_manager", "running",
    "set_client_timeouts", "tracking_pool_manager",
]

_local = threading.local()

#: The attempt running on each thread (by ``threading.get_ident()``): where its connections
#: register, and (for an attempt under the watchdog) the watchdog's one registration of it,
#: which it reads as a snapshot. One store when an attempt starts, one delete when it ends.
running: dict[int, AttemptConnections] = {}
get_ident = threading.get_ident


class AttemptConnections:
    """The connections one attempt used on its thread; :meth:`abandon` closes them.

    ``connect_timeout``: the attempt's exact connect timeout (clickhouse-connect gives urllib3
    whole seconds, rounded up, at least while the client is being created), cut to the
    statement's deadline. Once a connect of the attempt timed out, urllib3's own retry of it
    fails at once: failing over is the pool's job, not a second wait on the same replica."""

    # No ``__slots__``: the flags most attempts never set stay the class's (one per statement).
    abandoned = False
    connect_timed_out = False
    #: A request of the attempt went out whole (the watchdog: a read whose request has yet to be
    #: sent after a stall of this process waits on this process, not on its replica).
    request_sent = False
    connect_timeout: float | None = None
    #: Who watches the attempt while it runs (the sync pool's watchdog; None: nobody).
    watcher: object | None = None

    def __init__(self, connect_timeout: float | None = None) -> None:
        self.connections: list[HTTPConnection] = []
        if connect_timeout is not None:
            self.connect_timeout = connect_timeout

    # No lock: an append, a flag and a copy of the list are each atomic, and their order makes
    # every connection shut down by one side or the other: add() appends, then reads the flag;
    # abandon() sets the flag, then copies the list. A connection added after the copy sees the
    # flag; one added before it is in the copy (shutting a socket down twice is harmless).

    def add(self, connection: HTTPConnection) -> None:
        connections = self.connections
        if not connections or connections[-1] is not connection:  # connect() inside request(): one entry
            connections.append(connection)
        if self.abandoned:
            _shutdown(connection)

    def abandon(self) -> None:
        """Shut down every socket of the attempt (the worker's blocked read or write fails at once)."""
        self.abandoned = True
        for connection in list(self.connections):
            _shutdown(connection)

    def __enter__(self) -> AttemptConnections:
        running[get_ident()] = self
        return self

    def __exit__(self, *exc: object) -> None:
        running.pop(get_ident(), None)
        if self.abandoned:
            self.close_abandoned()

    def close_abandoned(self) -> None:
        """Its thread is done with them: close them whole (socket, and the response the
        connection still holds) now rather than leave them to the garbage collector."""
        for connection in self.connections:
            with contextlib.suppress(Exception):
                connection.close()


def current_attempt() -> AttemptConnections | None:
    return running.get(get_ident())


class _QuietWhenAbandoned(logging.Filter):
    """clickhouse-connect logs a warning (with a traceback in some versions) for the request
    the pool broke off on purpose, and for its best-effort KILL QUERY; the pool reports those
    itself (at debug level)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_local, "quiet", False):
            return False
        attempt = current_attempt()
        return attempt is None or not attempt.abandoned


@contextlib.contextmanager
def quiet_transport() -> Iterator[None]:
    """Around a best-effort request (KILL QUERY): its failure is not worth a warning."""
    _local.quiet = True
    try:
        yield
    finally:
        _local.quiet = False


#: Where the sync transport of clickhouse-connect 0.x and 1.x logs a failed request.
#: (``httputil``: the response reader's "unexpected failure to read next chunk", with a traceback.)
_CLICKHOUSE_CONNECT_LOGGERS = ("clickhouse_connect.driver.httpclient", "clickhouse_connect.driver._backend.http_sync",
                               "clickhouse_connect.driver.httputil")
attach_filter(_QuietWhenAbandoned(), _CLICKHOUSE_CONNECT_LOGGERS)


def _shutdown(connection: HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed, or never connected
        sock.shutdown(socket.SHUT_RDWR)


class _Tracked(HTTPConnection):
    """Registers with the current thread's attempt when a request starts or waits. A base of
    both tracked connection classes: in ``_TrackedHTTPSConnection(_Tracked, HTTPSConnection)``
    its ``super()`` is ``HTTPSConnection``."""

    def _register(self) -> AttemptConnections | None:
        attempt = running.get(get_ident())  # current_attempt(), inlined: once per request
        if attempt is not None:
            connections = attempt.connections  # attempt.add(self), inlined
            if not connections or connections[-1] is not self:
                connections.append(self)
            if attempt.abandoned:
                _shutdown(self)
                raise ConnectionAbortedError("attempt abandoned by clickhouse-lb")
        return attempt

    def connect(self) -> None:
        attempt = current_attempt()
        if attempt is not None:
            if attempt.connect_timed_out:
                raise ConnectTimeoutError(self, "connect already timed out in this attempt (clickhouse-lb)")
            limit = attempt.connect_timeout
            current = getattr(self, "timeout", None)
            if limit is not None and (not isinstance(current, (int, float)) or current > limit):
                setattr(self, "timeout", limit)  # noqa: B010 - the connect timeout urllib3 connects with
        try:
            super().connect()
        except ConnectTimeoutError as exc:
            # (urllib3 2 makes a refused connection, NewConnectionError, a ConnectTimeoutError too)
            if attempt is not None and not isinstance(exc, NewConnectionError):
                attempt.connect_timed_out = True
            raise
        self._register()

    def request(self, *args: Any, **kwargs: Any) -> Any:
        attempt = self._register()
        sent = super().request(*args, **kwargs)
        if attempt is not None:
            attempt.request_sent = True
        return sent

    # No getresponse() of its own: it follows request() on the same connection, registered
    # there; an attempt abandoned in between has that connection shut down already.


class _TrackedHTTPConnection(_Tracked):
    pass


class _TrackedHTTPSConnection(_Tracked, HTTPSConnection):
    pass


class _TrackedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _TrackedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


#: Options under which clickhouse-connect builds a pool manager of its own (or uses the user's).
_OWN_MANAGER_OPTIONS = ("pool_mgr", "http_proxy", "https_proxy", "ca_cert", "client_cert", "client_cert_key",
                        "server_host_name", "tls_mode", "dedicated_pool")


def tracking_pool_manager(
    client_options: Mapping[str, Any], *, owner: object | None = None, maxsize: int = 16
) -> PoolManager | None:
    """A pool manager whose connections can be abandoned, or None where clickhouse-connect would
    not use its plain shared kind of manager (the pool then leaves the transport alone). It is
    ``owner``'s: closed when ``owner`` closes it or is garbage-collected (no owner: the caller's to close)."""
    if any(client_options.get(name) not in (None, False) for name in _OWN_MANAGER_OPTIONS):
        return None
    if client_options.get("verify") in (False, "false", "False", "0", 0, "proxy"):
        return None
    if any(os.environ.get(name) for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")):
        return None
    try:
        from clickhouse_connect.driver import httputil

        manager: PoolManager = httputil.get_pool_manager(maxsize=maxsize)
    except Exception:  # pragma: no cover - a clickhouse-connect without that helper
        logger.debug("could not build a pool manager; abandoned attempts finish at their socket timeout",
                     exc_info=True)
        return None
    manager.pool_classes_by_scheme = {"http": _TrackedHTTPConnectionPool, "https": _TrackedHTTPSConnectionPool}
    if owner is not None:
        weakref.finalize(owner, release_pool_manager, manager)
    return manager


def release_pool_manager(manager: PoolManager) -> None:
    """Close ``manager``'s connections and take it out of clickhouse-connect's registry of
    managers. The registry (its connections' age, ``max_connection_age``, and its clear at exit)
    kept a manager, with its idle sockets, for the life of the process: one per pool closed or
    dropped, one per SQLAlchemy engine of an engine-per-query application."""
    manager.clear()
    from clickhouse_connect.driver import httputil

    registry = getattr(httputil, "all_managers", None)
    if isinstance(registry, dict):
        registry.pop(manager, None)


def set_client_timeouts(client: Any, timeouts: Timeouts) -> bool:
    """Give a sync clickhouse-connect client exact connect and socket timeouts (its constructor
    took them rounded up to whole seconds). False, with the client left as it was, when the
    client does not keep a urllib3 ``Timeout`` where every supported version keeps it."""
    current = getattr(client, "timeout", None)
    if not isinstance(current, Timeout):
        logger.debug("client %r keeps no urllib3 Timeout; leaving its whole-second timeouts", type(client))
        return False
    connect = current.connect_timeout if timeouts.connect is None else timeouts.connect
    read = current.read_timeout if timeouts.socket is None else timeouts.socket
    client.timeout = Timeout(connect=connect, read=read)
    return True

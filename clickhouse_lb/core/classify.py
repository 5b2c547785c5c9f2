"""Which failures are the replica's and which are the query's: the one place that decides.

A **replica failure** means "this replica cannot serve now": it counts an error against the
replica and the statement moves on to the next one. A **query failure** would repeat on every
replica (syntax, unknown table, type errors, ``throwIf``, permissions, quotas): it is raised
at once, unchanged, and counts nothing.

For writes the second question is whether the request may have reached the server (``sent``):
a failure before sending is always safe to retry elsewhere; after it, only an insert with a
stable ``insert_deduplication_token`` is (see :mod:`clickhouse_lb.core.failover`).

Replica failures:

==================================================  =====  ==========================================
failure                                             sent   examples
==================================================  =====  ==========================================
connection refused, DNS failure, connect timeout    no     urllib3 NewConnectionError, aiohttp
                                                           ClientConnectorError, ConnectionTimeoutError
any replica failure while creating its client       no     ReplicaConnectError (the statement was
                                                           not sent: the client talks at creation)
attempt abandoned by the pool (hung, timed out)     yes    AttemptAbandonedError
socket timeout before a response, reset, cut short  yes    ReadTimeoutError, ProtocolError,
                                                           IncompleteRead, ServerDisconnectedError
HTTP 429/502/503/504 from something in between      yes    a proxy or load balancer answering
server errors listed in REPLICA_ERROR_CODES         yes    NETWORK_ERROR 210, KEEPER_EXCEPTION 999
==================================================  =====  ==========================================

Each failure also has a ``kind`` (for metrics, and for the health probes: a successful ``/ping``
disproves ``connect`` and ``disconnect`` failures, never a server's answer or a timeout):
``connect`` (never sent), ``disconnect`` (cut off after sending), ``timeout`` (no answer in time),
``http_status`` (a proxy answered 429/502/503/504), ``server_error`` (a replica error code),
``hung`` (an attempt abandoned because the replica did not answer a liveness ``/ping``), and
``query`` (a query failure).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from clickhouse_lb._redact import brief
from clickhouse_lb.errors import AttemptAbandonedError, ReplicaConnectError

__all__ = ["PING_DISPROVABLE_KINDS", "REACHABILITY_KINDS", "REPLICA_ERROR_CODES", "Failure", "classify", "error_code"]

#: Server error codes that mean "this replica cannot serve now" (src/Common/ErrorCodes.cpp).
REPLICA_ERROR_CODES: dict[int, str] = {
    202: "TOO_MANY_SIMULTANEOUS_QUERIES",
    203: "NO_FREE_CONNECTION",
    209: "SOCKET_TIMEOUT",
    210: "NETWORK_ERROR",
    # The replica is still running a query with this id: typically an earlier try of this very
    # statement that the client gave up on (a hung replica resumed, a driver's own resend of a
    # request whose connection was cut). Another replica can take the statement; a write that
    # was sent before stays "may have been applied".
    216: "QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING",
    225: "NO_ZOOKEEPER",
    242: "TABLE_IS_READ_ONLY",
    279: "ALL_CONNECTION_TRIES_FAILED",
    319: "UNKNOWN_STATUS_OF_INSERT",
    999: "KEEPER_EXCEPTION",
}

#: HTTP statuses that a proxy or load balancer in front of a replica answers when it is down.
REPLICA_HTTP_STATUSES = frozenset({429, 502, 503, 504})

# Transport exceptions by class name (urllib3, http.client, aiohttp, builtins): matching names
# keeps aiohttp an optional import while still recognising its errors.
_NOT_SENT = frozenset(
    {
        "NewConnectionError",
        "NameResolutionError",
        "ConnectTimeoutError",
        "ConnectionRefusedError",
        "gaierror",
        "ClientConnectorError",
        "ClientConnectorDNSError",
        "ConnectionTimeoutError",
    }
)
_SENT = frozenset(
    {
        "ReadTimeoutError",
        "ProtocolError",
        "IncompleteRead",
        "InvalidChunkLength",
        "RemoteDisconnected",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "SocketTimeoutError",
        "ServerTimeoutError",
        "ClientOSError",
        "TimeoutError",
        "StreamFailureError",
        "ProxyError",
        "SSLError",
    }
)

# Sent, then no answer in time: the replica may be alive and slow (a ping does not disprove it).
_TIMEOUTS = frozenset({"ReadTimeoutError", "SocketTimeoutError", "ServerTimeoutError", "TimeoutError"})

#: Failure kinds that say only "the replica could not be reached": an answered ``/ping`` disproves them.
REACHABILITY_KINDS = frozenset({"connect", "disconnect", "http_status"})

#: Error kinds a run of successful health probes may clear: the above, failed probes and pings
#: (a replica found hung by a liveness check failed a ping too).
PING_DISPROVABLE_KINDS = REACHABILITY_KINDS | {"probe", "ping", "hung"}

_CODE_RE = re.compile(r"(?:\bCode:\s*|exception, code:\s*)(\d+)")
_HTTP_STATUS_RE = re.compile(r"HTTP status (\d{3})")


@dataclass(frozen=True)
class Failure:
    """What one failed attempt means for failover."""

    replica: bool
    sent: bool
    code: int | None
    reason: str
    #: connect, disconnect, timeout, http_status, server_error or query (see the module doc).
    kind: str = "query"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and contexts, and urllib3's ``MaxRetryError.reason``."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen or len(seen) > 16:
            continue
        seen.add(id(current))
        yield current
        for nested in (getattr(current, "reason", None), current.__cause__, current.__context__):
            if isinstance(nested, BaseException):
                stack.append(nested)


def error_code(exc: BaseException) -> int | None:
    """The ClickHouse error code carried by a clickhouse-connect exception, if any."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    match = _CODE_RE.search(str(exc))
    return int(match.group(1)) if match else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _describe(exc: BaseException) -> str:
    """One line for logs and status: the error, plus its root transport cause when the error
    itself is as vague as clickhouse-connect's "Error executing HTTP request"; at most a few
    hundred characters, without the request's query string (see :func:`brief`)."""
    described = _one_line(exc)
    root = None
    retried = False
    for cause in _causes(exc):
        if cause is exc:
            continue
        if type(cause).__name__ == "MaxRetryError":
            retried = True
        else:
            root = cause
    if root is not None:
        if retried or str(root) in described:
            # clickhouse-connect wraps urllib3's MaxRetryError ("... Max retries exceeded with
            # url: /?<every setting> (Caused by <root>) executing HTTP request attempt 1 ..."):
            # the root cause is all of it that says what failed.
            described = f"{type(exc).__name__}: {_one_line(root)}"
        else:
            described = f"{described} ({_one_line(root)})"
    return brief(described)


def classify(exc: BaseException) -> Failure:
    """Replica failure or query failure, and whether the request may have been sent."""
    if isinstance(exc, ReplicaConnectError):
        return Failure(replica=True, sent=False, code=None, reason=exc.reason, kind=exc.kind)
    if isinstance(exc, AttemptAbandonedError):
        # The pool closed the connection of a sent request: the replica did not answer /ping
        # ("hung"), or the attempt ran out of time (receive timeout, statement deadline).
        kind = "hung" if exc.kind == "hung" else "timeout"
        return Failure(replica=True, sent=True, code=None, reason=exc.reason, kind=kind)
    reason = _describe(exc)
    code = error_code(exc)
    if code is not None:
        # The server answered with an error, so the request reached it, whatever transport
        # trouble the client had handled before (an implicit __context__ is not the cause).
        replica = code in REPLICA_ERROR_CODES
        kind = "server_error" if replica else "query"
        return Failure(replica=replica, sent=True, code=code, reason=reason, kind=kind)
    names: set[str] = set()
    for cause in _causes(exc):
        names.update(cls.__name__ for cls in type(cause).__mro__)
    if names & _NOT_SENT:
        return Failure(replica=True, sent=False, code=None, reason=reason, kind="connect")
    status = _HTTP_STATUS_RE.search(str(exc))
    if status and int(status.group(1)) in REPLICA_HTTP_STATUSES:
        return Failure(replica=True, sent=True, code=None, reason=reason, kind="http_status")
    if names & _SENT:
        kind = "timeout" if names & _TIMEOUTS else "disconnect"
        return Failure(replica=True, sent=True, code=None, reason=reason, kind=kind)
    # clickhouse-connect reports any other transport failure as OperationalError("Error
    # executing HTTP request") caused by a urllib3 HTTPError: the replica, not the query.
    if "OperationalError" in names and "HTTPError" in names:
        return Failure(replica=True, sent=True, code=None, reason=reason, kind="disconnect")
    return Failure(replica=False, sent=True, code=None, reason=reason)

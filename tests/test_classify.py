"""The failure classification table: replica failure or query failure, sent or not."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError, ProgrammingError

from clickhouse_lb.core._statements import is_read_only
from clickhouse_lb.core.classify import REPLICA_ERROR_CODES, classify, error_code

from .fakes import read_timeout, refused, reset_after_send, server_error


def _wrapped(cause: BaseException) -> OperationalError:
    error = OperationalError("Error executing HTTP request")
    error.__cause__ = cause
    return error


def _aiohttp(name: str, *bases: type[BaseException]) -> BaseException:
    """An exception whose class is named like aiohttp's (classification goes by class name)."""
    return type(name, bases or (Exception,), {})("boom")


CASES: list[tuple[str, Callable[[], BaseException], bool, bool]] = [
    # (what, error, replica failure?, may have been sent?)
    ("connection refused", refused, True, False),
    ("DNS failure", lambda: _wrapped(socket.gaierror(-2, "Name or service not known")), True, False),
    ("read timeout", read_timeout, True, True),
    ("reset after send", reset_after_send, True, True),
    ("aiohttp connect", lambda: _aiohttp("ClientConnectorError", OSError), True, False),
    ("aiohttp disconnect", lambda: _aiohttp("ServerDisconnectedError"), True, True),
    ("asyncio timeout", TimeoutError, True, True),
    ("proxy 503", lambda: OperationalError("HTTP driver received HTTP status 503, server response: down"), True, True),
    ("proxy 502", lambda: DatabaseError("HTTP driver received HTTP status 502"), True, True),
    ("NETWORK_ERROR", lambda: server_error(210, "NETWORK_ERROR"), True, True),
    ("UNKNOWN_STATUS_OF_INSERT", lambda: server_error(319, "UNKNOWN_STATUS_OF_INSERT"), True, True),
    ("TABLE_IS_READ_ONLY", lambda: server_error(242, "TABLE_IS_READ_ONLY"), True, True),
    ("QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING", lambda: server_error(216, "QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING"),
     True, True),
    ("UNKNOWN_TABLE", lambda: server_error(60, "UNKNOWN_TABLE"), False, True),
    ("SYNTAX_ERROR", lambda: server_error(62, "SYNTAX_ERROR"), False, True),
    ("throwIf", lambda: server_error(395, "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO"), False, True),
    ("ACCESS_DENIED", lambda: server_error(497, "ACCESS_DENIED"), False, True),
    ("QUOTA_EXCEEDED", lambda: server_error(201, "QUOTA_EXCEEDED"), False, True),
    ("auth failed", lambda: server_error(516, "AUTHENTICATION_FAILED"), False, True),
    ("code only in text", lambda: DatabaseError("Code: 210. DB::Exception: x (NETWORK_ERROR)"), True, True),
    ("client misuse", lambda: ProgrammingError("Attempt to execute concurrent queries within the same session"),
     False, True),
    ("type error", lambda: TypeError("bad data"), False, True),
]


@pytest.mark.parametrize(("what", "make", "replica", "sent"), CASES, ids=[c[0] for c in CASES])
def test_classification_table(what: str, make: Callable[[], BaseException], replica: bool, sent: bool) -> None:
    failure = classify(make())
    assert (failure.replica, failure.sent) == (replica, sent), what


def test_reason_names_the_root_cause() -> None:
    assert "Connection refused" in classify(refused()).reason


def test_codes_list_is_documented_with_names() -> None:
    assert REPLICA_ERROR_CODES[210] == "NETWORK_ERROR"
    assert error_code(server_error(999, "KEEPER_EXCEPTION")) == 999
    assert error_code(ValueError("nothing")) is None


@pytest.mark.parametrize(
    ("sql", "read"),
    [
        ("SELECT 1", True),
        ("  select 1", True),
        ("WITH 1 AS x SELECT x", True),
        ("-- comment\nSELECT 1", True),
        ("/* a */ (SELECT 1) UNION ALL (SELECT 2)", True),
        ("SHOW TABLES", True),
        ("DESCRIBE TABLE t", True),
        ("EXPLAIN SELECT 1", True),
        ("EXISTS TABLE t", True),
        (b"SELECT 1", True),
        ("INSERT INTO t VALUES (1)", False),
        ("/* tag */ INSERT INTO t VALUES (1)", False),
        ("WITH 1 AS x INSERT INTO t SELECT x", False),
        ("ALTER TABLE t DELETE WHERE 1", False),
        ("DROP TABLE t", False),
        ("CREATE TABLE t (x UInt8) ENGINE = Memory", False),
        ("SELECTED", False),
        ("", False),
        (None, False),
    ],
)
def test_read_only_statements(sql: str | bytes | None, read: bool) -> None:
    assert is_read_only(sql) is read


def test_a_server_error_is_sent_even_with_an_earlier_transport_error_in_its_context() -> None:
    """An error the server answered with reached the server, even when the client had handled
    a refused connection (a stale keep-alive, a first try) just before raising it."""
    try:
        try:
            raise refused()
        except OperationalError:
            raise server_error(210, "NETWORK_ERROR")  # noqa: B904 - the implicit context is the point
    except DatabaseError as error:
        failure = classify(error)
    assert (failure.replica, failure.sent, failure.code) == (True, True, 210)


KINDS: dict[str, str] = {
    "connection refused": "connect",
    "DNS failure": "connect",
    "read timeout": "timeout",
    "reset after send": "disconnect",
    "aiohttp connect": "connect",
    "aiohttp disconnect": "disconnect",
    "asyncio timeout": "timeout",
    "proxy 503": "http_status",
    "NETWORK_ERROR": "server_error",
    "TABLE_IS_READ_ONLY": "server_error",
    "UNKNOWN_TABLE": "query",
    "type error": "query",
}


@pytest.mark.parametrize("what", sorted(KINDS))
def test_failure_kind_says_whether_a_ping_could_disprove_it(what: str) -> None:
    make = next(c[1] for c in CASES if c[0] == what)
    assert classify(make()).kind == KINDS[what]


def test_a_client_creation_failure_keeps_the_kind_of_its_cause() -> None:
    # clickhouse-connect runs a query while it creates a client: a server error there is
    # still a server error (a ping would not disprove it), not a refused connection.
    from clickhouse_lb.pools._base import connect_failure

    answered = connect_failure("a:8123", server_error(210, "NETWORK_ERROR"))
    unreachable = connect_failure("a:8123", refused())
    assert answered is not None
    assert unreachable is not None
    assert (classify(answered).kind, classify(answered).sent) == ("server_error", False)
    assert classify(unreachable).kind == "connect"

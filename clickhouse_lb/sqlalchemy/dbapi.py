"""The DB-API of ``clickhousedb+lb``: clickhouse-connect's connection, over a pinned replica.

clickhouse-connect's :class:`~clickhouse_connect.dbapi.connection.Connection` builds a client
from connection arguments; here the client already exists: it is a
:class:`~clickhouse_lb.PinnedSession`, one replica chosen by the pool's strategy. Every cursor
statement goes through that session, which counts a replica failure against the replica (in
the engine-wide balancing state) and raises :class:`~clickhouse_lb.errors.SessionLostError`;
the dialect reports that as a disconnect, so SQLAlchemy invalidates the connection and the
next checkout is pinned anew, away from the failed replica.

This module is also the dialect's DB-API module (PEP 249 globals): its exception classes are
clickhouse-connect's driver exceptions, the ones its client raises and clickhouse-lb's derive
from. SQLAlchemy wraps (as ``sqlalchemy.exc.OperationalError`` ...) and asks ``is_disconnect``
only about instances of the module's ``Error``; clickhouse-connect 1.x's own ``dbapi`` module
exports these classes, but 0.x's declares an unrelated ``Error`` that nothing raises, under which
a lost replica would never be seen as a disconnect. Connections come from the dialect's
``connect()``, so there is no module-level ``connect``.
"""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Any, cast

from clickhouse_connect.dbapi.connection import Connection
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,  # PEP 249 name: shadows the builtin in this module, as in clickhouse-connect
)

from clickhouse_lb.pools._client_api import STATEMENT_METHODS
from clickhouse_lb.pools.pool import PinnedSession

__all__ = [
    "Binary",
    "DataError",
    "DatabaseError",
    "Date",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "PinnedConnection",
    "ProgrammingError",
    "Time",
    "Timestamp",
    "Warning",
    "apilevel",
    "paramstyle",
    "threadsafety",
]

# PEP 249 globals, as clickhouse-connect declares them.
apilevel = "2.0"
threadsafety = 2
paramstyle = "pyformat"
# PEP 249 type constructors (SQLAlchemy's LargeBinary binds through ``Binary``).
Date = date
Time = time
Timestamp = datetime
Binary = bytes

_STATEMENTS = frozenset((*STATEMENT_METHODS, "ping"))


class _CursorClient:
    """What a DB-API cursor sees as its client. Statements (``query``, ``insert``, ``command``
    ...) go through the pinned session, for its failure accounting; everything else
    (``create_query_context``, ``server_tz``, settings look-ups ...) is the replica's own
    clickhouse-connect client, which does no I/O for them."""

    __slots__ = ("_pinned",)

    def __init__(self, pinned: PinnedSession) -> None:
        self._pinned = pinned

    def __getattr__(self, name: str) -> Any:
        if name in _STATEMENTS:
            return getattr(self._pinned, name)
        return getattr(self._pinned.client, name)

    def close(self) -> None:
        self._pinned.close()


class PinnedConnection(Connection):
    """A clickhouse-connect DB-API connection whose client is pinned to one replica.

    ``address`` is that replica (``host:port``); ``session_id`` its ClickHouse session (``None``
    with ``autogenerate_session_id=false``). Commit and rollback are no-ops, as in
    clickhouse-connect (ClickHouse has no client-side transactions).
    """

    def __init__(self, pinned: PinnedSession) -> None:
        # Connection.__init__ would create its own client from connection arguments: the pinned
        # session's client takes its place, with the same integration tag.
        self._pin(pinned)

    def repin(self, pinned: PinnedSession) -> None:
        """Move this connection to another pinned session (closing the one it had): Alembic's
        connection is moved to the migration replica (:mod:`clickhouse_lb.sqlalchemy._alembic`)."""
        old = self.pinned
        self._pin(pinned)
        old.close()

    def _pin(self, pinned: PinnedSession) -> None:
        """Everything this connection takes from its pinned session, set together (a session's
        replica and ClickHouse session never change: a new one comes with :meth:`repin`)."""
        self.pinned = pinned
        self.client = cast(Client, _CursorClient(pinned))
        self.client._add_integration_tag("sqlalchemy")
        self.timezone = pinned.client.server_tz
        self.address: str = pinned.address
        self.session_id: str | None = pinned.session_id

    def close(self) -> None:
        self.pinned.close()

    def __repr__(self) -> str:
        return f"<PinnedConnection on {self.pinned.address}>"

"""Every difference between the SQLAlchemy and clickhouse-connect versions the dialect runs on.

Two combinations are supported and tested: SQLAlchemy 2.x with clickhouse-connect 1.x, and
Apache Superset's pins, SQLAlchemy 1.4 with clickhouse-connect 0.13 to 0.15 (Superset 6.1
requires ``sqlalchemy<2`` and ``clickhouse-connect<1.0``; ``.ci/compat`` runs the tests there).
What differs between them is handled here, except two things that have to sit elsewhere
and serve every version alike: the dialect's DB-API module (:mod:`clickhouse_lb.sqlalchemy.dbapi`,
whose exception classes clickhouse-connect 0.x's own module lacks) and the dialect class's
``dbapi()``, the name under which SQLAlchemy 1.4 asks for that module.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote

from clickhouse_connect.cc_sqlalchemy.inspector import ChInspector
from clickhouse_connect.common import version as clickhouse_connect_version
from sqlalchemy import text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.schema import Table

__all__ = ["Inspector", "url_database"]

# SQLAlchemy 2.1 percent-decodes the database of a URL string (and encodes it when rendering
# one); 1.4 and 2.0 keep the path as it was written. Asked of the running SQLAlchemy itself
# rather than read from its version number.
_SQLALCHEMY_DECODES_DATABASE = make_url("clickhousedb://h/%25").database == "%"


def url_database(url: URL) -> str | None:
    """The URL's database, percent-decoded once on every SQLAlchemy version (``my%20db`` is
    ``my db``, ``my%2520db`` is ``my%20db``), like its user and password."""
    database = url.database
    if database is None or _SQLALCHEMY_DECODES_DATABASE:
        return database
    return unquote(database)


_CLICKHOUSE_CONNECT_0 = clickhouse_connect_version().split(".")[0] == "0"


class _ZeroXInspector(ChInspector):
    """clickhouse-connect 0.x's ``reflect_table`` looks the table's engine up in database
    ``'None'`` when the ``Table`` has no schema (``Table(name, metadata, autoload_with=engine)``
    raises ``NoResultFound: Table None.name does not exist``); 1.x takes the connection's current
    database. Here the current database stands in for the missing schema during reflection, so
    the reflected ``Table`` is the same as under 1.x (its own schema stays ``None``)."""

    def reflect_table(self, table: Table, *args: Any, **kwargs: Any) -> None:
        if table.schema is not None:
            super().reflect_table(table, *args, **kwargs)
            return
        # Table(autoload_with=...) reflects through an inspector bound to a connection.
        connection = cast(Connection, self.bind)
        table.schema = connection.execute(text("SELECT currentDatabase()")).scalar()
        try:
            super().reflect_table(table, *args, **kwargs)
        finally:
            table.schema = None


#: The dialect's reflection: clickhouse-connect's own, repaired for a Table without schema on 0.x.
Inspector: type[ChInspector] = _ZeroXInspector if _CLICKHOUSE_CONNECT_0 else ChInspector

"""The real ClickHouse engine (chdb) behind the local replica: connections, settings, errors.

One replica process opens ONE chdb data path (chdb allows one per process) and as many
connections on it as it needs: each connection has its own query context (``SET`` settings,
current database, TEMPORARY tables) while tables are shared, and queries on different
connections run in parallel. A connection serialises its own queries.

Per-query settings (the URL parameters of an HTTP request) are applied with ``SET`` and undone
lazily: an :class:`EngineConn` remembers which settings it currently carries on behalf of the
previous request (its *overlay*) and the value each had before, so a client that sends the same
settings on every request (clickhouse-connect does) pays for the ``SET`` only once per
connection, while the next request that does not send them gets the previous values back.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from chdb.state import sqlitelike

#: Error name by code, filled from the engine's system.errors at startup (a few fallbacks first).
ERROR_NAMES: dict[int, str] = {
    3: "UNEXPECTED_END_OF_FILE",
    36: "BAD_ARGUMENTS",
    48: "NOT_IMPLEMENTED",
    60: "UNKNOWN_TABLE",
    62: "SYNTAX_ERROR",
    115: "UNKNOWN_SETTING",
    164: "READONLY",
    202: "TOO_MANY_SIMULTANEOUS_QUERIES",
    209: "SOCKET_TIMEOUT",
    210: "NETWORK_ERROR",
    241: "MEMORY_LIMIT_EXCEEDED",
    242: "TABLE_IS_READ_ONLY",
    279: "ALL_CONNECTION_TRIES_FAILED",
    319: "UNKNOWN_STATUS_OF_INSERT",
    372: "SESSION_NOT_FOUND",
    373: "SESSION_IS_LOCKED",
    516: "AUTHENTICATION_FAILED",
    999: "KEEPER_EXCEPTION",
    1000: "POCO_EXCEPTION",
    1001: "STD_EXCEPTION",
    1002: "UNKNOWN_EXCEPTION",
}

# ClickHouse's exceptionCodeToHTTPStatus (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), by name.
_STATUS_BY_NAME: dict[str, int] = {
    **dict.fromkeys(
        ("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE", "ACCESS_DENIED"), 403
    ),
    **dict.fromkeys(
        (
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        ),
        400,
    ),
    **dict.fromkeys(
        (
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        ),
        404,
    ),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

_CODE_RE = re.compile(r"Code: (\d+)\. ")
_NAME_TAIL_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*$")


def error_name(code: int) -> str:
    """ClickHouse's symbolic name for an error code (``UNKNOWN_EXCEPTION`` style fallback)."""
    return ERROR_NAMES.get(code, f"UNKNOWN_ERROR_{code}")


def http_status(code: int) -> int:
    """The HTTP status ClickHouse answers with for an exception code."""
    return _STATUS_BY_NAME.get(error_name(code), 500)


class ClickHouseError(Exception):
    """A ClickHouse exception: ``code`` and the full ``Code: N. DB::Exception: ... (NAME)`` text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text

    @classmethod
    def make(cls, code: int, message: str) -> ClickHouseError:
        """Build an error the way the server formats it: ``Code: N. DB::Exception: msg. (NAME)``."""
        return cls(code, f"Code: {code}. DB::Exception: {message}. ({error_name(code)})")

    @classmethod
    def from_engine(cls, exc: BaseException) -> ClickHouseError:
        """Convert a chdb exception (its text carries the ClickHouse code) to a ClickHouseError."""
        text = str(exc).strip()
        match = _CODE_RE.search(text)
        if match is None:
            return cls.make(1001, f"{type(exc).__name__}: {text}")
        text = text[match.start() :]
        return cls(int(match.group(1)), text)

    @property
    def http_status(self) -> int:
        return http_status(self.code)


def sql_string(value: str) -> str:
    """Quote a Python string as a ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def sql_identifier(name: str) -> str:
    """Quote an identifier (database name) when needed."""
    if _IDENT_RE.match(name):
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class _Inserter(Protocol):
    """What this module uses of chdb's streaming insert (chdb's own methods are untyped)."""

    def append(self, data: bytes) -> None: ...
    def finish(self) -> Any: ...
    def cancel(self) -> None: ...


@dataclass
class Summary:
    """What the server reports of one statement in its ``X-ClickHouse-Summary`` header."""

    read_rows: int = 0
    read_bytes: int = 0
    written_rows: int = 0
    written_bytes: int = 0
    #: Seconds.
    elapsed: float = 0.0

    def header(self) -> str:
        """The header's value, as the server writes it: every number a string, the time in ns."""
        return json.dumps(
            {
                "read_rows": str(self.read_rows),
                "read_bytes": str(self.read_bytes),
                "written_rows": str(self.written_rows),
                "written_bytes": str(self.written_bytes),
                "elapsed_ns": str(int(self.elapsed * 1e9)),
            },
            separators=(",", ":"),
        )


@dataclass
class Result:
    """What one executed statement produced."""

    body: bytes
    summary: Summary = field(default_factory=Summary)
    #: Set instead of ``body`` when the output is streamed (see :class:`EngineStream`), which
    #: then counts the summary.
    stream: EngineStream | None = None


class EngineStream:
    """A running query whose output the engine hands over block by block (chdb ``send_query``).

    :meth:`fetch` returns the next piece of output, ``None`` once the result is complete, and
    raises :class:`ClickHouseError` when the query fails part way (rows may already be out).
    The connection serves nothing else until the stream is finished or cancelled with :meth:`cancel`.
    """

    def __init__(self, conn: EngineConn, handle: Any) -> None:
        self.conn = conn
        self._handle = handle
        self._started = time.perf_counter()
        self.done = False
        #: Rows and bytes read so far; the time once done.
        self.summary = Summary()

    def fetch(self) -> bytes | None:
        if self.done:
            return None
        try:
            res = self.conn._raw.streaming_fetch_result(self._handle)
        except Exception as exc:
            self._finish(failed=True)
            raise ClickHouseError.from_engine(exc) from None
        if res is None:
            self._finish(failed=False)
            return None
        if res.has_error():
            self._finish(failed=True)
            raise ClickHouseError.from_engine(RuntimeError(res.error_message()))
        rows = int(res.rows_read())
        data = res.bytes() or b""
        self.summary.read_rows += rows
        self.summary.read_bytes += int(res.bytes_read())
        if rows == 0:  # the end; the piece may still carry a format's suffix (JSON's closing part)
            self._finish(failed=False)
            return data or None
        return data

    def cancel(self) -> None:
        """Stop a stream that is not finished (the client went away); no-op once done."""
        if self.done:
            return
        with contextlib.suppress(Exception):
            self.conn._raw.streaming_cancel_query(self._handle)
        self._finish(failed=True)

    def _finish(self, failed: bool) -> None:
        self.done = True
        self.summary.elapsed = time.perf_counter() - self._started
        if failed:
            # A query that died part way may leave the context in a state nobody should inherit.
            self.conn.broken = True
            self.conn.discard_leftovers()


class EngineConn:
    """One chdb connection: a query context of its own on the shared data path."""

    def __init__(self, path: str) -> None:
        self._wrapper = sqlitelike.Connection(path)
        self._raw: Any = self._wrapper._conn
        self.database = "default"
        self._overlay: dict[str, str] = {}
        self._saved: dict[str, str | None] = {}
        self.closed = False
        #: Set when a query failed part way; the pool then drops the connection instead of reusing it.
        self.broken = False
        #: A SET statement of the client's ran on this connection (a session's): its settings
        #: are then not only what apply_settings put on it.
        self.set_by_client = False

    # -- execution -------------------------------------------------------------------------
    def execute(self, sql: str, fmt: str = "TabSeparated", params: dict[str, str] | None = None) -> Result:
        """Run one statement; raise :class:`ClickHouseError` on failure."""
        try:
            res = self._raw.query(sql, fmt, params=params or {})
        except Exception as exc:
            self.discard_leftovers()
            raise ClickHouseError.from_engine(exc) from None
        if res is None:
            return Result(b"")
        if res.has_error():
            self.discard_leftovers()
            raise ClickHouseError.from_engine(RuntimeError(res.error_message()))
        summary = Summary(
            int(res.rows_read()), int(res.bytes_read()), int(res.rows_written()), int(res.bytes_written()),
            float(res.elapsed()),
        )
        return Result(res.bytes() or b"", summary)

    def discard_leftovers(self) -> None:
        """After a failed query: run one throwaway query.

        chdb 26.9 keeps the output a failed query had produced and prepends it to the result of
        the connection's next query; the next request (another client's, for a pooled
        connection) would get those bytes. One small query takes them."""
        with contextlib.suppress(Exception):
            self._raw.query("SELECT 1", "TSV", params={})

    def stream(self, sql: str, fmt: str, params: dict[str, str] | None = None) -> EngineStream:
        """Start a SELECT whose output is fetched block by block (see :class:`EngineStream`)."""
        try:
            handle = self._raw.send_query(sql, fmt, params=params or {})
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from None
        return EngineStream(self, handle)

    def insert(self, statement: str, fmt: str, data: bytes) -> Result:
        """Stream ``data`` (encoded in input format ``fmt``) into ``statement`` (``INSERT INTO t (cols)``)."""
        try:
            inserter: _Inserter = self._wrapper.send_insert(statement, fmt)
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from None
        try:
            if data:
                inserter.append(data)
            res = inserter.finish()
        except Exception as exc:
            with contextlib.suppress(Exception):
                inserter.cancel()
            raise ClickHouseError.from_engine(exc) from None
        written = Summary(
            written_rows=int(res.rows_written), written_bytes=int(res.bytes_written), elapsed=float(res.elapsed)
        )
        return Result(b"", written)

    def scalar(self, sql: str) -> str:
        """Run a one-value query and return the value as text."""
        return self.execute(sql, "TabSeparatedRaw").body.decode().rstrip("\n")

    # -- per-request state -----------------------------------------------------------------
    def apply_settings(self, settings: dict[str, str]) -> None:
        """Make exactly ``settings`` (on top of this connection's own state) active.

        Settings of the previous request not present in ``settings`` get their prior values
        back. Unknown settings raise ClickHouse's UNKNOWN_SETTING from the engine itself.
        """
        new_names = [n for n in settings if n not in self._overlay]
        if new_names:
            self._remember(new_names)
        assignments: list[str] = []
        for name in [n for n in self._overlay if n not in settings]:
            prior = self._saved.pop(name, None)
            assignments.append(f"{name} = DEFAULT" if prior is None else f"{name} = {sql_string(prior)}")
            del self._overlay[name]
        for name, value in settings.items():
            if self._overlay.get(name) != value:
                assignments.append(f"{name} = {sql_string(value)}")
        if not assignments:
            return
        try:
            self.execute("SET " + ", ".join(assignments))
        except ClickHouseError:
            self._resync()
            raise
        self._overlay.update(settings)

    def _remember(self, names: list[str]) -> None:
        in_list = ", ".join(sql_string(n) for n in names)
        # JSON, not TSVRaw: a setting's value may hold tabs or newlines.
        rows = self.execute(
            f"SELECT name, value, changed FROM system.settings WHERE name IN ({in_list})", "JSONCompactEachRow"
        )
        found: set[str] = set()
        for line in rows.body.decode().splitlines():
            name, value, changed = json.loads(line)
            self._saved[name] = value if int(changed) else None
            found.add(name)
        for name in names:
            if name not in found:
                # Not a listed setting: an alias, or unknown. A lone SET lets the engine decide
                # (raising UNKNOWN_SETTING like the server does) before anything is changed.
                self.execute(f"SET {name} = DEFAULT")
                self._saved[name] = None

    def _resync(self) -> None:
        """After a failed SET, put every overlaid setting back one by one."""
        for name in list(self._overlay):
            prior = self._saved.pop(name, None)
            with contextlib.suppress(ClickHouseError):
                self.execute(f"SET {name} = DEFAULT" if prior is None else f"SET {name} = {sql_string(prior)}")
        self._overlay.clear()
        self._saved.clear()

    def use(self, database: str) -> None:
        """Switch the current database (no-op if already current)."""
        if database != self.database:
            self.execute(f"USE {sql_identifier(database)}")
            self.database = database

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self._wrapper.close()


class ConnPool:
    """Idle engine connections for sessionless requests (created on demand, kept up to ``idle``).

    ``readonly``: every connection of this pool runs with that ``readonly`` level, set once when
    it is made (``readonly = 2``, what a GET request gets, still allows per-request settings;
    a connection cannot leave readonly mode, hence a pool of its own)."""

    def __init__(self, path: str, idle: int = 8, readonly: int = 0) -> None:
        self._path = path
        self._idle_max = idle
        self._readonly = readonly
        self._idle: list[EngineConn] = []
        self._lock = threading.Lock()

    def get(self) -> EngineConn:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        conn = EngineConn(self._path)
        if self._readonly:
            conn.execute(f"SET readonly = {self._readonly}")
        return conn

    def put(self, conn: EngineConn, discard: bool = False) -> None:
        if not discard and not conn.closed and not conn.broken:
            with self._lock:
                if len(self._idle) < self._idle_max:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

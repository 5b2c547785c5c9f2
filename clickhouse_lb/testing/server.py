"""A ClickHouse replica for tests: the real engine (chdb) behind ClickHouse's HTTP interface.

Run one with ``python -m clickhouse_lb.testing.replica --name r1 --data-dir D`` (see
:mod:`clickhouse_lb.testing.replica`) or, far more usually, through
:class:`clickhouse_lb.testing.LocalCluster`.

Faithful (what clickhouse-connect, curl users and this project's load balancer rely on):

* SQL, data types, formats, functions, errors: the real ClickHouse engine (chdb 26.9), so error
  codes and texts are the server's (``Code: 60. DB::Exception: ... (UNKNOWN_TABLE)``).
* ``POST`` and ``GET`` on ``/`` (GET is read-only: writes fail with READONLY, 164); the query in
  the ``query`` URL parameter and/or the body (both: the body is appended after a newline; for an
  ``INSERT ... FORMAT X`` the rest of the body is the data, in any input format); ``/ping``,
  ``/replicas_status`` and ``GET /`` without a query answer ``Ok.\\n``; multipart/form-data bodies
  with ``query`` and ``param_*`` fields, and files as external data tables (``<name>_format``,
  ``<name>_structure`` or ``<name>_types`` as fields or URL parameters; the table lives for that
  query). Query text and parameter values are binary-safe (bytes that are not UTF-8 reach the
  engine unchanged).
* URL parameters: ``database``, ``query_id`` (echoed, generated when absent; a query id already
  running is refused with 216), ``default_format`` (default TabSeparated), ``session_id``,
  ``session_timeout`` (default 60 s; expired sessions are closed), ``session_check`` (372
  SESSION_NOT_FOUND), ``close_session``, ``param_*`` query parameters, ``wait_end_of_query``,
  ``client_protocol_version`` (Native blocks carry their block info and DateTime columns their
  zone, as a server sends them to such a client), ``user``/``password``, HTTP basic auth,
  ``X-ClickHouse-User``/``X-ClickHouse-Key`` (user ``default`` and the configured ``users``, each
  with a password and a ``readonly`` level a request can only make stricter; wrong credentials:
  516 AUTHENTICATION_FAILED, HTTP 403). Every other parameter is a setting for that one query
  (unknown: UNKNOWN_SETTING 115); it is not persisted into the session.
* Sessions: one engine connection per ``session_id``, so ``SET``, ``USE`` and TEMPORARY tables
  persist; concurrent use of one session is refused with 373 SESSION_IS_LOCKED. Sessionless
  requests use a pool of connections and run in parallel; nothing they change leaks to the next.
* Results stream: a SELECT whose output format writes blocks that simply concatenate (Native,
  RowBinary, TSV, CSV, JSONEachRow, ...) is read from the engine block by block and, unless
  ``wait_end_of_query=1``, sent chunked as blocks come once there are more than two. A failure
  before that is an ordinary error response; a failure after it cannot change the status any
  more, so the exception is written into the body between ``__exception__`` markers and the
  response's ``X-ClickHouse-Exception-Tag``, as ClickHouse 25.11+ does.
* Response headers: ``X-ClickHouse-Server-Display-Name``, ``-Query-Id``, ``-Format``,
  ``-Timezone``, ``-Summary`` (read/written rows and bytes, elapsed_ns), ``-Exception-Tag``,
  ``Content-Type`` by format; errors carry ``X-ClickHouse-Exception-Code``, the HTTP status
  ClickHouse maps the code to, and the body ``Code: N. DB::Exception: ... (NAME) (version V)``.
* HTTPS on a second port when a TLS context is given (``LocalCluster(tls=True)``).
* ``system.query_log`` (the engine's; its ``query_id`` is the engine's own id, not the HTTP one).
* Compression: responses per ``Accept-Encoding`` when ``enable_http_compression=1`` (gzip, deflate,
  zstd, lz4 frame, br if ``brotli`` is importable); request bodies per ``Content-Encoding``.

Not faithful / not implemented:

* ``compress=1`` / ``decompress=1`` (ClickHouse's native block compression with checksums) are
  refused with NOT_IMPLEMENTED (48, HTTP 501); use HTTP compression instead.
* No ``X-ClickHouse-Progress`` headers (``send_progress_in_http_headers`` is accepted and
  ignored); a streamed response's ``X-ClickHouse-Summary`` is the one at its start.
* ``X-ClickHouse-Summary`` has no ``result_rows``/``result_bytes``/``total_rows_to_read``.
* Formats with a header, prefix or suffix (JSON, XML, Arrow, Parquet, ...WithNames) are produced
  whole: chdb writes each streamed block as a complete document of such a format.
* Readonly for a *session* request (GET or ``readonly`` parameter) is decided from the statement's
  first keyword instead of by the engine (sessionless requests use the engine's own check).
* Users are this front end's: the engine runs every query as its one user ``default`` (so
  ``currentUser()`` is ``default``); no quotas, roles, row policies or grants (chdb has no
  writable access storage), and users made with ``CREATE USER`` cannot log in.
* Replication is the local cluster's own (:mod:`clickhouse_lb.testing._replication`, described
  in docs/local-cluster.md): ``Replicated*MergeTree`` tables become ``*MergeTree`` tables that
  replicate through a log on disk shared by the replicas; ``ON CLUSTER``, ``system.clusters``,
  ``system.replicas`` and ``SYSTEM SYNC REPLICA`` are answered by it. A ``Replicated`` database
  engine is refused (NOT_IMPLEMENTED).

Fault injection (a path no ClickHouse server has): ``GET/POST /__clickhouse_lb__/faults`` with a
JSON object ``{"delay": seconds, "fail_next": n, "code": 210}``. The delay is applied before every
*query* request (not to ``/ping``, ``/replicas_status`` or the control endpoint); the next ``n`` query
requests then fail with ClickHouse error ``code`` (``Code: 210. DB::Exception: Injected failure by
clickhouse_lb.testing. (NETWORK_ERROR)``, the HTTP status ClickHouse uses for that code).
``GET /__clickhouse_lb__/info`` answers ``{"name", "pid", "sessions"}``.
``GET/POST /__clickhouse_lb__/replication`` reads or sets the replication faults
(``{"delay": seconds, "stopped": bool}``; answers also ``applied``, ``log_end``, ``queue``).
SIGUSR1/SIGUSR2 put the replica in and out of a network black hole
(:mod:`clickhouse_lb.testing._blackhole`).
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import logging
import os
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit
from xml.sax.saxutils import escape as xml_escape

from clickhouse_lb.testing import _encoding, _native
from clickhouse_lb.testing._dedup_repair import drop_uncommitted_records
from clickhouse_lb.testing._engine import (
    ERROR_NAMES,
    ClickHouseError,
    ConnPool,
    EngineConn,
    EngineStream,
    Result,
    sql_identifier,
)
from clickhouse_lb.testing._http import HttpServer, Request, Response
from clickhouse_lb.testing._replication import Replication, RunStatement
from clickhouse_lb.testing._request import (
    ExternalTable,
    escape_undecodable,
    external_table,
    late_exception,
)
from clickhouse_lb.testing._sqltext import (
    Statement,
    exists_by_catalog,
    first_keyword,
    format_tail,
    mentions_temporary,
    split_statement,
    use_target,
    without_format_tail,
)
from clickhouse_lb.testing._users import User

log = logging.getLogger("clickhouse_lb.testing.server")

CONTROL_PREFIX = "/__clickhouse_lb__/"

# URL parameters ClickHouse's HTTP handler consumes itself (never settings).
_HTTP_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "query_id",
        "stacktrace",
        "role",
        "buffer_size",
        "wait_end_of_query",
        "session_id",
        "session_timeout",
        "session_check",
        "close_session",
        "client_protocol_version",
        "compress",
        "decompress",
    }
)
# Settings that only shape the HTTP exchange; accepted, handled here or ignored, not sent to the engine.
_HTTP_SETTINGS = frozenset(
    {
        "enable_http_compression",
        "http_zlib_compression_level",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "cancel_http_readonly_queries_on_client_close",
        "add_http_cors_header",
        "http_wait_end_of_query",
        "http_response_buffer_size",
        "http_native_compression_disable_checksumming_on_decompress",
        "http_write_exception_in_output_format",
        "http_response_headers",
    }
)
_READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXISTS", "EXPLAIN", "SET", "USE", "("})
_STATE_KEYWORDS = frozenset({"SET", "USE"})
_RESULT_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXISTS", "EXPLAIN", "CHECK", "("})

# Statements whose output the engine can hand over block by block (chdb streams SELECTs only).
_STREAM_KEYWORDS = frozenset({"SELECT", "WITH", "("})
# Output formats whose per-block outputs simply concatenate (no header, prefix or suffix):
# chdb writes every streamed block as a complete document of its format, so a JSON, Arrow,
# Parquet or ...WithNames result must be produced whole instead.
_BLOCKWISE_FORMATS = frozenset(
    name.lower()
    for name in (
        "Native",
        "RowBinary",
        "TabSeparated",
        "TSV",
        "TabSeparatedRaw",
        "TSVRaw",
        "CSV",
        "JSONEachRow",
        "JSONLines",
        "NDJSON",
        "JSONCompactEachRow",
        "JSONStringsEachRow",
        "JSONCompactStringsEachRow",
        "LineAsString",
    )
)


def _drop_quietly(conn: EngineConn, name: str) -> None:
    if not conn.closed and not conn.broken:
        try:
            conn.execute(f"DROP TEMPORARY TABLE IF EXISTS {name}")
        except ClickHouseError:
            conn.broken = True  # let the pool forget a connection in a doubtful state


def content_type(fmt: str) -> str:
    """The Content-Type ClickHouse sends for an output format."""
    low = fmt.lower()
    if low.startswith(("tabseparated", "tsv")):
        return "text/tab-separated-values; charset=UTF-8"
    if low.startswith("csv"):
        header = "present" if "names" in low else "absent"
        return f"text/csv; charset=UTF-8; header={header}"
    if low.startswith("json"):
        return "application/json; charset=UTF-8"
    if low == "xml":
        return "application/xml; charset=UTF-8"
    binary = (
        "native",
        "rowbinary",
        "parquet",
        "arrow",
        "orc",
        "avro",
        "protobuf",
        "msgpack",
        "npy",
        "capnproto",
        "bson",
        "rawblob",
    )
    if low.startswith(binary):
        return "application/octet-stream"
    return "text/plain; charset=UTF-8"


@dataclass
class _Session:
    id: str
    conn: EngineConn
    lock: threading.Lock
    timeout: float
    last_used: float


class _Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.delay = 0.0
        self.fail_next = 0
        self.code = 210

    def update(self, data: dict[str, object]) -> dict[str, object]:
        with self._lock:
            if "delay" in data:
                self.delay = max(0.0, float(str(data["delay"])))
            if "fail_next" in data:
                self.fail_next = max(0, int(str(data["fail_next"])))
            if "code" in data:
                self.code = int(str(data["code"]))
            return self.snapshot()

    def snapshot(self) -> dict[str, object]:
        return {"delay": self.delay, "fail_next": self.fail_next, "code": self.code}

    def take(self) -> tuple[float, int | None]:
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return self.delay, self.code
            return self.delay, None


@dataclass
class _Plan:
    """Everything one query request asks for, once the HTTP layer is peeled off."""

    statement: Statement
    settings: dict[str, str]
    query_params: dict[str, str]
    readonly: int
    database: str | None
    default_format: str
    params: dict[str, str]
    #: Undone when the answer is complete (a streamed one: after its last block).
    cleanup: ExitStack = field(default_factory=ExitStack)
    stream: bool = False
    external: list[ExternalTable] = field(default_factory=list)
    user: str = "default"
    #: The format the statement's output is written in (its FORMAT clause, else default_format).
    output_format: str = "TabSeparated"


def _same(block: bytes) -> bytes:
    return block


class _Chunks:
    """A streamed body whose ``close()`` releases the query's resources even if iteration never
    started (a generator's ``finally`` does not run then: a HEAD request, a client gone early)."""

    def __init__(self, blocks: Iterator[bytes], finish: Callable[[], None]) -> None:
        self._blocks = blocks
        self._finish = finish

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> bytes:
        return next(self._blocks)

    def close(self) -> None:
        try:
            close = getattr(self._blocks, "close", None)
            if close is not None:
                close()
        finally:
            self._finish()


@dataclass
class _Progressive:
    """A streamed answer: the engine stream, the blocks already fetched, and how to send the rest."""

    stream: EngineStream
    ready: list[bytes]
    shape: Callable[[bytes], bytes]
    tag: str
    method: str | None
    level: int | None
    cleanup: ExitStack


class ReplicaServer:
    """One replica: an engine data directory, sessions, fault state and the HTTP front end."""

    def __init__(
        self,
        name: str,
        data_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        password: str = "",
        shard: str = "01",
        users: dict[str, User] | None = None,
        tls: ssl.SSLContext | None = None,
        https_port: int = 0,
        cluster_name: str = "lb_cluster",
        replication_dir: str | os.PathLike[str] | None = None,
        cluster_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.data_dir = Path(data_dir)
        self.password = password
        self.users: dict[str, User] = {"default": User(password)}
        self.users.update(users or {})
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "config.xml"
        config.write_text(
            "<clickhouse>\n"
            f"  <display_name>{xml_escape(name)}</display_name>\n"
            f"  <macros><replica>{xml_escape(name)}</replica><shard>{xml_escape(shard)}</shard></macros>\n"
            "  <query_log><database>system</database><table>query_log</table>"
            "<flush_interval_milliseconds>1000</flush_interval_milliseconds></query_log>\n"
            # The engine's one user may manage access (SHOW USERS, SHOW POLICIES), as a server's
            # default user usually can; authentication itself is this front end's.
            "  <users><default><no_password/><networks><ip>::/0</ip></networks><profile>default</profile>"
            "<quota>default</quota><access_management>1</access_management></default></users>\n"
            "  <profiles><default/></profiles><quotas><default/></quotas>\n"
            f"  <users_config>{xml_escape(str(config))}</users_config>\n"
            "</clickhouse>\n"
        )
        self._path = f"{self.data_dir / 'db'}?config-file={config}"
        # Before the engine reads them: a SIGKILL inside an insert's commit can leave a block id
        # without its part, which the engine would take for a duplicate (see _dedup_repair).
        drop_uncommitted_records(self.data_dir / "db")
        self._anchor = EngineConn(self._path)  # keeps the engine up; used for server-level queries
        self.version = self._anchor.scalar("SELECT version()")
        self.timezone = self._anchor.scalar("SELECT timezone()")
        self._load_error_names()
        self._pool = ConnPool(self._path)
        self._get_pool = ConnPool(self._path, readonly=2)  # GET requests: readonly = 2
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._running_ids: set[str] = set()
        self._running_lock = threading.Lock()
        self.faults = _Faults()
        self.replication = Replication(
            name,
            shard,
            self._path,
            self.data_dir,
            Path(replication_dir) if replication_dir is not None else self.data_dir / "replication",
            cluster_name=cluster_name,
            cluster_file=Path(cluster_file) if cluster_file is not None else None,
        )
        self.replication.start()
        #: Set while the replica is black-holed (see clickhouse_lb.testing._blackhole).
        self.blackholed = threading.Event()
        self._unblackholed = threading.Event()
        self._stop = threading.Event()
        self.http = HttpServer((host, port), self.handle)
        #: The HTTPS listener (``tls`` given), like ClickHouse's https_port beside http_port.
        self.https = HttpServer((host, https_port), self.handle, ssl_context=tls) if tls is not None else None
        self._reaper = threading.Thread(target=self._reap_sessions, name="session-reaper", daemon=True)
        self._reaper.start()

    @property
    def port(self) -> int:
        return self.http.port

    def set_blackholed(self, on: bool) -> None:
        """While black-holed, requests on established connections are never answered."""
        if on:
            self._unblackholed.clear()
            self.blackholed.set()
        else:
            self.blackholed.clear()
            self._unblackholed.set()

    def _load_error_names(self) -> None:
        try:
            rows = self._anchor.execute(
                "SELECT code, name FROM system.errors SETTINGS system_events_show_zero_values = 1", "TSVRaw"
            ).body.decode()
        except ClickHouseError:
            log.warning("could not read system.errors; using the built-in error names")
            return
        for line in rows.splitlines():
            code, _, name = line.partition("\t")
            ERROR_NAMES.setdefault(int(code), name)

    # -- lifecycle ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        if self.https is not None:
            threading.Thread(
                target=self.https.serve_forever, kwargs={"poll_interval": 0.2}, name="https", daemon=True
            ).start()
        self.http.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        """Stop serving and close every engine connection."""
        self._stop.set()
        self.http.shutdown()
        self.http.server_close()
        if self.https is not None:
            self.https.shutdown()
            self.https.server_close()
        self.replication.close()
        with self._sessions_lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.conn.close()
        self._pool.close()
        self._get_pool.close()
        self._anchor.close()

    def _reap_sessions(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            expired: list[_Session] = []
            with self._sessions_lock:
                for sid, session in list(self._sessions.items()):
                    if now - session.last_used > session.timeout and session.lock.acquire(blocking=False):
                        del self._sessions[sid]
                        expired.append(session)
            for session in expired:
                log.debug("session %s expired", session.id)
                session.conn.close()
                session.lock.release()

    # -- HTTP entry point --------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        """Answer one HTTP request (called from the connection's thread)."""
        split = urlsplit(request.target)
        path = split.path or "/"
        # surrogateescape: binary parameter values and query text survive (see _request.decode_sql).
        params = dict(parse_qsl(split.query, keep_blank_values=True, errors="surrogateescape"))
        if path in ("/ping", "/replicas_status") and request.method in ("GET", "HEAD"):
            return self._ok()
        if path.startswith(CONTROL_PREFIX):
            return self._control(path[len(CONTROL_PREFIX) :], request)
        if self.blackholed.is_set():  # established connections go silent too
            self._unblackholed.wait()
            return Response(503, [], b"", close=True)
        query_id = params.get("query_id") or str(uuid.uuid4())
        base_headers = [("X-ClickHouse-Server-Display-Name", self.name), ("X-ClickHouse-Query-Id", query_id)]
        # Sent on every response (ClickHouse 25.11+): marks an exception written into the body.
        tag = secrets.token_hex(8)
        base_headers.append(("X-ClickHouse-Exception-Tag", tag))
        if path != "/":
            return Response(
                404,
                [*base_headers, ("Content-Type", "text/plain; charset=UTF-8")],
                f"There is no handle {path}\n\nUse / or /ping for health checks.\n"
                "Or /replicas_status for more sophisticated health checks.\n\n"
                "Send queries from your program with POST method or GET /?query=...\n".encode(),
            )
        if request.method not in ("GET", "POST", "HEAD"):
            return self._error(ClickHouseError.make(48, f"HTTP method {request.method} is not supported"), base_headers)
        cleanup = ExitStack()
        try:
            user_name, user = self._authenticate(request, params)
            external: list[ExternalTable] = []
            if request.headers.get("content-type", "").startswith("multipart/form-data"):
                request.body, external = self._read_multipart(request, params)
            if request.method in ("GET", "HEAD") and "query" not in params:
                return self._ok()
            delay, fail_code = self.faults.take()
            if delay > 0:
                time.sleep(delay)
            if fail_code is not None:
                raise ClickHouseError.make(fail_code, "Injected failure by clickhouse_lb.testing")
            cleanup.enter_context(self._query_id_running(query_id))
            response = self._query(
                request,
                params,
                base_headers,
                tag=tag,
                cleanup=cleanup,
                external=external,
                user_name=user_name,
                user=user,
            )
            if response.chunks is not None:
                cleanup = ExitStack()  # the stream owns the cleanup now (it runs after the last block)
            return response
        except ClickHouseError as exc:
            return self._error(exc, base_headers)
        finally:
            cleanup.close()

    @staticmethod
    def _ok() -> Response:
        return Response(200, [("Content-Type", "text/html; charset=UTF-8")], b"Ok.\n")

    def _error(self, exc: ClickHouseError, headers: list[tuple[str, str]]) -> Response:
        body = f"{exc.text} (version {self.version})\n".encode()
        return Response(
            exc.http_status,
            [
                *headers,
                ("Content-Type", "text/plain; charset=UTF-8"),
                ("X-ClickHouse-Exception-Code", str(exc.code)),
            ],
            body,
        )

    def _control(self, what: str, request: Request) -> Response:
        if what == "faults":
            if request.method == "POST":
                try:
                    data = json.loads(request.body or b"{}")
                    if not isinstance(data, dict):
                        raise ValueError("expected a JSON object")
                    state = self.faults.update(data)
                except (ValueError, TypeError) as exc:
                    return Response(400, [("Content-Type", "text/plain")], f"bad fault request: {exc}\n".encode())
                log.info("faults set: %s", state)
            else:
                state = self.faults.snapshot()
            return Response(200, [("Content-Type", "application/json")], json.dumps(state).encode())
        if what == "replication":
            try:
                data = json.loads(request.body or b"{}") if request.method == "POST" else None
                if data is not None and not isinstance(data, dict):
                    raise ValueError("expected a JSON object")
                state = self.replication.control(data)
            except (ValueError, TypeError) as exc:
                return Response(400, [("Content-Type", "text/plain")], f"bad replication request: {exc}\n".encode())
            return Response(200, [("Content-Type", "application/json")], json.dumps(state).encode())
        if what == "info":
            with self._sessions_lock:
                n_sessions = len(self._sessions)
            info = {"name": self.name, "pid": os.getpid(), "sessions": n_sessions}
            return Response(200, [("Content-Type", "application/json")], json.dumps(info).encode())
        return Response(404, [("Content-Type", "text/plain")], b"unknown control endpoint\n")

    def _authenticate(self, request: Request, params: dict[str, str]) -> tuple[str, User]:
        user, password = "default", ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise ClickHouseError.make(516, "Invalid authentication: bad basic credentials") from None
        if "x-clickhouse-user" in request.headers:
            user = request.headers["x-clickhouse-user"]
            password = request.headers.get("x-clickhouse-key", "")
        if "user" in params:
            user = params["user"]
            password = params.get("password", "")
        elif "password" in params:
            password = params["password"]
        known = self.users.get(user)
        given = password.encode("utf-8", "surrogateescape")  # URL parameters keep undecodable bytes
        if known is None or not secrets.compare_digest(given, known.password.encode()):
            raise ClickHouseError.make(
                516, f"{user}: Authentication failed: password is incorrect, or there is no user with such name"
            )
        return user, known

    @staticmethod
    def _read_multipart(request: Request, params: dict[str, str]) -> tuple[bytes, list[ExternalTable]]:
        """Take the fields of a multipart body: ``query`` and ``param_*`` fields go to ``params``,
        files are external data tables. Returns the remaining body (none) and the tables."""
        head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + request.body)
        files: list[tuple[str, bytes]] = []
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if not isinstance(name, str):
                continue
            payload = part.get_payload(decode=True)
            data = payload if isinstance(payload, bytes) else str(payload).encode()
            if part.get_filename() is not None:
                files.append((name, data))
                continue
            value = data.decode("utf-8", "surrogateescape")
            if name == "query":
                params["query"] = f"{params['query']}\n{value}" if "query" in params else value
            else:
                params[name] = value
        # After all fields: a table's _format/_structure/_types may come as fields or URL parameters.
        return b"", [external_table(name, data, params) for name, data in files]

    @contextmanager
    def _query_id_running(self, query_id: str) -> Iterator[None]:
        with self._running_lock:
            if query_id in self._running_ids:
                raise ClickHouseError.make(216, f"Query with id = {query_id} is already running")
            self._running_ids.add(query_id)
        try:
            yield
        finally:
            with self._running_lock:
                self._running_ids.discard(query_id)

    # -- queries -----------------------------------------------------------------------------
    def _query(
        self,
        request: Request,
        params: dict[str, str],
        base_headers: list[tuple[str, str]],
        *,
        tag: str,
        cleanup: ExitStack,
        external: list[ExternalTable],
        user_name: str,
        user: User,
    ) -> Response:
        for flag in ("compress", "decompress"):
            if params.get(flag, "0").lower() in ("1", "true"):
                raise ClickHouseError.make(
                    48,
                    f"{flag}=1 (ClickHouse native block compression) is not implemented by clickhouse_lb.testing; "
                    "use HTTP compression (enable_http_compression=1 and Accept-Encoding / Content-Encoding)",
                )
        body = request.body
        if body and request.method == "POST":
            try:
                body = _encoding.decompress(body, request.headers.get("content-encoding"))
            except _encoding.UnsupportedEncoding as exc:
                raise ClickHouseError.make(48, f"Unsupported Content-Encoding: {exc}") from None
            except Exception as exc:
                raise ClickHouseError.make(432, f"Cannot decompress request body: {exc}") from None
        statement = split_statement(params.get("query"), body if request.method == "POST" else b"")
        if statement.insert_stmt is None:
            exists = exists_by_catalog(statement.sql)
            if exists is not None:
                statement = Statement(exists)
        settings: dict[str, str] = {}
        query_params: dict[str, str] = {}
        for key, value in params.items():
            if key.startswith("param_"):
                query_params[key[6:]] = escape_undecodable(value)
            elif key not in _HTTP_PARAMS and key not in _HTTP_SETTINGS:
                settings[key] = value
        readonly = 2 if request.method in ("GET", "HEAD") else 0
        if "readonly" in settings:
            asked = int(settings.pop("readonly") or 0)
            if asked:  # a GET cannot lift readonly; 1 (no settings changes) is stricter than 2
                readonly = min(readonly, asked) if readonly else asked
        if user.readonly:  # the user's profile: a request can only make it stricter
            readonly = min(readonly, user.readonly) if readonly else user.readonly
        default_format = params.get("default_format") or "TabSeparated"
        fmt = default_format
        if statement.insert_stmt is None:
            fmt = format_tail(statement.sql) or fmt
        plan = _Plan(
            statement, settings, query_params, readonly, params.get("database") or None, default_format, params
        )
        plan.cleanup = cleanup
        plan.external = external
        plan.user = user_name
        plan.stream = params.get("wait_end_of_query", "0").lower() not in ("1", "true")
        plan.output_format = fmt
        session_id = params.get("session_id") or None
        result = self._run_in_session(session_id, plan) if session_id else self._run_sessionless(plan)
        headers = list(base_headers)
        if statement.insert_stmt is None and first_keyword(statement.sql) in _RESULT_KEYWORDS:
            # Like ClickHouse: only statements with an output format announce it.
            headers += [
                ("X-ClickHouse-Format", fmt),
                ("X-ClickHouse-Timezone", self.timezone),
                ("Content-Type", content_type(fmt)),
            ]
        else:
            headers += [("X-ClickHouse-Timezone", self.timezone), ("Content-Type", "text/plain; charset=UTF-8")]
        method = None
        if params.get("enable_http_compression", "0").lower() in ("1", "true"):
            method = _encoding.choose(request.headers.get("accept-encoding"))
        level_text = params.get("http_zlib_compression_level")
        level = int(level_text) if level_text else None
        revision = self._native_revision(params, fmt)
        if result.stream is not None:
            stream = result.stream
            blocks: list[bytes] = []
            # A failure before the head is sent is still an ordinary error response: with
            # wait_end_of_query=1 that is any failure; otherwise one in the first two blocks
            # (ClickHouse too holds back what fits in its response buffer).
            while len(blocks) < 2 or not plan.stream:
                block = stream.fetch()
                if block is None:
                    break
                blocks.append(block)
            if not stream.done:
                shape = self._native_shaper(revision, blocks[0], plan, None)
                progressive = _Progressive(stream, [shape(b) for b in blocks], shape, tag, method, level, cleanup)
                return self._streamed(progressive, headers)
            shape = self._native_shaper(revision, blocks[0] if blocks else b"", plan, stream.conn)
            result.body = b"".join(shape(b) for b in blocks)
            result.summary = stream.summary
        elif revision and result.body:
            whole = _native.split_blocks(result.body) or [result.body]
            result.body = b"".join(_native.for_revision(b, revision) for b in whole)
        payload = result.body
        if method and payload:
            payload = _encoding.compress(payload, method, level)
            headers.append(("Content-Encoding", method))
        headers.append(("X-ClickHouse-Summary", result.summary.header()))
        return Response(200, headers, payload)

    @staticmethod
    def _native_revision(params: dict[str, str], fmt: str) -> int:
        """The client's protocol revision when the output is Native (0: the engine's own form)."""
        if fmt.lower() != "native":
            return 0
        try:
            return max(0, int(params.get("client_protocol_version") or 0))
        except ValueError:
            raise ClickHouseError.make(
                27, f"Cannot parse client_protocol_version {params['client_protocol_version']!r}"
            ) from None

    def _native_shaper(
        self, revision: int, first_block: bytes, plan: _Plan, conn: EngineConn | None
    ) -> Callable[[bytes], bytes]:
        """How to turn each engine block into the client's protocol revision (see :mod:`_native`)."""
        if not revision or not first_block:
            return _same
        zoned: list[str | None] | None = None
        if revision >= _native.REVISION_WITH_DATETIME_ZONE:
            types = _native.column_types(first_block)
            if "DateTime" in types:
                zoned = self._zoned_types(plan, conn, types)
        return lambda block: _native.for_revision(block, revision, zoned)

    def _zoned_types(self, plan: _Plan, conn: EngineConn | None, types: list[str]) -> list[str | None] | None:
        """The real types of the columns the engine announced as plain DateTime (from DESCRIBE).

        ``conn``: the query's own connection when its stream is finished (same database,
        settings, temporary tables); else a pooled one (a stream still running occupies the other).
        """
        sql = without_format_tail(plan.statement.sql).rstrip().rstrip(";")
        describe = f"DESCRIBE ({sql}\n)"
        pooled = conn is None
        engine = self._pool.get() if conn is None else conn
        try:
            if pooled:
                engine.use(plan.database or "default")
                engine.apply_settings(plan.settings)
            rows = engine.execute(describe, "JSONCompactEachRow", plan.query_params).body.decode().splitlines()
        except ClickHouseError as exc:
            log.info("no zones for DateTime columns: DESCRIBE failed: %s", exc.text)
            return None
        finally:
            if pooled:
                self._pool.put(engine)
        described = [str(json.loads(row)[1]) for row in rows]
        return [
            real if seen == "DateTime" and real.startswith("DateTime(") else None
            for seen, real in zip(types, described)
        ]

    def _streamed(self, progressive: _Progressive, headers: list[tuple[str, str]]) -> Response:
        """A result of more than two blocks, sent as it comes (chunked), like ClickHouse does.

        A failure after the head left cannot change the status any more: ClickHouse then writes
        the exception into the body, framed by the response's exception tag, and so does this."""
        p = progressive
        compressor = _encoding.StreamCompressor(p.method, p.level) if p.method else None
        if p.method:
            headers.append(("Content-Encoding", p.method))
        headers.append(("X-ClickHouse-Summary", p.stream.summary.header()))

        def encode(data: bytes) -> bytes:
            return compressor.chunk(data) if compressor is not None and data else data

        def finish() -> None:
            p.stream.cancel()  # no-op when finished; stops the engine when the client went away
            p.cleanup.close()  # idempotent: the query's connection, session lock, query id

        def blocks() -> Iterator[bytes]:
            try:
                for data in p.ready:
                    yield encode(data)
                while True:
                    try:
                        block = p.stream.fetch()
                    except ClickHouseError as exc:
                        log.info("query failed after its first rows were sent: %s", exc.text)
                        yield encode(late_exception(p.tag, f"{exc.text} (version {self.version})"))
                        break
                    if block is None:
                        break
                    yield encode(p.shape(block))
                if compressor is not None:
                    yield compressor.end()
            finally:
                finish()

        return Response(200, headers, chunks=_Chunks(blocks(), finish))

    def _execute(self, conn: EngineConn, plan: _Plan) -> Result:
        statement = plan.statement
        if statement.insert_stmt is not None and statement.insert_format is not None:
            insert_stmt, insert_format = statement.insert_stmt, statement.insert_format

            def run_insert(sql: str) -> Result:
                return conn.insert(sql, insert_format, statement.data)

            runner = RunStatement(run_insert, statement.data, insert_format)
            return self.replication.execute(conn, insert_stmt, plan.settings, runner)
        blockwise = plan.output_format.lower() in _BLOCKWISE_FORMATS

        def run(sql: str) -> Result:
            if blockwise and first_keyword(sql) in _STREAM_KEYWORDS:
                try:
                    return Result(b"", stream=conn.stream(sql, plan.default_format, plan.query_params))
                except ClickHouseError as exc:
                    # chdb streams plain SELECTs only (not e.g. several statements); run the rest whole.
                    if exc.code != 36 or "Streaming query is not supported" not in exc.text:
                        raise
            return conn.execute(sql, plan.default_format, plan.query_params)

        # Replication (clickhouse_lb.testing._replication) sees every statement: it replicates
        # writes to replicated tables and ON CLUSTER statements, and answers system.replicas/clusters.
        return self.replication.execute(conn, statement.sql, plan.settings, RunStatement(run))

    @staticmethod
    def _attach_external(conn: EngineConn, plan: _Plan) -> None:
        """Create the request's external data tables on ``conn``; they are dropped after the query."""
        for table in plan.external:
            name = sql_identifier(table.name)
            conn.execute(f"CREATE TEMPORARY TABLE {name} ({table.structure}) ENGINE = Memory")
            plan.cleanup.callback(_drop_quietly, conn, name)
            if table.data:
                conn.insert(f"INSERT INTO {name}", table.fmt, table.data)

    def _run_sessionless(self, plan: _Plan) -> Result:
        statement, readonly = plan.statement, plan.readonly
        # readonly = 2 (GET) has pooled connections of its own; readonly = 1 (asked for by
        # parameter) forbids even the SETs that restore a connection, so it gets a fresh one.
        pool = self._get_pool if readonly == 2 else self._pool
        conn = pool.get()
        keyword = first_keyword(statement.sql)
        # Anything that changes the connection beyond settings/database: use it once, then drop it.
        discard = [
            readonly == 1 or keyword in _STATE_KEYWORDS or mentions_temporary(statement.sql) or bool(plan.external)
        ]
        plan.cleanup.callback(lambda: pool.put(conn, discard=discard[0]))
        try:
            conn.use(plan.database or "default")
            conn.apply_settings(plan.settings)
            self._attach_external(conn, plan)
            if readonly == 1:
                conn.execute("SET readonly = 1")
            return self._execute(conn, plan)
        except ClickHouseError:
            raise
        except Exception:
            discard[0] = True
            raise

    @contextmanager
    def _session(self, session_id: str, params: dict[str, str]) -> Iterator[_Session]:
        timeout = float(params.get("session_timeout") or 60)
        check = params.get("session_check", "0").lower() in ("1", "true")
        with self._sessions_lock:
            session = self._sessions.get(session_id)
            if session is None:
                if check:
                    raise ClickHouseError.make(372, f"Session {session_id} not found")
                session = _Session(session_id, EngineConn(self._path), threading.Lock(), timeout, time.monotonic())
                self._sessions[session_id] = session
            if not session.lock.acquire(blocking=False):
                raise ClickHouseError.make(373, f"Session {session_id} is locked by a concurrent client")
            session.timeout = timeout
        try:
            yield session
        finally:
            session.last_used = time.monotonic()
            if params.get("close_session", "0").lower() in ("1", "true"):
                with self._sessions_lock:
                    if self._sessions.get(session_id) is session:
                        del self._sessions[session_id]
                session.conn.close()
            session.lock.release()

    def _run_in_session(self, session_id: str, plan: _Plan) -> Result:
        statement, database = plan.statement, plan.database
        keyword = first_keyword(statement.sql)
        if plan.readonly and (statement.insert_stmt is not None or keyword not in _READ_KEYWORDS):
            raise ClickHouseError.make(164, f"{plan.user}: Cannot execute query in readonly mode")
        # The session stays locked until the answer is complete (a streamed one: its last block).
        session = plan.cleanup.enter_context(self._session(session_id, plan.params))
        conn = session.conn
        if keyword in _STATE_KEYWORDS:
            # SET / USE change the session itself: run them on the session's own state.
            conn.apply_settings({})
            conn.set_by_client = conn.set_by_client or keyword == "SET"
            result = self._execute(conn, plan)
            if keyword == "USE":
                target = use_target(statement.sql)
                if target:
                    conn.database = target
            return result
        previous_db = conn.database
        if database:
            conn.use(database)
            plan.cleanup.callback(self._restore_database, conn, previous_db)
        conn.apply_settings(plan.settings)
        self._attach_external(conn, plan)
        return self._execute(conn, plan)

    @staticmethod
    def _restore_database(conn: EngineConn, previous_db: str) -> None:
        if conn.database == previous_db:
            return
        try:
            conn.use(previous_db)
        except ClickHouseError:  # the session's database was dropped meanwhile
            conn.execute(f"USE {sql_identifier('default')}")
            conn.database = "default"

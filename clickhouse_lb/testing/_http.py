"""The local replica's HTTP/1.1 server: h11 for the protocol, one thread per connection for the engine.

Why this shape: the engine (chdb) is called synchronously and releases the GIL while it works,
so a thread per connection (ClickHouse also runs one thread per HTTP connection) keeps a query's
round trip free of event-loop hops; h11 (the HTTP/1.1 state machine under httpcore and
uvicorn) does all the parsing and framing: request bodies with ``Content-Length`` or chunked,
``Expect: 100-continue``, keep-alive and ``Connection: close``, chunked responses.

Latency: every accepted socket gets ``TCP_NODELAY``; a whole response (status line, headers and
body) leaves in one ``sendall``, and a streamed one sends its head together with the first chunk,
so Nagle's algorithm and delayed ACKs never add their 40 ms.

TLS: give :class:`HttpServer` an :class:`ssl.SSLContext` and the handshake happens in the
connection's thread.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import h11

log = logging.getLogger("clickhouse_lb.testing.http")

_RECV_SIZE = 65536
_SEND_SLICE = 1 << 20
_MAX_HEAD = 1 << 20
#: Idle keep-alive connections are closed after this many seconds (ClickHouse: keep_alive_timeout).
KEEP_ALIVE_TIMEOUT = 30.0


@dataclass
class Request:
    """One HTTP request, body read whole. Header names are lower-cased; values are latin-1 text."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes
    client: tuple[str, int]
    secure: bool = False


@dataclass
class Response:
    """An HTTP response: ``body`` sent whole (``Content-Length``), or ``chunks`` streamed (chunked).

    ``headers`` keep their order and case. ``chunks`` is consumed after the head is sent; it must
    not raise (the application writes a late failure into the stream itself, as ClickHouse does);
    if it does anyway, the connection is dropped so the client sees a truncated response. Its
    ``close()``, if it has one, is called once the response is over, sent or not.
    """

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    chunks: Iterator[bytes] | None = None
    close: bool = False


Handler = Callable[[Request], Response]


class _ConnectionHandler(socketserver.BaseRequestHandler):
    server: HttpServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(KEEP_ALIVE_TIMEOUT)
        if self.server.ssl_context is not None:
            try:
                sock = self.server.ssl_context.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError) as exc:
                log.debug("TLS handshake with %s failed: %s", self.client_address, exc)
                return
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        try:
            while self._one_exchange(sock, conn):
                conn.start_next_cycle()
        except (OSError, h11.ProtocolError) as exc:
            log.debug("connection from %s ended: %s", self.client_address, exc)
        finally:
            if sock is not self.request:
                with contextlib.suppress(OSError):
                    sock.close()

    @staticmethod
    def _next_event(sock: socket.socket, conn: h11.Connection) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if conn.they_are_waiting_for_100_continue:
                sock.sendall(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            conn.receive_data(sock.recv(_RECV_SIZE))

    def _one_exchange(self, sock: socket.socket, conn: h11.Connection) -> bool:
        try:
            event = self._next_event(sock, conn)
            if isinstance(event, h11.ConnectionClosed):
                return False
            assert isinstance(event, h11.Request)
            parts: list[bytes] = []
            while True:
                body_event = self._next_event(sock, conn)
                if isinstance(body_event, h11.Data):
                    parts.append(bytes(body_event.data))
                elif isinstance(body_event, h11.EndOfMessage):
                    break
                else:  # ConnectionClosed in the middle of a body
                    return False
        except h11.RemoteProtocolError as exc:
            self._send_bad_request(sock, conn, exc)
            return False
        request = Request(
            event.method.decode("ascii").upper(),
            event.target.decode("latin-1"),
            f"HTTP/{event.http_version.decode('ascii')}",
            _header_dict(event.headers),
            b"".join(parts),
            self.client_address,
            self.server.ssl_context is not None,
        )
        try:
            response = self.server.app(request)
        except Exception:  # the app must answer; this is a last resort
            log.exception("unhandled error for %s %s", request.method, request.target)
            response = Response(500, [("Content-Type", "text/plain; charset=UTF-8")], b"Internal error\n")
        self._send(sock, conn, response, head_only=request.method == "HEAD")
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    @staticmethod
    def _head(conn: h11.Connection, response: Response, length: int | None) -> bytes:
        headers: list[tuple[bytes, bytes]] = [(b"Date", formatdate(usegmt=True).encode())]
        if response.close:
            headers.append((b"Connection", b"close"))
        else:
            headers.append((b"Keep-Alive", f"timeout={int(KEEP_ALIVE_TIMEOUT)}".encode()))
        headers += [(k.encode("latin-1"), v.encode("latin-1", "replace")) for k, v in response.headers]
        if length is not None:
            headers.append((b"Content-Length", str(length).encode()))
        return conn.send(h11.Response(status_code=response.status, headers=headers)) or b""

    def _send(self, sock: socket.socket, conn: h11.Connection, response: Response, head_only: bool) -> None:
        try:
            self._send_response(sock, conn, response, head_only)
        finally:
            close = getattr(response.chunks, "close", None)
            if close is not None:  # always: a stream's close releases what its query holds
                close()

    def _send_response(self, sock: socket.socket, conn: h11.Connection, response: Response, head_only: bool) -> None:
        if response.chunks is None or head_only:
            head = self._head(conn, response, len(response.body))
            if head_only:
                _send_all(sock, head + (conn.send(h11.EndOfMessage()) or b""))
                return
            data = conn.send(h11.Data(data=response.body)) if response.body else b""
            _send_all(sock, head + (data or b"") + (conn.send(h11.EndOfMessage()) or b""))
            return
        pending = self._head(conn, response, None)  # no length: chunked (HTTP/1.1) or until close (1.0)
        try:
            for chunk in response.chunks:
                if chunk:
                    _send_all(sock, pending + (conn.send(h11.Data(data=chunk)) or b""))
                    pending = b""
        except OSError:
            raise
        except Exception:
            log.exception("streamed response failed; dropping the connection")
            raise OSError("streamed response failed") from None
        _send_all(sock, pending + (conn.send(h11.EndOfMessage()) or b""))

    @staticmethod
    def _send_bad_request(sock: socket.socket, conn: h11.Connection, exc: h11.RemoteProtocolError) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = f"Bad Request: {exc}\n".encode()
        try:
            head = conn.send(
                h11.Response(
                    status_code=exc.error_status_hint,
                    headers=[
                        ("Content-Type", "text/plain; charset=UTF-8"),
                        ("Content-Length", str(len(body))),
                        ("Connection", "close"),
                    ],
                )
            )
            data = (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            sock.sendall((head or b"") + data)
        except (OSError, h11.LocalProtocolError):
            pass


def _send_all(sock: socket.socket, data: bytes) -> None:
    """``sendall`` in slices: Python applies a socket's timeout to a whole ``sendall``, so one call
    for a big body would fail on a slow reader after KEEP_ALIVE_TIMEOUT; per slice it means
    "the client read nothing for that long"."""
    view = memoryview(data)
    for start in range(0, len(view), _SEND_SLICE):
        sock.sendall(view[start : start + _SEND_SLICE])


def _header_dict(headers: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        key = bytes(name).decode("latin-1").lower()
        text = bytes(value).decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


class HttpServer(socketserver.ThreadingTCPServer):
    """Threaded keep-alive HTTP/1.1 server calling ``app(request) -> response`` (HTTPS with ``ssl_context``)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], app: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.app = app
        self.ssl_context = ssl_context
        super().__init__(address, _ConnectionHandler)

    @property
    def port(self) -> int:
        addr: Any = self.server_address
        return int(addr[1])

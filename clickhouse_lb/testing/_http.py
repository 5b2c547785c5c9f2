"""A small, fast, threaded HTTP/1.1 server for the local replica (standard library only).

Why not :mod:`http.server`: its handler writes the status line, the headers and the body in
separate ``send`` calls, and with Nagle's algorithm plus the client's delayed ACK every
request then costs ~40 ms. Here every accepted socket gets ``TCP_NODELAY`` and the whole
response (status line, headers, body) leaves in ONE ``sendall``, so a round trip costs what
the engine costs.

Supported: keep-alive (HTTP/1.1 default, ``Connection: close`` honoured), request bodies with
``Content-Length`` or ``Transfer-Encoding: chunked``, ``Expect: 100-continue``. Responses are
always sent whole with ``Content-Length`` (ClickHouse streams chunked responses; clients see no
difference except that nothing arrives before the query ends, as with ``wait_end_of_query=1``).
One thread per connection (daemon threads), like ClickHouse's one thread per HTTP connection.
"""

from __future__ import annotations

import logging
import socket
import socketserver
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, BinaryIO

log = logging.getLogger("clickhouse_lb.testing.http")

_MAX_LINE = 1 << 20
_MAX_HEADERS = 200
#: Idle keep-alive connections are closed after this many seconds (ClickHouse: keep_alive_timeout).
KEEP_ALIVE_TIMEOUT = 30.0


class BadRequest(Exception):
    """The bytes on the socket are not a valid HTTP/1.x request."""


@dataclass
class Request:
    """One parsed HTTP request. Header names are lower-cased."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes
    client: tuple[str, int]


@dataclass
class Response:
    """A whole HTTP response. ``headers`` keep their order and case."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    close: bool = False


Handler = Callable[[Request], Response]


def _read_line(rfile: BinaryIO) -> bytes:
    line = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise BadRequest("line too long")
    return line


def _read_chunked(rfile: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = _read_line(rfile)
        if not size_line:
            raise BadRequest("unexpected end of chunked body")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise BadRequest("bad chunk size") from exc
        if size == 0:
            while True:  # trailers
                trailer = _read_line(rfile)
                if trailer in (b"\r\n", b"\n", b""):
                    return b"".join(parts)
        data = rfile.read(size)
        if len(data) != size:
            raise BadRequest("unexpected end of chunk")
        parts.append(data)
        _read_line(rfile)  # CRLF after the chunk


class _ConnectionHandler(socketserver.BaseRequestHandler):
    server: HttpServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(KEEP_ALIVE_TIMEOUT)
        rfile: Any = sock.makefile("rb", buffering=65536)
        try:
            while self._one_request(sock, rfile):
                pass
        except (OSError, BadRequest) as exc:
            log.debug("connection from %s ended: %s", self.client_address, exc)
        finally:
            rfile.close()

    def _one_request(self, sock: socket.socket, rfile: BinaryIO) -> bool:
        line = _read_line(rfile)
        while line in (b"\r\n", b"\n"):  # tolerate stray CRLF between requests
            line = _read_line(rfile)
        if not line:
            return False
        try:
            method, target, version = line.decode("latin-1").split()
        except ValueError:
            self._send_simple(sock, 400, "Bad Request\n")
            return False
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            hline = _read_line(rfile)
            if hline in (b"\r\n", b"\n", b""):
                break
            name, sep, value = hline.decode("latin-1").partition(":")
            if not sep:
                raise BadRequest("bad header line")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            raise BadRequest("too many headers")
        if headers.get("expect", "").lower() == "100-continue":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = _read_chunked(rfile)
        else:
            length = int(headers.get("content-length", "0") or 0)
            body = rfile.read(length) if length else b""
            if len(body) != length:
                raise BadRequest("unexpected end of body")
        conn_hdr = headers.get("connection", "").lower()
        keep_alive = "close" not in conn_hdr if version == "HTTP/1.1" else "keep-alive" in conn_hdr
        request = Request(method.upper(), target, version, headers, body, self.client_address)
        try:
            response = self.server.app(request)
        except Exception:  # the app must answer; this is a last resort
            log.exception("unhandled error for %s %s", method, target)
            response = Response(500, [("Content-Type", "text/plain; charset=UTF-8")], b"Internal error\n")
        keep_alive = keep_alive and not response.close
        self._send(sock, response, keep_alive, head_only=request.method == "HEAD")
        return keep_alive

    @staticmethod
    def _send(sock: socket.socket, response: Response, keep_alive: bool, head_only: bool = False) -> None:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {response.status} {reason}", f"Date: {formatdate(usegmt=True)}"]
        lines.append("Connection: Keep-Alive" if keep_alive else "Connection: Close")
        if keep_alive:
            lines.append(f"Keep-Alive: timeout={int(KEEP_ALIVE_TIMEOUT)}")
        lines.extend(f"{k}: {v}" for k, v in response.headers)
        lines.append(f"Content-Length: {len(response.body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        sock.sendall(head if head_only else head + response.body)

    def _send_simple(self, sock: socket.socket, status: int, text: str) -> None:
        self._send(sock, Response(status, [("Content-Type", "text/plain; charset=UTF-8")], text.encode()), False)


class HttpServer(socketserver.ThreadingTCPServer):
    """Threaded keep-alive HTTP/1.1 server calling ``app(request) -> response``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], app: Handler) -> None:
        self.app = app
        super().__init__(address, _ConnectionHandler)

    @property
    def port(self) -> int:
        addr: Any = self.server_address
        return int(addr[1])

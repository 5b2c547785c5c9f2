"""The pool's own connections (health probes, delay reads, liveness pings, discovery) reach a
replica as its clickhouse-connect client does: under ``proxy_path``, with ``server_host_name``
as the TLS name (a certificate issued for a name, reached by IP), through ``http_proxy`` /
``https_proxy``. Real loopback servers: a stub replica answering only under ``/ch``, over HTTP
or HTTPS (a trustme certificate for ``ch.internal``), and a small forward proxy (forwarding for
HTTP, ``CONNECT`` tunnels for HTTPS)."""

from __future__ import annotations

import asyncio
import importlib.util
import select
import socket
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb.config.discovery import DiscoverySettings
from clickhouse_lb.config.replicas import parse_host
from clickhouse_lb.pools._liveness import SyncLiveness
from clickhouse_lb.probes._discovery_query import ClusterReader
from clickhouse_lb.probes._ping import AsyncPinger, SyncPinger, delay_url, ping_once, ping_url
from clickhouse_lb.probes._route import Route

from .fakes import reply

trustme = pytest.importorskip("trustme")

NAME = "ch.internal"


class _Replica(BaseHTTPRequestHandler):
    """ClickHouse's HTTP interface under the path prefix ``/ch`` only; records what it saw."""

    seen: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Host")))
        if self.path == "/ch/ping":
            body = b"Ok.\n"
        elif self.path.startswith("/ch/?query="):
            body = b"" if "clusters" in self.path else b"7\n"
        else:
            self.send_error(404)
            return
        reply(self, body)

    def log_message(self, *args: Any) -> None:
        pass


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy: ``GET http://...`` forwarded, ``CONNECT host:port`` tunnelled."""

    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path}")
        with urllib.request.urlopen(urllib.request.Request(self.path, headers=dict(self.headers))) as answer:
            body = answer.read()
            self.send_response(answer.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:
        self.seen.append(f"CONNECT {self.path}")
        host, port = self.path.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as upstream:
            self.send_response(200)
            self.end_headers()
            ends = [self.connection, upstream]
            while True:
                readable, _, _ = select.select(ends, [], [], 5)
                if not readable:
                    return
                for end in readable:
                    data = end.recv(65536)
                    if not data:
                        return
                    (upstream if end is self.connection else self.connection).sendall(data)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> Iterator[Any]:
    handler.seen = []  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _no_env_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, str(path)


@pytest.fixture
def replica() -> Iterator[Any]:
    yield from _serve(_Replica)


@pytest.fixture
def tls_replica(ca_file: tuple[Any, str]) -> Iterator[Any]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca_file[0].issue_cert(NAME).configure_cert(context)
    yield from _serve(_Replica, context)


@pytest.fixture
def proxy() -> Iterator[Any]:
    yield from _serve(_Proxy)


def _address(server: Any) -> str:
    return f"127.0.0.1:{server.server_port}"


def _check_sync(address: str, options: dict[str, Any]) -> None:
    pinger = SyncPinger(options, timeout=5.0)
    try:
        outcome = pinger.ping(ping_url(address, options))
        assert outcome.ok, outcome.error
        assert pinger.delay(delay_url(address, options)) == (7.0, None)
    finally:
        pinger.close()
    liveness = SyncLiveness(options)
    try:
        reading = liveness.ping(ping_url(address, options), address, 5.0)
        assert reading.ok, reading.error
    finally:
        liveness.close()
    reader = ClusterReader(options, DiscoverySettings(cluster="c"), connect_timeout=5.0)
    try:
        assert reader.rows(parse_host(address)) == []
    finally:
        reader.close()


def _check_async(address: str, options: dict[str, Any]) -> None:
    async def run() -> None:
        pinger = AsyncPinger(options, timeout=5.0)
        try:
            outcome = await pinger.ping(ping_url(address, options))
            assert outcome.ok, outcome.error
            assert await pinger.delay(delay_url(address, options)) == (7.0, None)
        finally:
            await pinger.close()
        assert await ping_once(Route(options), ping_url(address, options), 5.0)

    asyncio.run(run())


#: The async pinger needs the async extra (aiohttp), which the CI's compat job (clickhouse-connect
#: 0.x, no native async client) does not install.
CHECKS = [
    pytest.param(_check_sync, id="sync"),
    pytest.param(_check_async, id="async", marks=pytest.mark.skipif(
        importlib.util.find_spec("aiohttp") is None, reason="the async extra (aiohttp) is not installed")),
]


@pytest.mark.parametrize("check", CHECKS)
def test_probes_follow_proxy_path(replica: Any, check: Any) -> None:
    check(_address(replica), {"proxy_path": "/ch"})
    assert {path.split("?")[0] for path, _ in replica.RequestHandlerClass.seen} <= {"/ch/ping", "/ch/"}


def test_liveness_url_follows_proxy_path() -> None:
    with clickhouse_lb.get_pool(["10.0.0.1:8123"], proxy_path="ch/", connect_on_create=False) as pool:
        assert pool._ping_url(0) == "http://10.0.0.1:8123/ch/ping"


@pytest.mark.parametrize("check", CHECKS)
def test_probes_verify_the_server_host_name(tls_replica: Any, ca_file: tuple[Any, str], check: Any) -> None:
    options = {"secure": True, "ca_cert": ca_file[1], "server_host_name": NAME, "proxy_path": "/ch"}
    check(_address(tls_replica), options)
    assert {host for _, host in tls_replica.RequestHandlerClass.seen} == {NAME}  # the Host header, as the clients


def test_a_wrong_name_still_fails_verification(tls_replica: Any, ca_file: tuple[Any, str]) -> None:
    options = {"secure": True, "ca_cert": ca_file[1], "server_host_name": "other.internal", "proxy_path": "/ch"}
    pinger = SyncPinger(options, timeout=5.0)
    try:
        outcome = pinger.ping(ping_url(_address(tls_replica), options))
    finally:
        pinger.close()
    assert not outcome.ok
    assert "certificate" in (outcome.error or "").lower()


@pytest.mark.parametrize("check", CHECKS)
def test_probes_go_through_the_http_proxy(replica: Any, proxy: Any, check: Any) -> None:
    check(_address(replica), {"proxy_path": "/ch", "http_proxy": f"127.0.0.1:{proxy.server_port}"})
    assert f"GET http://{_address(replica)}/ch/ping" in proxy.RequestHandlerClass.seen


@pytest.mark.parametrize("check", CHECKS)
def test_probes_tunnel_through_the_https_proxy(
    tls_replica: Any, proxy: Any, ca_file: tuple[Any, str], check: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.server_port}")  # the environment's, as the clients
    options = {"secure": True, "ca_cert": ca_file[1], "server_host_name": NAME, "proxy_path": "/ch"}
    check(_address(tls_replica), options)
    assert set(proxy.RequestHandlerClass.seen) == {f"CONNECT {_address(tls_replica)}"}
    assert tls_replica.RequestHandlerClass.seen


def test_no_proxy_is_honoured(replica: Any, proxy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    _check_sync(_address(replica), {"proxy_path": "/ch"})
    assert proxy.RequestHandlerClass.seen == []

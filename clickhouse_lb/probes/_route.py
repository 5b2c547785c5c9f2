"""How the pool's own connections reach a replica (health probes, replication-delay reads,
liveness pings, discovery): decided here only, from the client options, the way
clickhouse-connect's clients reach it, so that a replica the statements reach is never seen down
by the probes for being reached another way.

- **URL**: ``http(s)://host:port`` (HTTPS as :func:`~clickhouse_lb.config.tls.uses_tls` says),
  then ``proxy_path`` (a server behind a reverse proxy's path prefix: ``/ch/ping``, not ``/ping``).
- **TLS**: ``verify``, ``ca_cert`` (``"certifi"`` too), ``client_cert``/``client_cert_key``, and
  ``server_host_name``: the name sent as SNI and checked against the certificate (the client's
  ``server_hostname``/``assert_hostname``), also sent as the ``Host`` header, as the clients do
  on every request (HTTP too).
- **Proxy**: the sync client's rule. HTTP: ``http_proxy``, else the ``http_proxy`` environment
  variable. HTTPS: ``https_proxy``, else the ``https_proxy`` environment variable, else
  ``http_proxy`` and its variable. The environment's ``no_proxy`` is honoured (clickhouse-connect's
  own check); a proxy given without a scheme is ``http://`` (``https://`` for ``https_proxy``).
  An HTTPS replica is reached through a ``CONNECT`` tunnel, an HTTP one by forwarding.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Mapping
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.util import parse_url

from clickhouse_lb.config.tls import uses_tls

__all__ = ["Route", "RoutedManagers", "base_url"]


def base_url(address: str, options: Mapping[str, Any]) -> str:
    """``http(s)://host:port[/proxy_path]`` of a replica, as its client's URL (no trailing slash)."""
    prefix = str(options.get("proxy_path") or "").strip("/")
    return f"{'https' if uses_tls(options) else 'http'}://{address}{'/' + prefix if prefix else ''}"


def _ssl_context(options: Mapping[str, Any]) -> ssl.SSLContext:
    """TLS as the replica clients are told (``verify``, ``ca_cert``, ``client_cert``/``_key``)."""
    ca_cert = options.get("ca_cert") or None
    if ca_cert == "certifi":  # clickhouse-connect's own spelling for certifi's bundle (certifi: its dependency)
        import certifi

        ca_cert = certifi.where()
    context = ssl.create_default_context(cafile=ca_cert)
    if not options.get("verify", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.get("client_cert"):
        context.load_cert_chain(options["client_cert"], options.get("client_cert_key") or None)
    return context


def _with_scheme(proxy: str, default: str) -> str:
    return proxy if proxy.startswith(("http://", "https://")) else f"{default}://{proxy}"


class Route:
    """The way to the replicas of one pool (see the module's doc); build it once, it holds the
    TLS context."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.secure = uses_tls(options)
        self.ssl_context = _ssl_context(options) if self.secure else None
        self.server_host_name: str | None = options.get("server_host_name") or None
        self._verify = bool(options.get("verify", True))
        self.headers = {"Host": self.server_host_name} if self.server_host_name else {}
        self._http_proxy: str | None = options.get("http_proxy") or None
        self._https_proxy: str | None = options.get("https_proxy") or None

    def proxy(self, host: str, port: int) -> str | None:
        """The proxy URL to reach ``host:port`` through, or None."""
        from clickhouse_connect.driver.httputil import check_env_proxy

        if self.secure:
            found = self._https_proxy or check_env_proxy("https", host, port)
            if found:
                return _with_scheme(found, "https")
        found = self._http_proxy or check_env_proxy("http", host, port)
        return _with_scheme(found, "http") if found else None

    def tls_options(self) -> dict[str, Any]:
        """urllib3 connection (pool) keywords for an HTTPS replica."""
        options: dict[str, Any] = {"ssl_context": self.ssl_context}
        if self.server_host_name:
            options["server_hostname"] = self.server_host_name
            if self._verify:
                options["assert_hostname"] = self.server_host_name
        return options

    def connection(self, scheme: str, host: str, port: int) -> tuple[HTTPConnection, bool]:
        """A fresh urllib3 connection to a replica and whether its requests name the whole URL
        (forwarded by a proxy) rather than the path."""
        proxy = self.proxy(host, port)
        if proxy is None:
            if scheme == "https":
                return HTTPSConnection(host, port, **self.tls_options()), False
            return HTTPConnection(host, port), False
        url = parse_url(proxy)
        proxy_host, proxy_port = url.host or "localhost", url.port or (443 if url.scheme == "https" else 80)
        if scheme == "http":
            return (HTTPSConnection(proxy_host, proxy_port) if url.scheme == "https"
                    else HTTPConnection(proxy_host, proxy_port)), True
        try:  # urllib3 2: the tunnel's own TLS settings (a private module: its public API has no other way)
            from urllib3._base_connection import ProxyConfig
        except ImportError:  # pragma: no cover - urllib3 1.26: a plain CONNECT tunnel
            tunnel = HTTPSConnection(proxy_host, proxy_port, ssl_context=self.ssl_context)
            tunnel.set_tunnel(host, port)
            return tunnel, False
        tunnel = HTTPSConnection(proxy_host, proxy_port, proxy=url, proxy_config=ProxyConfig(None, False, None, None),
                                 **self.tls_options())
        tunnel.set_tunnel(host, port, scheme=url.scheme or "http")
        return tunnel, False

    def aiohttp_options(self, url: str) -> dict[str, Any]:
        """aiohttp request keywords for ``url`` (a session whose connector has :attr:`ssl_context`)."""
        parsed = parse_url(url)
        options: dict[str, Any] = {"headers": dict(self.headers)}
        proxy = self.proxy(parsed.host or "localhost", parsed.port or (443 if self.secure else 80))
        if proxy:
            options["proxy"] = proxy
        if self.secure and self.server_host_name:
            options["server_hostname"] = self.server_host_name
        return options


class RoutedManagers:
    """urllib3 pool managers that send each request the :class:`Route`'s way (one manager per
    proxy, none, or several when ``no_proxy`` exempts some replicas)."""

    def __init__(self, route: Route, **pool_options: Any) -> None:
        self.route = route
        self._pool_options = {**pool_options, **(route.tls_options() if route.secure else {})}
        self._managers: dict[str | None, urllib3.PoolManager] = {}
        self._lock = threading.Lock()

    def get(self, url: str, headers: Mapping[str, str], timeout: urllib3.Timeout) -> urllib3.BaseHTTPResponse:
        parsed = parse_url(url)
        proxy = self.route.proxy(parsed.host or "localhost", parsed.port or (443 if self.route.secure else 80))
        with self._lock:
            manager = self._managers.get(proxy)
            if manager is None:
                manager = self._managers[proxy] = (urllib3.ProxyManager(proxy, **self._pool_options) if proxy
                                                   else urllib3.PoolManager(**self._pool_options))
        return manager.request("GET", url, headers={**self.route.headers, **headers}, timeout=timeout)

    def clear(self) -> None:
        with self._lock:
            managers, self._managers = list(self._managers.values()), {}
        for manager in managers:
            manager.clear()

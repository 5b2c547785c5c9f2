"""Whether a pool's replicas speak HTTPS: decided here only, from the client options as the
user gave them (``secure=``, ``interface=``), so that the default port, the clients, the
``/ping`` probes, discovery and the shared-state key never disagree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["uses_tls"]

_TRUE = ("1", "true", "yes", "on")


def uses_tls(options: Mapping[str, Any]) -> bool:
    """True when clickhouse-connect would connect over HTTPS with these options: ``secure``
    true (a bool, or a DSN's or URL's string), or ``interface="https"``. Lenient about the
    spelling: the values were validated where they came in
    (:func:`clickhouse_lb.config.pool_config.check_client_option`) or are about to be."""
    secure = options.get("secure")
    if isinstance(secure, str):
        secure = secure.strip().lower() in _TRUE
    interface = options.get("interface")
    return bool(secure) or (isinstance(interface, str) and interface.strip().lower() == "https")

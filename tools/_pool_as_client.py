"""pytest plugin for tools/run_clickhouse_connect_suite.py (its pooled run): every
``create_client`` / ``get_client`` becomes ``clickhouse_lb.get_pool`` and every
``get_async_client`` / ``create_async_client`` becomes ``clickhouse_lb.get_async_pool``, over
the replicas in ``$CLICKHOUSE_LB_SUITE_HOSTS``, ``load_balancing="in_order"`` (loaded with
``-p``, before the suite's conftest imports these names)."""

from __future__ import annotations

import os
from typing import Any

import clickhouse_connect
import clickhouse_connect.driver

import clickhouse_lb
from clickhouse_lb.config.pool_config import async_client_option_names, sync_client_option_names

HOSTS = os.environ["CLICKHOUSE_LB_SUITE_HOSTS"].split(",")
ORIGINAL = clickhouse_connect.driver.create_client
ORIGINAL_ASYNC = getattr(clickhouse_connect.driver, "create_async_client", None)
# Read from the real factories' signatures, before they are patched.
sync_client_option_names()
if ORIGINAL_ASYNC is not None:
    async_client_option_names()


def _replicas(kwargs: dict[str, Any]) -> dict[str, Any]:
    # The suite names one server (host/port, or a DSN naming it): the pool gets the replicas
    # instead (hosts given with a dsn win over its host; the DSN gives the rest).
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    return kwargs


def pooled_client(*args: Any, **kwargs: Any) -> Any:
    if args:  # create_client(host) positionally is not a form the suite uses; keep it honest
        raise TypeError("create_client takes keyword arguments only")
    kwargs = _replicas(kwargs)
    pool = clickhouse_lb.get_pool(HOSTS, load_balancing="in_order", connect_on_create=False, **kwargs)
    pool._factory = ORIGINAL  # the replicas' own clients: not this patched create_client
    return pool.connect()


async def pooled_async_client(*args: Any, **kwargs: Any) -> Any:
    if args:
        raise TypeError("get_async_client takes keyword arguments only")
    kwargs = _replicas(kwargs)
    pool = clickhouse_lb.get_async_pool(HOSTS, load_balancing="in_order", connect_on_create=False, **kwargs)
    pool._factory = ORIGINAL_ASYNC
    return await pool.connect()


for module in (clickhouse_connect, clickhouse_connect.driver):
    for name in ("create_client", "get_client"):
        if hasattr(module, name):
            setattr(module, name, pooled_client)
    if ORIGINAL_ASYNC is not None and os.environ.get("CLICKHOUSE_LB_SUITE_ASYNC", "1") != "0":
        for name in ("create_async_client", "get_async_client"):
            if hasattr(module, name):
                setattr(module, name, pooled_async_client)

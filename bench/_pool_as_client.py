"""pytest plugin for bench/clickhouse_connect_suite.py: ``create_client`` / ``get_client``
become ``clickhouse_lb.get_pool`` over ``$CLICKHOUSE_LB_SUITE_HOSTS`` (loaded with ``-p``,
before the suite's conftest imports them)."""

from __future__ import annotations

import os
from typing import Any

import clickhouse_connect
import clickhouse_connect.driver

import clickhouse_lb
from clickhouse_lb.config.pool_config import sync_client_option_names

HOSTS = os.environ["CLICKHOUSE_LB_SUITE_HOSTS"].split(",")
ORIGINAL = clickhouse_connect.driver.create_client
sync_client_option_names()  # read from the real create_client's signature, before it is patched


def pooled_client(**kwargs: Any) -> Any:
    # The suite names one server: the pool gets the replicas instead.
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    pool = clickhouse_lb.get_pool(HOSTS, load_balancing="in_order", connect_on_create=False, **kwargs)
    pool._factory = ORIGINAL  # the replicas' own clients: not this patched create_client
    return pool.connect()


for module in (clickhouse_connect, clickhouse_connect.driver):
    for name in ("create_client", "get_client"):
        if hasattr(module, name):
            setattr(module, name, pooled_client)

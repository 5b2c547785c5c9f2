"""pytest plugin for tools/run_clickhouse_connect_suite.py (its pooled run): every
``create_client`` / ``get_client`` becomes ``clickhouse_lb.get_pool``, every
``get_async_client`` / ``create_async_client`` becomes ``clickhouse_lb.get_async_pool``, and
every ``create_engine("clickhousedb://...")`` a ``clickhousedb+lb://`` engine, over the replicas
in ``$CLICKHOUSE_LB_SUITE_HOSTS``, ``load_balancing="in_order"`` (loaded with ``-p``, before the
suite's conftest imports these names). ``clickhouse_lb.alembic`` is imported, the one line a
user adds to an Alembic env.py."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import clickhouse_connect
import clickhouse_connect.driver
import sqlalchemy
import sqlalchemy.engine
from sqlalchemy.engine import URL, make_url

import clickhouse_lb
import clickhouse_lb.alembic
from clickhouse_lb.config.pool_config import async_client_option_names, sync_client_option_names

HOSTS = os.environ["CLICKHOUSE_LB_SUITE_HOSTS"].split(",")
ORIGINAL = clickhouse_connect.driver.create_client
ORIGINAL_ASYNC = getattr(clickhouse_connect.driver, "create_async_client", None)
# Read from the real factories' signatures, before they are patched.
sync_client_option_names()
if ORIGINAL_ASYNC is not None:
    async_client_option_names()


# Each client the suite makes is a pool of its own, with a balancing state of its own
# (share_state=False), as plain clients share nothing: a replica error one test provokes on
# purpose (a timeout) must not move every later test's pools to another replica, where the
# suite's database does not exist (the replicas are independent engines).


SERVER = (os.environ["CLICKHOUSE_CONNECT_TEST_HOST"], os.environ["CLICKHOUSE_CONNECT_TEST_PORT"])


def _hosts(kwargs: dict[str, Any]) -> list[str]:
    """The suite names one server (host/port, or a DSN naming it): the pool gets the replicas
    instead (hosts given with a dsn win over its host; the DSN gives the rest). A client aimed
    elsewhere on purpose (a port nothing listens on) keeps its own address."""
    host, port = kwargs.pop("host", None), kwargs.pop("port", None)
    if host is not None and port is not None and (str(host), str(port)) != SERVER:
        return [f"{host}:{port}"]
    return HOSTS


def pooled_client(*args: Any, **kwargs: Any) -> Any:
    if args:  # create_client(host) positionally is not a form the suite uses; keep it honest
        raise TypeError("create_client takes keyword arguments only")
    hosts = _hosts(kwargs)
    pool = clickhouse_lb.get_pool(
        hosts, load_balancing="in_order", connect_on_create=False, share_state=False, **kwargs
    )
    return pool.connect()


async def pooled_async_client(*args: Any, **kwargs: Any) -> Any:
    if args:
        raise TypeError("get_async_client takes keyword arguments only")
    hosts = _hosts(kwargs)
    pool = clickhouse_lb.get_async_pool(
        hosts, load_balancing="in_order", connect_on_create=False, share_state=False, **kwargs
    )
    return await pool.connect()


# The pools' (and the dialects' pools') replica clients are the real ones, not these patched
# factories: their default factory is looked up on this namespace.
clickhouse_lb.pools.pool.clickhouse_connect = SimpleNamespace(get_client=ORIGINAL)  # type: ignore[assignment]
if ORIGINAL_ASYNC is not None:
    import clickhouse_lb.pools.aio

    clickhouse_lb.pools.aio.clickhouse_connect = SimpleNamespace(  # type: ignore[assignment]
        get_async_client=clickhouse_connect.get_async_client
    )

for module in (clickhouse_connect, clickhouse_connect.driver):
    for name in ("create_client", "get_client"):
        if hasattr(module, name):
            setattr(module, name, pooled_client)
    if ORIGINAL_ASYNC is not None and os.environ.get("CLICKHOUSE_LB_SUITE_ASYNC", "1") != "0":
        for name in ("create_async_client", "get_async_client"):
            if hasattr(module, name):
                setattr(module, name, pooled_async_client)


ORIGINAL_CREATE_ENGINE = sqlalchemy.engine.create_engine


def pooled_engine(url: Any, *args: Any, **kwargs: Any) -> Any:
    parsed = make_url(url)
    if parsed.drivername == "clickhousedb":
        # The replicas in the host=host:port form (the one SQLAlchemy renders with %3A, which
        # the dialect's engine URL avoids), the rest of the URL as the suite wrote it.
        parsed = URL.create(
            "clickhousedb+lb", parsed.username, parsed.password, None, None, parsed.database, parsed.query
        ).update_query_pairs([*(("host", h) for h in HOSTS), ("load_balancing", "in_order"), ("share_state", "0")])
    return ORIGINAL_CREATE_ENGINE(parsed, *args, **kwargs)


if os.environ.get("CLICKHOUSE_LB_SUITE_SQLALCHEMY", "1") != "0":
    sqlalchemy.create_engine = pooled_engine
    sqlalchemy.engine.create_engine = pooled_engine

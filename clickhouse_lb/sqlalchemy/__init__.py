"""SQLAlchemy support: the ``clickhousedb+lb://`` engine URL (Core, ORM, pandas, Superset).

Registered through the ``sqlalchemy.dialects`` entry point, so after installing
the ``sqlalchemy`` extra (``pip install ".[sqlalchemy]"`` in a checkout, or
``pip install "clickhouse-lb[sqlalchemy] @ git+https://github.com/clickhouse-lb/clickhouse-lb"``)::

    from sqlalchemy import create_engine
    engine = create_engine("clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:8123/db?load_balancing=in_order")

Types, compiler and reflection are clickhouse-connect's (``clickhousedb``); balancing and
failover are added underneath. See docs/sqlalchemy.md.
"""

from __future__ import annotations

from clickhouse_lb.sqlalchemy.dbapi import PinnedConnection
from clickhouse_lb.sqlalchemy.dialect import ClickHouseLBDialect, get_replica_pool
from clickhouse_lb.sqlalchemy.url import EngineArgs, engine_args_from_url

__all__ = ["ClickHouseLBDialect", "EngineArgs", "PinnedConnection", "engine_args_from_url", "get_replica_pool"]

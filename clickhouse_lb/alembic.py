"""Alembic migrations over ``clickhousedb+lb://``: add ``import clickhouse_lb.alembic`` to a stock
env.py (as ``alembic init`` writes it); nothing else changes.

The import registers clickhouse-connect's Alembic implementation
(``clickhouse_connect.cc_sqlalchemy.alembic``: ClickHouse DDL, engines, the version table kept
with inserts and mutations) with one addition, so that the replicas have one migration state:

* with ``cluster=<name>`` in the URL, the version table is created ``ON CLUSTER <name>`` as a
  ``ReplicatedMergeTree`` (every replica has it), and each run first syncs its replica's copy;
  write the migrations' own DDL ``ON CLUSTER`` too;
* without it, every Alembic run is pinned to the URL's first replica, whatever
  ``load_balancing`` says: the version table and the migrations exist there only, and while
  that replica is down Alembic fails naming it rather than migrate another replica.

See docs/sqlalchemy.md ("Alembic"). Importing this module is also harmless for plain
``clickhousedb://`` engines: they get clickhouse-connect's implementation unchanged.
"""

from __future__ import annotations

import clickhouse_connect.cc_sqlalchemy.alembic  # noqa: F401  (registers its operations and DDL)

from clickhouse_lb.sqlalchemy._alembic import ClickHouseLBImpl

__all__ = ["ClickHouseLBImpl"]

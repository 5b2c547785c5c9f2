"""Alembic without ``cluster=``: the error when the migration replica (the URL's first) is down
names that replica and its error only (the run against real replicas is
integration/test_alembic.py)."""

from __future__ import annotations

import clickhouse_connect
import pytest
from alembic.util import CommandError
from sqlalchemy import create_engine

from clickhouse_lb.sqlalchemy._alembic import _pin_first_replica

from .test_sqlalchemy_dialect import URL, StubCluster, connect


def test_a_down_migration_replica_is_named_with_its_error_not_the_healthy_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stubs = StubCluster()
    monkeypatch.setattr(clickhouse_connect, "get_client", stubs.factory)
    stubs.down.add("a")
    engine = create_engine(URL)
    assert connect(engine).address == "b:8123"  # the engine's connections fail over
    pool = engine.dialect.replica_pool
    assert pool is not None
    with pytest.raises(CommandError) as caught:
        _pin_first_replica(pool, session=True)
    message = str(caught.value)
    assert message.startswith("The migration replica a:8123 (the URL's first host) is unavailable: ")
    assert "Connection refused" in message
    assert "(3 attempts)" in message
    # b and c are healthy and were not asked: not reported as unavailable
    assert "b:8123" not in message
    assert "c:8123" not in message
    assert "not tried" not in message
    assert "All 3 replicas" not in message
    pool.close()

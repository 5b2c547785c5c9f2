"""Checked by mypy (CI's ``mypy`` step; see ``[tool.mypy] files`` in pyproject.toml), never run.

Both pools' statement methods are declared once (``clickhouse_lb.pools._client_api``); a type
checker must still see clickhouse-connect's own signature on each surface: the Client's on a
sync pool or session, the AsyncClient's, as a coroutine, on an async one. An error here is a
user's lost type checking.
"""

from collections.abc import Coroutine, Sequence
from typing import Any

from clickhouse_connect.driver.query import QueryResult
from clickhouse_connect.driver.summary import QuerySummary
from typing_extensions import assert_type

from clickhouse_lb import AsyncReplicaPool, ReplicaPool
from clickhouse_lb.pools.aio import AsyncPinnedSession
from clickhouse_lb.pools.pool import PinnedSession


def sync_surfaces(pool: ReplicaPool, session: PinnedSession) -> None:
    assert_type(pool.query("SELECT 1", settings={"max_threads": 1}), QueryResult)
    assert_type(session.insert("t", [[1]], column_names=["x"]), QuerySummary)
    assert_type(pool.command("SELECT 1"), str | int | Sequence[str] | QuerySummary)
    pool.query(1)  # type: ignore[arg-type]
    pool.query("SELECT 1", no_such_parameter=1)  # type: ignore[call-arg]


async def async_surfaces(pool: AsyncReplicaPool, session: AsyncPinnedSession) -> None:
    pending = assert_type(pool.query("SELECT 1"), Coroutine[Any, Any, QueryResult])
    assert_type(await pending, QueryResult)
    assert_type(await session.insert("t", [[1]], column_names=["x"]), QuerySummary)
    await pool.query(1)  # type: ignore[arg-type]


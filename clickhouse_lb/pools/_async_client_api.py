"""The AsyncClient-like surface shared by :class:`~clickhouse_lb.AsyncReplicaPool` and its
pinned sessions: :mod:`clickhouse_lb.pools._client_api`'s methods made from ``AsyncClient``'s.

Each coroutine method takes ``AsyncClient``'s parameters and returns its type; the body
awaits ``_call``. The streaming methods, like ``AsyncClient``'s, are awaited for a
``StreamContext`` that is then used with ``async with`` and ``async for``.
"""

from __future__ import annotations

from typing import Any

from clickhouse_connect.driver.asyncclient import AsyncClient

from clickhouse_lb.pools._client_api import async_statement

__all__ = ["AsyncClientAPI"]


class AsyncClientAPI:
    """clickhouse-connect's AsyncClient statement methods, each routed through ``_call``."""

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    query = async_statement(AsyncClient.query)
    query_np = async_statement(AsyncClient.query_np)
    query_df = async_statement(AsyncClient.query_df)
    query_df_arrow = async_statement(AsyncClient.query_df_arrow)
    query_arrow = async_statement(AsyncClient.query_arrow)
    raw_query = async_statement(AsyncClient.raw_query)
    raw_stream = async_statement(AsyncClient.raw_stream)
    query_column_block_stream = async_statement(AsyncClient.query_column_block_stream)
    query_row_block_stream = async_statement(AsyncClient.query_row_block_stream)
    query_rows_stream = async_statement(AsyncClient.query_rows_stream)
    query_np_stream = async_statement(AsyncClient.query_np_stream)
    query_df_stream = async_statement(AsyncClient.query_df_stream)
    query_arrow_stream = async_statement(AsyncClient.query_arrow_stream)
    query_df_arrow_stream = async_statement(AsyncClient.query_df_arrow_stream)
    command = async_statement(AsyncClient.command)
    insert = async_statement(AsyncClient.insert)
    insert_df = async_statement(AsyncClient.insert_df)
    insert_arrow = async_statement(AsyncClient.insert_arrow)
    insert_df_arrow = async_statement(AsyncClient.insert_df_arrow)
    raw_insert = async_statement(AsyncClient.raw_insert)
    data_insert = async_statement(AsyncClient.data_insert)

"""The AsyncClient-like surface shared by :class:`~clickhouse_lb.AsyncReplicaPool` and its
pinned sessions: the asyncio twin of :mod:`clickhouse_lb._client_api`.

Each coroutine method has clickhouse-connect's own ``AsyncClient`` signature and docstring
(copied onto it at import time) and the same return type; the body only names the method and
awaits ``_call``, which decides on which replica it runs. The streaming methods, like
``AsyncClient``'s, are awaited for a ``StreamContext`` that is then used with ``async with``
and ``async for``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clickhouse_connect.driver.asyncclient import AsyncClient

from ._client_api import SYNC_METHODS, mirrors

if TYPE_CHECKING:
    from clickhouse_connect.driver.common import StreamContext
    from clickhouse_connect.driver.query import QueryResult
    from clickhouse_connect.driver.summary import QuerySummary

__all__ = ["ASYNC_METHODS", "AsyncClientAPI"]

_client = functools.partial(mirrors, AsyncClient)

#: The AsyncClient methods a pool balances: the same names as the sync Client's.
ASYNC_METHODS = list(SYNC_METHODS)


class AsyncClientAPI:
    """clickhouse-connect's AsyncClient methods, each routed through ``_call``."""

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    @_client()
    async def query(self, *args: Any, **kwargs: Any) -> QueryResult:
        return await self._call("query", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_np(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("query_np", args, kwargs)

    @_client()
    async def query_df(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("query_df", args, kwargs)

    @_client()
    async def query_df_arrow(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("query_df_arrow", args, kwargs)

    @_client()
    async def query_arrow(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("query_arrow", args, kwargs)

    @_client()
    async def raw_query(self, *args: Any, **kwargs: Any) -> bytes:
        return await self._call("raw_query", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def raw_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("raw_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_column_block_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_column_block_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_row_block_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_row_block_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_rows_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_rows_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_np_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_np_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_df_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_df_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_arrow_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_arrow_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def query_df_arrow_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return await self._call("query_df_arrow_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def command(self, *args: Any, **kwargs: Any) -> str | int | Sequence[str] | QuerySummary:
        return await self._call("command", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def insert(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return await self._call("insert", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def insert_df(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return await self._call("insert_df", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def insert_arrow(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return await self._call("insert_arrow", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def insert_df_arrow(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return await self._call("insert_df_arrow", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def raw_insert(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return await self._call("raw_insert", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    async def data_insert(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return await self._call("data_insert", args, kwargs)  # type: ignore[no-any-return]

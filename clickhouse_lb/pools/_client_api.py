"""The Client-like surface shared by :class:`~clickhouse_lb.ReplicaPool` and its pinned sessions.

Each statement method is made by :func:`statement` from clickhouse-connect's own method: it
takes that method's parameters and returns its type (to type checkers, through a ParamSpec,
and to ``help()``/IDEs, through ``__wrapped__``), and its body only hands the call to
``_call``, which decides on which replica it runs. :mod:`clickhouse_lb.pools._async_client_api`
builds the asyncio twin with :func:`async_statement`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from clickhouse_connect.driver.client import Client

__all__ = ["STATEMENT_METHODS", "SyncClientAPI", "async_statement", "statement"]

P = ParamSpec("P")
R = TypeVar("R")

#: The Client methods a pool balances (each one statement, each with failover); the
#: AsyncClient's have the same names.
STATEMENT_METHODS = (
    "query",
    "query_np",
    "query_df",
    "query_df_arrow",
    "query_arrow",
    "raw_query",
    "raw_stream",
    "query_column_block_stream",
    "query_row_block_stream",
    "query_rows_stream",
    "query_np_stream",
    "query_df_stream",
    "query_arrow_stream",
    "query_df_arrow_stream",
    "command",
    "insert",
    "insert_df",
    "insert_arrow",
    "insert_df_arrow",
    "raw_insert",
    "data_insert",
)


def statement(
    original: Callable[Concatenate[Any, P], R], through: str = "_call"
) -> Callable[Concatenate[SyncClientAPI, P], R]:
    """A method with ``original``'s parameters and result that runs through ``self._call``
    (``through="_call_read"``: a method that only reads, run on one replica with failover and no
    balancing settings taken out of its arguments, e.g. ``create_insert_context``)."""
    name = original.__name__

    if through == "_call":  # every statement: no getattr() per call

        def method(self: SyncClientAPI, /, *args: P.args, **kwargs: P.kwargs) -> R:
            result: R = self._call(name, args, kwargs)  # (an annotation, not typing.cast: no call per statement)
            return result
    else:

        def method(self: SyncClientAPI, /, *args: P.args, **kwargs: P.kwargs) -> R:
            result: R = getattr(self, through)(name, args, kwargs)
            return result

    functools.update_wrapper(method, original)  # help() and IDEs show the real parameters
    return method


def async_statement(
    original: Callable[Concatenate[Any, P], Awaitable[R]], through: str = "_call"
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The coroutine twin of :func:`statement`: awaits ``self._call`` (or ``through``)."""
    name = original.__name__

    if through == "_call":

        async def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await self._call(name, args, kwargs)
            return result
    else:

        async def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await getattr(self, through)(name, args, kwargs)
            return result

    functools.update_wrapper(method, original)
    return method


class SyncClientAPI:
    """clickhouse-connect's Client statement methods, each routed through ``_call``."""

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    query = statement(Client.query)
    query_np = statement(Client.query_np)
    query_df = statement(Client.query_df)
    query_df_arrow = statement(Client.query_df_arrow)
    query_arrow = statement(Client.query_arrow)
    raw_query = statement(Client.raw_query)
    raw_stream = statement(Client.raw_stream)
    query_column_block_stream = statement(Client.query_column_block_stream)
    query_row_block_stream = statement(Client.query_row_block_stream)
    query_rows_stream = statement(Client.query_rows_stream)
    query_np_stream = statement(Client.query_np_stream)
    query_df_stream = statement(Client.query_df_stream)
    query_arrow_stream = statement(Client.query_arrow_stream)
    query_df_arrow_stream = statement(Client.query_df_arrow_stream)
    command = statement(Client.command)
    insert = statement(Client.insert)
    insert_df = statement(Client.insert_df)
    insert_arrow = statement(Client.insert_arrow)
    insert_df_arrow = statement(Client.insert_df_arrow)
    raw_insert = statement(Client.raw_insert)
    data_insert = statement(Client.data_insert)

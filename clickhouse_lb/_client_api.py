"""The Client-like surface shared by :class:`~clickhouse_lb.ReplicaPool` and its pinned sessions.

Each method has clickhouse-connect's own signature and docstring (copied onto it at import
time, so ``help()`` and IDEs show the real parameters) and the same return type; the body only
names the method and hands the call to ``_call``, which decides on which replica it runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from clickhouse_connect.driver.client import Client

if TYPE_CHECKING:
    from clickhouse_connect.driver.common import StreamContext
    from clickhouse_connect.driver.query import QueryResult
    from clickhouse_connect.driver.summary import QuerySummary

__all__ = ["SYNC_METHODS", "SyncClientAPI"]

F = TypeVar("F", bound=Callable[..., Any])


def mirrors(source: type, name: str | None = None) -> Callable[[F], F]:
    """Give the decorated method the signature and docstring of ``source.<name>``."""

    def decorate(method: F) -> F:
        original = getattr(source, name or method.__name__, None)
        if original is not None:
            method.__doc__ = original.__doc__
            with contextlib.suppress(TypeError, ValueError):  # builtins without signatures
                method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
        return method

    return decorate


_client = functools.partial(mirrors, Client)

#: The Client methods a pool balances (each one statement, each with failover).
SYNC_METHODS = [
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
]


class SyncClientAPI:
    """clickhouse-connect's Client methods, each routed through ``_call``."""

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    @_client()
    def query(self, *args: Any, **kwargs: Any) -> QueryResult:
        return self._call("query", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_np(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("query_np", args, kwargs)

    @_client()
    def query_df(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("query_df", args, kwargs)

    @_client()
    def query_df_arrow(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("query_df_arrow", args, kwargs)

    @_client()
    def query_arrow(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("query_arrow", args, kwargs)

    @_client()
    def raw_query(self, *args: Any, **kwargs: Any) -> bytes:
        return self._call("raw_query", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def raw_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("raw_stream", args, kwargs)

    @_client()
    def query_column_block_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_column_block_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_row_block_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_row_block_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_rows_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_rows_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_np_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_np_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_df_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_df_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_arrow_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_arrow_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def query_df_arrow_stream(self, *args: Any, **kwargs: Any) -> StreamContext:
        return self._call("query_df_arrow_stream", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def command(self, *args: Any, **kwargs: Any) -> str | int | Sequence[str] | QuerySummary:
        return self._call("command", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def insert(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return self._call("insert", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def insert_df(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return self._call("insert_df", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def insert_arrow(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return self._call("insert_arrow", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def insert_df_arrow(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return self._call("insert_df_arrow", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def raw_insert(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return self._call("raw_insert", args, kwargs)  # type: ignore[no-any-return]

    @_client()
    def data_insert(self, *args: Any, **kwargs: Any) -> QuerySummary:
        return self._call("data_insert", args, kwargs)  # type: ignore[no-any-return]

"""The Client-like surfaces of the pools: :class:`SyncClientAPI` (:class:`~clickhouse_lb.ReplicaPool`
and its pinned sessions) and :class:`AsyncClientAPI` (the asyncio pool and its sessions).

The statement methods are declared once, in :class:`ClientStatements`: each line names
clickhouse-connect's ``Client`` method and its ``AsyncClient`` twin. A type checker reads each
as a descriptor (:class:`Statement`) whose type depends on the surface it is read from: the
Client method's parameters and result on a sync pool, the AsyncClient's as a coroutine on an
async one. At run time each surface holds plain functions made from them (:func:`statement`,
:func:`async_statement`: no descriptor call per statement), whose body only hands the call to
``_call``, which decides on which replica it runs; ``help()`` and IDEs see the real parameters
through ``__wrapped__``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from clickhouse_connect.driver.client import Client

if TYPE_CHECKING:
    from clickhouse_connect.driver.asyncclient import AsyncClient
else:

    class _ByName:
        """``AsyncClient`` in the declarations below, at run time: ``AsyncClient.query`` is the
        name ``"query"``. The sync pool must import under clickhouse-connect 0.x (Superset's
        range), whose AsyncClient lacks methods the list names; the async pool, which needs
        1.10+, takes each from the real class (:func:`make_async_methods`)."""

        def __getattr__(self, name: str) -> str:
            return name

    AsyncClient = _ByName()

__all__ = ["STATEMENT_METHODS", "AsyncClientAPI", "ClientStatements", "SyncClientAPI", "async_statement",
           "make_async_methods", "statement"]

P = ParamSpec("P")
R = TypeVar("R")
AP = ParamSpec("AP")
AR = TypeVar("AR")


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


class Statement(Generic[P, R, AP, AR]):
    """One statement method of both surfaces: ``Client``'s method and ``AsyncClient``'s.

    Only a type checker reads it through ``__get__``: each surface replaces it with the function
    :func:`statement` or :func:`async_statement` makes (see :func:`_made`). At run time the
    AsyncClient method is known by its name only (see ``_ByName``)."""

    __slots__ = ("sync",)

    def __init__(
        self, sync: Callable[Concatenate[Any, P], R], asynchronous: Callable[Concatenate[Any, AP], Awaitable[AR]]
    ) -> None:
        name = getattr(asynchronous, "__name__", asynchronous)  # (a name at run time)
        if sync.__name__ != name:
            raise TypeError(f"{sync.__qualname__} and AsyncClient.{name} are not one statement")
        self.sync: Callable[Concatenate[Any, P], R] = sync

    if TYPE_CHECKING:

        @overload
        def __get__(self, obj: None, owner: type) -> Statement[P, R, AP, AR]: ...
        @overload
        def __get__(self, obj: SyncClientAPI, owner: type) -> Callable[P, R]: ...
        @overload
        def __get__(self, obj: AsyncClientAPI, owner: type) -> Callable[AP, Coroutine[Any, Any, AR]]: ...
        def __get__(self, obj: object, owner: type) -> Any: ...


class ClientStatements:
    """The statements a pool balances (each one statement, each with failover), declared once."""

    query = Statement(Client.query, AsyncClient.query)
    query_np = Statement(Client.query_np, AsyncClient.query_np)
    query_df = Statement(Client.query_df, AsyncClient.query_df)
    query_df_arrow = Statement(Client.query_df_arrow, AsyncClient.query_df_arrow)
    query_arrow = Statement(Client.query_arrow, AsyncClient.query_arrow)
    raw_query = Statement(Client.raw_query, AsyncClient.raw_query)
    raw_stream = Statement(Client.raw_stream, AsyncClient.raw_stream)
    query_column_block_stream = Statement(Client.query_column_block_stream, AsyncClient.query_column_block_stream)
    query_row_block_stream = Statement(Client.query_row_block_stream, AsyncClient.query_row_block_stream)
    query_rows_stream = Statement(Client.query_rows_stream, AsyncClient.query_rows_stream)
    query_np_stream = Statement(Client.query_np_stream, AsyncClient.query_np_stream)
    query_df_stream = Statement(Client.query_df_stream, AsyncClient.query_df_stream)
    query_arrow_stream = Statement(Client.query_arrow_stream, AsyncClient.query_arrow_stream)
    query_df_arrow_stream = Statement(Client.query_df_arrow_stream, AsyncClient.query_df_arrow_stream)
    command = Statement(Client.command, AsyncClient.command)
    insert = Statement(Client.insert, AsyncClient.insert)
    insert_df = Statement(Client.insert_df, AsyncClient.insert_df)
    insert_arrow = Statement(Client.insert_arrow, AsyncClient.insert_arrow)
    insert_df_arrow = Statement(Client.insert_df_arrow, AsyncClient.insert_df_arrow)
    raw_insert = Statement(Client.raw_insert, AsyncClient.raw_insert)
    data_insert = Statement(Client.data_insert, AsyncClient.data_insert)


_DECLARED: dict[str, Statement[Any, Any, Any, Any]] = {
    name: value for name, value in vars(ClientStatements).items() if isinstance(value, Statement)
}
#: The Client methods a pool balances, in declaration order; the AsyncClient's have the same names.
STATEMENT_METHODS = tuple(_DECLARED)


def _made(surface: type, make: Callable[[Statement[Any, Any, Any, Any]], Callable[..., Any]]) -> None:
    """Give ``surface`` each declared statement as the plain function ``make`` builds from it."""
    for name, declared in _DECLARED.items():
        setattr(surface, name, make(declared))


class SyncClientAPI(ClientStatements):
    """clickhouse-connect's Client statement methods, each routed through ``_call``."""

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError


class AsyncClientAPI(ClientStatements):
    """clickhouse-connect's AsyncClient statement methods, each awaiting ``_call``. The streaming
    methods, like ``AsyncClient``'s, are awaited for a ``StreamContext`` that is then used with
    ``async with`` and ``async for``."""

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError


_made(SyncClientAPI, lambda declared: statement(declared.sync))


def make_async_methods(client_class: type) -> None:
    """Give :class:`AsyncClientAPI` its statement methods, made from ``client_class``'s (the
    real ``AsyncClient``: the async pool's module calls this once, at import)."""
    _made(AsyncClientAPI, lambda declared: async_statement(getattr(client_class, declared.sync.__name__)))

"""A client pinned to one replica of a pool (``pool.session()``, ``pool.pin()``): what the
sync and async pinned sessions share (forwarding, and a replica failure as
:class:`~clickhouse_lb.errors.SessionLostError`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from clickhouse_lb.core._statements import PreparedCall, prepare_call
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.errors import SessionLostError
from clickhouse_lb.pools._client_members import unknown_attribute_message

__all__ = ["PinnedBase"]

C = TypeVar("C")


class _Pool(Protocol):
    @property
    def balancer(self) -> Balancer: ...


class PinnedBase(Generic[C]):
    """A client pinned to one replica of a pool: statements run there only. A replica failure
    counts an error against it (as in the pool) and becomes a SessionLostError; query failures
    pass through unchanged. Everything that is not a statement is the client's own."""

    _settings_position: ClassVar[Mapping[str, int | None]] = {}

    def __init__(self, pool: _Pool, index: int, client: C, balancer: Balancer | None = None) -> None:
        # ``balancer``: the one of the view the session was pinned from (discovery may have
        # replaced the pool's since).
        self._balancer = balancer or pool.balancer
        self._index = index
        self.client = client
        self.address = self._balancer.addresses[index]
        get_setting = getattr(client, "get_client_setting", None)
        self.session_id: str | None = get_setting("session_id") if get_setting is not None else None

    def _prepare(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PreparedCall:
        return prepare_call(method, args, kwargs, self._settings_position.get(method), auto_token=False)

    def _lost(self, exc: Exception, write: bool = True) -> SessionLostError | None:
        """The error for a failed statement: None for a query failure (raise it unchanged)."""
        failure = self._balancer.count_failure(self._index, exc)
        if not failure.replica:
            return None
        return SessionLostError(self.address, failure.reason, may_have_been_applied=failure.sent and write)

    def __getattr__(self, name: str) -> Any:
        # Everything that is not a statement (server_tz, create_query_context, ...) is the
        # pinned client's own: there is only one replica to ask.
        if name.startswith("__") or name == "client":
            raise AttributeError(name)
        return getattr(self.client, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The client's members are the client's own too (session.database = "x" changes it);
        # anything else would be read by nothing.
        if name.startswith("_") or name in ("client", "address", "session_id") or hasattr(type(self), name):
            object.__setattr__(self, name, value)
        elif hasattr(self.client, name):
            setattr(self.client, name, value)
        else:
            raise AttributeError(unknown_attribute_message(type(self).__name__, name, dir(self.client)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} on {self.address}>"

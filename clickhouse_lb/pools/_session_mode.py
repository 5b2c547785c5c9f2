"""A pool given ``session_id=`` (or ``autogenerate_session_id=True``): what a ``get_client`` user
means by it, one ClickHouse session that every statement runs in.

A ClickHouse session lives on one server, so such a pool runs every statement on one replica,
chosen by the strategy at the first statement (failing over while a replica cannot be reached),
exactly as ``pool.session()`` does; its clients carry the session id, so ``get_client_setting
("session_id")`` answers it. When that replica fails, the statement raises
:class:`~clickhouse_lb.errors.SessionLostError` (the session's temporary tables and SET are gone
with it: never moved silently) and the next statement pins the session anew, on the replica the
strategy picks then, with the same session id.

Here: which session id a pool has, and the options its clients get; the route itself, written
once for both pools, is :mod:`clickhouse_lb.pools._session_route`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from clickhouse_lb.config._values import as_bool

__all__ = ["SESSION_OPTIONS", "pool_session_id", "pooled_client_options"]

#: The client options that decide a session: the pool's clients get theirs from
#: :func:`pooled_client_options` (pinned sessions: a new id each).
SESSION_OPTIONS = ("session_id", "autogenerate_session_id")


def pool_session_id(client_options: Mapping[str, Any]) -> str | None:
    """The session every statement of the pool runs in: ``session_id=`` as given, a new UUID
    for ``autogenerate_session_id=True`` given explicitly, else None (statements balanced over
    the replicas, no session: clickhouse-connect's common ``autogenerate_session_id`` default is
    not a request for one, since a session would put the whole pool on one replica)."""
    given = client_options.get("session_id")
    if given:
        return str(given)
    auto = client_options.get("autogenerate_session_id")
    if auto is not None and as_bool("autogenerate_session_id", auto):
        return str(uuid.uuid4())
    return None


def pooled_client_options(session_id: str | None) -> dict[str, Any]:
    """The session options of a pool's own clients (one per replica)."""
    return {"session_id": session_id} if session_id else {"autogenerate_session_id": False}

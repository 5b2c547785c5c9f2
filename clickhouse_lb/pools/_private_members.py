"""Private Client members that code written against clickhouse-connect reads anyway (its own
integration suite does: ``client._apply_server_tz``, ``client._autogenerate_query_id``, and the
AsyncClient's ``_session`` (its aiohttp session, which tests patch) and ``_initialized``): on a
pool, read-only facts of the reference replica's client, like ``server_version``
(:mod:`clickhouse_lb.pools._client_members`), with no I/O. A member the reference client does not
have (``_session`` on a sync pool) is an AttributeError, as on the client.

A closed async pool's ``_session`` is None, as a closed AsyncClient's is (code checks a close
that way); a closed pool has no reference client to ask."""

from __future__ import annotations

import inspect
from typing import Any

from clickhouse_lb.pools._client_members import FACT, _read_only_property

__all__ = ["PRIVATE_FACTS", "PrivateMembers"]

PRIVATE_FACTS = ("_apply_server_tz", "_autogenerate_query_id", "_session", "_initialized")


class PrivateMembers:
    """A base of the pools that only holds the properties of :data:`PRIVATE_FACTS`."""


def _closed_async_session_is_none(reference: property) -> property:
    def get(self: Any) -> Any:
        # An async pool is the one whose close() is a coroutine function (the AsyncClient has
        # the aiohttp session; the sync Client has no _session at all, closed or not).
        if getattr(self, "_closed", False) and inspect.iscoroutinefunction(type(self).close):
            return None
        return reference.__get__(self)

    return property(get, reference.fset, doc=reference.__doc__)


for _name in PRIVATE_FACTS:
    _member = _read_only_property(_name, FACT)
    setattr(PrivateMembers, _name, _closed_async_session_is_none(_member) if _name == "_session" else _member)

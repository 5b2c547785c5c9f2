"""Private Client members that code written against clickhouse-connect reads anyway (its own
integration suite does: ``client._apply_server_tz``, ``client._autogenerate_query_id``, and the
AsyncClient's ``_session`` (its aiohttp session, which tests patch) and ``_initialized``): on a
pool, read-only facts of the reference replica's client, like ``server_version``
(:mod:`clickhouse_lb.pools._client_members`), with no I/O. A member the reference client does not
have (``_session`` on a sync pool) is an AttributeError, as on the client."""

from __future__ import annotations

from clickhouse_lb.pools._client_members import FACT, _read_only_property

__all__ = ["PRIVATE_FACTS", "PrivateMembers"]

PRIVATE_FACTS = ("_apply_server_tz", "_autogenerate_query_id", "_session", "_initialized")


class PrivateMembers:
    """A base of the pools that only holds the properties of :data:`PRIVATE_FACTS`."""


for _name in PRIVATE_FACTS:
    setattr(PrivateMembers, _name, _read_only_property(_name, FACT))

"""Private Client members that code written against clickhouse-connect reads anyway (its own
integration suite does: ``client._apply_server_tz``, ``client._autogenerate_query_id``): on a
pool, read-only facts of the reference replica's client, like ``server_version``
(:mod:`clickhouse_lb.pools._client_members`), with no I/O."""

from __future__ import annotations

from clickhouse_lb.pools._client_members import FACT, _read_only_property

__all__ = ["PRIVATE_FACTS", "PrivateMembers"]

PRIVATE_FACTS = ("_apply_server_tz", "_autogenerate_query_id")


class PrivateMembers:
    """A base of the pools that only holds the properties of :data:`PRIVATE_FACTS`."""


for _name in PRIVATE_FACTS:
    setattr(PrivateMembers, _name, _read_only_property(_name, FACT))

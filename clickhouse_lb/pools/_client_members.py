"""The rest of clickhouse-connect's Client on a pool: every public member that is not a statement.

A pool stands for N clients, one per replica. Each public member of a clickhouse-connect Client
gets one meaning on a pool, from :data:`MEMBERS`:

* **state** (``database``, ``query_limit``, ``tz_source``, ``compression``, ``timeout``, ...):
  assigning it on the pool assigns it on every replica's client that exists, and records it;
  every client the pool creates later (a replica first used later, a client re-created after a
  replica restarts, a pinned session) gets the recorded changes replayed in order. Reading it
  reads the reference client (below), or the recorded value while no client exists.
  ``set_client_setting``, ``set_access_token`` and the ``headers``/``params`` dicts (a view
  whose writes go to every client) are recorded and replayed the same way.
* **facts** (``server_version``, ``server_settings``, ``protocol_version``): what a replica
  reported when the pool connected to it, read from the **reference client**: the first client
  the pool created (at creation, the replica that answered the check), so that two reads agree.
  ``server_tz`` is a fact that may also be assigned (an override, as on a Client: state).
  ``min_version(v)`` is answered for the lowest ``server_version`` among the replicas the pool
  has connected to. Facts cannot be assigned.
  ``uri`` and ``url`` are facts too: the reference replica's (what clickhouse-connect's own
  error scrubbing and logging read; ``pool.client(address).url`` for another replica).

Reading a member never does I/O and never raises anything but an ``AttributeError``: before any
replica has answered (``connect_on_create=False``), a fact or an unrecorded state member raises
:class:`~clickhouse_lb.errors.PoolMemberError` (an ``AttributeError``) saying to connect first,
so ``hasattr``, ``getattr(pool, name, default)`` and ``inspect.getmembers`` behave. Explicit
calls (``min_version``, ``get_client_setting``, ``create_query_context``) may connect.

The record and the table are here; the pools hook in at two points: each new client goes
through :meth:`ClientChanges.replay`, and the first one becomes the reference.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator, MutableMapping
from types import MappingProxyType
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar, cast

from clickhouse_connect.driver.client import Client

from clickhouse_lb.errors import PoolMemberError

__all__ = [
    "FACT",
    "MEMBERS",
    "METHOD",
    "PER_REPLICA",
    "STATE",
    "ClientChanges",
    "ClientMembers",
    "member_names",
]

P = ParamSpec("P")
R = TypeVar("R")

STATE = "state"
FACT = "fact"
CONSTANT = "constant"
PER_REPLICA = "per replica"
METHOD = "method"

#: Client dicts that users change in place (``client.headers["X-Y"] = "z"``).
SHARED_MAPS = frozenset({"headers", "params"})


class Member(NamedTuple):
    kind: str
    #: For PER_REPLICA members: what to use instead. For the others: how a pool answers it.
    note: str = ""


_USE_CLIENT = "use pool.client(address).{name} for one replica, pool.addresses for the list"

#: Every public member of clickhouse-connect's Client/HttpClient/AsyncClient (0.13 to 1.12) and
#: its meaning on a pool. ``tests/test_client_members.py`` fails when the installed
#: clickhouse-connect has a public member missing here (or on the pools).
MEMBERS: dict[str, Member] = {
    # state: applied to every replica's client, recorded and replayed
    "database": Member(STATE),
    "query_limit": Member(STATE),
    "query_retries": Member(STATE, "the pool's clients default to 0: failover is the pool's job"),
    "tz_source": Member(STATE),
    "tz_mode": Member(STATE),
    "show_clickhouse_errors": Member(STATE),
    "max_error_message": Member(STATE),
    "compression": Member(STATE),
    "write_compression": Member(STATE),
    "form_encode_query_params": Member(STATE),
    "http_retries": Member(STATE),
    "timeout": Member(STATE),
    "http": Member(STATE),
    "server_host_name": Member(STATE),
    "apply_server_timezone": Member(STATE),  # clickhouse-connect < 1.0
    "utc_tz_aware": Member(STATE),  # clickhouse-connect < 1.0
    "server_tz": Member(STATE, "read from the reference replica; assigning overrides it on every client"),
    "headers": Member(STATE, "a view: writes go to every replica's client"),
    "params": Member(STATE, "a view: writes go to every replica's client"),
    # facts: what the reference replica reported
    "server_version": Member(FACT),
    "server_settings": Member(FACT, "read-only mapping"),
    "protocol_version": Member(FACT),
    "valid_transport_settings": Member(CONSTANT),
    "optional_transport_settings": Member(CONSTANT),
    # one value per replica: the reference replica's (what clickhouse-connect's error scrubbing reads)
    "uri": Member(FACT, _USE_CLIENT),
    "url": Member(FACT, _USE_CLIENT),
    # methods with a pool meaning (implemented by the pools and ClientMembers)
    "set_client_setting": Member(METHOD, "every replica's client, recorded and replayed"),
    "get_client_setting": Member(METHOD, "the reference client's value"),
    "set_access_token": Member(METHOD, "every replica's client, recorded and replayed"),
    "min_version": Member(METHOD, "true when every replica connected to is at least that version"),
    "create_query_context": Member(METHOD, "built on the reference client; use it with pool.query(context=...)"),
    "create_insert_context": Member(METHOD, "a read with failover; use it with pool.insert(context=...)"),
    "close_connections": Member(METHOD, "every replica's client; the pool stays open"),
    "close": Member(METHOD, "every replica's client; the pool is closed"),
    "ping": Member(METHOD, "true when some replica answers"),
}


def member_names() -> frozenset[str]:
    return frozenset(MEMBERS)


_DELETED = object()

# A recorded change: ("attr", name), ("setting", key), ("token",), ("item", attr, key).
ChangeKey = tuple[str, ...]


def _apply(client: Any, key: ChangeKey, value: Any) -> None:
    kind = key[0]
    if kind == "attr":
        if not hasattr(client, key[1]):  # a member of another clickhouse-connect version
            raise AttributeError(f"{type(client).__name__} has no attribute {key[1]!r} to set on every replica")
        setattr(client, key[1], value)
    elif kind == "setting":
        client.set_client_setting(key[1], value)
    elif kind == "token":
        client.set_access_token(value)
    else:  # "item": one key of a shared dict
        mapping = getattr(client, key[1])
        if value is _DELETED:
            mapping.pop(key[2], None)
        else:
            mapping[key[2]] = value


class ClientChanges:
    """Every change made through a pool to its clients' state, latest per target, in the order
    made: replayed on each client the pool creates, so that a client created later (a replica
    first used later, or re-created after a restart) is in the state the user set."""

    def __init__(self) -> None:
        self._changes: dict[ChangeKey, Any] = {}
        #: Moves with every change: a client made while a change was being made replays again.
        self.version = 0

    def record(self, key: ChangeKey, value: Any) -> None:
        if key[0] == "attr" and key[1] in SHARED_MAPS:  # a whole new dict replaces its item changes
            for old in [k for k in self._changes if k[0] == "item" and k[1] == key[1]]:
                del self._changes[old]
        self._changes.pop(key, None)  # moved to the end: replayed in the order last made
        self._changes[key] = value
        self.version += 1

    def get(self, key: ChangeKey) -> tuple[bool, Any]:
        if key in self._changes:
            return True, self._changes[key]
        return False, None

    def replay(self, client: Any) -> None:
        for key, value in list(self._changes.items()):  # a snapshot: another thread may record
            _apply(client, key, value)

    def __len__(self) -> int:
        return len(self._changes)


class SharedMap(MutableMapping[str, Any]):
    """A pool's ``headers`` or ``params``: reads from the reference client, writes to every
    replica's client (recorded for the clients created later)."""

    def __init__(self, pool: ClientMembers, name: str) -> None:
        self._pool = pool
        self._name = name

    def _current(self) -> MutableMapping[str, Any]:
        return cast(MutableMapping[str, Any], self._pool._member_value(self._name))

    def __getitem__(self, key: str) -> Any:
        return self._current()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._pool._change(("item", self._name, key), value)

    def __delitem__(self, key: str) -> None:
        if key not in self._current():
            raise KeyError(key)
        self._pool._change(("item", self._name, key), _DELETED)

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._current()))

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return repr(dict(self._current()))


def _state_property(name: str) -> property:
    def get(self: ClientMembers) -> Any:
        if name in SHARED_MAPS:
            return SharedMap(self, name)
        return self._member_value(name)

    def set_(self: ClientMembers, value: Any) -> None:
        if name in SHARED_MAPS:
            value = dict(value)
        self._change(("attr", name), value)

    return property(get, set_, doc=f"``{name}`` of every replica's client (see clickhouse_lb.pools._client_members).")


def _read_only_property(name: str, kind: str) -> property:
    def get(self: ClientMembers) -> Any:
        value = self._member_value(name)
        return MappingProxyType(value) if isinstance(value, dict) else value

    def set_(self: ClientMembers, value: Any) -> None:
        what = "what each replica reports when the pool connects to it" if kind == FACT else "the client class's own"
        raise PoolMemberError(
            f"{name!r} cannot be assigned on a pool: it is {what} (read on the first replica the pool "
            f"connected to; pool.client(address).{name} for another)"
        )

    return property(get, set_, doc=f"``{name}`` as the reference replica's client reports it.")


def _per_replica_property(name: str, note: str) -> property:
    def get(self: ClientMembers) -> Any:
        raise PoolMemberError(f"A pool has one {name!r} per replica: {note.format(name=name)}")

    def set_(self: ClientMembers, value: Any) -> None:
        raise PoolMemberError(f"{name!r} cannot be assigned on a pool: it is per replica, set when its client is made")

    return property(get, set_, doc=f"Per replica: {note.format(name=name)}.")


def on_reference(original: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method with ``original``'s parameters and result that runs on the reference client."""
    name = original.__name__

    def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return cast(R, self._on_reference(name, args, kwargs))

    functools.update_wrapper(method, original)
    method.__doc__ = (
        f"clickhouse-connect's ``{name}`` on the reference client (the first replica the pool connected "
        "to); a query context made here runs on any replica through ``pool.query(context=...)``.\n\n"
        + (original.__doc__ or "")
    )
    return method


class ClientMembers:
    """The non-statement Client members both pools share (no I/O here: the pools give
    :meth:`_reference_client` and the clients). Subclasses: the pools."""

    _changes: ClientChanges
    _reference: int | None
    #: Set at the end of the pool's ``__init__``: from then on, assigning an unknown public
    #: attribute raises instead of creating an attribute nothing reads.
    _sealed = False

    # -- given by the pools ----------------------------------------------------------------

    def _existing_clients(self) -> list[Any]:
        """The pooled clients created so far, the reference client first."""
        clients = [slot.client for slot in getattr(self, "_clients", ()) if slot.client is not None]
        reference = self._reference_or_none()
        if reference is not None:
            clients.remove(reference)
            clients.insert(0, reference)
        return clients

    def _reference_or_none(self) -> Any:
        index = self._reference
        return None if index is None else self._clients[index].client  # type: ignore[attr-defined]

    def _reference_client(self) -> Any:
        """The client explicit calls read from; the sync pool connects one when none exists."""
        raise NotImplementedError

    #: How to connect this kind of pool, for the error of a member read before any replica answered.
    _connect_hint = "call pool.connect() first (get_pool does unless connect_on_create=False)"

    # -- members ---------------------------------------------------------------------------

    def _member_value(self, name: str) -> Any:
        client = self._reference_or_none()
        if client is None:
            recorded, value = self._changes.get(("attr", name))
            if recorded:
                return value
            # No I/O in an attribute read (debuggers, hasattr and IPython completion read them).
            raise PoolMemberError(
                f"{name!r} is read from the first replica the pool connects to, and no replica has "
                f"answered yet: {self._connect_hint}"
            )
        return getattr(client, name)

    def _change(self, key: ChangeKey, value: Any) -> None:
        """Apply one change to the reference client (a value it refuses is refused before
        anything is recorded), record it for the clients to come, then apply it to the other
        existing clients. Recording before looking at the others closes the race with a client
        being made in another thread: either it is in its slot by then, or :meth:`_placed`
        sees the new version and replays."""
        reference = self._reference_or_none()
        if reference is not None:
            _apply(reference, key, value)
        self._changes.record(key, value)
        for client in self._existing_clients():
            if client is not reference:
                _apply(client, key, value)

    def _placed(self, index: int, client: Any, version: int) -> None:
        """A new pooled client is in its slot: it becomes the reference if it is the first, and
        replays again if a change was recorded since ``version`` (taken before it was made)."""
        if self._reference is None:
            self._reference = index
        if self._changes.version != version:
            self._changes.replay(client)

    def set_client_setting(self, key: str, value: Any) -> None:
        """Set a ClickHouse setting on every replica's client, now and on those created later."""
        self._change(("setting", key), value)

    def get_client_setting(self, key: str) -> str | None:
        """The setting's value on the reference client (the same on every client of the pool)."""
        client = self._reference_or_none()
        if client is None:
            recorded, value = self._changes.get(("setting", key))
            if recorded:
                return None if value is None else str(value)
            client = self._reference_client()
        return cast("str | None", client.get_client_setting(key))

    def set_access_token(self, access_token: str) -> None:
        """Use this access token on every replica's client, now and on those created later."""
        self._change(("token",), access_token)

    def min_version(self, version_str: str) -> bool:
        """True when every replica the pool has connected to runs at least ``version_str``
        (answered for the lowest version seen)."""
        clients = self._existing_clients() or [self._reference_client()]
        return all(client.min_version(version_str) for client in clients)

    def _on_reference(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self._reference_client(), method)(*args, **kwargs)

    create_query_context = on_reference(Client.create_query_context)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or not self._sealed or hasattr(type(self), name) or name in self.__dict__:
            object.__setattr__(self, name, value)
            return
        raise AttributeError(unknown_attribute_message(type(self).__name__, name, dir(type(self))))


def unknown_attribute_message(owner: str, name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, [n for n in known if not n.startswith("_")], n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{owner} has no attribute {name!r} to assign (it would be read by nothing){hint}"


def install_members(cls: type) -> None:
    """Add the state, fact and per-replica properties of :data:`MEMBERS` to a pool class."""
    for name, member in MEMBERS.items():
        if member.kind == STATE:
            setattr(cls, name, _state_property(name))
        elif member.kind in (FACT, CONSTANT):
            setattr(cls, name, _read_only_property(name, member.kind))
        elif member.kind == PER_REPLICA:
            setattr(cls, name, _per_replica_property(name, member.note))


install_members(ClientMembers)

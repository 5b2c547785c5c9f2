"""The sync and async pools are one design in two calling conventions: the same public members,
each of the same kind (method, property, attribute), with the same parameters. A member added
to one pool only, or a parameter that drifted, fails here (behaviour is held equal by the
``flavour``-parametrised tests of tests/test_pools.py)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from clickhouse_connect.driver.asyncclient import AsyncClient
from clickhouse_connect.driver.client import Client

from clickhouse_lb.pools._client_api import STATEMENT_METHODS
from clickhouse_lb.pools.aio import AsyncPinnedSession, AsyncReplicaPool
from clickhouse_lb.pools.pool import PinnedSession, ReplicaPool
from clickhouse_lb.pools.sharded import ShardedPool
from clickhouse_lb.pools.sharded_aio import AsyncShardedPool

PAIRS = [(ReplicaPool, AsyncReplicaPool), (PinnedSession, AsyncPinnedSession), (ShardedPool, AsyncShardedPool)]

#: Where the calling convention itself differs: a context manager, and ``await pool``.
CONVENTION = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    if isinstance(member, (staticmethod, classmethod)):
        return type(member).__name__
    if callable(member):
        return "method"
    return "attribute"


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    target = function.fget if isinstance(function, property) else function
    signature = inspect.signature(target)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_the_same_public_members(sync: type, aio: type) -> None:
    assert public(sync) - public(aio) == set(), f"only on {sync.__name__}"
    assert public(aio) - public(sync) == set(), f"only on {aio.__name__}"


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_each_member_has_the_same_kind_and_parameters(sync: type, aio: type) -> None:
    differ = []
    for name in sorted(public(sync)):
        mine, theirs = inspect.getattr_static(sync, name), inspect.getattr_static(aio, name)
        if kind(mine) != kind(theirs):
            differ.append(f"{name}: {kind(mine)} vs {kind(theirs)}")
        elif name in STATEMENT_METHODS and sync in (ReplicaPool, PinnedSession):
            # Mirrors of clickhouse-connect's own methods: each pool takes its client's
            # parameters (Client.raw_insert and AsyncClient.raw_insert differ in clickhouse-connect).
            if parameters(mine) != parameters(getattr(Client, name)):
                differ.append(f"{name}: not Client.{name}'s parameters")
            if parameters(theirs) != parameters(getattr(AsyncClient, name)):
                differ.append(f"{name}: not AsyncClient.{name}'s parameters")
        elif kind(mine) == "method" and parameters(mine) != parameters(theirs):
            differ.append(f"{name}: {parameters(mine)} vs {parameters(theirs)}")
    assert differ == []


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_what_blocks_in_one_is_awaited_in_the_other(sync: type, aio: type) -> None:
    # A method of the async pool that is a coroutine function blocks in the sync pool, and a
    # sync-pool coroutine would be a bug: the pair differs only in the calling convention.
    for name in sorted(public(sync)):
        mine, theirs = inspect.getattr_static(sync, name), inspect.getattr_static(aio, name)
        if kind(mine) == "method":
            assert not inspect.iscoroutinefunction(mine), name
    for mine, theirs in CONVENTION.items():
        assert not inspect.iscoroutinefunction(getattr(sync, mine))
        assert inspect.iscoroutinefunction(getattr(aio, theirs))


def test_the_check_sees_a_member_on_one_side_only() -> None:
    class Drifted(AsyncReplicaPool):
        def only_here(self) -> None: ...

    with pytest.raises(AssertionError, match="only on Drifted"):
        test_the_same_public_members(ReplicaPool, Drifted)

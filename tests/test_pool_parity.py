"""The sync and async pools are one design in two calling conventions: the same public members,
each of the same kind (method, property, attribute), with the same parameters, and the same
behaviour: one script of replica answers and statements gives both pools the same trace of
results, errors, calls, events, counts and stats. A member added to one pool only, a parameter
that drifted, or a pool that decides differently, fails here (the ``flavour``-parametrised tests
of tests/test_pools.py hold named behaviours equal one by one)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from clickhouse_connect.driver.asyncclient import AsyncClient
from clickhouse_connect.driver.client import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clickhouse_lb.pools._client_api import STATEMENT_METHODS
from clickhouse_lb.pools.aio import AsyncPinnedSession, AsyncReplicaPool
from clickhouse_lb.pools.pool import PinnedSession, ReplicaPool
from clickhouse_lb.pools.sharded import ShardedPool
from clickhouse_lb.pools.sharded_aio import AsyncShardedPool

from . import fakes

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


# -- behaviour: the same script on both pools -------------------------------------------------
#
# A script is what each fake replica answers (in order, the last repeating) and a list of
# statements; the trace is everything a user can observe: each statement's result or error
# (its class, and whether a failed write may have been applied), the replica each call reached,
# the events the listeners saw, the error counts and the stats. The two pools must give the
# same trace. Transport error texts differ by design (urllib3's words against aiohttp's), so an
# event's ``error`` text is left out; its kind is compared.

OUTCOMES = ("ok", "refused", "dropped", "timeout", "server")
STATEMENTS = (
    ("query", ("SELECT 1",), {}),
    ("command", ("INSERT INTO t SELECT 1",), {}),
    ("command", ("CREATE TABLE IF NOT EXISTS t (x UInt8) ENGINE Memory",), {"settings": {"idempotent": 1}}),
    ("query", ("SELECT 2",), {"settings": {"load_balancing": "in_order"}}),
    ("insert", ("t", [[1]]), {"column_names": ["x"]}),
    ("ping", (), {}),
    ("session", ("SELECT 3",), {}),
)


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def on_error_recorded(self, event: Any) -> None:
        self.seen.append(("error", event.address, event.kind, event.errors_count))

    def on_failover(self, event: Any) -> None:
        self.seen.append(("failover", event.operation, event.address, event.attempt, event.next_address))

    def on_replica_recovered(self, event: Any) -> None:
        self.seen.append(("recovered", event.address, event.reason))


def _errors_of(flavour: str) -> dict[str, Any]:
    if flavour == "sync":
        return {"refused": fakes.refused, "dropped": fakes.reset_after_send, "timeout": fakes.read_timeout,
                "server": lambda: fakes.server_error(60, "UNKNOWN_TABLE")}
    from . import test_aio

    return {"refused": test_aio.refused, "dropped": test_aio.disconnected, "timeout": test_aio.read_timeout,
            "server": lambda: fakes.server_error(60, "UNKNOWN_TABLE")}


def _outcome(result: Any) -> tuple[Any, ...]:
    if isinstance(result, BaseException):
        return ("raised", type(result).__name__, getattr(result, "may_have_been_applied", None))
    return ("returned", result)


async def _steps(pool: Any, statements: list[int], awaiting: bool) -> list[tuple[Any, ...]]:
    """Run the statements (awaited for the async pool), each outcome recorded."""

    async def value(result: Any) -> Any:
        return await result if awaiting else result

    outcomes = []
    for number in statements:
        method, args, kwargs = STATEMENTS[number]
        try:
            if method == "session":
                pinned = await value(pool.pin())
                try:
                    result: Any = (pinned.address, await value(pinned.query(*args)))
                finally:
                    await value(pinned.close())
            else:
                result = await value(getattr(pool, method)(*args, **kwargs))
        except Exception as exc:
            result = exc
        outcomes.append(_outcome(result))
    return outcomes


def _trace(flavour: str, scripts: dict[str, list[str]], statements: list[int], load_balancing: str) -> Any:
    errors = _errors_of(flavour)
    if flavour == "sync":
        cluster, make_pool = fakes.FakeCluster(*scripts), fakes.make_pool
    else:
        from . import test_aio

        cluster, make_pool = test_aio.AsyncFakeCluster(*scripts), test_aio.make_pool
    for host, script in scripts.items():
        cluster[host].outcomes = ["ok" if o == "ok" else errors[o] for o in script]
    events = _Events()
    pool = make_pool(cluster, load_balancing=load_balancing, listeners=[events])
    if flavour == "sync":
        outcomes = asyncio.run(_steps(pool, statements, awaiting=False))
        pool.close()
    else:

        async def run() -> list[tuple[Any, ...]]:
            try:
                return await _steps(pool, statements, awaiting=True)
            finally:
                await pool.close()

        outcomes = asyncio.run(run())
    calls = [(host, call[0]) for host, replica in cluster.replicas.items() for call in replica.calls]
    return {
        "outcomes": outcomes,
        "calls": sorted(calls),
        "events": events.seen,
        "errors_count": [s.errors_count for s in pool.replicas],
        "stats": pool.stats,
    }


def _async_pool_available() -> bool:
    from . import test_pools

    return "async" in test_pools.FLAVOURS


needs_async = pytest.mark.skipif(not _async_pool_available(), reason="the async pool needs clickhouse-connect >= 1.10")

SCRIPTS = [
    pytest.param({"a": ["ok"], "b": ["ok"]}, [0, 1, 4, 5, 6], "in_order", id="all-answer"),
    pytest.param({"a": ["refused"], "b": ["ok"], "c": ["ok"]}, [0, 0, 1, 5, 6], "in_order", id="one-refuses"),
    pytest.param({"a": ["dropped", "ok"], "b": ["ok"]}, [1, 2, 0], "in_order", id="write-dropped-after-send"),
    pytest.param({"a": ["timeout"], "b": ["timeout"]}, [0, 1, 5, 6], "in_order", id="every-replica-hangs"),
    pytest.param({"a": ["server"], "b": ["ok"]}, [0, 3, 6], "first_or_random", id="query-failure-passes-through"),
    pytest.param({"a": ["refused", "refused", "ok"], "b": ["refused", "ok"], "c": ["ok"]}, [0, 1, 2, 3, 4, 5, 6],
                 "random", id="mixed"),
]


@needs_async
@pytest.mark.parametrize(("scripts", "statements", "load_balancing"), SCRIPTS)
def test_the_same_script_gives_the_same_trace(
    scripts: dict[str, list[str]], statements: list[int], load_balancing: str
) -> None:
    assert _trace("async", scripts, statements, load_balancing) == _trace("sync", scripts, statements, load_balancing)


@needs_async
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts=st.lists(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=4), min_size=1, max_size=3).map(
        lambda lists: {"abc"[i]: script for i, script in enumerate(lists)}
    ),
    statements=st.lists(st.integers(0, len(STATEMENTS) - 1), min_size=1, max_size=6),
    # Not round_robin: its counter starts at a random place per replica set (SystemRandom), so two
    # pools' first replicas differ by design.
    load_balancing=st.sampled_from(["random", "in_order", "first_or_random"]),
)
def test_any_script_gives_the_same_trace(
    scripts: dict[str, list[str]], statements: list[int], load_balancing: str
) -> None:
    assert _trace("async", scripts, statements, load_balancing) == _trace("sync", scripts, statements, load_balancing)


def test_the_trace_tells_scripts_apart() -> None:
    # Guards the comparison: a trace that missed failovers or errors would pass any pair of pools.
    ok = _trace("sync", {"a": ["ok"], "b": ["ok"]}, [0, 1], "in_order")
    refused = _trace("sync", {"a": ["refused"], "b": ["ok"]}, [0, 1], "in_order")
    assert ok["outcomes"] == [("returned", "query@a"), ("returned", "command@a")]
    assert refused["outcomes"] == [("returned", "query@b"), ("returned", "command@b")]
    assert ok["events"] != refused["events"]
    assert ok["errors_count"] != refused["errors_count"]
    assert ok["calls"] != refused["calls"]

"""Read-your-writes in a pool: when it applies to a statement, and the few things it adds to
that statement's run (the decisions are :mod:`clickhouse_lb.core.read_your_writes`'s).

A statement is under read-your-writes when its own ``settings={"read_your_writes": ...}`` says
so, else when the pool's setting is on or a ``with pool.read_your_writes():`` block of this pool
is open in the thread or task. Under it, a write that succeeds is remembered with the replica
that acknowledged it; a read that has recent writes to follow tries their replicas first and,
on any other replica, first waits for it to catch up (``SYSTEM SYNC REPLICA``) within
``read_your_writes_timeout_ms``. Off (the default), the pool's statement path only tests
:attr:`PoolReadYourWrites.armed` and the statement's own setting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NoReturn, TypeVar, cast

from clickhouse_lb.config.read_your_writes import ReadYourWritesSettings
from clickhouse_lb.core._statements import PreparedCall
from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.classify import classify
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.core.race import RaceFailure
from clickhouse_lb.core.read_your_writes import (
    RecentWrite,
    caught_up,
    missing_on,
    order_for_read,
    recent_writes,
    record_write,
    sync_replica_sql,
    written_table,
)
from clickhouse_lb.errors import AttemptAbandonedError, ReadYourWritesError

__all__ = ["PoolReadYourWrites", "ReadYourWritesBlock", "ReadYourWritesMember", "StatementHook"]

F = TypeVar("F", bound=Callable[..., Any])
#: ``catch_up(plan, index, sql, settings)``: the pool runs ``sql`` on replica ``index`` as an attempt of ``plan``.
CatchUp = Callable[[StatementPlan, int, str, dict[str, Any]], Any]
AsyncCatchUp = Callable[[StatementPlan, int, str, dict[str, Any]], Awaitable[Any]]

#: The pools whose ``read_your_writes()`` block is open in this thread or task.
_BLOCKS: ContextVar[tuple[PoolReadYourWrites, ...]] = ContextVar("clickhouse_lb_read_your_writes_blocks", default=())


class PoolReadYourWrites:
    """One pool's read-your-writes: its settings and its open blocks."""

    __slots__ = ("_lock", "_open", "armed", "database", "settings")

    def __init__(self, settings: ReadYourWritesSettings, database: str | None = None) -> None:
        self.settings = settings
        #: The writes' tables are qualified with it when they have no database of their own.
        self.database = database
        #: Whether a statement without its own setting may be under read-your-writes: the pool
        #: setting, or a block of this pool open somewhere (the only test when it is off).
        self.armed = settings.read_your_writes
        self._open = 0
        self._lock = threading.Lock()

    def begin(self, call: PreparedCall, method: str, balancer: Balancer) -> StatementHook | None:
        """What read-your-writes adds to this statement; None: nothing (not under it, or a read
        with no recent write to follow: balanced as ever)."""
        on = call.read_your_writes
        if on is None:
            on = self.settings.read_your_writes or self in _BLOCKS.get()
        if not on:
            return None
        settings, addresses = self.settings, balancer.addresses
        writes = recent_writes(addresses, time.monotonic(), settings.window)
        if call.write:
            # A write goes where the earlier ones are (it needs no catch-up: the order of writes
            # is replication's), so that one replica keeps having all of them for the reads.
            table = written_table(method, call.args, call.kwargs, call.text, self.database)
            return StatementHook(addresses, writes, table, settings, write=True)
        return StatementHook(addresses, writes, None, settings) if writes else None

    def opened(self) -> None:
        with self._lock:
            self._open += 1
            self.armed = True

    def closed(self) -> None:
        with self._lock:
            self._open -= 1
            self.armed = self.settings.read_your_writes or self._open > 0


@dataclass(slots=True, eq=False)
class StatementHook:
    """Read-your-writes for one statement: a write is remembered where it succeeds; a read
    goes to replicas that have ``writes`` first, and makes any other catch up."""

    addresses: Sequence[str]
    writes: tuple[RecentWrite, ...]
    table: str | None
    settings: ReadYourWritesSettings
    _: KW_ONLY
    write: bool = False
    #: When the read's catch-up waits must end (set by the first one).
    deadline: float | None = field(default=None, init=False)

    def order(self, order: list[int]) -> list[int]:
        return order_for_read(order, self.addresses, self.writes) if self.writes else order

    def _steer(self, plan: StatementPlan) -> None:
        # A hedge would send the read to a replica that may not have the write, unsynced.
        if self.writes and not self.write:
            plan.hedgeable = plan.stall_hedgeable = False

    def guard_sync(self, attempt: F, attempts: StatementAttempts, catch_up: CatchUp) -> F:
        """``attempt`` preceded by the catch-up its replica needs, followed by the write's record.
        ``catch_up(plan, index, sql, settings)`` runs the ``SYNC REPLICA`` the way the pool runs
        an attempt of ``plan`` (liveness checks, receive timeout, the plan's deadline)."""
        self._steer(attempts.plan)

        def guarded(index: int) -> Any:
            address = self.addresses[index]
            missing = missing_on(self.writes, address) if not self.write else []
            for table, first in self._tables(missing):
                plan, own = self._catch_up_plan(attempts, first, address)
                try:
                    catch_up(plan, index, sync_replica_sql(table), self._server_bound(plan))
                except Exception as exc:
                    self._raise_failed(exc, first, table, address, own)
            self._synced(missing, address)
            result = attempt(index)
            self._written(address)
            return result

        return cast(F, guarded)

    def guard_async(self, attempt: F, attempts: StatementAttempts, catch_up: AsyncCatchUp) -> F:
        """:meth:`guard_sync` for a coroutine ``attempt`` (and ``catch_up``)."""
        self._steer(attempts.plan)

        async def guarded(index: int) -> Any:
            address = self.addresses[index]
            missing = missing_on(self.writes, address) if not self.write else []
            for table, first in self._tables(missing):
                plan, own = self._catch_up_plan(attempts, first, address)
                try:
                    await catch_up(plan, index, sync_replica_sql(table), self._server_bound(plan))
                except Exception as exc:
                    self._raise_failed(exc, first, table, address, own)
            self._synced(missing, address)
            result = await attempt(index)
            self._written(address)
            return result

        return cast(F, guarded)

    def _catch_up_plan(
        self, attempts: StatementAttempts, write: RecentWrite, address: str
    ) -> tuple[StatementPlan, bool]:
        """How a catch-up waits: as the statement's attempts do (its settings: liveness checks,
        receive timeout), cut at what is left of the read's bound, or at the statement's own
        deadline when that comes sooner (``own``: False). Not hedged: it must run where it is."""
        remaining = self._remaining(write, address)
        base = attempts.plan
        deadline = attempts.deadline
        own = deadline.at is None or deadline.at - time.monotonic() > remaining
        plan = StatementPlan.of(attempts.plan_context, attempts, base.statement, base.settings,
                                Deadline(remaining) if own else deadline)
        plan.hedgeable = plan.stall_hedgeable = False
        return plan, own

    @staticmethod
    def _server_bound(plan: StatementPlan) -> dict[str, Any]:
        # The server stops waiting too (TIMEOUT_EXCEEDED, a clearer answer than a cut connection).
        return {"receive_timeout": round(max(plan.deadline.remaining() or 0.0, 0.001), 3)}

    def _written(self, address: str) -> None:
        if self.write:  # remember who acknowledged it
            record_write(address, self.table, time.monotonic(), self.settings.window)

    @staticmethod
    def _synced(missing: list[RecentWrite], address: str) -> None:
        if missing:  # later reads may go there too
            caught_up([w for w in missing if w.table is not None], address)

    @staticmethod
    def _tables(missing: list[RecentWrite]) -> list[tuple[str, RecentWrite]]:
        """The tables to sync (once each), with the write that asks for each; writes of unknown
        table cannot be caught up with and are left to the window (see docs/read-your-writes.md)."""
        seen: dict[str, RecentWrite] = {}
        for write in missing:
            if write.table is None:
                logger.debug("read-your-writes: a write of unknown table on %s cannot be synced", write.address)
            elif write.table not in seen:
                seen[write.table] = write
        return list(seen.items())

    def _remaining(self, write: RecentWrite, address: str) -> float:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.settings.timeout
        remaining = self.deadline - now
        if remaining <= 0.001:
            raise ReadYourWritesError(write.address, write.table or "?", address, self.settings.timeout,
                                      "no time left after earlier catch-ups")
        return remaining

    def _raise_failed(self, exc: Exception, write: RecentWrite, table: str, address: str, own: bool) -> NoReturn:
        error = exc.error if isinstance(exc, RaceFailure) else exc
        if own and isinstance(error, AttemptAbandonedError) and error.kind == "deadline":
            # The read's bound ran out on a replica that did not answer: no time left for another.
            raise ReadYourWritesError(write.address, table, address, self.settings.timeout,
                                      "no answer within the bound") from error
        if classify(error).replica:
            raise exc  # this replica cannot serve now (refused, hung): fail over, as for the read
        raise ReadYourWritesError(write.address, table, address, self.settings.timeout,
                                  classify(error).reason) from error


class ReadYourWritesBlock:
    """``with pool.read_your_writes():`` (or ``async with``): the block's statements on this pool
    are under read-your-writes. Nests; the thread's or task's writes outlive the block. One
    object may be entered in several threads or tasks at once, and nested: it keeps no state of
    its own (no token), each entry is this context's, in ``_BLOCKS``."""

    __slots__ = ("_pool",)

    def __init__(self, pool: PoolReadYourWrites) -> None:
        self._pool = pool

    def __enter__(self) -> ReadYourWritesBlock:
        _BLOCKS.set((*_BLOCKS.get(), self._pool))
        self._pool.opened()
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.closed()
        blocks = _BLOCKS.get()
        for at in range(len(blocks) - 1, -1, -1):  # this context's innermost entry of the pool
            if blocks[at] is self._pool:
                _BLOCKS.set(blocks[:at] + blocks[at + 1 :])
                return

    async def __aenter__(self) -> ReadYourWritesBlock:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


class ReadYourWritesMember:
    """``pool.read_your_writes()``, the same on both pools."""

    _ryw: PoolReadYourWrites

    def read_your_writes(self) -> ReadYourWritesBlock:
        """``with pool.read_your_writes():`` (``async with`` works too): statements of the block
        on this pool, in this thread or task, are under read-your-writes (as with the pool
        setting ``read_your_writes=1``): a read that follows a write goes to a replica known to
        have it. See docs/read-your-writes.md."""
        return ReadYourWritesBlock(self._ryw)

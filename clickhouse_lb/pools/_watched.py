"""One attempt under the sync pool's watchdog (:mod:`clickhouse_lb.pools._watchdog`): the entry its
caller's thread registers, which the watchdog's thread reads, and, for a read whose first check
came due during a stall, the race of a second run beside the caller's, claimed by one side or
the other without a lock."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import select
from collections.abc import Callable
from functools import partial
from typing import Any

from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.core.race import AttemptMachine, AttemptSpec
from clickhouse_lb.errors import AttemptAbandonedError
from clickhouse_lb.pools._transport import AttemptConnections

__all__ = ["Planned", "Watched", "new_entry", "plan_of"]

#: An entry made by hand (no ``__init__`` call, no keyword arguments: one per statement).
new_entry = object.__new__

#: What an attempt of a statement is run from: its plan, or its attempts (which build the plan
#: only when asked: StatementAttempts.plan).
Planned = StatementPlan | StatementAttempts


def plan_of(planned: Planned) -> StatementPlan:
    return planned if isinstance(planned, StatementPlan) else planned.plan


class Watched(AttemptConnections):
    """One attempt under watch, and the connections it uses (one object per attempt: this runs
    for every statement). To its machine it is the run's handle: never ``done()``, because the
    watchdog stops driving an attempt as soon as its call returns (the caller takes it off)."""

    # What most attempts never set, the class's (see run_planned: one entry per statement).
    verdict: AttemptAbandonedError | None = None
    machine: AttemptMachine | None = None
    #: A ping it waits for came back: resume it now.
    woken = False
    #: Its machine ended (decided): nothing wakes it again.
    over = False
    #: The end of a race, once its machine started a second run beside the caller's (a read
    #: whose check came due while this process stalled): a future of ``(replica index, result)``
    #: the caller waits for. Claimed, by whichever side comes first, with one atomic
    #: ``setdefault`` on the entry's ``__dict__``: the caller, as its call ends, stores None
    #: (nothing may race it from then on); the watchdog, before it starts the second run, the
    #: future (the caller then waits for it).
    race: cf.Future[tuple[int, Any]] | None = None
    #: In a race, the caller's call ended: to its machine this run is then done, with
    #: ``ended_with`` (None: it answered ``value``).
    ended = False
    ended_with: BaseException | None = None
    value: Any = None

    # Set by whoever builds the entry (by hand, no __init__: one per statement, see run_at).
    _source: AttemptSpec | Planned  # what its machine is built from, if it outlives its first wake-up
    index: int
    query_id: str | None
    started: float
    #: The attempt's call (a second run of a race calls it on a worker thread).
    call: Callable[[int, str | None], Any]
    #: When the watchdog next resumes its machine (at first: its first wake-up; inf: never).
    due: float

    @classmethod
    def of_spec(cls, spec: AttemptSpec, query_id: str | None, started: float) -> Watched:
        """The entry of an attempt run from its spec, starting at ``started``."""
        entry: Watched = new_entry(cls)
        entry._source, entry.index, entry.query_id, entry.started, entry.connections = \
            spec, spec.first, query_id, started, []
        entry.connect_timeout = spec.connect_timeout
        entry.due = spec.watch(spec.first, started).next_wake(started)[1] + started
        return entry

    @property
    def planned(self) -> float:
        """When its next wake-up is due."""
        return self.due

    def start_machine(self) -> AttemptMachine:
        source = self._source
        # Not hedged here (the pool sends hedged reads to SyncDriver); a read may still race a
        # second run after a stall, once the race is claimed (see ``race``).
        spec = source if isinstance(source, AttemptSpec) else source.spec(self.index)
        pick = spec.stall_hedge_index
        spec = dataclasses.replace(spec, hedge_index=_no_hedge,
                                   stall_hedge_index=None if pick is None else partial(_claim_race, self, pick),
                                   waiting_on_us=_waiting_on_us)
        self.machine = AttemptMachine(spec, running=(self, self.started, self.query_id))
        return self.machine

    def claim_end(self) -> cf.Future[tuple[int, Any]] | None:
        """The caller's call ended: claim the end (no race may start from now on); the race
        it must wait for if one started first."""
        race: cf.Future[tuple[int, Any]] | None = self.__dict__.setdefault("race", None)
        return race

    # To its machine, the caller's run is done only once its call ended in a race.
    def done(self) -> bool:
        return self.ended

    def exception(self) -> BaseException | None:
        return self.ended_with

    def result(self) -> Any:
        return self.value


def _claim_race(entry: Watched, pick: Callable[[set[int]], int | None], running: set[int]) -> int | None:
    """The machine's ``stall_hedge_index`` for an entry: ``pick``'s replica once the race is
    claimed before the caller's call ended (else None: nothing to race any more)."""
    index = pick(running)
    if index is None:
        return None
    race: cf.Future[tuple[int, Any]] = cf.Future()
    return index if entry.__dict__.setdefault("race", race) is race else None


def _no_hedge(running: set[int]) -> int | None:
    return None


def _waiting_on_us(handle: Any) -> bool:
    """The machine's ``waiting_on_us``: whether the caller's run waits on this process, not on
    its replica: its request has yet to go out (the caller's thread stalled before it sent it),
    or its connection has bytes in the socket that the caller's thread has not read (it is
    waiting for the GIL after a stall)."""
    if not isinstance(handle, Watched):
        return False  # a second run's handle: cannot tell
    if not handle.request_sent:
        return True
    connections = handle.connections
    sock = getattr(connections[-1], "sock", None) if connections else None
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed meanwhile: the caller's read fails, nothing waits
        return False

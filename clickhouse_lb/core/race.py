"""How one attempt runs so that it can be abandoned, and how a hedged read races (sans-I/O).

:func:`run_attempt` is a generator that decides; a driver does the I/O it asks for. The sync
driver (:mod:`clickhouse_lb.pools._drive_sync`: worker threads, ``concurrent.futures.wait``) and the
async one (:mod:`clickhouse_lb.pools._drive_async`: tasks, ``asyncio.wait``) execute the same
commands, so the two pools cannot drift on what a hang, a timeout or a hedge does. (The sync
pool's cheap path for an attempt that is not hedged, :mod:`clickhouse_lb.pools._watchdog`, keeps the
same :class:`~clickhouse_lb.core.watch.AttemptWatch` decisions without a second thread per
statement.)

``Launch(replica, query_id)``
    start the call on replica index ``replica`` (on a worker thread / as a task); answer: a handle
    with ``done()``, ``exception()``, ``result()`` (a Future-like object);
``Wait(handles, timeout)``
    return when one of the handles is done or after ``timeout`` seconds;
``Ping(replica, timeout)``
    is that replica alive (``/ping`` on a separate connection)? answer: a bool, or a
    :class:`~clickhouse_lb.core.stalls.PingReading` (which also tells a stalled waiter);
``Abandon(handle, replica, query_id, kill)``
    stop waiting for that run: close its connection, and with ``kill`` (the replica is alive:
    a lost hedge, a timeout) ask it, best effort and without waiting, to ``KILL QUERY`` the
    run's query id.

The decisions of each wait are :class:`~clickhouse_lb.core.watch.AttemptWatch`'s. The first answer
wins; a run that fails while another still runs is reported (``on_failure``) and the other is
awaited; when the last run fails, :class:`RaceFailure` carries the replica and the error.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from clickhouse_lb.core.stalls import read_check
from clickhouse_lb.core.watch import AttemptWatch, Wake
from clickhouse_lb.errors import AttemptAbandonedError

__all__ = ["Abandon", "AttemptSpec", "Launch", "Ping", "RaceFailure", "Run", "Wait", "run_attempt"]


class Handle(Protocol):
    def done(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> Any: ...


class Launch(NamedTuple):
    replica: int
    query_id: str | None


class Wait(NamedTuple):
    handles: list[Any]
    timeout: float


class Ping(NamedTuple):
    replica: int
    timeout: float


class Abandon(NamedTuple):
    handle: Any
    replica: int
    query_id: str | None
    #: Also ask the replica to KILL the query (it is alive; pointless for a hung one).
    kill: bool


Command = Launch | Wait | Ping | Abandon


class RaceFailure(Exception):
    """The last run of an attempt failed: on replica ``index`` with ``error``."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


@dataclass
class Run:
    index: int
    handle: Any
    watch: AttemptWatch
    query_id: str | None
    started: float


@dataclass
class AttemptSpec:
    """What one attempt needs decided (everything the generator asks outside itself)."""

    first: int
    clock: Callable[[], float]
    #: A watch for a run starting now on a replica (deadline, receive timeout, liveness, hedge delay).
    watch: Callable[[int, float], AttemptWatch]
    #: The replica to hedge to (the next one of the plan not already running), or None.
    hedge_index: Callable[[set[int]], int | None] = lambda running: None
    #: A fresh query id for a run (so a lost hedge can be killed), or None to let the client pick.
    query_id: Callable[[], str | None] = lambda: None
    address: Callable[[int], str] = str
    write: bool = False
    #: The exact connect timeout of a run, cut to the statement's deadline (None: the client's).
    connect_timeout: float | None = None
    #: A run failed while another kept going (count it now).
    on_failure: Callable[[int, BaseException], object] = lambda index, exc: None
    #: A run lost a hedged race: the replica was slower (count a slowdown).
    on_slower: Callable[[int], object] = lambda index: None
    #: The winner's replica and latency in seconds (for the adaptive hedge delay).
    on_latency: Callable[[int, float], object] = lambda index, seconds: None
    #: A run lost the race after running this many seconds unanswered (its replica is at least
    #: that slow: the adaptive hedge delay learns from the losers too).
    on_unanswered: Callable[[int, float], object] = lambda index, seconds: None
    #: A hedge started on this replica (the extra load hedging costs).
    on_hedge: Callable[[int], object] = lambda index: None


def run_attempt(spec: AttemptSpec) -> Generator[Command, Any, tuple[int, Any]]:
    """Decide one attempt (and its hedge): yields commands, returns ``(replica index, result)``,
    raises :class:`RaceFailure`."""
    clock = spec.clock
    runs: list[Run] = []

    def launch(index: int, *, hedge: bool = False) -> Generator[Command, Any, None]:
        query_id = spec.query_id()
        started = clock()
        handle = yield Launch(index, query_id)
        watch = spec.watch(index, started)
        if hedge:
            watch.hedged()  # one hedge per attempt: the hedge itself is not hedged again
        runs.append(Run(index, handle, watch, query_id, started))

    def abandoned(run: Run, kind: str, detail: str) -> AttemptAbandonedError:
        return AttemptAbandonedError(spec.address(run.index), kind, detail, write=spec.write)

    yield from launch(spec.first)
    planned = clock()  # when the current wake-up was due (to tell a stalled process)
    while True:
        for run in list(runs):
            if not run.handle.done():
                continue
            error = run.handle.exception()
            if error is None:
                ended = clock()
                for other in runs:
                    if other is not run:
                        yield Abandon(other.handle, other.index, other.query_id, True)
                        spec.on_slower(other.index)
                        spec.on_unanswered(other.index, ended - other.started)
                spec.on_latency(run.index, ended - run.started)
                return run.index, run.handle.result()
            runs.remove(run)
            if not runs:
                raise RaceFailure(run.index, error)
            spec.on_failure(run.index, error)
        now = clock()
        wakes = [(run, *run.watch.next_wake(now)) for run in runs]
        run, wake, delay = min(wakes, key=lambda w: w[2])
        if delay > 0:
            planned = now + delay
            yield Wait([r.handle for r in runs], delay)
            continue
        if wake is Wake.DEADLINE:
            for other in runs:
                yield Abandon(other.handle, other.index, other.query_id, True)
            waited = now - run.started
            raise RaceFailure(run.index, abandoned(run, "deadline", f"failover_timeout ran out after {waited:.3f}s"))
        if wake is Wake.HEDGE:
            if run.watch.defer_hedge(now, now - planned):
                continue
            run.watch.hedged()
            index = spec.hedge_index({r.index for r in runs})
            if index is not None:
                spec.on_hedge(index)
                yield from launch(index, hedge=True)
            continue
        if wake is Wake.CHECK:
            timeout = run.watch.ping_timeout(now)
            answer = yield Ping(run.index, timeout)
            pinged = clock()
            # Woke up late, or the ping's wait did: this process stalled, not the replica.
            check = read_check(answer, woke_late=now - planned, elapsed=pinged - now, timeout=timeout,
                               tolerance=run.watch.liveness.stall_tolerance)
            planned = pinged
            if not run.watch.checked(check.alive, pinged, stalled=check.stalled, hard=check.hard):
                continue
            error = abandoned(run, "hung", f"no answer to /ping within {run.watch.liveness.ping_timeout:g}s "
                                           f"after waiting {now - run.started:.3f}s")
        else:  # RECEIVE_TIMEOUT
            limit = (run.watch.receive_at or run.started) - run.started
            error = abandoned(run, "receive_timeout", f"timed out: no answer within {limit:g}s")
        yield Abandon(run.handle, run.index, run.query_id, wake is not Wake.CHECK)
        runs.remove(run)
        if not runs:
            raise RaceFailure(run.index, error)
        spec.on_failure(run.index, error)

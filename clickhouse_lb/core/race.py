"""The attempt machine: how one attempt waits, is checked, hedged, cut at the deadline and
abandoned, decided in one place without I/O.

:func:`run_attempt` is a generator that decides; a driver does the I/O it asks for, and only
that. Three drivers carry out the same commands: the sync pool's worker threads
(:mod:`clickhouse_lb.pools._drive_sync`), the async pool's tasks
(:mod:`clickhouse_lb.pools._drive_async`), and the sync pool's watchdog
(:mod:`clickhouse_lb.pools._watchdog`), for an attempt that runs on its caller's own thread. So
every rule (when to wake, what a failed ping means, when a hedge starts, what the deadline
cuts) and every abandon message is written here once; the drivers cannot drift.

``Launch(replica, query_id)``
    start the call on replica index ``replica`` (on a worker thread / as a task); answer: a handle
    with ``done()``, ``exception()``, ``result()`` (a Future-like object);
``Wait(handles, timeout)``
    return when one of the handles (runs, pings) is done or after ``timeout`` seconds (None: no
    timeout);
``Ping(replica, timeout)``
    start a liveness check of that replica (``/ping`` on a separate connection) and answer at
    once with its handle; its ``result()`` is a bool or a
    :class:`~clickhouse_lb.core.stalls.PingReading` (an ``exception()`` counts as no answer).
    The ping is not waited for in place: while it is out the attempt's answer and the deadline
    still end the wait;
``Abandon(handle, replica, query_id, kill, error)``
    stop waiting for that run: close its connection, and with ``kill`` (the replica is alive:
    a lost hedge, a timeout) ask it, best effort and without waiting, to ``KILL QUERY`` the
    run's query id. ``error``: why it was given up (None: it lost a hedged race), the verdict a
    caller blocked in that run raises.

A driver may start the machine on a run it has already started (``running=``): the watchdog
does, when a run outlives its first wake-up, so the common statement, answered before that,
costs no machine at all.

The decisions of each wait are :class:`~clickhouse_lb.core.watch.AttemptWatch`'s. A read whose
first check came due while this process stalled is raced on another replica beside that check
(``AttemptSpec.stall_hedge_index``; see :meth:`~clickhouse_lb.core.watch.AttemptWatch.after_stall`),
hedging or not: the watchdog carries out that ``Launch`` too. The first answer
wins; a run that fails while another still runs is reported (``on_failure``) and the other is
awaited; when the last run fails, :class:`RaceFailure` carries the replica and the error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

from clickhouse_lb.core.stalls import PingReading, read_check
from clickhouse_lb.core.watch import AttemptWatch, StallStep, Wake
from clickhouse_lb.errors import AttemptAbandonedError

__all__ = ["Abandon", "AttemptMachine", "AttemptSpec", "Launch", "Ping", "RaceFailure", "Run", "Wait",
           "run_attempt"]


class Handle(Protocol):
    def done(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> Any: ...


class Launch(NamedTuple):
    replica: int
    query_id: str | None


class Wait(NamedTuple):
    handles: list[Any]
    timeout: float | None


class Ping(NamedTuple):
    replica: int
    timeout: float


class Abandon(NamedTuple):
    handle: Any
    replica: int
    query_id: str | None
    #: Also ask the replica to KILL the query (it is alive; pointless for a hung one).
    kill: bool
    #: Why the run was given up (None: it lost a hedged race to another run).
    error: AttemptAbandonedError | None = None


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
    #: The handle of its liveness check while one is out.
    ping: Any = None
    #: When that check was due and started, how late it started, and its timeout.
    check_at: float = 0.0
    check_late: float = 0.0
    check_timeout: float = 0.0


@dataclass
class AttemptSpec:
    """What one attempt needs decided (everything the generator asks outside itself)."""

    first: int
    clock: Callable[[], float]
    #: A watch for a run starting now on a replica (deadline, receive timeout, liveness, hedge delay).
    watch: Callable[[int, float], AttemptWatch]
    #: The replica to hedge to (the next one of the plan not already running), or None.
    hedge_index: Callable[[set[int]], int | None] = lambda running: None
    #: The replica to race a read on when its first check came due during a stall of this
    #: process (:meth:`~clickhouse_lb.core.watch.AttemptWatch.after_stall`), or None; the whole
    #: field None: never (a write, a read that must stay on its replica).
    stall_hedge_index: Callable[[set[int]], int | None] | None = None
    #: Whether a run (given its handle) waits on this process, not on its replica: its request
    #: has yet to go out, or its answer's bytes are in the socket unread. Such a read is not raced
    #: after a stall. None: the driver cannot tell.
    waiting_on_us: Callable[[Any], bool] | None = None
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


def abandon_message(
    kind: str, watch: AttemptWatch, started: float, waited_until: float, ping_timeout: float | None = None
) -> str:
    """The one text of each way an attempt is given up (``kind``: deadline, hung, receive_timeout).
    ``hung``: the last check's ping timeout (a write's grows with each failed check) and how
    long the attempt had waited when that check was sent."""
    if kind == "deadline":
        return f"failover_timeout ran out after {waited_until - started:.3f}s"
    if kind == "hung":
        timeout = watch.liveness.ping_timeout if ping_timeout is None else ping_timeout
        return f"no answer to /ping within {timeout:.3g}s after waiting {waited_until - started:.3f}s"
    limit = (watch.receive_at or started) - started
    return f"timed out: no answer within {limit:g}s"


def run_attempt(
    spec: AttemptSpec, running: tuple[Any, float, str | None] | None = None
) -> Generator[Command, Any, tuple[int, Any]]:
    """Decide one attempt (and its hedge): yields commands, returns ``(replica index, result)``,
    raises :class:`RaceFailure`. ``running``: the first run is already out, as ``(handle,
    started, query_id)`` (the machine then begins at that run's first wake-up)."""
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

    def abandoned(run: Run, kind: str, waited_until: float) -> AttemptAbandonedError:
        detail = abandon_message(kind, run.watch, run.started, waited_until, run.check_timeout or None)
        return AttemptAbandonedError(spec.address(run.index), kind, detail, write=spec.write)

    def give_up(run: Run, error: AttemptAbandonedError, *, kill: bool) -> Generator[Command, Any, None]:
        """Abandon one run; the attempt fails with ``error`` when it was the last."""
        yield Abandon(run.handle, run.index, run.query_id, kill, error)
        runs.remove(run)
        if not runs:
            raise RaceFailure(run.index, error)
        spec.on_failure(run.index, error)

    if running is None:
        yield from launch(spec.first)
        planned = clock()  # when the current wake-up was due (to tell a stalled process)
    else:
        handle, started, query_id = running
        watch = spec.watch(spec.first, started)
        runs.append(Run(spec.first, handle, watch, query_id, started))
        planned = started + watch.next_wake(started)[1]  # its first wake-up, due now
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
        for run in list(runs):
            ping = run.ping
            if ping is None or not ping.done():
                continue
            run.ping = None
            answer = ping.result() if ping.exception() is None else False
            if isinstance(answer, PingReading):
                # The timeout the ping was given (adapted to the replica's history: at least the
                # check's), which a hung verdict names.
                run.check_timeout = max(run.check_timeout, answer.timeout)
            pinged = clock()
            # Woke up late, or the ping's wait did: this process stalled, not the replica.
            check = read_check(answer, woke_late=run.check_late, elapsed=pinged - run.check_at,
                               timeout=run.check_timeout, tolerance=run.watch.liveness.stall_tolerance,
                               retry_safe=run.watch.retry_safe)
            planned = pinged
            if run.watch.checked(check.alive, pinged, stalled=check.stalled, hard=check.hard):
                yield from give_up(run, abandoned(run, "hung", run.check_at), kill=False)
        now = clock()
        wakes = [(run, *run.watch.next_wake(now)) for run in runs]
        run, wake, delay = min(wakes, key=lambda w: w[2])
        if delay > 0:
            planned = now + delay
            handles = [r.handle for r in runs]
            handles.extend(r.ping for r in runs if r.ping is not None)
            yield Wait(handles, None if delay == math.inf else delay)
            continue
        if wake is Wake.DEADLINE:
            error = abandoned(run, "deadline", now)
            for other in runs:
                yield Abandon(other.handle, other.index, other.query_id, True,
                              error if other is run else abandoned(other, "deadline", now))
            raise RaceFailure(run.index, error)
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
            late = now - planned
            if spec.stall_hedge_index is not None and len(runs) == 1:
                peek = spec.waiting_on_us
                step = run.watch.after_stall(now, late, None if peek is None else partial(peek, run.handle))
                if step is StallStep.SETTLE:
                    continue
                if step is not StallStep.CHECK:
                    late = max(late, run.watch.stalled_by)  # the check still started after a stall
                if step is StallStep.HEDGE:
                    run.watch.hedged()
                    index = spec.stall_hedge_index({run.index})
                    if index is not None:
                        spec.on_hedge(index)
                        yield from launch(index, hedge=True)
            run.check_at, run.check_late = now, late
            run.check_timeout = run.watch.ping_timeout(now)
            run.watch.checking()
            run.ping = yield Ping(run.index, run.check_timeout)
            continue
        # RECEIVE_TIMEOUT
        yield from give_up(run, abandoned(run, "receive_timeout", now), kill=True)


class AttemptMachine:
    """:func:`run_attempt` stepped by a driver: :meth:`send` gives the driver's answer to the
    last command and returns the next one, or None once the attempt is decided (``outcome``
    then holds ``(replica index, result)``); a failed attempt raises :class:`RaceFailure`.

    A driver that loops iterates it instead: each command in turn, the driver's answer to it
    set as ``reply`` (None when a command has none)."""

    __slots__ = ("_steps", "outcome", "reply")

    def __init__(self, spec: AttemptSpec, running: tuple[Any, float, str | None] | None = None) -> None:
        self._steps = run_attempt(spec, running)
        self.outcome: tuple[int, Any] = (spec.first, None)
        self.reply: Any = None

    def __iter__(self) -> Iterator[Command]:
        command = self.send()
        while command is not None:
            self.reply = None
            yield command
            command = self.send(self.reply)

    def send(self, reply: Any = None) -> Command | None:
        try:
            return self._steps.send(reply)
        except StopIteration as stop:
            self.outcome = stop.value
            return None

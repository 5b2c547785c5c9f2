"""The sync pool's cheap path for an attempt that is not hedged: the statement runs on the
caller's own thread, and one watchdog thread per pool carries out the attempt machine's
commands (:class:`~clickhouse_lb.core.race.AttemptMachine`: liveness checks, the receive timeout,
the deadline) for every running attempt. To abandon an attempt the watchdog shuts its
connections down (:class:`~clickhouse_lb.pools._transport.AttemptConnections`): the caller's blocked
read fails at once and the caller raises the machine's verdict (the ``error`` of its
``Abandon``).

It decides nothing itself. Per statement it only notes when the attempt's first wake-up is due
(:func:`~clickhouse_lb.core.watch.first_wake`, no machine, no thread hand-off: that would cost
more than the pool's whole bookkeeping); the machine is built, on the watchdog thread, only for
an attempt that outlives that moment. Hedged reads need two runs at once and go through
:class:`~clickhouse_lb.pools._drive_sync.SyncDriver`; so does a pool whose connections cannot be
shut down from outside (no abandonable transport). One race starts here all the same: a read
whose first check came due while this process stalled gets a second run on a worker thread
(the machine's ``Launch``), and its caller then returns whichever answers first
(:mod:`clickhouse_lb.pools._watched`).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.core.race import Abandon, AttemptSpec, Command, Launch, Ping, RaceFailure, Wait
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.core.watch import first_wake
from clickhouse_lb.pools._drive_sync import abandon_run, kill_quietly, launch_on_thread
from clickhouse_lb.pools._leftovers import release
from clickhouse_lb.pools._threads import attempt_executor, check_executor
from clickhouse_lb.pools._transport import get_ident, running
from clickhouse_lb.pools._watched import Planned, Watched, new_entry, plan_of

__all__ = ["Watchdog"]

T = TypeVar("T")

#: Seconds: the shortest while between two looks of an idle watchdog thread.
_SHORTEST_LOOK = 0.05


class Watchdog:
    """Watches the attempts running on their callers' threads. ``ping(index, timeout)``: a
    liveness check; ``kill(index, query_id)``: a best-effort KILL QUERY."""

    def __init__(
        self,
        ping: Callable[[int, float], bool | PingReading],
        kill: Callable[[int, str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        idle_exit: float = 10.0,
    ) -> None:
        self._ping = ping
        self._kill = kill
        self._clock = clock
        # The condition's own lock, taken directly on the per-attempt path (cheaper than the
        # condition's Python-level context manager).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._wakes_at = math.inf  # when the watchdog thread means to wake up next
        self._checks = check_executor()
        self._idle_exit = idle_exit
        # How far ahead of its start the last attempt that told the watchdog was due (its first
        # wake-up: check_after, the receive timeout...): while idle, the thread looks again that
        # far ahead (see _loop), so that attempts started since then, due no sooner, need not
        # wake it one by one. inf: none told it yet.
        self._lead = math.inf
        # When the thread last found nothing to watch (None: it found something at its last look).
        self._idle_since: float | None = None
        #: Entries whose machine started a second run, until their race ends (under the lock).
        self._racing: set[Watched] = set()

    def run(self, spec: AttemptSpec, call: Callable[[int, str | None], T]) -> tuple[int, T]:
        """Run ``call`` on this thread under watch: ``(replica that answered, result)``; raises
        the machine's verdict when it abandoned the attempt, the call's own error otherwise."""
        query_id = spec.query_id()
        started = self._clock()
        entry = Watched.of_spec(spec, query_id, started)
        # (the spec stands in for a plan: with its entry given, run_at reads nothing of it)
        result = self.run_at(cast(Planned, spec), call, spec.first, entry)
        race = entry.race
        winner = race.result()[0] if race is not None and race.done() else spec.first
        if winner == spec.first:  # (a race's machine reported its winner's latency itself)
            spec.on_latency(spec.first, self._clock() - started)
        return winner, result

    def run_planned(self, plan: StatementPlan, index: int, call: Callable[[int, str | None], T]) -> T:
        """:meth:`run` for an attempt of a statement's plan (not hedged) on replica ``index``,
        without building its :class:`~clickhouse_lb.core.race.AttemptSpec`: the per-statement path."""
        return self.run_at(plan, call, index)

    def run_at(
        self, plan: Planned, call: Callable[[int, str | None], T], index: int,
        entry: Watched | None = None,
    ) -> T:
        """:meth:`run_planned` with the replica last: ``partial(watchdog.run_at, attempts, call)`` is a
        statement's attempt (no closure of the pool's, one call less). ``plan``: the statement's
        :class:`StatementPlan`, or its :class:`StatementAttempts`, whose plan is built only if the
        attempt outlives its first wake-up (``entry``: built already, from a spec, by :meth:`run`).

        ``call`` runs on this thread, its entry registered meanwhile (one function for both, the
        entry's making and its watch: a statement's path calls one frame fewer). One
        registration, no lock: the entry is this thread's running attempt (where its
        connections register, see :mod:`clickhouse_lb.pools._transport`), which the watchdog
        thread reads as a snapshot; it is told only when this attempt is due sooner than it
        means to wake up anyway (see :meth:`_loop`: while it looks, it means to wake up never,
        so that no attempt registered meanwhile goes unseen). An attempt with nothing to wait
        for (no liveness check, timeout or deadline: due never) tells it nothing."""
        if entry is None:
            settings = plan.settings
            # The entry built by hand (no __init__ call, no keyword arguments: one per statement).
            entry = new_entry(Watched)
            entry._source, entry.index, entry.connections = plan, index, []
            deadline_at = plan.deadline.at
            if deadline_at is None:  # the usual statement: no query id of the pool's, nothing to cut
                entry.query_id, entry.connect_timeout = plan.query_id, settings.timeouts.connect
                entry.started = started = self._clock()
                entry.due = started + settings.first_wake_after  # first_wake() without a deadline, computed once
            else:
                full = plan_of(plan)
                entry.query_id, entry.connect_timeout = full.run_query_id(None)(), full.connect_timeout()
                entry.started = started = self._clock()
                entry.due = first_wake(started, settings.liveness, settings.timeouts.receive, deadline_at)
        entry.watcher, entry.call = self, call
        thread = get_ident()
        running[thread] = entry
        first = entry.due
        if first < self._wakes_at:
            self._notify(first, entry.started)
        try:
            value: T = call(entry.index, entry.query_id)
        except Exception as exc:
            del running[thread]
            race = entry.claim_end()
            if entry.abandoned:
                entry.close_abandoned()
            verdict = entry.verdict
            if race is None and verdict is None:
                raise
            if race is not None:  # raced: the race's end is the attempt's
                self._ended(entry, exc, None)
            release(exc)
            del exc
        except BaseException as exc:  # KeyboardInterrupt: leave no second run behind
            del running[thread]
            if entry.claim_end() is not None:
                self._ended(entry, exc, None)
            raise
        else:
            del running[thread]
            # entry.claim_end(), inlined (every statement passes here)
            if entry.__dict__.setdefault("race", None) is not None:  # this run answered first: the second is abandoned
                self._ended(entry, None, value)
            elif entry.abandoned:
                entry.close_abandoned()
            return value
        # (outside the handler: the verdict is not chained to the call's error)
        if race is not None:
            winner, value = self._race_end(entry, race)
            if winner != entry.index and isinstance(plan, StatementAttempts):  # (run() reads the winner itself)
                plan.answered_by = winner
            return value
        assert verdict is not None
        raise verdict

    def _ended(self, entry: Watched, error: BaseException | None, value: Any) -> None:
        """The caller's call of a raced entry ended: its machine decides the race on (wakes now)."""
        entry.ended_with, entry.value = error, value
        with self._cond:
            entry.ended = entry.woken = True
            self._cond.notify()

    @staticmethod
    def _race_end(entry: Watched, race: cf.Future[tuple[int, Any]]) -> tuple[int, Any]:
        """Wait for the race the caller's run was part of: ``(the winner, its result)``, or the
        :class:`RaceFailure` of its last run (which the failover loop reads as that run's)."""
        try:
            return race.result()
        except BaseException:
            if not race.done():  # interrupted while waiting: nothing of the race is left running
                entry.abandon()
            raise

    def _notify(self, first: float, started: float) -> None:
        """An attempt started at ``started`` is due at ``first``, sooner than the watchdog means
        to wake up: tell it (starting its thread when none runs)."""
        with self._lock:
            self._lead = first - started
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, name="clickhouse-lb-watchdog", daemon=True)
                self._thread.start()
            if first < self._wakes_at:
                self._wakes_at = first
                self._cond.notify()

    def _mine(self) -> list[Watched]:
        """A snapshot of this watchdog's running attempts (every thread's attempt, read at once),
        but those it will never act on (due never, no machine: nothing to wait for), which must
        not keep it from ending when idle."""
        mine = [entry for entry in list(running.values())
                if isinstance(entry, Watched) and entry.watcher is self
                and (entry.due != math.inf or entry.machine is not None)]
        if self._racing:  # (raced entries are driven to the race's end, their caller's call over or not)
            mine.extend(entry for entry in self._racing if entry not in mine)
        return mine

    # -- the watchdog thread -----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    self._wakes_at = math.inf
                    self._thread = None
                    return
                # While it looks, it means to wake up never: an attempt registered during the
                # look that this snapshot misses finds ``_wakes_at`` infinite and notifies
                # (under the lock, so the notify lands in the wait below).
                self._wakes_at = math.inf
                now = self._clock()
                watched = self._mine()
                due = [entry for entry in watched if entry.woken or entry.due <= now]
                if not due:
                    if not watched:
                        tick = self._idle_look(now)
                        if tick is None:
                            self._thread = None  # (_wakes_at stays infinite: the next attempt starts one)
                            return
                        self._cond.wait(tick)
                        continue
                    self._idle_since = None
                    self._wakes_at = min(entry.due for entry in watched)
                    self._cond.wait(None if self._wakes_at == math.inf else self._wakes_at - now)
                    continue
                self._wakes_at = now
                self._idle_since = None
                for entry in due:
                    # Cleared before its machine looks at its pings: a ping that comes back
                    # after that look wakes it again.
                    entry.woken = False
                    entry.due = math.inf
            for entry in due:
                try:
                    self._advance(entry)
                except Exception:  # pragma: no cover - a defect: it must not end every attempt's watch
                    logger.exception("the watchdog failed to advance an attempt on replica %d", entry.index)

    def _idle_look(self, now: float) -> float | None:
        """Nothing to watch at ``now`` (the condition held): None when it has been so for a
        whole ``idle_exit`` (then the thread ends: a pool nobody closes must not keep one; the
        next attempt starts a new one); else how long to wait until the next look.

        The next look is planned ``lead`` ahead (the lead of the last attempt that told the
        watchdog), not "never": an attempt that starts after now is due no sooner than that
        (unless its own first wake-up is sooner: then it tells the watchdog, as always), so it
        need not wake this thread. Planned "never", every attempt that came and went before a
        look would make the next one wake the thread again: a thread wake-up per statement
        for statements spaced apart (BENCHMARKS.md, the real mix)."""
        since = self._idle_since
        if since is None:
            since = self._idle_since = now
        left = since + self._idle_exit - now
        if left <= 0:
            self._idle_since = None
            return None
        # (never shorter than _SHORTEST_LOOK: an attempt due at once, its deadline past, must not
        # make an idle thread spin; any look ahead is correct, a shorter due tells the thread)
        tick = min(max(self._lead, _SHORTEST_LOOK), left)
        self._wakes_at = now + tick
        return tick

    def _advance(self, entry: Watched) -> None:
        """Resume the entry's machine and carry out its commands until it waits again."""
        if entry.over:
            return  # decided (a ping that came back after its deadline woke it again)
        machine = entry.machine or entry.start_machine()
        try:
            command = machine.send()
            while command is not None and not isinstance(command, Wait):
                command = machine.send(self._carry_out(entry, command))
        except RaceFailure as failure:
            # Given up: its Abandon carried the verdict (the entry stays due never); a race's
            # caller raises the failure of its last run.
            self._race_over(entry, failure)
            return
        if command is None:
            self._race_over(entry, None)
            return
        with self._lock:
            entry.due = math.inf if command.timeout is None else self._clock() + command.timeout

    def _race_over(self, entry: Watched, failure: RaceFailure | None) -> None:
        """The entry's machine ended: the end of its race, if it raced, for the caller."""
        entry.over = True
        race = entry.race
        if race is None or race.done():
            return
        with self._lock:
            self._racing.discard(entry)
            entry.due = math.inf
        if failure is not None:
            race.set_exception(failure)
        else:
            assert entry.machine is not None
            race.set_result(entry.machine.outcome)

    def _carry_out(self, entry: Watched, command: Command) -> Any:
        if isinstance(command, Ping):
            future = self._checks.submit(self._ping, command.replica, command.timeout)
            future.add_done_callback(lambda done: self._wake(entry))
            return future
        if isinstance(command, Abandon):
            if command.handle is not entry:  # the second run of a race
                abandon_run(command, self._kill)
                return None
            entry.verdict = command.error  # before the connections close: the caller reads it then
            if not entry.ended:  # (a call that ended has nothing left to cut)
                entry.abandon()
            if command.kill and command.query_id:
                self._checks.submit(kill_quietly, self._kill, command.replica, command.query_id)
            return None
        if isinstance(command, Launch):  # the second run of a race (see _claim_race)
            run = launch_on_thread(attempt_executor(), entry.call, command, entry.connect_timeout)
            with self._lock:
                self._racing.add(entry)
            run.future.add_done_callback(lambda done: self._wake(entry))
            return run
        return None

    def _wake(self, entry: Watched) -> None:
        with self._cond:
            entry.woken = True
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

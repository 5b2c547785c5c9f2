"""What a driver waiting for one attempt's answer does next (pure; the clock is passed in).

An attempt's request is out; the caller waits for the answer. It wakes up for the earliest of:

* ``DEADLINE``: the statement's ``failover_timeout`` ran out: abandon the attempt, the
  statement raises :class:`~clickhouse_lb.errors.StatementTimeoutError`;
* ``RECEIVE_TIMEOUT``: no answer within the attempt's ``receive_timeout``: abandon, a replica
  failure (failover as usual);
* ``HEDGE``: a hedged read's delay passed without an answer: start the same read on the next
  replica (see :mod:`clickhouse_lb.core.hedging`);
* ``CHECK``: the attempt has waited ``liveness_check_after_ms`` (then every
  ``liveness_check_interval_ms``): ping the replica on a separate connection, with
  ``liveness_ping_timeout_ms``. ClickHouse answers ``/ping`` from its own thread, so a busy
  replica answers while a hung one (stopped process, black hole, wedged server) does not.
  A replica that answers keeps its attempt, however long the query runs; one that does not is
  hung: abandon the attempt (a replica failure) after one failed check for a statement that is
  safe to repeat elsewhere, and after ``liveness_failed_checks_for_writes`` consecutive ones for
  a write that is not (it cannot fail over, so a false alarm would cost an error the user sees,
  not just a retry). A failed ping during which this process itself ran late (the check woke
  up, or the ping's timeout fired, more than ``stall_tolerance`` after planned: a loaded machine,
  a busy event loop) is inconclusive and repeated (a false alarm would take a healthy replica
  out of rotation until its error decays), unless the ping's socket, looked at after the stall,
  was still silent: the kernel received meanwhile, the replica had the whole timeout
  (:mod:`clickhouse_lb.core.stalls`), and for a read that counts as a check on time does; and
  a read whose checks all went unanswered for
  ``STALLED_SILENCE`` (1 s), stalls or not, is given up (a process stalled back to back would
  otherwise never leave a stopped replica). For a write that is not safe to repeat, stalled checks
  never count: it is given up only when its replica is shown gone (a ping refused or reset, or
  ``liveness_failed_checks_for_writes`` pings in a row, each on a fresh connection, failing
  while this process ran on time). What counts as a stall is judged in
  :mod:`clickhouse_lb.core.stalls`, shared with the health probes.

Defaults: check after 100 ms, ping timeout 150 ms, so a read that went to a hung replica moves
on after about 0.25 s (the next replica's answer included, under 0.5 s: see BENCHMARKS.md); a
healthy replica is pinged once a second while a long query runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from clickhouse_lb.config.liveness import LIVENESS_DEFAULTS, LivenessPolicy

__all__ = ["CAUGHT_UP_SHARE", "STALLED_SILENCE", "STALL_RACE_FACTOR", "WRITE_PING_GROWTH", "AttemptWatch",
           "LivenessPolicy", "StallStep", "Wake", "first_wake"]


#: How much longer each further check of an unsafe write waits (see :meth:`AttemptWatch.ping_timeout`).
#: Doubling (0.15 + 0.3 + 0.6 s) was too little: a healthy LocalCluster replica running
#: clickhouse-connect's own suite (``test_temporary_tables``) left ``/ping`` unanswered 2.0 s, and
#: its session's ``CREATE TEMPORARY TABLE`` was failed as an unknown outcome after 1.45 s.
WRITE_PING_GROWTH = 4


#: How long a read's checks may go unanswered, stalled or not, before the replica counts as hung
#: (seconds, from the first unanswered check): about four capped ping timeouts. A saturated but
#: live replica answered every ping within 0.38 s (BENCHMARKS.md); a write never counts stalled
#: checks (it cannot fail over).
STALLED_SILENCE = 1.0


#: How many ``stall_tolerance``s late a read's first check must come due for the read to be raced
#: after the stall (:meth:`AttemptWatch.after_stall`).
STALL_RACE_FACTOR = 3

#: How late (a share of ``stall_tolerance``) a settle's own wake-up may be for this process to
#: count as caught up after the stall, where the driver cannot look at the run's socket (the
#: asyncio driver; :meth:`AttemptWatch.after_stall`). Later than that, it is still reading what
#: arrived during the stall: an event loop with 10 answers in hand after a 0.8 s hold took longer
#: than one 50 ms settle to read them, and the reads whose answers were in hand were raced (moved
#: to other replicas: a busy-machine run's 10 concurrent nearest_hostname reads came out 8 / 1 / 1).
CAUGHT_UP_SHARE = 0.25


class _Budget(Protocol):
    def available(self) -> bool: ...


class Wake(str, Enum):
    DEADLINE = "deadline"
    RECEIVE_TIMEOUT = "receive_timeout"
    HEDGE = "hedge"
    CHECK = "check"


class StallStep(str, Enum):
    """What a read's first liveness check does when its waiter woke up late (:meth:`AttemptWatch.after_stall`)."""

    #: Check as usual.
    CHECK = "check"
    #: Check as usual, counting the stall it follows as the check's own (a settle found the run
    #: waiting on this process, not on its replica: nothing to race).
    STALLED_CHECK = "stalled_check"
    #: Wait ``stall_tolerance`` more first: the answer may be in hand, unread.
    SETTLE = "settle"
    #: Start the same read on another replica beside the check.
    HEDGE = "hedge"


class AttemptWatch:
    """The waits of one attempt. Times are the driver's clock readings (monotonic seconds)."""

    __slots__ = ("_budget", "_checked", "_checking", "_failed_checks", "_hedge_deferred", "_inconclusive",
                 "_next_check", "_raced", "_settle_began", "_silent_since", "_stall_step", "deadline_at", "hedge_at",
                 "liveness", "receive_at", "retry_safe", "stalled_by", "started")

    def __init__(
        self,
        started: float,
        *,
        liveness: LivenessPolicy = LIVENESS_DEFAULTS,
        receive_timeout: float | None = None,
        deadline_at: float | None = None,
        hedge_after: float | None = None,
        retry_safe: bool = True,
        budget: _Budget | None = None,
    ) -> None:
        """``budget``: the pool's retry budget; while it is spent, a hung run that would be
        sent elsewhere keeps waiting instead (until its receive timeout or the deadline)."""
        self.started = started
        self.liveness = liveness
        self.receive_at = None if receive_timeout is None else started + receive_timeout
        self.deadline_at = deadline_at
        self.hedge_at = None if hedge_after is None else started + hedge_after
        self.retry_safe = retry_safe
        self._next_check = None if liveness.check_after is None else started + liveness.check_after
        self._failed_checks = 0
        self._inconclusive = 0
        #: When the current run of unanswered checks began (None: the last check was answered).
        self._silent_since: float | None = None
        self._budget = budget
        self._hedge_deferred = False
        self._checking = False
        #: A check's outcome was recorded (:meth:`checked`): the replica was asked once already.
        self._checked = False
        #: A second run raced this one (a hedge), or this run is that second run.
        self._raced = False
        #: Where :meth:`after_stall` is: 0 not asked, 1 settling, 2 decided.
        self._stall_step = 0
        #: When the settle after a stall began.
        self._settle_began = 0.0
        #: How late the waiter woke up when the first check came due during a stall (seconds).
        self.stalled_by = 0.0

    def next_wake(self, now: float) -> tuple[Wake, float]:
        """The next reason to wake up and how many seconds from ``now`` (0: it is due).
        Ties go to the deadline first, then the receive timeout, the hedge, the check. While a
        check is out (:meth:`checking`) only the deadline and the receive timeout wake it: they
        bound the attempt whatever its ping does."""
        timers: list[tuple[float | None, Wake]] = [
            (self.deadline_at, Wake.DEADLINE), (self.receive_at, Wake.RECEIVE_TIMEOUT)
        ]
        if not self._checking:
            timers += [(self.hedge_at, Wake.HEDGE), (self._next_check, Wake.CHECK)]
        candidates = [(at, wake) for at, wake in timers if at is not None]
        if not candidates:
            return Wake.DEADLINE, float("inf")
        at, wake = min(candidates, key=lambda c: c[0])
        return wake, max(0.0, at - now)

    def ping_timeout(self, now: float) -> float:
        """The ping's timeout: the policy's, cut so that it ends by the deadline. For a write
        that is not safe to repeat it grows ``WRITE_PING_GROWTH`` times with each failed check
        in a row: a replica is shown gone by a silence that grows (0.15 + 0.6 + 2.4 s by
        default, the verdict about 3.5 s after the write was sent), not by three short ones that
        a replica busy for a second or two (a long GC, its own work holding the GIL) can leave
        unanswered. A write cannot fail over, so waiting longer costs only how soon a hung
        replica's write reports its unknown outcome, while a false verdict fails a write that
        succeeded."""
        limit = self.liveness.ping_timeout
        if not self.retry_safe:
            limit *= WRITE_PING_GROWTH ** self._failed_checks
        for at in (self.deadline_at, self.receive_at):
            if at is not None:
                limit = min(limit, max(0.001, at - now))
        return limit

    def checking(self) -> None:
        """A liveness check is out (its outcome goes to :meth:`checked`)."""
        self._checking = True

    def defer_hedge(self, now: float, woke_late: float) -> bool:
        """A hedge is due but its waiter woke up ``woke_late`` seconds late: True (once per
        attempt) when that is a stall of this process (over ``stall_tolerance``) and the hedge
        waits ``stall_tolerance`` more, for an answer that may already be in hand, unread."""
        tolerance = self.liveness.stall_tolerance
        if self._hedge_deferred or woke_late <= tolerance or self.hedge_at is None:
            return False
        self._hedge_deferred = True
        self.hedge_at = now + tolerance
        return True

    def hedged(self) -> None:
        """The hedge started (or cannot): no further HEDGE wake for this attempt."""
        self.hedge_at = None
        self._raced = True

    def after_stall(
        self, now: float, woke_late: float, waiting_on_us: Callable[[], bool] | None = None
    ) -> StallStep:
        """The check is due and its waiter woke up ``woke_late`` seconds late: what to do.
        ``waiting_on_us``: whether the run waits on this process, not on its replica (its request
        has yet to go out, or its answer's bytes are in the socket unread); None: the driver
        cannot tell.

        A read whose first check came due while this process stalled (``STALL_RACE_FACTOR`` times
        ``stall_tolerance``, 150 ms by default:
        another thread held the GIL, the event loop was blocked, the VM was paused) has waited
        unanswered through the stall, which says nothing yet about its replica. Pinging first
        costs a ping timeout after the stall before the read can move, and under a GIL held
        0.8 s every second that wait crossed the next hold: a reader on a stopped replica was
        stuck 1.9 s, two holds (BENCHMARKS.md). So such a read, not raced yet, settles first
        (SETTLE: an answer that came during the stall is in hand, unread, and is read then):
        ``stall_tolerance``, and again while this process is still catching up, up to
        ``STALL_RACE_FACTOR`` tolerances in all: while it waits on this process (its answer is
        in the socket unread, or its request has yet to go out), or, where the driver cannot
        look, while the settle's own wake-up comes more than ``CAUGHT_UP_SHARE`` of a tolerance
        late. Then, if it still waits on this process, it is checked as usual (STALLED_CHECK:
        its replica owes it nothing, nothing to race); otherwise it also starts on another
        replica at once (HEDGE), beside the check: the first answer wins, and a healthy
        replica's long query loses nothing (it is not abandoned, only raced; the retry budget
        bounds these extra requests as it bounds hedges). Not for writes (they cannot run
        twice), nor once the replica has been checked (a live replica running a long query is
        not raced again)."""
        tolerance = self.liveness.stall_tolerance
        if self._stall_step == 1:
            # Where the driver can look (the request gone out or not, the socket), that says it;
            # one that cannot goes by its own lateness.
            if waiting_on_us is not None:
                waiting = behind = waiting_on_us()
            else:
                waiting, behind = False, woke_late > CAUGHT_UP_SHARE * tolerance
            if behind and now + tolerance - self._settle_began <= STALL_RACE_FACTOR * tolerance:
                self._next_check = now + tolerance  # still catching up: settle again
                return StallStep.SETTLE
            self._stall_step = 2
            return StallStep.STALLED_CHECK if waiting else StallStep.HEDGE
        # Only a stall of STALL_RACE_FACTOR tolerances (150 ms by default): over just one, a loaded
        # machine's lag (an event loop busy with 30 answers at load 7: 50-100 ms) raced healthy
        # replicas' reads and moved their answers to other replicas (a round_robin spread of 30
        # came out 9/10/11 in a CI run); a GIL held by another thread stalls for most of a second.
        if (self._stall_step or self._raced or self._checked or not self.retry_safe
                or woke_late <= STALL_RACE_FACTOR * tolerance):
            return StallStep.CHECK
        self._stall_step = 1
        self.stalled_by = woke_late
        self._settle_began = now
        self._next_check = now + tolerance
        return StallStep.SETTLE

    def checked(self, alive: bool, now: float, *, stalled: bool = False, hard: bool = False) -> bool:
        """Record a liveness check's outcome; True: abandon the attempt (the replica is hung).
        ``stalled``: this process ran late around the check (see ``stall_tolerance`` and
        :func:`clickhouse_lb.core.stalls.read_check`); ``hard``: the ping was refused or reset
        on a fresh connection, the replica is shown gone."""
        self._checking = False
        self._checked = True
        if alive:
            self._failed_checks = 0
            self._silent_since = None
            self._next_check = now + self.liveness.interval
            return False
        if hard:
            self._next_check = None
            return True
        if self._silent_since is None:
            self._silent_since = now
        if stalled and self.retry_safe and now - self._silent_since >= STALLED_SILENCE:
            # A read whose replica left every check unanswered for this long, stalls or not:
            # the pinger looks at the socket again after a late wake-up, so a live replica's
            # answer (milliseconds on a LAN) would have been found. Without this, a process
            # stalled back to back (another thread holding the GIL) never abandons a read on a
            # stopped replica (measured: a reader stuck through a whole pause).
            stalled = False
        if stalled:
            # A check that failed while this process itself ran late proves nothing about the
            # replica: it never counts, for a read or a write (the receive timeout and the
            # deadline still bound the attempt). The first ``max_inconclusive`` are asked again
            # at once, later ones after a ping timeout (a process stalled again and again).
            self._inconclusive += 1
            again = self._inconclusive <= self.liveness.max_inconclusive
            self._next_check = now if again else now + min(self.liveness.interval, self.liveness.ping_timeout)
            return False
        self._failed_checks += 1
        needed = 1 if self.retry_safe else max(1, self.liveness.failed_checks_for_writes)
        if self._failed_checks >= needed:
            # Shown hung (a failed check while this process ran): abandoned whatever the retry
            # budget. The budget limits requests that add load to replicas that serve; one that
            # does not answer /ping serves nothing, and its statements' re-sends are not charged
            # (core/policy.py FailoverPolicy.resends).
            self._next_check = None
            return True
        # Not yet conclusive for an unsafe write: check again soon rather than a second later.
        self._next_check = now + min(self.liveness.interval, self.liveness.ping_timeout)
        return False


def first_wake(started: float, liveness: LivenessPolicy, receive_timeout: float | None,
               deadline_at: float | None) -> float:
    """When an :class:`AttemptWatch` for a run not hedged, started at ``started``, first wakes up
    (``watch.next_wake(started)`` as an absolute time; inf: never), without building the watch:
    the sync pool's per-statement path needs only this, most attempts end before it."""
    at = math.inf if deadline_at is None else deadline_at
    if receive_timeout is not None and started + receive_timeout < at:
        at = started + receive_timeout
    check_after = liveness.check_after
    if check_after is not None and started + check_after < at:
        at = started + check_after
    return at if at > started else started

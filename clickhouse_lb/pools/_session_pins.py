"""Session affinity by statement setting: a statement whose ``settings`` carry a non-empty
``session_id`` runs on the replica that ClickHouse session lives on.

A plain client never needs this (its one server holds every session); a pool balances each
statement on its own, so without it ``CREATE TEMPORARY TABLE`` could land on one replica and the
``INSERT`` that follows on another, which has no such session (UNKNOWN_TABLE).

* The first statement with a given id is balanced as usual (strategy, error counts, failover:
  no session state exists anywhere yet); the replica that answered it becomes the session's.
* Later statements with that id run on that replica only, whatever the error counts say. A
  replica failure there raises :class:`~clickhouse_lb.errors.SessionLostError` (naming the id and
  the replica) instead of failing over, and drops the pin: the server lost the session's
  temporary tables, so the next statement with the id starts afresh, as after a lost
  ``pool.session()``. A query failure (bad SQL, ...) passes through and keeps the pin.
* A pin expires after the session's idle timeout (the statement's ``session_timeout`` setting,
  else ClickHouse's default of 60 s), counted from the session's last statement, as the server
  counts it; the map is an LRU bounded to :data:`MAX_PINS` ids.

The map is the pool's, not the shared replica set's: ClickHouse scopes a session id to the user
that opened it, and pools sharing one replica set may log in as different users (the same id
would then name two sessions); a session is also not something another pool's statements can
see. Statements without ``session_id`` never reach this module (the pool checks the prepared
call's ``settings``, None on the common path, first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from clickhouse_lb.core._statements import PreparedCall
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.core.policy import Verdict
from clickhouse_lb.core.race import RaceFailure
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.errors import ConfigurationError, SessionLostError

__all__ = ["DEFAULT_SESSION_TIMEOUT", "MAX_PINS", "SessionAttempts", "SessionPins", "statement_session"]

T = TypeVar("T")

#: ClickHouse's ``default_session_timeout`` (seconds): a session's idle time before the server drops it.
DEFAULT_SESSION_TIMEOUT = 60.0
#: How many session ids a pool remembers (least recently used forgotten first).
MAX_PINS = 4096


def statement_session(settings: Mapping[str, Any]) -> tuple[str | None, float]:
    """The session a statement's settings name (None: none) and its idle timeout in seconds."""
    given = settings.get("session_id")
    if not given:
        return None, DEFAULT_SESSION_TIMEOUT
    timeout = settings.get("session_timeout")
    try:
        seconds = DEFAULT_SESSION_TIMEOUT if timeout is None else float(timeout)
    except (TypeError, ValueError):  # the server refuses it: the statement fails there, pinning nothing
        seconds = DEFAULT_SESSION_TIMEOUT
    return str(given), seconds


class SessionPins:
    """Which replica (by address) each session id lives on, until it has been idle for its
    timeout; thread-safe (the critical sections do no I/O, so the async pool shares the kind)."""

    def __init__(self, max_pins: int = MAX_PINS, clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_pins
        self._clock = clock
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pins)

    def replica(self, session_id: str) -> str | None:
        """The address the session lives on (None: not pinned, or idle past its timeout)."""
        with self._lock:
            pin = self._pins.get(session_id)
            if pin is None:
                return None
            if pin[1] <= self._clock():
                del self._pins[session_id]  # the server has dropped it too
                return None
            self._pins.move_to_end(session_id)
            return pin[0]

    def pin(self, session_id: str, address: str, timeout: float) -> None:
        """The session answered on ``address`` now: it lives there for ``timeout`` idle seconds."""
        with self._lock:
            self._pins[session_id] = (address, self._clock() + timeout)
            self._pins.move_to_end(session_id)
            while len(self._pins) > self._max:
                self._pins.popitem(last=False)

    def drop(self, session_id: str, address: str) -> None:
        """Forget the session if it still lives on ``address`` (a newer pin stays)."""
        with self._lock:
            pin = self._pins.get(session_id)
            if pin is not None and pin[0] == address:
                del self._pins[session_id]

    def attempts(
        self, balancer: Balancer, order: Sequence[int], method: str, call: PreparedCall, budget: RetryBudget | None,
    ) -> StatementAttempts:
        """The attempts of a statement whose settings may name a session: on the session's
        replica only when it is pinned, else balanced over ``order`` (pinning where it answers)."""
        assert call.settings is not None
        route = self._route(call.settings, balancer, order)
        if route is None:  # session_id given empty: no session, balanced as any statement
            return StatementAttempts(balancer, order, operation=method, statement=call, budget=budget)
        return route.arm(SessionAttempts(balancer, route.order, operation=method, statement=call, budget=budget))

    def read_attempts(
        self, balancer: Balancer, order: Sequence[int], method: str, settings: Mapping[str, Any],
        budget: RetryBudget | None,
    ) -> StatementAttempts:
        """:meth:`attempts` for a client method that only reads (``create_insert_context``:
        the columns of a session's temporary table are known in that session only)."""
        route = self._route(settings, balancer, order)
        if route is None:
            return StatementAttempts(balancer, order, operation=method, write=False, budget=budget)
        return route.arm(SessionAttempts(balancer, route.order, operation=method, write=False, budget=budget))

    def _route(self, settings: Mapping[str, Any], balancer: Balancer, order: Sequence[int]) -> _Route | None:
        session_id, timeout = statement_session(settings)
        if session_id is None:
            return None
        address = self.replica(session_id)
        if address is None:  # the session's first statement (or the first since it was lost)
            return _Route(self, session_id, timeout, order, False)
        try:
            index = balancer.index_of(address)
        except ConfigurationError:  # discovery took the replica out of the set: its session is gone
            self.drop(session_id, address)
            raise SessionLostError(address, "the replica left the replica set", session_id=session_id) from None
        return _Route(self, session_id, timeout, (index,), True)


class _Route(NamedTuple):
    """Where a session's statement runs: ``order`` (the session's replica alone once pinned)."""

    pins: SessionPins
    session_id: str
    timeout: float
    order: Sequence[int]
    pinned: bool

    def arm(self, attempts: Any) -> StatementAttempts:
        attempts._pins, attempts._session_id, attempts._timeout, attempts._pinned = (
            self.pins, self.session_id, self.timeout, self.pinned)
        return cast(StatementAttempts, attempts)


class SessionAttempts(StatementAttempts):
    """The attempts of a statement in a session: the replica that answers is (again) the
    session's; once pinned, a replica failure is a :class:`SessionLostError`, never a failover."""

    _pins: SessionPins
    _session_id: str
    _timeout: float
    _pinned = False

    def hedge_candidate(self, running: set[int]) -> int | None:
        return None  # a hedge elsewhere would open the session on a second replica

    def left(self, index: int, result: T) -> T:
        result = super().left(index, result)
        self._pins.pin(self._session_id, self._balancer.addresses[index], self._timeout)
        return result

    def succeeded(self, index: int) -> None:
        super().succeeded(index)
        self._pins.pin(self._session_id, self._balancer.addresses[index], self._timeout)

    def failed(self, index: int, exc: BaseException, *, ran_on: int | None = None) -> BaseException:
        if not self._pinned:  # the session's first statement fails over as any statement
            return super().failed(index, exc, ran_on=ran_on)
        self._balancer.state.replica_load.finish(index, self._attempt_started)
        self.verdict = Verdict.RAISE  # never elsewhere: the session's state is on this replica only
        if isinstance(exc, RaceFailure):
            exc = exc.error
        if not isinstance(exc, Exception):
            return exc
        failure = self._balancer.count_failure(index, exc)
        if not failure.replica:
            return exc
        address = self._balancer.addresses[index]
        self._pins.drop(self._session_id, address)
        lost = SessionLostError(address, failure.reason, may_have_been_applied=failure.sent and self.write,
                                session_id=self._session_id)
        lost.__cause__ = exc
        return lost

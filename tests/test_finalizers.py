"""A pool dropped without close() is cleaned up by finalizers, which run wherever the garbage
collector does: inside any allocation, on any thread, possibly inside the very lock they need.
None of them may wait for a lock.

The deadlock these tests are named after: a pool's finalizer took its listeners off the shared
balancer with ``ListenerSet.remove`` while the same thread was inside that set's ``add`` or
``remove`` (building the new tuples allocates, the collector ran there): the thread waited for
a lock it held, and every thread creating or closing a pool over those replicas after it hung
behind it (3 runs of 3 hung on the stress below before the fix)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb.core.events import FailoverEvent, ListenerSet

HOSTS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
WAIT = 60  # a healthy run takes well under a second per thread; a deadlock never ends


class Failovers:
    def __init__(self) -> None:
        self.seen: list[FailoverEvent] = []

    def on_failover(self, event: FailoverEvent) -> None:
        self.seen.append(event)


EVENT = FailoverEvent(operation="query", address="a:8123", attempt=1, error="e", next_address="b:8123")


def _finished(target: Any, *args: Any) -> bool:
    thread = threading.Thread(target=target, args=args, daemon=True)  # (daemon: a deadlock must not hold the exit)
    thread.start()
    thread.join(WAIT)
    return not thread.is_alive()


def test_a_listener_discarded_inside_the_sets_own_locked_section_goes_without_waiting() -> None:
    listeners = ListenerSet()
    victim = Failovers()
    listeners.add(victim)

    class DiscardsOnInspection:
        """Runs a discard where a finalizer can: while add() builds the new tuples, lock held."""

        finalized = False

        @property
        def on_failover(self) -> Any:
            if listeners._lock.locked() and not self.finalized:  # once, as a finalizer runs
                self.finalized = True
                listeners.discard(victim)
            return lambda event: None

    assert _finished(listeners.add, DiscardsOnInspection()), "discard() waited for the lock its own thread held"
    listeners.failover(EVENT)
    assert victim.seen == []  # removed by add() before it let the lock go
    assert len(listeners) == 1


def test_a_discard_with_the_lock_free_removes_at_once() -> None:
    listeners = ListenerSet()
    kept, dropped = Failovers(), Failovers()
    listeners.add(kept)
    listeners.add(dropped)
    listeners.discard(dropped)
    listeners.failover(EVENT)
    assert (len(kept.seen), len(dropped.seen)) == (1, 0)


@pytest.fixture
def collector_at_every_turn() -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(5, 2, 2)  # a collection nearly every few allocations: finalizers run anywhere
    try:
        yield
    finally:
        gc.set_threshold(*old)


@pytest.mark.usefixtures("collector_at_every_turn")
def test_pools_dropped_in_cycles_on_four_threads_never_deadlock() -> None:
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(150):
                pool = clickhouse_lb.get_pool(HOSTS, connect_on_create=False, health_check_interval_ms=10_000)
                holder: list[Any] = [pool]
                holder.append(holder)  # freed by the collector only: its finalizers run wherever it runs
                if i % 3 == 0:
                    pool.close()
                del pool, holder
        except BaseException as exc:  # pragma: no cover - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert [t.is_alive() for t in threads] == [False] * 4, "a thread deadlocked in a finalizer"
    assert errors == []

"""The two engine-per-query scenarios of the shared balancing state, for any kind of client.

A *serve* callable stands for one query of an engine-per-query application (Superset builds a
new engine for each query): it builds a fresh engine or pool from the same URL or arguments,
runs one statement, reads the state's view of replica r1, drops the engine or pool, and
returns ``Served``. The sync and async dialects and ``get_pool`` each provide one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from clickhouse_lb.testing import ClusterBase

#: The half-life the in_order scenario uses: long enough that a handful of engines are made
#: well inside it on a loaded machine, short enough to wait for re-admission.
HALF_LIFE = 4.0


@dataclass(frozen=True)
class Served:
    replica: str  # getMacro('replica') of the replica that answered
    r1_errors: int  # r1's errors_count after the statement
    r1_last_error_time: float | None


def check_round_robin(served: list[Served], names: list[str]) -> None:
    """30 engines, one statement each: each replica answered 10 +- 1 of them."""
    counts = Counter(s.replica for s in served)
    assert len(served) == 30
    assert set(counts) == set(names), counts
    assert all(9 <= counts[name] <= 11 for name in names), counts
    # And they took turns: one shared counter, one step per engine (engines starting each at a
    # random position would give 10 +- 1 by luck about one time in seven, and never this).
    sequence = [s.replica for s in served]
    assert all(sequence[i] != sequence[i - 1] for i in range(1, 30)), sequence
    assert all(sequence[i] == sequence[i - 3] for i in range(3, 30)), sequence


@dataclass
class InOrderRun:
    """What the in_order scenario saw."""

    start: float
    failure_time: float | None = None
    readmitted_after: float | None = None
    checked_inside_half_life: int = 0


def check_engine(run: InOrderRun, served: Served) -> None:
    """An engine that was made and done after the first failure and before the half-life was
    over must not have tried r1: it is answered by r2, and r1's last error is still the first
    failure's (while r1 is down, an attempt there would record a new one; once it is back, the
    engine would be answered by r1). Its error count is read after the statement, so it may
    just have decayed. (The decay clock starts at the first engine's plan, after ``run.start``:
    an engine done before ``run.start + HALF_LIFE`` planned before any decay.)"""
    if time.monotonic() - run.start < HALF_LIFE:
        assert served.replica == "r2", served
        assert served.r1_errors <= 1, served
        assert served.r1_last_error_time == run.failure_time, served
        run.checked_inside_half_life += 1


def check_first(run: InOrderRun, served: Served) -> None:
    # The first engine finds r1 down, counts one error against it and fails over to r2.
    assert served.replica == "r2", served
    assert served.r1_errors == 1, served
    assert served.r1_last_error_time is not None
    run.failure_time = served.r1_last_error_time


def in_order_after_kill(cluster: ClusterBase, serve: Callable[[], Served]) -> InOrderRun:
    cluster.kill(0)
    run = InOrderRun(start=time.monotonic())
    check_first(run, serve())
    for _ in range(5):
        check_engine(run, serve())
    cluster.restart(0)
    _until_readmitted(run, serve)
    return run


def _until_readmitted(run: InOrderRun, serve: Callable[[], Served]) -> None:
    deadline = run.start + 3 * HALF_LIFE + 30
    while time.monotonic() < deadline:
        served = serve()
        if served.replica == "r1":  # its plan ran before this, after the decay
            run.readmitted_after = time.monotonic() - run.start
            return
        check_engine(run, served)
        time.sleep(0.1)  # pacing the engines, not synchronisation: the loop ends on what it sees
    raise AssertionError(f"r1 was not re-admitted within {deadline - run.start:.0f} s")


async def in_order_after_kill_async(cluster: ClusterBase, serve: Callable[[], Awaitable[Served]]) -> InOrderRun:
    import asyncio

    cluster.kill(0)
    run = InOrderRun(start=time.monotonic())
    check_first(run, await serve())
    for _ in range(5):
        check_engine(run, await serve())
    cluster.restart(0)
    deadline = run.start + 3 * HALF_LIFE + 30
    while time.monotonic() < deadline:
        served = await serve()
        if served.replica == "r1":
            run.readmitted_after = time.monotonic() - run.start
            return run
        check_engine(run, served)
        await asyncio.sleep(0.1)  # pacing, not synchronisation
    raise AssertionError(f"r1 was not re-admitted within {deadline - run.start:.0f} s")


def check_in_order(run: InOrderRun) -> None:
    # Enough engines ran inside the half-life to mean something; r1 came back no earlier than
    # its error decayed (a half-life after the first engine's plan), and not much later.
    assert run.checked_inside_half_life >= 3, run
    assert run.readmitted_after is not None
    assert HALF_LIFE <= run.readmitted_after <= 3 * HALF_LIFE + 30, run

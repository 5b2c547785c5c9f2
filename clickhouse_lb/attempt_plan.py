"""From a statement's settings to the :class:`~clickhouse_lb.race.AttemptSpec` of each of its
attempts (pure; shared by the sync and async pools).

Per statement: the timeouts, liveness policy and hedging policy in force (the pool's, changed
by the statement's own ``settings=``), its deadline, whether it may be hedged (read-only, not
pinned), and where the outcomes go (error and slowdown counts, the latency window of the
adaptive hedge delay).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .attempt_settings import AttemptSettings
from .deadline import Deadline
from .hedging import LatencyWindow
from .race import AttemptSpec
from .watch import AttemptWatch

__all__ = ["StatementPlan"]


@dataclass
class StatementPlan:
    """How the attempts of one statement wait. ``hedge_candidate(running)``: the next replica
    of the statement's plan not already running (None: none left)."""

    settings: AttemptSettings
    deadline: Deadline
    addresses: tuple[str, ...]
    hedgeable: bool
    retry_safe: bool
    write: bool
    window: LatencyWindow
    count_failure: Callable[[int, BaseException], object]
    count_slowdown: Callable[[int], object]
    hedge_candidate: Callable[[set[int]], int | None]
    #: Called when a hedge starts (the pool counts them: ``hedged_requests``).
    count_hedge: Callable[[int], object] = lambda index: None
    #: The statement's own query id (from its settings), used for every run; None: the pool
    #: gives each run a fresh one where it may have to KILL it.
    query_id: str | None = None
    clock: Callable[[], float] = time.monotonic

    def hedge_after(self) -> float | None:
        if not self.hedgeable:
            return None
        return self.settings.hedging.hedge_after(self.window)

    def spec(self, first: int) -> AttemptSpec:
        """The spec of an attempt starting on replica ``first``."""
        settings = self.settings
        hedge_after = self.hedge_after()
        deadline_at = self.deadline.at
        receive = settings.timeouts.receive
        retry_safe = self.retry_safe

        def watch(index: int, started: float) -> AttemptWatch:
            return AttemptWatch(
                started,
                liveness=settings.liveness,
                receive_timeout=receive,
                deadline_at=deadline_at,
                hedge_after=hedge_after,
                retry_safe=retry_safe,
            )

        fixed = self.query_id
        # A query id of the pool's own only where the pool may have to KILL the run: a hedge
        # that lost, a deadline (reads only: a write is never cut short on a live replica).
        killable = (hedge_after is not None or deadline_at is not None) and self.retry_safe and not self.write
        return AttemptSpec(
            first=first,
            clock=self.clock,
            watch=watch,
            hedge_index=self.hedge_candidate if hedge_after is not None else _no_hedge,
            query_id=(lambda: fixed) if fixed is not None else (_new_query_id if killable else _no_query_id),
            address=self.addresses.__getitem__,
            write=self.write,
            connect_timeout=self.deadline.cut(settings.timeouts.connect),
            on_failure=self.count_failure,
            on_slower=self.count_slowdown,
            on_latency=self.window.add if self.hedgeable else _ignore,
            on_hedge=self.count_hedge,
        )


def _no_hedge(running: set[int]) -> int | None:
    return None


def _new_query_id() -> str | None:
    return f"clickhouse-lb-{uuid.uuid4().hex}"


def _no_query_id() -> str | None:
    return None


def _ignore(seconds: float) -> None:
    return None

"""What a pool runs on a replica besides a statement's own attempt, watched as that attempt is:
``create_insert_context``'s DESCRIBE and a read-your-writes catch-up. Under the sync pool's
watchdog (:mod:`clickhouse_lb.pools._watchdog`), else on the pool's driver: liveness checks, the
receive timeout, the deadline. A base of :class:`~clickhouse_lb.pools._pool_steps.PoolSteps`,
which both pools are; they give what is declared here."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.pools._base import PoolBase, ReplicaSetView
from clickhouse_lb.pools._steps import Steps
from clickhouse_lb.pools._watched import Planned, plan_of

__all__ = ["WatchedRuns"]


class WatchedRuns(PoolBase):
    """The watched runs both pools make (see the module)."""

    #: The sync pool's watchdog; the async pool runs every attempt on its driver.
    _watchdog: Any = None
    #: Carries a body out: ``drive`` or ``drive_async`` (clickhouse_lb.pools._steps).
    _drive: Callable[[Steps[Any]], Any]
    #: Runs a planned attempt (liveness checks, hedges, the deadline): SyncDriver or AsyncDriver;
    #: with the pool's liveness check of a replica and its KILL QUERY.
    _driver: Any
    _replica_alive: Callable[[int, float], Any]
    _kill_query: Callable[[int, str], Any]

    def _client(self, index: int, view: ReplicaSetView | None = None) -> Any:
        raise NotImplementedError

    @staticmethod
    def _raced(attempts: StatementAttempts, index: int, outcome: tuple[int, Any]) -> Any:
        """An attempt's result from its race: a hedge that answered first is that replica's
        success, not the slower replica's the attempt began on."""
        winner, result = outcome
        if winner != index:
            attempts.answered_by = winner
        return result

    def _catch_up(
        self, view: ReplicaSetView, plan: StatementPlan, index: int, sql: str, settings: dict[str, Any]
    ) -> Any:
        """A read-your-writes catch-up (``sql`` on replica ``index``), watched as an attempt of ``plan``."""
        def run(index: int, query_id: str | None) -> Any:
            given = settings if query_id is None else {**settings, "query_id": query_id}  # (to KILL it)
            return self._drive(self._on_replica_steps(index, "command", (sql,), {"settings": given}, view))

        return self._watched(plan, run)(index)

    def _watched(self, planned: Planned, run: Callable[[int, str | None], Any]) -> Callable[[int], Any]:
        """An attempt running ``run(index, query_id)`` watched as a statement's is: under the sync
        pool's watchdog, else on the driver (liveness checks, the receive timeout, the deadline)."""
        if self._watchdog is not None and not planned.settings.hedging.enabled:
            return partial(self._watchdog.run_at, planned, run)

        def attempt(index: int) -> Any:
            return self._drive(self._planned_steps(planned, index, run))

        return attempt

    def _planned_steps(self, planned: Planned, index: int, run: Callable[..., Any]) -> Steps[Any]:
        plan, driver = plan_of(planned), self._driver
        outcome = yield partial(driver.run_planned, plan, index, run, self._replica_alive, self._kill_query)
        return outcome[1] if planned is plan else self._raced(cast(StatementAttempts, planned), index, outcome)

    def _on_replica_steps(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], view: ReplicaSetView | None = None
    ) -> Steps[Any]:
        client = yield partial(self._client, index, view)
        return (yield partial(getattr(client, method), *args, **kwargs))

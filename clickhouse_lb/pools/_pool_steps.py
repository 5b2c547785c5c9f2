"""Both pools' bodies, written once (see :mod:`clickhouse_lb.pools._steps`): a statement's
preparation, creating a replica's client, ``connect``, ``ping``, ``pin``, a read with failover,
the discovery refresh and the close sequence. The pools carry them out, calling or awaiting,
and give the I/O they are made of under the same names:

* ``_plan(overrides, view)``: the replica order (the async pool first resolves this machine's
  host name off the loop, once, when a strategy needs it);
* ``_client(index, view)``, ``_factory(**options)``, the clients' own methods, and the attempt's
  watch (:mod:`clickhouse_lb.pools._watched_runs`);
* ``_run_attempts(attempts, call, policy)``: tenacity's loop (``run_sync`` or ``run_async``);
* ``_close_all(clients)``, ``_off_loop(function)``, ``_drive(steps)``;
* ``_configured(client)`` and ``_close_transport()``: the sync pool's hold on urllib3
  (:mod:`clickhouse_lb.pools._transport`), nothing in the async pool.

What the two pools do differently on purpose, and why:

* Probes shared between pools over one replica set (:mod:`clickhouse_lb.probes._shared`) are the
  sync pool's only: the shared worker is a thread, which outlives the pool that started it; an
  async pool's worker is a task of its own event loop, and another pool over the same replicas
  may run on another loop (each pool then probes for itself).
* The watchdog (:mod:`clickhouse_lb.pools._watchdog`) is the sync pool's fast path for an
  attempt that is not hedged: it runs on the caller's thread, where the async pool needs none
  (its attempt is a task that can be cancelled).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, ClassVar, TypeVar

from clickhouse_lb.config.attempt_settings import NO_STATEMENT_SETTINGS
from clickhouse_lb.config.pool_config import PoolConfig
from clickhouse_lb.config.settings import NO_OVERRIDES
from clickhouse_lb.core._statements import PreparedCall, prepare_call, split_pool_settings
from clickhouse_lb.core.attempt_specs import PlanContext
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.events import Listener
from clickhouse_lb.core.failover import StatementAttempts
from clickhouse_lb.errors import CREATION_CHECK
from clickhouse_lb.pools._base import ReplicaSetView, pin_options
from clickhouse_lb.pools._read_your_writes import PoolReadYourWrites
from clickhouse_lb.pools._session_pins import SessionPins
from clickhouse_lb.pools._session_route import SessionRoute
from clickhouse_lb.pools._steps import Steps, close_quietly
from clickhouse_lb.pools._watched_runs import WatchedRuns

__all__ = ["PoolSteps"]

S = TypeVar("S", bound="PoolSteps")

#: ``create_insert_context``'s statement, as its attempts are planned (a read, watched as a query is).
_DESCRIBE = prepare_call("query", ("DESCRIBE TABLE",), {}, None, auto_token=False)


class PoolSteps(WatchedRuns):
    """What both pools do around their I/O; subclasses give the I/O (see the module)."""

    _options: dict[str, Any]
    _factory: Callable[..., Any]
    _policy: Any
    #: The pool's pinned-session class (``pin()`` returns one).
    _pinned_class: ClassVar[Callable[..., Any]]
    #: The worker is the shared replica set's (the sync pool's; see the module): close() leaves it running.
    _prober_shared = False
    _detach_forwarder: Callable[[], object] | None = None
    #: The class of the statements' attempts, holding what they all share (built on the first
    #: statement, again after discovery changed the replica set, whose balancer it was built for).
    _attempts_class: type[StatementAttempts] | None = None

    # -- the I/O, given by each pool ---------------------------------------------------------

    #: Tenacity's loop over a statement's attempts: ``run_sync`` or ``run_async``.
    _run_attempts: Callable[..., Any]

    def _plan(self, overrides: Any = NO_OVERRIDES, view: ReplicaSetView | None = None) -> Any:
        raise NotImplementedError

    def _close_all(self, clients: list[Any]) -> Any:
        raise NotImplementedError

    def _off_loop(self, function: Callable[[], Any]) -> Callable[[], Any]:
        """A step running blocking ``function`` where it does not hold up other statements."""
        return function

    def _configured(self, client: Any) -> None:
        """A new client, before the pool's recorded changes are replayed on it."""

    def _creation_abandoned(self) -> bool:
        """Whether a creation that just failed was broken off on purpose by the pool."""
        return False

    def _close_transport(self) -> None:
        """The end of close(): what the pool holds besides its clients."""

    # -- construction --------------------------------------------------------------------------

    #: The lock of a slot and of the session route: a thread's, or a task's.
    _lock_class: Callable[[], Any]

    def __init__(
        self,
        config: PoolConfig,
        *,
        listeners: Iterable[Listener] = (),
        client_factory: Callable[..., Any] | None = None,
        balancer: Balancer | None = None,
    ) -> None:
        super().__init__(config, listeners=listeners, balancer=balancer)
        self._ryw = PoolReadYourWrites(config.read_your_writes, config.client_options.get("database"))
        self._view = self._view._replace(slots=tuple(self._new_slot() for _ in self.config.replicas))
        self._set_up(client_factory)
        self._in_session = SessionRoute(self, self._lock_class) if self._session_id else None
        #: Statements naming a session in their settings: the replica each session lives on.
        self._session_pins = SessionPins()
        self._sealed = True

    def _change(self, key: Any, value: Any) -> None:
        super()._change(key, value)
        if key == ("attr", "database"):  # (once the clients took it) writes are now in this database
            self._ryw.database = value

    def _set_up(self, client_factory: Any) -> None:
        """The pool's own: its client factory, client options, drivers and probe worker."""
        raise NotImplementedError

    def _own_prober(self, worker_class: Callable[..., Any]) -> Any:
        """The pool's own probe worker (None with probes off), with discovery's refresh; a pool
        dropped without close() does not leave it running."""
        if self._health is None:
            return None
        prober = worker_class(
            self._health, self._balancer.addresses, self._options,
            refresher=weakref.WeakMethod(self._refresh_discovery), refresh_interval=self._refresh_interval(),
        )
        weakref.finalize(self, prober.stop)
        return prober

    def _refresh_interval(self) -> float | None:
        return self.config.discovery.interval if self.config.seeds else None

    # -- statements ----------------------------------------------------------------------------

    def _begin(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], view: ReplicaSetView,
        call: PreparedCall | None = None,
    ) -> tuple[PreparedCall, StatementAttempts, Any]:
        """One statement up to its first attempt: the call as the pool sees it (unless given,
        prepared already), the replica order (lagging replicas last, read-your-writes' replica
        first) and its attempts (counted as started), which carry the attempt settings in force
        and build the statement's :class:`StatementPlan` only when an attempt asks for it
        (``attempts.plan``: a hedge, a wake-up that came due). One call on the hot path: the
        preparation is inlined here rather than taken from ``_prepare``."""
        if call is None:
            call = prepare_call(
                method, args, kwargs, self._settings_position.get(method),
                auto_token=view.balancer.settings.auto_insert_deduplication_token,
            )
        order = view.balancer.plan_indices(call.overrides)
        health = view.health
        # (_fresh_first's own first test, here: no call while no replica lags)
        if health is not None and health.schedule.worst_delay():
            order = self._fresh_first(order, call.settings, view)
        ryw = self._ryw.begin(call, method, view.balancer) if self._ryw.armed or call.read_your_writes else None
        if ryw is not None:
            order = ryw.order(order)
        # self._attempts() inlined: this runs for every statement.
        self._stats.count_statement()
        if self._prober is not None:
            self._prober.ensure_started()
        balancer = view.balancer
        kind = self._attempts_class
        if kind is None or kind._balancer is not balancer:  # the first statement, or discovery changed the set
            kind = self._attempts_class = StatementAttempts.of_pool(balancer, self._budget, self.config.attempts,
                                                                    self._plan_context(balancer))
        settings = call.settings
        if settings is None:  # the common statement: what it shares with the others is its class's
            return call, kind.of(order, method, call), ryw
        if "session_id" in settings:
            attempts = self._session_pins.attempts(balancer, order, method, call, self._budget)
            attempts.plan_context, attempts.settings = kind.plan_context, kind.settings
        else:
            attempts = kind.of(order, method, call)
        if call.query_id is not None:
            attempts.query_id = call.query_id
        own = call.attempt_settings
        if own is not NO_STATEMENT_SETTINGS:
            attempts.settings = own.apply(self.config.attempts)
        return call, attempts, ryw

    def _attempts_kind(self, balancer: Balancer) -> type[StatementAttempts]:
        """The class of the statements' attempts over ``balancer`` (what :meth:`_begin` inlines)."""
        kind = self._attempts_class
        if kind is None or kind._balancer is not balancer:
            kind = self._attempts_class = StatementAttempts.of_pool(balancer, self._budget, self.config.attempts,
                                                                    self._plan_context(balancer))
        return kind

    def _plan_context(self, balancer: Balancer) -> PlanContext:
        """What the plans of the statements over ``balancer`` share."""
        return PlanContext(balancer.addresses, self._latencies, balancer.record_slowdown, self._count_hedge,
                           self._budget)

    def _read_steps(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Steps[Any]:
        """A client method that only reads (``create_insert_context``), on one replica with
        failover; no balancing settings are taken out of its arguments."""
        if self._in_session is not None:
            return (yield partial(self._in_session.call, method, args, kwargs))
        self._check_open()
        settings = kwargs.get("settings")
        own, rest = split_pool_settings(settings)
        if own:  # not for its DESCRIBE; kept in the context, for the insert that takes it
            context = yield from self._read_steps(method, args, {**kwargs, "settings": rest})
            context.settings = {**own, **(context.settings or {})}
            return context

        def run(index: int, query_id: str | None) -> Any:
            return self._drive(self._on_replica_steps(index, method, args, kwargs))

        if settings and "session_id" in settings:  # the columns of a session's temporary table
            order = yield partial(self._plan)
            self._started()
            attempts = self._session_pins.read_attempts(self._view.balancer, order, method, settings, self._budget)
            attempt: Callable[[int], Any] = partial(run, query_id=None)
        else:
            order = yield partial(self._plan)
            self._started()
            attempts = self._attempts_kind(self._view.balancer).of(order, method, _DESCRIBE)
            attempt = self._watched(attempts, run)
        return (yield partial(self._run_attempts, attempts, attempt, self._policy))

    # -- clients -------------------------------------------------------------------------------

    def _new_client_steps(self, index: int, view: ReplicaSetView | None, extra: dict[str, Any]) -> Steps[Any]:
        client = yield partial(self._factory, **self._client_arguments(index, self._options, extra, view))
        self._configured(client)
        try:
            self._changes.replay(client)  # what the user set on the pool since it was made
        except BaseException:
            yield from close_quietly(client)
            raise
        return client

    def _client_steps(self, index: int, view: ReplicaSetView) -> Steps[Any]:
        """The replica's shared client, created under its slot's lock; when that creation fails
        with a replica failure, the callers that waited for it share the failure at once
        rather than each waiting out the same timeout (see ``ClientSlot``)."""
        slot = view.slots[index]
        seen = slot.creations
        yield slot.lock.acquire
        try:
            self._check_open()
            if slot.client is not None:
                return slot.client
            address = view.balancer.addresses[index]
            slot.raise_if_retired(address)
            slot.raise_shared_failure(seen)
            version = self._changes.version
            try:
                with slot.creating(address):
                    client = yield from self._new_client_steps(index, view, self._pooled_options)
            except Exception:
                if self._creation_abandoned():
                    slot.failure = None  # broken off on purpose: nothing for the waiters to share
                raise
            if self._closed:  # closed while the client was being created
                yield from close_quietly(client)
                raise self._closed_error()
            slot.client = client
            self._placed(index, client, version)
            return client
        finally:
            slot.lock.release()

    def _connect_steps(self: S) -> Steps[S]:
        self._check_open()
        if self._reference_or_none() is None:
            attempts = self._attempts(CREATION_CHECK, (yield partial(self._plan)), write=False)
            yield partial(self._run_attempts, attempts, self._client, self._policy)
        return self

    def _ping_steps(self, timeout: float | None) -> Steps[bool]:
        """True when some replica answers ``/ping`` (tried in plan order); each replica that
        does not answer gets an error counted, as a failed attempt would."""
        self._check_open()
        self._started()
        view = self._view
        with self._view_in_use(view):
            for index in (yield partial(self._plan, NO_OVERRIDES, view)):
                try:
                    client = yield partial(self._client, index, view)
                    answered = yield (partial(client.ping, timeout) if timeout else client.ping)
                except Exception as exc:
                    if not view.balancer.count_failure(index, exc).replica:
                        raise
                    continue
                if view.balancer.ping_answered(index, answered):
                    return True
            return False

    # -- sessions ------------------------------------------------------------------------------

    def _session_attempts(self, view: ReplicaSetView) -> Steps[StatementAttempts]:
        """The attempts that pin a session: the strategy's order, lagging replicas last."""
        order = self._fresh_first((yield partial(self._plan, NO_OVERRIDES, view)), None, view)
        return self._attempts("session", order, retry_after_send=True, write=False, view=view)

    def _pin_steps(self, session: bool) -> Steps[Any]:
        self._check_open()
        extra = pin_options(session)
        view = self._view
        attempts = yield from self._session_attempts(view)

        def connect(index: int) -> Any:
            return self._drive(self._pinned_client_steps(index, view, extra))

        index, client = yield partial(self._run_attempts, attempts, connect, self._policy)
        return self._pinned_class(self, index, client, view.balancer)

    def _pinned_client_steps(self, index: int, view: ReplicaSetView, extra: dict[str, Any]) -> Steps[tuple[int, Any]]:
        client = yield from self._new_client_steps(index, view, extra)
        return index, client

    # -- discovery and close -------------------------------------------------------------------

    @staticmethod
    def _taken(slots: Any) -> list[Any]:
        """The slots' clients, each taken out of its slot (under its lock, in the sync pool)."""
        return [client for client in (slot.take() for slot in slots) if client is not None]

    def _refresh_discovery(self) -> Any:
        """Re-read the cluster (blocking I/O, off the loop) and apply the change: called by the
        probe worker, on its thread or awaited on its loop."""
        return self._drive(self._refresh_steps())

    def _refresh_steps(self) -> Steps[None]:
        if self._closed:
            return
        replicas = yield self._off_loop(self._read_cluster)
        if replicas is not None and not self._closed:
            self._apply_discovered(replicas)

    def _close_steps(self) -> Steps[None]:
        self._closed = True
        prober: Any = self._prober
        if prober is not None and not self._prober_shared:
            yield prober.close
        if self._detach_forwarder is not None:
            self._detach_forwarder()
        self._detach_listeners()
        self._release_shared_state()
        with self._discovery_lock:  # no view replaced from here on
            pass
        yield partial(self._close_all, self._taken(self._clients))
        self._close_transport()

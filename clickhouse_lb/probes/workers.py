"""The probe workers: one per pool, started lazily by the first statement, stopped by
``close()``. They only send pings and report outcomes; :class:`~clickhouse_lb.core.health.HealthMonitor`
decides everything. Neither ever holds a lock a statement waits on.

* :class:`ProbeWorker` (sync pool): a daemon thread that wakes when a replica is due and hands
  the pings to a few helper threads, so one hung replica cannot delay the others' probes.
* :class:`AsyncProbeWorker` (async pool): a task on the loop of the statement that started it,
  one short task per ping.

Discovery (``cluster=``): the same worker re-reads the cluster every
``cluster_discovery_interval_ms`` (through a weak reference to the pool's refresh, so the
worker never keeps a dropped pool alive); when the set changes, the pool hands the worker the
new view's monitor and addresses (:meth:`ProbeWorker.retarget`). A probe in flight reports to
the monitor it was started for.

Fork safety: a child process inherits neither thread nor task (they do not exist there) nor
the parent's ping connections. ``os.register_at_fork`` forgets them in the child, and a pid
check at every start covers anything else; the child's first statement starts its own worker.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from clickhouse_lb.core.events import log_failure
from clickhouse_lb.core.health import BalancerGone, HealthMonitor, ProbeOutcome
from clickhouse_lb.probes._ping import AsyncPinger, SyncPinger, delay_url, ping_url

__all__ = ["AsyncProbeWorker", "ProbeWorker"]

#: Never spin: the shortest sleep between two looks at the schedule.
_MIN_WAIT = 0.005


class _Pinger(Protocol):
    def ping(self, url: str) -> ProbeOutcome: ...

    def delay(self, url: str) -> tuple[float | None, str | None]: ...

    def close(self) -> None: ...


class _AsyncPinger(Protocol):
    async def ping(self, url: str) -> ProbeOutcome: ...

    async def delay(self, url: str) -> tuple[float | None, str | None]: ...

    async def close(self) -> None: ...


_WORKERS: weakref.WeakSet[_Worker] = weakref.WeakSet()


def _forget_all_in_child() -> None:
    for worker in list(_WORKERS):
        worker._forget_after_fork()


#: A forked child forgets every worker's thread itself (so a worker that has a thread runs it in
#: this process: no pid to compare per statement, ``os.getpid()`` being a system call, 0.9 us
#: here and several in a statement's cold path, BENCHMARKS.md "The real mix").
FORGETS_AT_FORK = hasattr(os, "register_at_fork")  # not on Windows
if FORGETS_AT_FORK:
    os.register_at_fork(after_in_child=_forget_all_in_child)


class _Target:
    """What the worker probes: a monitor and its replicas' URLs, replaced together."""

    __slots__ = ("delay_urls", "monitor", "urls")

    def __init__(self, monitor: HealthMonitor, addresses: Sequence[str], options: Mapping[str, Any]) -> None:
        self.monitor = monitor
        self.urls = [ping_url(address, options) for address in addresses]
        self.delay_urls = [delay_url(address, options) for address in addresses]


class _Refresh:
    """When the discovery refresh is due (None: never)."""

    def __init__(self, interval: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self.running = False
        self.next = clock() + interval if interval else None

    def due(self) -> bool:
        if self.next is None or self.running or self._clock() < self.next:
            return False
        self.running = True
        return True

    def done(self) -> None:
        assert self.interval is not None
        self.next = self._clock() + self.interval
        self.running = False

    def wait(self, wait: float) -> float:
        if self.next is None or self.running:
            return wait
        return min(wait, self.next - self._clock())


class _Worker:
    """What both workers share: the target, the refresh schedule, what a reading means. A
    worker pings through ``pinger_factory()`` (by default its kind's pinger with the health
    timeout) and re-reads the cluster through ``refresher()`` (None: the pool is gone)."""

    _default_pinger: Callable[[Mapping[str, Any], float], Any]

    def __init__(
        self,
        monitor: HealthMonitor,
        addresses: Sequence[str],
        options: Mapping[str, Any],
        *,
        pinger_factory: Callable[[], Any] | None = None,
        refresher: Callable[[], Any] | None = None,
        refresh_interval: float | None = None,
    ) -> None:
        self._options = dict(options)
        self._target = _Target(monitor, addresses, options)
        self._refresher = refresher
        self._refresh = _Refresh(refresh_interval if refresher is not None else None)
        timeout = monitor.settings.timeout
        default = self._default_pinger  # not self in the closure: no cycle through the worker
        self._pinger_factory = pinger_factory or (lambda: default(options, timeout))
        self._closed = False
        self._clear()
        _WORKERS.add(self)

    @property
    def monitor(self) -> HealthMonitor:
        return self._target.monitor

    def retarget(self, monitor: HealthMonitor, addresses: Sequence[str]) -> None:
        """Probe another replica set from now on (discovery replaced the pool's)."""
        self._target = _Target(monitor, addresses, self._options)

    @staticmethod
    def _read(pinger: Any, target: _Target, index: int, delay: bool) -> Any:
        """The probe's I/O: a ping, or the replication-delay read (a coroutine for the async pinger)."""
        return pinger.delay(target.delay_urls[index]) if delay else pinger.ping(target.urls[index])

    @staticmethod
    def _report(target: _Target, index: int, delay: bool, reading: Any) -> None:
        """A probe's reading, handed to the monitor it was started for (raises BalancerGone)."""
        if delay:
            target.monitor.finish_delay(index, *reading)
        else:
            target.monitor.finish(index, reading)

    def _clear(self) -> None:
        """Nothing running: at construction, and in a forked child."""
        raise NotImplementedError

    def _forget_after_fork(self) -> None:
        """In a child process: the parent's thread or task, and its connections, are not ours."""
        self._clear()
        self.monitor.schedule.reset()

    @staticmethod
    def _failed(target: _Target, index: int, delay: bool) -> None:  # pragma: no cover - a surprise
        what = "replication delay" if delay else "health probe"
        log_failure(f"clickhouse_lb {what} of %s", target.urls[index])


class ProbeWorker(_Worker):
    """Background probes of a sync pool."""

    _default_pinger = SyncPinger

    def _clear(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._helpers: ThreadPoolExecutor | None = None
        self._pinger: _Pinger | None = None
        self._pid: int | None = None

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    def ensure_started(self) -> None:
        """Start the worker unless it runs in this process already (cheap when it does)."""
        if self._thread is not None and (FORGETS_AT_FORK or self._pid == os.getpid()):
            return
        with self._lock:
            if self._closed or not self.monitor.settings.enabled:
                return
            if self._pid != os.getpid():
                self._forget_after_fork()
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._pinger = self._pinger_factory()
            self._helpers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="clickhouse-lb-probe")
            self._thread = threading.Thread(target=self._run, name="clickhouse-lb-health", daemon=True)
            self._pid = os.getpid()
            self._thread.start()

    def _run(self) -> None:
        stop, helpers = self._stop, self._helpers
        assert helpers is not None
        while not (stop.is_set() or self._closed):
            target = self._target
            try:
                for index in target.monitor.due():
                    helpers.submit(self._probe, target, index, False)
                for index in target.monitor.delay_due():
                    helpers.submit(self._probe, target, index, True)
                if self._refresh.due():
                    helpers.submit(self._rediscover)
                wait = self._refresh.wait(target.monitor.next_wakeup())
            except RuntimeError:  # the helpers were shut down by close(), or the pool is gone
                break
            except Exception:  # pragma: no cover - the worker must outlive any surprise
                log_failure("clickhouse_lb health worker")
                wait = target.monitor.settings.interval
            stop.wait(max(_MIN_WAIT, wait))
        stop.set()
        helpers.shutdown(wait=False, cancel_futures=True)

    def _rediscover(self) -> None:
        assert self._refresher is not None
        try:
            refresh = self._refresher()
            if refresh is None:  # the pool is gone
                self._stop.set()
            else:
                refresh()
        except Exception:  # pragma: no cover - the worker must outlive any surprise
            log_failure("clickhouse_lb cluster discovery")
        finally:
            self._refresh.done()

    def _probe(self, target: _Target, index: int, delay: bool) -> None:
        pinger = self._pinger
        if pinger is None or self._stop.is_set():
            return
        try:
            self._report(target, index, delay, self._read(pinger, target, index, delay))
        except BalancerGone:
            if target is self._target:
                self._stop.set()
        except Exception:  # pragma: no cover
            self._failed(target, index, delay)

    def stop(self) -> None:
        """Ask the worker to stop, without waiting (the pool was garbage-collected unclosed).

        Only a flag: this runs as a finalizer, that is wherever the garbage collector happens
        to run, for example inside this worker's own ``helpers.submit`` while it holds the
        executor's locks; shutting the executor down here deadlocked every thread that submits
        (seen in CI). Not even the stop event's ``set()``, which takes the event's lock (the GC
        can run inside that event's own ``set()`` on the same thread). The worker sees the flag
        when it next wakes, within one probe interval, and shuts its helpers down itself."""
        self._closed = True

    def close(self) -> None:
        """Stop the worker (waits for it briefly; it never runs statements)."""
        with self._lock:
            self._closed = True
            thread, helpers, pinger = self._thread, self._helpers, self._pinger
            self._stop.set()
            self._thread = self._helpers = self._pinger = None
        if thread is not None and thread is not threading.current_thread() and self._pid == os.getpid():
            thread.join(timeout=5)
        if helpers is not None:
            helpers.shutdown(wait=False, cancel_futures=True)
        if pinger is not None:
            pinger.close()


class AsyncProbeWorker(_Worker):
    """Background probes of an async pool: a task on the loop of the statement that started it."""

    _default_pinger = AsyncPinger

    def _clear(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._pid: int | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self._pid == os.getpid()

    def ensure_started(self) -> None:
        """Start the task on the running loop unless it runs there already."""
        if self._closed or not self.monitor.settings.enabled:
            return
        task = self._task
        loop = asyncio.get_running_loop()
        if task is not None and self._pid == os.getpid() and not task.done() and task.get_loop() is loop:
            return
        if self._pid != os.getpid():
            self._forget_after_fork()
        elif task is not None and not task.done() and not task.get_loop().is_closed():
            # Started on another loop that still runs: stop it there, run here.
            task.get_loop().call_soon_threadsafe(task.cancel)
        self.monitor.schedule.abandon_in_flight()
        self._pid = os.getpid()
        self._task = loop.create_task(self._run(), name="clickhouse-lb-health")

    async def _run(self) -> None:
        pinger: _AsyncPinger = self._pinger_factory()
        probes: set[asyncio.Task[None]] = set()

        def spawn(probe: Coroutine[Any, Any, None], name: str = "clickhouse-lb-probe") -> None:
            task = asyncio.create_task(probe, name=name)
            probes.add(task)
            task.add_done_callback(probes.discard)

        try:
            while True:
                target = self._target
                try:
                    for index in target.monitor.due():
                        spawn(self._probe(pinger, target, index, False))
                    for index in target.monitor.delay_due():
                        spawn(self._probe(pinger, target, index, True))
                    if self._refresh.due():
                        spawn(self._rediscover(), "clickhouse-lb-discovery")
                    wait = self._refresh.wait(target.monitor.next_wakeup())
                except BalancerGone:
                    if target is self._target:
                        return
                    wait = _MIN_WAIT
                except Exception:  # pragma: no cover - the worker must outlive any surprise
                    log_failure("clickhouse_lb health worker")
                    wait = target.monitor.settings.interval
                await asyncio.sleep(max(_MIN_WAIT, wait))
        finally:
            for probe in probes:
                probe.cancel()
            try:
                await asyncio.gather(*probes, return_exceptions=True)
            finally:  # (a second cancellation while the probes end: the sessions are closed anyway)
                await pinger.close()
                self.monitor.schedule.abandon_in_flight()

    async def _rediscover(self) -> None:
        # Cancellation (a BaseException) passes through: the worker is stopping.
        assert self._refresher is not None
        try:
            refresh = self._refresher()
            if refresh is not None:
                await refresh()
        except Exception:  # pragma: no cover - the worker must outlive any surprise
            log_failure("clickhouse_lb cluster discovery")
        finally:
            self._refresh.done()

    async def _probe(self, pinger: _AsyncPinger, target: _Target, index: int, delay: bool) -> None:
        try:
            self._report(target, index, delay, await self._read(pinger, target, index, delay))
        except BalancerGone:  # the loop notices too, and ends
            return
        except Exception:  # pragma: no cover
            self._failed(target, index, delay)

    def stop(self) -> None:
        """Cancel the task without waiting (the pool was garbage-collected unclosed)."""
        self._closed = True
        task = self._task
        if task is not None and not task.done() and self._pid == os.getpid() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def close(self) -> None:
        """Stop the task (and wait for it when it runs on this loop)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done() and self._pid == os.getpid():
            if task.get_loop() is asyncio.get_running_loop():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            elif not task.get_loop().is_closed():
                task.get_loop().call_soon_threadsafe(task.cancel)

"""The probe workers: one per pool, started lazily by the first statement, stopped by
``close()``. They only send pings and report outcomes; :class:`~clickhouse_lb.health.HealthMonitor`
decides everything. Neither ever holds a lock a statement waits on.

* :class:`ProbeWorker` (sync pool): a daemon thread that wakes when a replica is due and hands
  the pings to a few helper threads, so one hung replica cannot delay the others' probes.
* :class:`AsyncProbeWorker` (async pool): a task on the loop of the statement that started it,
  one short task per ping.

Fork safety: a child process inherits neither thread nor task (they do not exist there) nor
the parent's ping connections. ``os.register_at_fork`` forgets them in the child, and a pid
check at every start covers anything else; the child's first statement starts its own worker.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ._ping import AsyncPinger, SyncPinger, delay_url, ping_url
from .events import logger
from .health import BalancerGone, HealthMonitor, ProbeOutcome

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


_WORKERS: weakref.WeakSet[ProbeWorker | AsyncProbeWorker] = weakref.WeakSet()


def _forget_all_in_child() -> None:
    for worker in list(_WORKERS):
        worker._forget_after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_forget_all_in_child)


class ProbeWorker:
    """Background probes of a sync pool."""

    def __init__(
        self,
        monitor: HealthMonitor,
        addresses: Sequence[str],
        options: Mapping[str, Any],
        *,
        pinger_factory: Callable[[], _Pinger] | None = None,
    ) -> None:
        self.monitor = monitor
        self._urls = [ping_url(address, options) for address in addresses]
        self._delay_urls = [delay_url(address, options) for address in addresses]
        timeout = monitor.settings.timeout
        self._pinger_factory = pinger_factory or (lambda: SyncPinger(options, timeout))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._helpers: ThreadPoolExecutor | None = None
        self._pinger: _Pinger | None = None
        self._pid: int | None = None
        self._closed = False
        _WORKERS.add(self)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    def ensure_started(self) -> None:
        """Start the worker unless it runs in this process already (cheap when it does)."""
        if self._pid == os.getpid() and self._thread is not None:
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
            self._helpers = ThreadPoolExecutor(
                max_workers=min(8, len(self._urls)), thread_name_prefix="clickhouse-lb-probe"
            )
            self._thread = threading.Thread(target=self._run, name="clickhouse-lb-health", daemon=True)
            self._pid = os.getpid()
            self._thread.start()

    def _run(self) -> None:
        stop, helpers = self._stop, self._helpers
        assert helpers is not None
        while not stop.is_set():
            try:
                for index in self.monitor.due():
                    helpers.submit(self._probe, index)
                for index in self.monitor.delay_due():
                    helpers.submit(self._read_delay, index)
                wait = self.monitor.next_wakeup()
            except RuntimeError:  # the helpers were shut down by close(), or the pool is gone
                break
            except Exception:  # pragma: no cover - the worker must outlive any surprise
                logger.exception("clickhouse_lb health worker")
                wait = self.monitor.settings.interval
            stop.wait(max(_MIN_WAIT, wait))
        stop.set()
        helpers.shutdown(wait=False, cancel_futures=True)

    def _probe(self, index: int) -> None:
        pinger = self._pinger
        if pinger is None or self._stop.is_set():
            return
        try:
            self.monitor.finish(index, pinger.ping(self._urls[index]))
        except BalancerGone:
            self._stop.set()
        except Exception:  # pragma: no cover
            logger.exception("clickhouse_lb health probe of %s", self._urls[index])

    def stop(self) -> None:
        """Ask the worker to stop, without waiting (the pool was garbage-collected unclosed)."""
        self._closed = True
        self._stop.set()
        helpers = self._helpers
        if helpers is not None:
            helpers.shutdown(wait=False, cancel_futures=True)

    def _read_delay(self, index: int) -> None:
        pinger = self._pinger
        if pinger is None or self._stop.is_set():
            return
        try:
            self.monitor.finish_delay(index, *pinger.delay(self._delay_urls[index]))
        except BalancerGone:
            self._stop.set()
        except Exception:  # pragma: no cover
            logger.exception("clickhouse_lb replication delay of %s", self._urls[index])

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

    def _forget_after_fork(self) -> None:
        """In a child process: the parent's thread, helpers and connections are not ours."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._helpers = None
        self._pinger = None
        self._pid = None
        self.monitor.schedule.reset()


class AsyncProbeWorker:
    """Background probes of an async pool: a task on the loop of the statement that started it."""

    def __init__(
        self,
        monitor: HealthMonitor,
        addresses: Sequence[str],
        options: Mapping[str, Any],
        *,
        pinger_factory: Callable[[], _AsyncPinger] | None = None,
    ) -> None:
        self.monitor = monitor
        self._urls = [ping_url(address, options) for address in addresses]
        self._delay_urls = [delay_url(address, options) for address in addresses]
        timeout = monitor.settings.timeout
        self._pinger_factory = pinger_factory or (lambda: AsyncPinger(options, timeout))
        self._task: asyncio.Task[None] | None = None
        self._pid: int | None = None
        self._closed = False
        _WORKERS.add(self)

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
        pinger = self._pinger_factory()
        probes: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    for index in self.monitor.due():
                        probe = asyncio.create_task(self._probe(pinger, index), name="clickhouse-lb-probe")
                        probes.add(probe)
                        probe.add_done_callback(probes.discard)
                    for index in self.monitor.delay_due():
                        probe = asyncio.create_task(self._read_delay(pinger, index), name="clickhouse-lb-probe")
                        probes.add(probe)
                        probe.add_done_callback(probes.discard)
                    wait = self.monitor.next_wakeup()
                except BalancerGone:
                    return
                except Exception:  # pragma: no cover - the worker must outlive any surprise
                    logger.exception("clickhouse_lb health worker")
                    wait = self.monitor.settings.interval
                await asyncio.sleep(max(_MIN_WAIT, wait))
        finally:
            for probe in probes:
                probe.cancel()
            await asyncio.gather(*probes, return_exceptions=True)
            await pinger.close()
            self.monitor.schedule.abandon_in_flight()

    async def _probe(self, pinger: _AsyncPinger, index: int) -> None:
        try:
            self.monitor.finish(index, await pinger.ping(self._urls[index]))
        except asyncio.CancelledError:
            raise
        except BalancerGone:  # the loop notices too, and ends
            return
        except Exception:  # pragma: no cover
            logger.exception("clickhouse_lb health probe of %s", self._urls[index])

    def stop(self) -> None:
        """Cancel the task without waiting (the pool was garbage-collected unclosed)."""
        self._closed = True
        task = self._task
        if task is not None and not task.done() and self._pid == os.getpid() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def _read_delay(self, pinger: _AsyncPinger, index: int) -> None:
        try:
            self.monitor.finish_delay(index, *(await pinger.delay(self._delay_urls[index])))
        except asyncio.CancelledError:
            raise
        except BalancerGone:
            return
        except Exception:  # pragma: no cover
            logger.exception("clickhouse_lb replication delay of %s", self._urls[index])

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

    def _forget_after_fork(self) -> None:
        self._task = None
        self._pid = None
        self.monitor.schedule.reset()
